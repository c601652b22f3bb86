@testable import ContainerFS
import CLinux
import Containers
import FUSELowLevel
import Foundation
import Glibc
import Synchronization
import XCTest

/// The node table and its nodes driven directly, without a mount.
final class NodeTableTests: XCTestCase {
    private var directory = ""
    private var nodes: NodeTable!

    override func setUpWithError() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("nodes-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let descriptor = open(directory, O_PATH | O_DIRECTORY | O_CLOEXEC)
        XCTAssertGreaterThanOrEqual(descriptor, 0)
        var attributes = stat()
        XCTAssertEqual(fstat(descriptor, &attributes), 0)
        nodes = NodeTable(root: Node(descriptor: descriptor, attributes: attributes, exposedInode: UInt64(attributes.st_ino),
                                     zone: .documents, parent: nil, name: .empty))
    }

    override func tearDownWithError() throws {
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// Looks `name` up, as `ContainerFileSystem.lookupEntry` does.
    private func lookUp(_ name: String) -> Node? {
        var attributes = stat()
        guard lstat(directory + "/" + name, &attributes) == 0 else { return nil }
        return name.withCString { nodes.remember(descriptor: -1, attributes: attributes, zone: .documents, parent: nodes.root,
                                                 name: FileName($0), for: 0).node }
    }

    /// Publishes `content` over `name`, `node`'s file, as `Shadows.moveIntoPlace` does.
    private func publish(_ content: String, over node: Node, named name: String) {
        let shadow = directory + "/.shadow"
        XCTAssertTrue(FileManager.default.createFile(atPath: shadow, contents: Data(content.utf8)))
        var attributes = stat()
        XCTAssertEqual(lstat(shadow, &attributes), 0)
        let previous = nodes.republish(node, as: BackingKey(attributes))
        XCTAssertEqual(rename(shadow, directory + "/" + name), 0)
        nodes.finishRepublish(node, previous: previous)
    }

    /// A parent's last reference may go while its child's place lock is held (`setPlace`): a node
    /// that took a place lock as it went would wait forever on its child's when both are of one
    /// stripe (as the first build that kept a publish's replaced key by the stripe did).
    func testAParentGoingUnderItsChildsPlaceLockDoesNotWait() {
        func made() -> Node { Node.unplaced(mode: S_IFDIR | 0o755) }
        let child = made()
        var others: [Node] = []
        var parent: Node? = made()
        while parent!.stripe != child.stripe {
            others.append(parent!)
            parent = made()
        }
        child.setPlace(parent: parent!, name: NodeName(Array("child".utf8)))
        parent = nil
        others.removeAll()
        let next = made()
        let moved = DispatchSemaphore(value: 0)
        // The child then holds its parent's only reference; moving it lets the parent go.
        Thread.detachNewThread {
            child.setPlace(parent: next, name: NodeName(Array("child".utf8)))
            moved.signal()
        }
        XCTAssertEqual(moved.wait(timeout: .now() + 10), .success, "the parent's deinit waited on the child's place lock")
    }

    /// There is a node for every item the kernel knows (the README's memory rows): the allocator
    /// gives a node of up to 104 bytes 112, and one of 112 bytes 128. What the packing keeps in a
    /// byte or a bit reads back as it was given.
    func testANodeTakesOneHundredTwelveBytes() throws {
        for (mode, check) in [(S_IFREG | 0o644, \Node.isRegularFile), (S_IFDIR | 0o755, \Node.isDirectory),
                              (S_IFLNK | 0o777, \Node.isSymlink)] {
            let node = Node.unplaced(mode: mode)
            XCTAssertLessThanOrEqual(clinux_malloc_usable_size(Unmanaged.passUnretained(node).toOpaque()), 104)
            XCTAssertEqual(node.fileType, mode & S_IFMT)
            XCTAssertTrue(node[keyPath: check])
        }
        for name in ["evicted", "detached"] {
            XCTAssertTrue(FileManager.default.createFile(atPath: directory + "/" + name, contents: Data("0".utf8)))
        }
        let evicted = try XCTUnwrap(lookUp("evicted")), detached = try XCTUnwrap(lookUp("detached"))
        XCTAssertEqual(evicted.attributesByName().1, 0)
        evicted.evict()
        XCTAssertEqual(evicted.attributesByName().1, ESTALE)
        XCTAssertFalse(evicted.isDetached, "evicted, not detached")
        nodes.detach(detached)
        XCTAssertTrue(detached.isDetached)
        XCTAssertEqual(detached.attributesByName().1, 0, "detached, not evicted")
    }

    /// The answer "no security.capability" is kept until the file's attributes change or another
    /// file takes its place, and is not kept when they changed while it was read; the count of
    /// changes that tells so leaves the other flags as they were.
    func testANodeKeepsThatItHasNoCapabilityUntilItsAttributesChange() throws {
        XCTAssertTrue(FileManager.default.createFile(atPath: directory + "/f", contents: Data("0".utf8)))
        let node = try XCTUnwrap(lookUp("f"))
        XCTAssertFalse(node.hasNoCapability, "never asked")
        node.noteNoCapability(asOf: node.capabilityStamp)
        XCTAssertTrue(node.hasNoCapability)
        node.attributesChanged()
        XCTAssertFalse(node.hasNoCapability, "attributes changed after the answer")

        let stamp = node.capabilityStamp
        node.attributesChanged()
        node.noteNoCapability(asOf: stamp)
        XCTAssertFalse(node.hasNoCapability, "read while they changed")

        node.noteNoCapability(asOf: node.capabilityStamp)
        publish("1", over: node, named: "f")
        XCTAssertFalse(node.hasNoCapability, "another file took its place")

        node.evict()
        for _ in 0..<70 { node.attributesChanged() }
        node.noteNoCapability(asOf: node.capabilityStamp)
        XCTAssertTrue(node.hasNoCapability)
        XCTAssertEqual(node.attributesByName().1, ESTALE, "still evicted after the count")
        XCTAssertFalse(node.isDetached, "not detached by the count")
    }

    /// A node that shares its file with another keeps no capability answer, and a change of the
    /// attributes through it reaches the other's: a detached node and the name's new node, an
    /// unnamed file's node and the node its link made.
    func testANodeThatSharesItsFileKeepsNoCapabilityAnswer() throws {
        XCTAssertTrue(FileManager.default.createFile(atPath: directory + "/f", contents: Data("0".utf8)))
        let detached = try XCTUnwrap(lookUp("f"))
        detached.noteNoCapability(asOf: detached.capabilityStamp)
        nodes.detach(detached)
        XCTAssertFalse(detached.hasNoCapability, "detached: the name's next node has the file")
        detached.noteNoCapability(asOf: detached.capabilityStamp)
        XCTAssertFalse(detached.hasNoCapability)
        let named = try XCTUnwrap(lookUp("f"))
        XCTAssertTrue(named !== detached)
        named.noteNoCapability(asOf: named.capabilityStamp)
        XCTAssertTrue(named.hasNoCapability)
        nodes.attributesChanged(of: detached)
        XCTAssertFalse(named.hasNoCapability, "changed through the detached node")

        let file = open(directory, O_RDWR | O_TMPFILE | O_CLOEXEC, 0o600)
        XCTAssertGreaterThanOrEqual(file, 0)
        defer { close(file) }
        let pin = open("/proc/self/fd/\(file)", O_PATH | O_CLOEXEC)
        XCTAssertGreaterThanOrEqual(pin, 0)
        var attributes = stat()
        XCTAssertEqual(fstat(file, &attributes), 0)
        let unnamed = nodes.rememberUnnamed(pin: pin, attributes: attributes, zone: .data, parent: nodes.root)
        unnamed.noteNoCapability(asOf: unnamed.capabilityStamp)
        XCTAssertFalse(unnamed.hasNoCapability, "unnamed: a link names the file with another node")
        XCTAssertEqual(linkat(AT_FDCWD, "/proc/self/fd/\(file)", AT_FDCWD, directory + "/linked", AT_SYMLINK_FOLLOW), 0)
        let linked = try XCTUnwrap(lookUp("linked"))
        linked.noteNoCapability(asOf: linked.capabilityStamp)
        nodes.attributesChanged(of: unnamed)
        XCTAssertFalse(linked.hasNoCapability, "changed through the unnamed file's node")
        nodes.forget(nodes.inodeNumber(of: unnamed), count: 1)
    }

    /// A file republished over and over, as a rewrite's publishes do (`Shadows.moveIntoPlace`),
    /// is reachable by name all along to those who look meanwhile: an open checks, and an
    /// ESTALE there twice in a row reaches the program.
    func testAFileRepublishedMeanwhileStaysReachableByName() throws {
        XCTAssertTrue(FileManager.default.createFile(atPath: directory + "/f", contents: Data("0".utf8)))
        let node = try XCTUnwrap(lookUp("f"))
        let publishes = 8000
        let done = Atomic<Bool>(false)
        let lost = Atomic<Int>(0)
        let looker = Thread {
            while !done.load(ordering: .acquiring) {
                if node.attributesByName().1 != 0 { lost.add(1, ordering: .relaxed) }
            }
        }
        looker.start()
        for round in 1...publishes {
            publish("\(round)", over: node, named: "f")
        }
        done.store(true, ordering: .releasing)
        while !looker.isFinished { usleep(1000) }
        XCTAssertEqual(lost.load(ordering: .relaxed), 0, "times the name led elsewhere")
        XCTAssertEqual(node.attributesByName().1, 0)
    }

    /// A look-up that read a name's attributes just before a publish replaced its file makes no
    /// node for the replaced file (which would answer ESTALE at once): it is told to look again,
    /// and then finds the published file's node. Before, a listing and the kernel's retried look-up
    /// could each hand a reader such a node, and the second ESTALE reached its program.
    func testALookUpThatRacedAPublishMakesNoNodeOfTheReplacedFile() throws {
        XCTAssertTrue(FileManager.default.createFile(atPath: directory + "/f", contents: Data("0".utf8)))
        let node = try XCTUnwrap(lookUp("f"))
        let seen = nodes.replacements.load(ordering: .acquiring)
        var before = stat()
        XCTAssertEqual(lstat(directory + "/f", &before), 0)
        publish("1", over: node, named: "f")
        let raced = "f".withCString {
            nodes.remember(descriptor: -1, attributes: before, zone: .documents, parent: nodes.root, name: FileName($0), for: 0,
                           unlessReplacedSince: seen)
        }
        guard case .raced = raced else { return XCTFail("a node was made for the replaced file: \(raced)") }
        XCTAssertTrue(try XCTUnwrap(lookUp("f")) === node, "looked up again, the name leads to the published file's node")
        XCTAssertEqual(node.attributesByName().1, 0)
    }

    /// A reader's descriptor to register is opened by name: it is the node's file, or ESTALE, never
    /// another item at the name (another file, a FIFO, whose open must not block), and a pinned
    /// node's file is reached without its name.
    func testAnOpenByNameGetsTheNodesFileOrESTALE() throws {
        func content(of descriptor: Int32) -> String {
            var buffer = [UInt8](repeating: 0, count: 16)
            let count = pread(descriptor, &buffer, buffer.count, 0)
            close(descriptor)
            return String(decoding: buffer.prefix(max(count, 0)), as: UTF8.self)
        }
        let path = directory + "/f"
        XCTAssertTrue(FileManager.default.createFile(atPath: path, contents: Data("mine".utf8)))
        let node = try XCTUnwrap(lookUp("f"))
        let descriptor = node.openForReadingAndWriting()
        XCTAssertGreaterThanOrEqual(descriptor, 0)
        XCTAssertEqual(fcntl(descriptor, F_GETFL) & O_ACCMODE, O_RDWR)
        XCTAssertEqual(content(of: descriptor), "mine")
        // Another file at the name (the node's own kept open and linked as `own`, so that its number
        // is not reused).
        let kept = open(path, O_RDONLY | O_CLOEXEC)
        XCTAssertEqual(link(path, directory + "/own"), 0)
        XCTAssertEqual(unlink(path), 0)
        XCTAssertTrue(FileManager.default.createFile(atPath: path, contents: Data("other".utf8)))
        XCTAssertEqual(node.openForReadingAndWriting(), -1)
        XCTAssertEqual(errno, ESTALE)
        // A FIFO: opened to read and write it does not wait for a writer.
        XCTAssertEqual(unlink(path), 0)
        XCTAssertEqual(mkfifo(path, 0o644), 0)
        XCTAssertEqual(node.openForReadingAndWriting(), -1)
        XCTAssertEqual(errno, ESTALE)
        XCTAssertEqual(unlink(path), 0)
        XCTAssertEqual(node.openForReadingAndWriting(), -1)
        XCTAssertEqual(errno, ESTALE)
        // A symlink at the name, even one to the node's own file, is not followed (ELOOP).
        XCTAssertEqual(symlink("own", path), 0)
        XCTAssertEqual(node.openForReadingAndWriting(), -1)
        XCTAssertEqual(errno, ESTALE)
        XCTAssertEqual(unlink(path), 0)
        // Pinned (its name removed through the mount): its own file, by the pin.
        let pin = open("/proc/self/fd/\(kept)", O_PATH | O_CLOEXEC)
        close(kept)
        XCTAssertTrue(node.pin(pin))
        let pinned = node.openForReadingAndWriting()
        XCTAssertGreaterThanOrEqual(pinned, 0)
        XCTAssertEqual(content(of: pinned), "mine")
        nodes.forget(nodes.inodeNumber(of: node), count: 1)
    }

    /// A writer's open that found the kernel's node stale has the nodes of the name's file await
    /// it (`NodeTable.awaitWriter`): the one there and any made until it comes (the kernel may
    /// forget the first meanwhile) take no cached readers, so that the kernel's retry of the open
    /// finds none in its way. Once it came, a new node takes them again.
    func testNodesOfAFileAwaitingAWriterTakeNoCachedReadersUntilItComes() throws {
        XCTAssertTrue(FileManager.default.createFile(atPath: directory + "/f", contents: Data("0".utf8)))
        func registers(_ node: Node) -> Bool {
            node.withSession { _ in
                node.sharing.registers(writes: false, session: false, now: DispatchTime.now().uptimeNanoseconds, mayRegister: true)
            }
        }
        let first = try XCTUnwrap(lookUp("f"))
        XCTAssertTrue(registers(first))
        first.withSession { _ in nodes.awaitWriter(at: first.key, on: first) }
        XCTAssertFalse(registers(first))
        nodes.forget(nodes.inodeNumber(of: first), count: 1)
        let second = try XCTUnwrap(lookUp("f"))
        XCTAssertFalse(second === first)
        XCTAssertFalse(registers(second), "a node made while the writer is awaited awaits it too")
        // The writer joins the second node's session, as `joinSession` tells the table.
        second.withSession { _ in XCTAssertTrue(second.sharing.writerJoined()) }
        nodes.writerArrived(at: second.key)
        XCTAssertTrue(registers(second))
        nodes.forget(nodes.inodeNumber(of: second), count: 1)
        let third = try XCTUnwrap(lookUp("f"))
        XCTAssertTrue(registers(third))
        nodes.forget(nodes.inodeNumber(of: third), count: 1)
    }

    /// A node that was only looked up carries no file state (a node per item `find` or `ls -lR`
    /// names adds up); an open makes it, and what the open counted is gone once it closes.
    func testOnlyAnOpenGivesANodeItsFileState() throws {
        XCTAssertTrue(FileManager.default.createFile(atPath: directory + "/f", contents: Data("0".utf8)))
        let node = try XCTUnwrap(lookUp("f"))
        XCTAssertFalse(node.attributesVary)
        XCTAssertEqual(node.withSession { $0 == nil }, true)
        XCTAssertEqual(node.withCachedVersion { $0 == nil }, true)
        XCTAssertFalse(node.hasFileState, "a looked-up node")

        let opened = try XCTUnwrap(node.openHandle(.reader(inPlace: { false }), passthrough: nil, in: nodes) { _ in
            open(directory + "/f", O_RDONLY | O_CLOEXEC)
        })
        XCTAssertGreaterThanOrEqual(opened.descriptor, 0)
        XCTAssertTrue(node.hasFileState, "an opened node")
        XCTAssertTrue(node.sharing.hasOpenHandles)
        node.closeHandle(opened.path, passthrough: nil)
        close(opened.descriptor)
        XCTAssertFalse(node.sharing.hasOpenHandles)
        XCTAssertEqual(node.sharing, Sharing(), "what the open counted")
    }
    /// A reader that passes through opens one descriptor, for reading and writing, which is
    /// registered (a writer may join its backing file), and nobody asks its kind; one the kernel
    /// refuses ends with a descriptor opened as the reader asked, and its kind asked.
    func testAReaderThatPassesThroughOpensOnceAndIsNotAskedItsKind() throws {
        XCTAssertTrue(FileManager.default.createFile(atPath: directory + "/f", contents: Data("0".utf8)))
        let node = try XCTUnwrap(lookUp("f"))
        final class Registry: BackingFileRegistry {
            var answer: Int32 = 7
            var registered: [Int32] = []
            func openBacking(_ descriptor: Int32) -> Int32 {
                registered.append(fcntl(descriptor, F_GETFL) & O_ACCMODE)
                return answer
            }
            var closed: [Int32] = []
            func closeBacking(_ id: Int32) -> Int32 {
                closed.append(id)
                return id == 7 ? 0 : ENOENT
            }
        }
        let registry = Registry()
        var notClosed: [Int32] = []
        let passthrough = PassthroughFiles(registry: registry, refused: { _ in }, notClosed: { id, _ in notClosed.append(id) })
        var opens: [Bool] = []
        var asked = 0
        let reader = HandleOpening.reader(inPlace: { asked += 1; return false })
        let open = { (readWrite: Bool) -> Int32 in
            opens.append(readWrite)
            return Glibc.open(self.directory + "/f", (readWrite ? O_RDWR : O_RDONLY) | O_CLOEXEC)
        }
        let first = try XCTUnwrap(node.openHandle(reader, passthrough: passthrough, writable: true, in: nodes, open))
        XCTAssertEqual(first.path, .passthrough(backingID: 7))
        XCTAssertEqual(opens, [true], "one descriptor")
        XCTAssertEqual(registry.registered, [O_RDWR], "the descriptor registered is the reader's own")
        XCTAssertEqual(fcntl(first.descriptor, F_GETFL) & O_ACCMODE, O_RDWR)
        XCTAssertEqual(asked, 0, "a reader's kind tells nothing to passthrough")
        node.closeHandle(first.path, passthrough: passthrough)
        close(first.descriptor)

        registry.answer = -ENOMEM
        opens = []
        let refused = try XCTUnwrap(node.openHandle(reader, passthrough: passthrough, writable: true, in: nodes, open))
        XCTAssertEqual(refused.path, .pageCache)
        XCTAssertEqual(opens, [true, false], "opened again as the reader asked")
        XCTAssertEqual(fcntl(refused.descriptor, F_GETFL) & O_ACCMODE, O_RDONLY)
        XCTAssertEqual(asked, 1)
        node.closeHandle(refused.path, passthrough: passthrough)
        close(refused.descriptor)
        XCTAssertEqual(node.sharing, Sharing())
        XCTAssertEqual(registry.closed, [7], "the last passthrough handle's close")
        XCTAssertEqual(notClosed, [])
        passthrough.unregister(9)
        XCTAssertEqual(notClosed, [9], "an id the kernel does not hold is reported, not dropped")

        // A file that cannot be opened for writing (a program runs it: ETXTBSY) is opened as the
        // reader asked, and still passes through.
        registry.answer = 7
        opens = []
        let unwritable = try XCTUnwrap(node.openHandle(reader, passthrough: passthrough, writable: true, in: nodes) { readWrite in
            opens.append(readWrite)
            guard !readWrite else {
                errno = ETXTBSY
                return -1
            }
            return Glibc.open(self.directory + "/f", O_RDONLY | O_CLOEXEC)
        })
        XCTAssertEqual(opens, [true, false])
        XCTAssertEqual(unwritable.path, .passthrough(backingID: 7))
        XCTAssertEqual(fcntl(unwritable.descriptor, F_GETFL) & O_ACCMODE, O_RDONLY)
        node.closeHandle(unwritable.path, passthrough: passthrough)
        close(unwritable.descriptor)
        XCTAssertEqual(node.sharing, Sharing())
    }

    /// Looks the directory `name` up with a descriptor of its own, as a directory's node holds one.
    private func lookUpDirectory(_ name: String, zone: Zone) throws -> Node {
        let path = directory + "/" + name
        XCTAssertEqual(mkdir(path, 0o755), 0)
        let descriptor = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC)
        XCTAssertGreaterThanOrEqual(descriptor, 0)
        var attributes = stat()
        XCTAssertEqual(fstat(descriptor, &attributes), 0)
        return try XCTUnwrap(name.withCString {
            nodes.remember(descriptor: descriptor, attributes: attributes, zone: zone, parent: nodes.root, name: FileName($0), for: 0).node
        })
    }

    /// The kernel looking a known directory up again gets its node without a descriptor opened for
    /// it (`rememberHeld`), its place as found now; a file, or a directory no node holds, is
    /// looked up the whole way.
    func testALookUpOfAHeldDirectoryCountsItsNode() throws {
        let folder = try lookUpDirectory("folder", zone: .data)
        XCTAssertEqual(rename(directory + "/folder", directory + "/moved"), 0)
        var attributes = stat()
        XCTAssertEqual(lstat(directory + "/moved", &attributes), 0)
        let again = "moved".withCString {
            nodes.rememberHeld(attributes: attributes, zone: .documents, parent: nodes.root, name: FileName($0))
        }
        XCTAssertTrue(again === folder)
        XCTAssertEqual(folder.lookups, 2)
        XCTAssertEqual(folder.lastSeen.map { String(decoding: $0.name.bytes, as: UTF8.self) }, "moved")
        XCTAssertEqual(folder.zone, .documents)

        XCTAssertTrue(FileManager.default.createFile(atPath: directory + "/f", contents: Data("0".utf8)))
        _ = try XCTUnwrap(lookUp("f"))
        XCTAssertEqual(lstat(directory + "/f", &attributes), 0)
        XCTAssertNil("f".withCString {
            nodes.rememberHeld(attributes: attributes, zone: .documents, parent: nodes.root, name: FileName($0))
        }, "a file's node holds no descriptor")
        XCTAssertEqual(mkdir(directory + "/new", 0o755), 0)
        XCTAssertEqual(lstat(directory + "/new", &attributes), 0)
        XCTAssertNil("new".withCString {
            nodes.rememberHeld(attributes: attributes, zone: .documents, parent: nodes.root, name: FileName($0))
        })
    }

    /// The directory of a container's fixed place stays cached in the store once the kernel forgot
    /// its node, so that a cold look-up reads no block of the store's levels above the mount's
    /// (docs/store-format.md, "Cold caches"); a directory of the user's does not.
    func testAFixedPlacesDirectoryIsKeptOnceForgotten() throws {
        let documents = try lookUpDirectory("Documents", zone: .documents)
        let folder = try lookUpDirectory("folder", zone: .data)
        let documentsKey = documents.key, folderKey = folder.key
        XCTAssertFalse(nodes.pins.holds(documentsKey), "the node holds it while the kernel knows it")
        nodes.forget(nodes.inodeNumber(of: documents), count: 1)
        nodes.forget(nodes.inodeNumber(of: folder), count: 1)
        XCTAssertTrue(nodes.pins.holds(documentsKey))
        XCTAssertFalse(nodes.pins.holds(folderKey))
        XCTAssertEqual(nodes.pins.count, 1)
        // Looked up and forgotten again: still one pin.
        let again = open(directory + "/Documents", O_PATH | O_DIRECTORY | O_CLOEXEC)
        var attributes = stat()
        XCTAssertEqual(fstat(again, &attributes), 0)
        let node = try XCTUnwrap("Documents".withCString {
            nodes.remember(descriptor: again, attributes: attributes, zone: .documents, parent: nodes.root, name: FileName($0), for: 0).node
        })
        nodes.forget(nodes.inodeNumber(of: node), count: 1)
        XCTAssertEqual(nodes.pins.count, 1)
    }

    /// Full pins take no more, but give up those of directories removed from the store.
    func testFullPinsMakeRoomOnlyByDirectoriesThatAreGone() throws {
        let pins = DirectoryPins(limit: 2)
        var keys: [BackingKey] = []
        for name in ["a", "b", "c"] {
            let path = directory + "/" + name
            XCTAssertEqual(mkdir(path, 0o755), 0)
            let descriptor = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC)
            var attributes = stat()
            XCTAssertEqual(fstat(descriptor, &attributes), 0)
            keys.append(BackingKey(attributes))
            if name == "c" {
                XCTAssertEqual(pins.count, 2)
                XCTAssertEqual(rmdir(directory + "/a"), 0)
            }
            pins.keep(descriptor, of: keys.last!)
            close(descriptor)
        }
        XCTAssertEqual(pins.count, 2)
        XCTAssertFalse(pins.holds(keys[0]), "removed: its pin made room")
        XCTAssertTrue(pins.holds(keys[1]))
        XCTAssertTrue(pins.holds(keys[2]))
        let path = directory + "/d"
        XCTAssertEqual(mkdir(path, 0o755), 0)
        let descriptor = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC)
        var attributes = stat()
        XCTAssertEqual(fstat(descriptor, &attributes), 0)
        pins.keep(descriptor, of: BackingKey(attributes))
        close(descriptor)
        XCTAssertFalse(pins.holds(BackingKey(attributes)), "full of directories that exist")

        // After a refusal, removed ones are looked for at every 64th only.
        XCTAssertEqual(rmdir(directory + "/b"), 0)
        let another = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC)
        defer { close(another) }
        for _ in 1..<64 { pins.keep(another, of: BackingKey(attributes)) }
        XCTAssertFalse(pins.holds(BackingKey(attributes)), "63 refusals: not looked for yet")
        XCTAssertTrue(pins.holds(keys[1]))
        pins.keep(another, of: BackingKey(attributes))
        XCTAssertTrue(pins.holds(BackingKey(attributes)), "the 64th looked, and took the removed one's place")
        XCTAssertFalse(pins.holds(keys[1]))
    }

    /// A forgotten node's close that frees few blocks is done before the forget returns (waking a
    /// closer cost more than it); one that may free many is left to the closers, since with
    /// `-o discard` it waits for the device (docs/store-format.md, "Closing forgotten files").
    func testOnlyACloseThatFreesManyBlocksWaitsForACloser() throws {
        /// The node's inode number and pin, and whether its close may free many blocks; the test
        /// keeps no reference to the node, so that the table's is the last.
        func pinned(_ name: String, size: Int, unlink: Bool = true) throws -> (InodeNumber, Int32, Bool) {
            XCTAssertTrue(FileManager.default.createFile(atPath: directory + "/" + name, contents: Data(repeating: 7, count: size)))
            let node = try XCTUnwrap(lookUp(name))
            let pin = open(directory + "/" + name, O_PATH | O_CLOEXEC)
            XCTAssertTrue(node.pin(pin))
            if unlink { XCTAssertEqual(Glibc.unlink(directory + "/" + name), 0) }
            return (nodes.inodeNumber(of: node), pin, node.closeMayFreeBlocks)
        }
        let small = try pinned("small", size: 4096)
        let large = try pinned("large", size: 1 << 20)
        let linked = try pinned("linked", size: 1 << 20, unlink: false)
        XCTAssertFalse(small.2)
        XCTAssertTrue(large.2)
        XCTAssertFalse(linked.2, "closing it frees nothing: it has a name")

        nodes.forget(small.0, count: 1)
        XCTAssertEqual(fcntl(small.1, F_GETFD), -1, "closed by the forget itself")
        XCTAssertEqual(errno, EBADF)
        nodes.forget(large.0, count: 1)
        let deadline = Date().addingTimeInterval(10)
        while fcntl(large.1, F_GETFD) != -1, Date() < deadline { usleep(1000) }
        XCTAssertEqual(fcntl(large.1, F_GETFD), -1, "closed by a closer")
    }
}
