import CLinux
import Containers
import Dispatch
import Coordination
import FUSELowLevel
import Glibc
import Synchronization

/// Identifies a backing file: the table holds one node per backing inode, as passthrough_ll does.
struct BackingKey: Hashable {
    let device: UInt64
    let inode: UInt64

    init(_ attributes: stat) {
        device = UInt64(attributes.st_dev)
        inode = UInt64(attributes.st_ino)
    }

    init(device: UInt64, inode: UInt64) {
        self.device = device
        self.inode = inode
    }
}

/// What an open asks of a node's file (`Node.openHandle`): a writer's `Sharing.Opening`, or a
/// reader's, whose kind (`.inPlaceReader` or `.versionedReader`) is asked only when the handle
/// does not pass through, where it tells nothing: the answer may cost system calls (an
/// extended attribute of the file, its links).
enum HandleOpening {
    case writer(Sharing.Opening)
    case reader(inPlace: () -> Bool)

    var writes: Bool { writer != nil }

    /// The writer's opening; nil for a reader.
    var writer: Sharing.Opening? {
        if case .writer(let opening) = self { return opening }
        return nil
    }

    var resolved: Sharing.Opening {
        switch self {
        case .writer(let opening): opening
        case .reader(let inPlace): inPlace() ? .inPlaceReader : .versionedReader
        }
    }
}

/// A file or directory the kernel knows. Its address is the inode number the kernel uses for it.
/// Directories hold an `O_PATH` descriptor; other items are reached by name in their parent, so
/// that the daemon's descriptors stay few however many files the kernel knows.
///
/// Unchecked: every mutable field says what guards it (the table's lock, the place and session
/// stripe locks, or an atomic), which the compiler cannot see.
final class Node: @unchecked Sendable {
    /// The directory's `O_PATH` descriptor, for the node's life; -1 for anything else.
    let descriptor: Int32
    /// An `O_PATH` descriptor taken when the item's name was removed through the mount, so that an
    /// open item still answers; closed only with the node, as another thread may be using it.
    private let pinned = Atomic<Int32>(-1)
    /// Tells the kernel's file handles of this node from those of an earlier node at the same
    /// address (its inode number for the kernel): a handle kept past its file's removal must not
    /// open the next file made (`open_by_handle_at`, an NFS export). 0 for the root, as the kernel
    /// made it; constant for the node's life (the kernel takes another as a new inode).
    let generation: UInt32
    /// `ContainerFileSystem.writesInPlace`'s answer for the in-place attribute (bit 0), after the
    /// generation it was asked in (the other bits: its low 31; 0: never asked). A stale answer
    /// would need 2^31 changes of the attribute or moves of directories between two asks.
    let inPlaceAnswer = Atomic<UInt32>(0)
    /// The inode number `stat` shows: kept when a publish replaces the backing file.
    let exposedInode: UInt64
    /// The kernel's reference count; guarded by the node table's lock.
    var lookups: UInt64 = 0
    /// The backing file now, and the parent and name it was last seen under. Written under the
    /// node table's lock and the node's place lock; read under either (requests take the latter).
    private(set) var key: BackingKey
    private(set) var parent: Node?
    private(set) var name: NodeName
    // The zone, the flags, the file type and the count of open handles fill what the name leaves of
    // its last word: stored properties are laid out in the order declared, and a node per file adds
    // up. At 104 bytes the allocator gives a node 112, at 112 it gives 128
    // (`NodeTableTests.testANodeTakesOneHundredTwelveBytes`).
    /// Where the node sits, which decides its policy. Read on every request without the table's
    /// lock, so it is atomic; it changes only when the item moves out of the Inbox.
    private let zoneValue: Atomic<UInt8>
    var zone: Zone {
        get { Zone(rawValue: zoneValue.load(ordering: .relaxed))! }
        set { zoneValue.store(newValue.rawValue, ordering: .relaxed) }
    }
    /// `evictedFlag`, `detachedFlag` and `unnamedFlag`, set once each, never cleared;
    /// `noCapabilityFlag`, and above it a count of the changes of the file's extended attributes
    /// (see `noteNoCapability`).
    private let flags = Atomic<UInt8>(0)
    /// Set when the node lost its item and its inode number went to another file: it answers
    /// ESTALE (the kernel then looks the name up again).
    private static let evictedFlag: UInt8 = 1
    /// Set when a writer left the node to its cached readers (`NodeTable.detach`): later lookups of
    /// its name get another node, and the node holds the version its readers read.
    private static let detachedFlag: UInt8 = 2
    /// Set when the file was found to carry no `security.capability`; cleared when its extended
    /// attributes change through the mount or a publish replaces it.
    private static let noCapabilityFlag: UInt8 = 4
    /// Set for the node of an unnamed file (`NodeTable.rememberUnnamed`), which a `link` gives a
    /// second node.
    private static let unnamedFlag: UInt8 = 8
    /// One change of the extended attributes, counted in the bits above the flags (mod 16).
    private static let attributeChange: UInt8 = 16
    /// The file type bits of `st_mode` (`S_IFMT`), shifted right by 12.
    private let typeBits: UInt8
    var fileType: mode_t { mode_t(typeBits) << 12 }
    /// Files open on the node through the mount (a purge leaves these alone).
    let openHandles = Atomic<Int32>(0)
    /// What only a file opened through the mount needs; made at its first open, kept for the node's
    /// life, guarded by the session stripe's lock. Most nodes never have one: `ls -lR`, `find` and
    /// `stat` make a node for every item they name.
    private var fileState: FileState?

    private final class FileState {
        /// The write session of a regular file written through atomic replace; reached through `withSession`.
        var session: WriteSession?
        /// The version whose pages the kernel may hold.
        var cachedVersion: FileVersion?
        var sharing = Sharing()
    }

    /// The node's file state, made if it has none; the caller holds the session stripe's lock (or
    /// the node is not yet known to any other thread).
    private func madeFileState() -> FileState {
        if let fileState { return fileState }
        let made = FileState()
        fileState = made
        return made
    }

    /// Whether the node has its file state (`NodeTableTests`).
    var hasFileState: Bool { Node.sessionLocks[stripe].withLock { fileState != nil } }

    /// How the handles open on the file reach it, and whether it is live; guarded with the session.
    var sharing: Sharing {
        get { fileState?.sharing ?? Sharing() }
        _modify { yield &madeFileState().sharing }
    }
    /// Locks are shared by stripes of nodes: one for each of the files the kernel knows would cost
    /// more memory than the rest of the node. No code holds two of a kind at once.
    private static let sessionLocks = (0..<64).map { _ in PlainMutex() }
    /// Each also keeps, for the nodes of its stripe, the file a publish is renaming the node's file
    /// over, until the rename is done (`beginReplacing`): the name leads to either meanwhile. A
    /// publish's rename is brief and rare against the nodes that exist, so it is kept here; the
    /// publish holds the node from `beginReplacing` to `endReplacing`. (A node's `deinit` must not
    /// take these locks: the last reference to a parent may go under one, in `setPlace`.)
    private static let placeLocks = (0..<64).map { _ in Locked(Places()) }

    /// What a place lock guards besides the nodes' own fields.
    private struct Places {
        var replacing: [ObjectIdentifier: BackingKey] = [:]
        /// Counts every change of place in the stripe. Keys alone cannot tell that a place moved
        /// on: ext4 gives a publish's next file the number the last one freed, so publishes
        /// alternate between two keys and a place can look unchanged after two of them.
        var changes: UInt64 = 0
    }

    /// `descriptor`: an `O_PATH` descriptor on a directory, which the node then owns; -1 otherwise.
    init(descriptor: Int32, attributes: stat, exposedInode: UInt64, zone: Zone, parent: Node?, name: NodeName,
         generation: UInt32 = 0) {
        self.descriptor = descriptor
        self.key = BackingKey(attributes)
        self.typeBits = UInt8(truncatingIfNeeded: (attributes.st_mode & S_IFMT) >> 12)
        self.generation = generation
        self.exposedInode = exposedInode
        self.zoneValue = Atomic(zone.rawValue)
        self.parent = parent
        self.name = name
    }

    deinit {
        if descriptor >= 0 { close(descriptor) }
        let pin = pinned.load(ordering: .acquiring)
        if pin >= 0 { close(pin) }
    }

    /// Which of the lock stripes the node's locks are (by its address).
    @inline(__always)
    var stripe: Int {
        Int(truncatingIfNeeded: UInt(bitPattern: Unmanaged.passUnretained(self).toOpaque()) >> 6) & 63
    }

    /// Runs `body` with the node's write session, under its stripe's lock.
    func withSession<R>(_ body: (inout WriteSession?) -> R) -> R {
        withFileState(\.session, body)
    }

    /// Runs `body` with a field of the file state under the session stripe's lock. No state is
    /// made for a look that leaves the field empty.
    @inline(__always)
    private func withFileState<Value, R>(_ field: ReferenceWritableKeyPath<FileState, Value?>,
                                         _ body: (inout Value?) -> R) -> R {
        Node.sessionLocks[stripe].withLock {
            if let fileState { return body(&fileState[keyPath: field]) }
            var value: Value?
            let result = body(&value)
            if value != nil { madeFileState()[keyPath: field] = value }
            return result
        }
    }

    /// Opens the file for a handle that is not a write session's (`open` returns its descriptor, or
    /// -1 with errno set) and decides how the kernel reaches it (`Sharing.open`), under the session
    /// lock, so that no write session starts or publishes between the two. `writable`: the file may
    /// be written, so a passthrough backing file is opened for writing too. Nil when a writer in
    /// place must leave the node to passthrough readers: `nodes` detached it.
    ///
    /// `open(true)` asks for the file open for reading and writing: a reader that passes through
    /// and whose backing file must take writers too gets the one descriptor for both (the daemon
    /// neither writes through it nor keeps it past the handle, as the kernel keeps its backing
    /// file). A reader's kind is asked only if it does not pass through (`HandleOpening`).
    func openHandle(_ opening: HandleOpening, passthrough: PassthroughFiles?, writable: Bool = false, mapsShared: Bool = false,
                    in nodes: NodeTable, _ open: (_ readWrite: Bool) -> Int32) -> (descriptor: Int32, path: OpenPath)? {
        Node.sessionLocks[stripe].withLock {
            let writes = opening.writes
            if let writer = opening.writer, sharing.admit(writer, passesThrough: passthrough != nil) == .detach {
                nodes.detach(self)
                return nil
            }
            let now = DispatchTime.now().uptimeNanoseconds
            let session = fileState?.session != nil
            // A writer in place that may map the file shared (open for reading too) does not start
            // passthrough: the kernel would not see the times and size its mappings change in the
            // backing file. A live writer does, and its node's attributes are then asked afresh.
            let mayRegister = passthrough != nil && !(opening.writer == .inPlaceWriter && mapsShared)
            let registers = sharing.registers(writes: writes, session: session, now: now, mayRegister: mayRegister)
            let readWrite = registers && writable && !writes
            var descriptor = open(readWrite)
            // A file that cannot be opened for writing (a read-only backing filesystem, a program
            // running it) is registered as the reader opened it.
            if readWrite && descriptor < 0 { descriptor = open(false) }
            // Nothing counted: the caller answers the error and keeps no handle.
            guard descriptor >= 0 else { return (descriptor, .shared) }
            // A reader that registers opens as one whatever its kind (`Sharing.registered`).
            var effect = sharing.open(registers && !writes ? .versionedReader : opening.resolved, session: session, now: now,
                                      mayRegister: mayRegister)
            if effect == .register {
                let registered = passthrough?.register(descriptor, writable: writable || writes).map {
                    sharing.registered($0.id, writable: $0.writable, by: opening.writer ?? .versionedReader)
                }
                switch registered {
                case .open(let path)?:
                    effect = .open(path)
                case .unregister(let id)?:
                    passthrough?.unregister(id)
                    fallthrough
                default:
                    // Through the daemon or the page cache after all: a reader's own descriptor,
                    // as it opened the file.
                    if readWrite, case let reopened = open(false), reopened >= 0 {
                        Glibc.close(descriptor)
                        descriptor = reopened
                    }
                    effect = sharing.open(opening.resolved, session: session, now: now, mayRegister: false)
                }
            }
            switch effect {
            case .open(let path): return (descriptor, path)
            case .writerArrived(let path):
                nodes.writerArrived(at: key)
                return (descriptor, path)
            case .none, .detach, .register, .unregister: preconditionFailure("Sharing.open answers how the handle opens")
            }
        }
    }

    /// A handle `openHandle` counted has closed; the last through passthrough unregisters the version.
    func closeHandle(_ path: OpenPath, passthrough: PassthroughFiles?) {
        let effect = Node.sessionLocks[stripe].withLock { sharing.close(path) }
        if case .unregister(let id) = effect { passthrough?.unregister(id) }
    }

    /// Whether programs share the file live (`Sharing.isLive`).
    var isLive: Bool { Node.sessionLocks[stripe].withLock { sharing.isLive } }

    /// Whether the kernel must ask for the file's attributes each time: a live writer's shared
    /// mappings may move them behind its back (`Sharing.attributesMoveUnseen`), or a rewrite's
    /// writers see their writes and others the published version (`WriteSession.hidesWrites`).
    var attributesVary: Bool {
        Node.sessionLocks[stripe].withLock {
            guard let fileState else { return false }
            return fileState.sharing.attributesMoveUnseen || fileState.session?.hidesWrites == true
        }
    }

    func noticeSent() {
        Node.sessionLocks[stripe].withLock { sharing.noticeSent() }
    }

    /// Runs `body` with the version whose pages the kernel may hold, under the stripe's lock.
    func withCachedVersion<R>(_ body: (inout FileVersion?) -> R) -> R {
        withFileState(\.cachedVersion, body)
    }

    var isDirectory: Bool { fileType == S_IFDIR }
    var isSymlink: Bool { fileType == S_IFLNK }
    var isRegularFile: Bool { fileType == S_IFREG }

    /// Whether `ancestor` is this node or one of the directories above it, as last seen.
    func isWithin(_ ancestor: Node) -> Bool {
        var current: Node? = self
        while let node = current {
            if node === ancestor { return true }
            current = node.parent
        }
        return false
    }

    // MARK: Reaching the backing item

    private struct Place {
        let parent: Node?
        let name: NodeName
        let key: BackingKey
        let replaced: BackingKey?
        /// The stripe's count of changes when this was read.
        let change: UInt64

        /// Whether the file with `found` is the node's.
        func isMine(_ found: BackingKey) -> Bool { found == key || found == replaced }

        /// Whether no place in the stripe changed since `other` was read.
        func isSame(as other: Place) -> Bool { change == other.change }
    }

    /// Whether the item with `attributes`, found at `place`, is the node's: one of its files, and
    /// of its type (a file removed behind the daemon's back may leave its inode number to a FIFO).
    private func isMine(_ attributes: stat, at place: Place) -> Bool {
        place.isMine(BackingKey(attributes)) && attributes.st_mode & S_IFMT == fileType
    }

    /// The parent and name the node was last seen under (nil parent: the root), and its files.
    private var place: Place {
        Node.placeLocks[stripe].withLock { places in
            Place(parent: parent, name: name, key: key,
                  replaced: places.replacing.isEmpty ? nil : places.replacing[ObjectIdentifier(self)],
                  change: places.changes)
        }
    }

    /// The backing file now, read under the place lock.
    var currentKey: BackingKey {
        Node.placeLocks[stripe].withLock { _ in key }
    }

    /// The parent and name the node was last seen under (nil for the root).
    var lastSeen: (parent: Node, name: NodeName)? {
        let place = place
        return place.parent.map { ($0, place.name) }
    }

    /// Changes the node's place; the caller holds the node table's lock.
    func setPlace(parent: Node, name: NodeName) {
        Node.placeLocks[stripe].withLock { places in
            self.parent = parent
            self.name = name
            places.changes &+= 1
        }
    }

    /// Whether the node was last seen as `name` in `parent`; the caller holds the node table's lock.
    fileprivate func isPlaced<Name: Sequence<UInt8>>(in parent: Node, as name: Name) -> Bool {
        self.parent === parent && self.name.elementsEqual(name)
    }

    /// A look-up found the node as `name` in `parent`: one more kernel reference, and its place and
    /// zone as found. The caller holds the node table's lock.
    fileprivate func counted(placed: Bool, parent: Node, name: FileName, zone: Zone) {
        lookups += 1
        if !placed { setPlace(parent: parent, name: NodeName(name.bytes)) }
        if self.zone != zone { self.zone = zone }
    }

    /// A publish is renaming the file with `key` over the node's; the caller holds the table's lock.
    func beginReplacing(with key: BackingKey) {
        Node.placeLocks[stripe].withLock { places in
            places.replacing[ObjectIdentifier(self)] = self.key
            self.key = key
            places.changes &+= 1
        }
    }

    /// The publish's rename is done, or (`renamed` false) did not happen.
    func endReplacing(renamed: Bool) {
        Node.placeLocks[stripe].withLock { places in
            if let replaced = places.replacing.removeValue(forKey: ObjectIdentifier(self)), !renamed { key = replaced }
            places.changes &+= 1
        }
        if renamed { attributesChanged() }
    }

    func evict() { flags.bitwiseOr(Node.evictedFlag, ordering: .releasing) }

    private var isEvicted: Bool { flags.load(ordering: .acquiring) & Node.evictedFlag != 0 }

    var isDetached: Bool { flags.load(ordering: .acquiring) & Node.detachedFlag != 0 }

    /// Whether the file is known to carry no `security.capability`. The kernel asks for it before
    /// a write whenever it refreshed the file's attributes since the last write (it then forgets
    /// that the file has none), so a program that stats and writes in turn asks at every write.
    var hasNoCapability: Bool { flags.load(ordering: .acquiring) & Node.noCapabilityFlag != 0 }

    /// What `noteNoCapability` compares with: read before the attribute is.
    var capabilityStamp: UInt8 { flags.load(ordering: .acquiring) }

    /// Records that the file had no `security.capability` when read after `stamp` was taken,
    /// unless its attributes changed (or it was replaced) since: the answer may be stale then.
    /// A node that may share its file with another node (detached, unnamed) keeps no answer: a
    /// change through the other would not reach it.
    func noteNoCapability(asOf stamp: UInt8) {
        guard !Node.sharesItsFile(stamp) else { return }
        _ = flags.compareExchange(expected: stamp, desired: stamp | Node.noCapabilityFlag,
                                  ordering: .acquiringAndReleasing)
    }

    /// Whether a node with `flags` may share its file with another node: detached (the name's new
    /// node has the same file until a publish) or unnamed (a `link` names it with another node).
    private static func sharesItsFile(_ flags: UInt8) -> Bool { flags & (detachedFlag | unnamedFlag) != 0 }

    var sharesItsFile: Bool { Node.sharesItsFile(flags.load(ordering: .acquiring)) }

    fileprivate func markUnnamed() { flags.bitwiseOr(Node.unnamedFlag, ordering: .releasing) }

    /// The file's extended attributes changed, or another file took its place: a capability
    /// answer read before is stale. Called after the change, so that a read racing with it
    /// either saw the change or fails its `noteNoCapability`.
    func attributesChanged() {
        flags.wrappingAdd(Node.attributeChange, ordering: .acquiringAndReleasing)
        flags.bitwiseAnd(~Node.noCapabilityFlag, ordering: .acquiringAndReleasing)
    }

    /// Marks the node detached and pins its item, so that it keeps answering for that version
    /// whatever later happens to the name. False if it was detached already.
    fileprivate func markDetached() -> Bool {
        guard flags.bitwiseOr(Node.detachedFlag, ordering: .acquiringAndReleasing).oldValue & Node.detachedFlag == 0 else { return false }
        // Another node gets the name, and the file with it (`noteNoCapability`).
        flags.bitwiseAnd(~Node.noCapabilityFlag, ordering: .acquiringAndReleasing)
        guard !holdsItem else { return true }
        var attributes = stat()
        let descriptor = openByName(&attributes)
        if descriptor >= 0, !pin(descriptor) { close(descriptor) }
        return true
    }

    /// Whether the node holds a descriptor on its item, which then keeps its inode number.
    var holdsItem: Bool { held >= 0 }

    /// Whether closing the descriptor the node holds may free more than a few blocks: its item is
    /// unlinked and holds more than 16 KiB (or cannot be told). With `-o discard` freeing blocks
    /// waits for the device's discards, and longer the more blocks there are (docs/store-format.md,
    /// "Closing forgotten files").
    var closeMayFreeBlocks: Bool {
        let held = held
        guard held >= 0 else { return false }
        var attributes = stat()
        guard fstat(held, &attributes) == 0 else { return true }
        return attributes.st_nlink == 0 && attributes.st_blocks > 32
    }

    /// The descriptor the node holds on its item (a directory's, or a pin), or -1.
    @inline(__always)
    private var held: Int32 {
        descriptor >= 0 ? descriptor : pinned.load(ordering: .acquiring)
    }

    /// The item's attributes: one `fstatat` by name in the parent, which must still lead to the
    /// node's backing file (ESTALE if not: the kernel then looks the name up again).
    func attributes() -> (stat, Int32) {
        let held = held
        if held >= 0 { return Backing.attributes(of: held) }
        return attributesByName()
    }

    /// The attributes of the file the name the node was last seen under leads to: ESTALE unless
    /// that is still the node's backing file.
    func attributesByName() -> (stat, Int32) {
        var place = place
        var attributes = stat()
        // A publish (or a rename through the mount) may move the node on between the look at its
        // place and the `fstatat`: its place is looked at again then, before the name counts as
        // leading elsewhere. A rewrite under way publishes often: without this a reader's open, and
        // the kernel's retry of it, both answered ESTALE.
        for _ in 0..<4 {
            guard let parent = place.parent, !isEvicted else { return (attributes, ESTALE) }
            let result = place.name.withCString { fstatat(parent.descriptor, $0, &attributes, AT_SYMLINK_NOFOLLOW) }
            let error: Int32 = result != 0 ? (errno == ENOENT ? ESTALE : errno) : isMine(attributes, at: place) ? 0 : ESTALE
            if error == 0 { return (attributes, 0) }
            let now = self.place
            if now.isSame(as: place) { return (attributes, error) }
            place = now
        }
        return (attributes, ESTALE)
    }

    /// Runs `body` with an `O_PATH` descriptor on the node's backing item: one it holds, or one
    /// opened by name in the parent (never following a symlink), checked to be the node's file and
    /// closed afterwards. Like the system calls `body` makes: -1 with errno set on failure.
    func withDescriptor<R: SignedInteger>(_ body: (Int32) -> R) -> R {
        let held = held
        if held >= 0 { return body(held) }
        return withOpenedByName { descriptor, _ in body(descriptor) }
    }

    /// `withDescriptor`, with the item's attributes: those its check read, or an `fstat` of the
    /// descriptor the node holds.
    func withItem<R: SignedInteger>(_ body: (Int32, stat) -> R) -> R {
        let held = held
        guard held < 0 else {
            var attributes = stat()
            return fstat(held, &attributes) == 0 ? body(held, attributes) : -1
        }
        return withOpenedByName(body)
    }

    private func withOpenedByName<R: SignedInteger>(_ body: (Int32, stat) -> R) -> R {
        var attributes = stat()
        let descriptor = openByName(&attributes)
        guard descriptor >= 0 else { return -1 }
        let result = body(descriptor, attributes)
        let error = errno
        close(descriptor)
        errno = error
        return result
    }

    /// `withDescriptor` with the item's `/proc/self/fd` path, for calls that take a path.
    func withProcPath<R: SignedInteger>(_ body: (UnsafePointer<CChar>) -> R) -> R {
        withDescriptor { Backing.withProcPath($0, body) }
    }

    /// The node's regular file opened to read and write, or -1 with errno set (ESTALE if the name
    /// leads elsewhere). By name where the node holds no descriptor, then checked: two calls where
    /// an `O_PATH` descriptor and its reopen through `/proc` cost four, and the path walk through
    /// `/proc` is the dearest of them. Safe by name: `O_RDWR` never blocks (a FIFO has then a
    /// reader and a writer), a socket refuses it, the mount makes no devices (`mknod`), and no flag
    /// of it changes the file.
    func openForReadingAndWriting() -> Int32 {
        let held = held
        if held >= 0 { return Backing.withProcPath(held) { Glibc.open($0, O_RDWR | O_CLOEXEC) } }
        var attributes = stat()
        return openByName(&attributes, flags: O_RDWR | O_NOCTTY)
    }

    /// Keeps the item reachable after its name goes (unlink, or a rename over it): the node then
    /// holds `descriptor`, an `O_PATH` descriptor on its item. False if it needs none (the caller
    /// closes it then).
    func pin(_ descriptor: Int32) -> Bool {
        guard self.descriptor < 0 else { return false }
        return pinned.compareExchange(expected: -1, desired: descriptor, ordering: .acquiringAndReleasing).exchanged
    }

    /// The item opened by name (an `O_PATH` descriptor unless `flags` say otherwise; never
    /// following a symlink) and checked to be the node's file (with the attributes the check read),
    /// or -1 with errno set (ESTALE if the name leads elsewhere).
    private func openByName(_ attributes: inout stat, flags: Int32 = O_PATH) -> Int32 {
        let place = place
        guard let parent = place.parent, !isEvicted else {
            errno = ESTALE
            return -1
        }
        let descriptor = place.name.withCString { Backing.openPath($0, in: parent.descriptor, flags: flags) }
        guard descriptor >= 0 else {
            // ELOOP: a symlink at the name, where the node is no symlink (O_PATH opens one).
            if errno == ENOENT || errno == ELOOP { errno = ESTALE }
            return -1
        }
        guard fstat(descriptor, &attributes) == 0, isMine(attributes, at: place) else {
            close(descriptor)
            errno = ESTALE
            return -1
        }
        return descriptor
    }
}

/// What `NodeTable.remember` did with a look-up's item.
enum Remembered {
    case node(Node)
    case overShare
    case raced

    var node: Node? {
        guard case .node(let node) = self else { return nil }
        return node
    }
}

/// Every node the kernel holds a reference to, found by backing inode; forgotten as the kernel forgets.
/// Unchecked: its state is one value behind a lock, its counters atomics.
final class NodeTable: @unchecked Sendable {
    let root: Node

    private struct State {
        var nodes: NodeIndex
        /// Files whose node a writer left to cached readers (`detach`), and until when their next
        /// nodes await the writer (the kernel may forget the first before the writer's retried open
        /// reaches it; a writer that never comes is not awaited for ever).
        var awaitingWriter: [BackingKey: UInt64] = [:]
        /// The detached nodes of each file the kernel still holds: their readers read the file
        /// itself, which a logged rewrite must then not change in place.
        var detached: [BackingKey: [Node]] = [:]
        /// Inode numbers that survive a publish: the new backing file shows the old number.
        var aliases: [BackingKey: UInt64] = [:]
        /// Numbers still shown by aliased files, which a new backing file must not show too.
        var retired: Set<UInt64> = []
        var nextAlias: UInt64 = 1 << 48
        /// The most nodes indexed since memory was last given back (see `forget`).
        var peak = 0
        /// The charge of each node that holds a directory's descriptor for a counted user's lookup,
        /// given back (by dropping it) when the kernel forgets the node.
        var charged: [ObjectIdentifier: DescriptorCharge] = [:]
        /// The last node's generation; from a random start, so that handles kept across a remount
        /// do not match the new mount's nodes at the same addresses either.
        var generation = UInt32.random(in: 1 ... .max)

        /// A generation for a new node: never the root's 0.
        mutating func nextGeneration() -> UInt32 {
            generation = generation == .max ? 1 : generation + 1
            return generation
        }

        /// Indexes `node` under `key`, for a file new to the table. A node whose file had that
        /// number has lost it (the number was reused), and must never stand for the new one.
        mutating func index(_ node: Node, as key: BackingKey) {
            if let previous = nodes.updateValue(node, forKey: key), previous !== node, previous.key == key {
                previous.evict()
            }
            peak = max(peak, nodes.count)
        }

        /// Has the nodes made for the file at `key` await a writer (`Sharing.awaitWriter`); until when.
        mutating func awaitWriter(at key: BackingKey) -> UInt64 {
            let now = DispatchTime.now().uptimeNanoseconds
            if awaitingWriter.count >= 256 { awaitingWriter = awaitingWriter.filter { $0.value > now } }
            let until = now + NodeTable.writerAwaited
            awaitingWriter[key] = until
            return until
        }

        /// Whether the table shrank so far below its peak that its memory should go back: the
        /// index is rebuilt at its new size (a dictionary never shrinks by itself).
        mutating func shrinkIfFarBelowPeak() -> Bool {
            guard peak - nodes.count >= 10_000, nodes.count * 2 < peak else { return false }
            nodes = nodes.rebuilt()
            peak = nodes.count
            return true
        }

        mutating func exposedInode(for key: BackingKey) -> UInt64 {
            if let alias = aliases[key] { return alias }
            guard retired.contains(key.inode) else { return key.inode }
            nextAlias += 1
            aliases[key] = nextAlias
            return nextAlias
        }
    }

    private let state: Locked<State>
    /// Publishes that took a replaced file out of the index (`finishRepublish`). A look-up that read
    /// a name's attributes before one may hold those of the replaced file, which the name no longer
    /// leads to: a node made for it would be stale from the start (`remember`'s `seen`).
    let replacements = Atomic<UInt64>(0)
    /// The store's directories behind containers' fixed places, kept cached once forgotten.
    let pins = DirectoryPins()
    /// The daemon's descriptors held per user: directories' nodes and open handles. Taken inside
    /// `state`'s lock, never the other way round.
    let shares = Locked(DescriptorShares(limit: DescriptorShares.currentLimit ?? Int.max))

    /// Counts one descriptor for a handle of `uid`'s; nil past its share (EMFILE).
    func chargeHandle(for uid: uid_t) -> DescriptorCharge? {
        DescriptorCharge.take(uid, from: shares)
    }

    init(root: Node) {
        self.root = root
        state = Locked(State(nodes: NodeIndex(device: root.key.device)))
        root.lookups = 1
    }

    @inline(__always)
    func node(_ inode: InodeNumber) -> Node {
        inode == rootInode ? root : Unmanaged<Node>.fromOpaque(UnsafeRawPointer(bitPattern: UInt(inode))!).takeUnretainedValue()
    }

    @inline(__always)
    func inodeNumber(of node: Node) -> InodeNumber {
        node === root ? rootInode : InodeNumber(UInt(bitPattern: Unmanaged.passUnretained(node).toOpaque()))
    }

    /// Counts one more kernel reference to the backing item with `attributes`, seen as `name` in
    /// `parent`, adding a node for it if it has none. `descriptor` is a directory's `O_PATH`
    /// descriptor (-1 for other items): a new node owns it, counted against the share of `uid`
    /// (whose request looked it up); otherwise it is closed. `overShare` (and closed) past that
    /// share; `raced` (and closed) rather than a new node when a publish replaced a file since
    /// `seen` (`replacements` before `attributes` were read): the caller reads them again.
    func remember(descriptor: Int32, attributes: stat, zone: Zone, parent: Node, name: FileName,
                  for uid: uid_t, unlessReplacedSince seen: UInt64? = nil) -> Remembered {
        let key = BackingKey(attributes)
        if key == root.key {
            if descriptor >= 0 { close(descriptor) }
            return .node(root)
        }
        var confirmed: Node?
        while true {
            let (found, counted) = state.withLock { state -> (Remembered, Bool) in
                // A node of another type has a reused inode number: its item is gone.
                if let existing = state.nodes[key], existing.fileType == attributes.st_mode & S_IFMT {
                    let placed = existing.isPlaced(in: parent, as: name.bytes)
                    guard placed || existing === confirmed || existing.holdsItem else { return (.node(existing), false) }
                    if descriptor >= 0 { close(descriptor) }
                    existing.counted(placed: placed, parent: parent, name: name, zone: zone)
                    return (.node(existing), true)
                }
                if let seen, replacements.load(ordering: .relaxed) != seen {
                    if descriptor >= 0 { close(descriptor) }
                    return (.raced, true)
                }
                var charge: DescriptorCharge?
                if descriptor >= 0 {
                    charge = DescriptorCharge.take(uid, from: shares)
                    guard charge != nil else {
                        close(descriptor)
                        return (.overShare, true)
                    }
                }
                let node = Node(descriptor: descriptor, attributes: attributes, exposedInode: state.exposedInode(for: key),
                                zone: zone, parent: parent, name: NodeName(name.bytes), generation: state.nextGeneration())
                node.lookups = 1
                if !state.awaitingWriter.isEmpty, let until = state.awaitingWriter[key] { node.sharing.awaitWriter(until: until) }
                // The kernel's references keep the node alive, whatever the index says later.
                _ = Unmanaged.passRetained(node)
                state.index(node, as: key)
                if let charge, charge !== DescriptorCharge.uncounted { state.charged[ObjectIdentifier(node)] = charge }
                return (.node(node), true)
            }
            guard case .node(let found) = found, !counted else { return found }
            // Seen elsewhere last: the same item under another name (a hard link), or a node whose
            // item is gone and whose inode number now belongs to this one (then it is dropped).
            let (current, error) = found.attributes()
            if error == 0, BackingKey(current) == key {
                confirmed = found
            } else {
                state.withLock { state in
                    if state.nodes[key] === found { state.nodes[key] = nil }
                    if found.key == key { found.evict() }
                }
            }
        }
    }

    /// `remember` for an item a node holds a descriptor on (a directory), without opening one: the
    /// node found by the item's key, with the kernel's reference counted; nil if there is none.
    func rememberHeld(attributes: stat, zone: Zone, parent: Node, name: FileName) -> Node? {
        let key = BackingKey(attributes)
        if key == root.key { return root }
        return state.withLock { state in
            guard let existing = state.nodes[key], existing.fileType == attributes.st_mode & S_IFMT, existing.holdsItem else {
                return nil
            }
            existing.counted(placed: existing.isPlaced(in: parent, as: name.bytes), parent: parent, name: name, zone: zone)
            return existing
        }
    }

    /// The extended attributes of `node`'s file changed (`Node.attributesChanged`); when the node
    /// shares its file, so did those of the name's node for it.
    func attributesChanged(of node: Node) {
        node.attributesChanged()
        guard node.sharesItsFile else { return }
        let named = state.withLock { $0.nodes[node.currentKey] }
        if let named, named !== node { named.attributesChanged() }
    }

    /// Adds a node, with one kernel reference, for an unnamed file in `parent` (`open(O_TMPFILE)`),
    /// pinned by `pin`, an `O_PATH` descriptor on it. It stays out of the index: a `link` that names
    /// the file gets a node of its own for the name, which publishes can move, and this one keeps
    /// the file its handles write.
    func rememberUnnamed(pin: Int32, attributes: stat, zone: Zone, parent: Node) -> Node {
        state.withLock { state in
            let node = Node(descriptor: -1, attributes: attributes, exposedInode: state.exposedInode(for: BackingKey(attributes)),
                            zone: zone, parent: parent, name: .empty, generation: state.nextGeneration())
            _ = node.pin(pin)
            node.markUnnamed()
            node.lookups = 1
            _ = Unmanaged.passRetained(node)
            return node
        }
    }

    func forget(_ inode: InodeNumber, count: UInt64) {
        let node = node(inode)
        guard node !== root else { return }
        let (forgotten, shrunk) = state.withLock { state -> (Bool, Bool) in
            guard node.lookups > 0 else { return (false, false) }
            node.lookups -= min(count, node.lookups)
            guard node.lookups == 0 else { return (false, false) }
            if state.nodes[node.key] === node { state.nodes[node.key] = nil }
            if node.isDetached, var left = state.detached[node.key] {
                left.removeAll { $0 === node }
                state.detached[node.key] = left.isEmpty ? nil : left
            }
            state.charged.removeValue(forKey: ObjectIdentifier(node))
            return (true, state.shrinkIfFarBelowPeak())
        }
        if forgotten, node.isDirectory, node.zone.isFixedPlace { pins.keep(node.descriptor, of: node.key) }
        if forgotten { release(node) }
        // malloc keeps what was freed for later use; after the kernel forgot thousands of files, the
        // daemon gives it back to the system.
        if shrunk { DispatchQueue.global(qos: .utility).asyncInBackground { _ = clinux_malloc_trim(0) } }
    }

    /// Drops the kernel's reference to a forgotten node. Closing the last descriptor on an unlinked
    /// item frees its inode and blocks, the dearest step of an unlink when they are many: such a
    /// node goes to `closers`, so that no thread serving requests waits for that (the unlink was
    /// answered before the kernel forgot the node). Past `closesQueuedAtMost` waiting, it is done
    /// here. Any other close is done here too: waking a closer costs more than it.
    private func release(_ node: Node) {
        let reference = Unmanaged.passUnretained(node)
        if node.closeMayFreeBlocks {
            let queued = closesQueued.add(1, ordering: .relaxed).newValue
            if queued <= closesQueuedAtMost {
                closers[queued % closers.count].async {
                    reference.release()
                    self.closesQueued.subtract(1, ordering: .relaxed)
                }
                return
            }
            closesQueued.subtract(1, ordering: .relaxed)
        }
        reference.release()
    }

    /// Freeing blocks waits for the device when the filesystem discards them: four queues keep
    /// four such waits going at once (one fell behind a client's unlinks, eight cost more CPU).
    private let closers = (0..<4).map { DispatchQueue(label: "containerfs.nodes.closer\($0)") }
    private let closesQueued = Atomic<Int>(0)
    /// An eighth of the descriptors the daemon may hold, the rest being for directories and open files.
    private let closesQueuedAtMost: Int = {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 0 }
        return Int(min(limit.rlim_cur / 8, 4096))
    }()

    /// Leaves `node` to the handles reading it through the page cache, when a writer comes: the
    /// node keeps their version, and the next lookup of the name makes a node for the writer. The
    /// kernel's inode is the readers' alone then, so the writer can move its size and cache no more.
    func detach(_ node: Node) {
        let newly = node.markDetached()
        state.withLock { state in
            if newly { state.detached[node.key, default: []].append(node) }
            if state.nodes[node.key] === node { state.nodes[node.key] = nil }
            _ = state.awaitWriter(at: node.key)
        }
    }

    /// Makes the nodes made for the file at `key` until a writer comes take no cached readers, and
    /// `node` too if given (the caller holds its session lock): a writer's open, retried by the
    /// kernel, is on its way.
    func awaitWriter(at key: BackingKey, on node: Node? = nil) {
        let until = state.withLock { $0.awaitWriter(at: key) }
        node?.sharing.awaitWriter(until: until)
    }

    /// How long the nodes made after a `detach` wait for the writer: its retried open may first
    /// wait for presenters, as any coordinated write does.
    static let writerAwaited: UInt64 = 30_000_000_000

    /// The writer `detach` made way for has come: the file's later nodes take cached readers again.
    func writerArrived(at key: BackingKey) {
        state.withLock { _ = $0.awaitingWriter.removeValue(forKey: key) }
    }

    /// Whether a node serves the file at `key`, or keeps an inode number for it, or the kernel still
    /// holds a node of it left to its readers.
    func serves(_ key: BackingKey) -> Bool {
        state.withLock { $0.nodes[key] != nil || $0.aliases[key] != nil || $0.detached[key] != nil }
    }

    /// Whether someone other than `node`'s writers has its file open: a handle on the node, or on a
    /// detached node of the file (`detach`). A detached node without handles has no reader left: a
    /// mapping holds its handle, and no lookup leads to the node any more. The caller holds the
    /// node's session lock.
    func othersHaveOpen(_ node: Node) -> Bool {
        if node.sharing.hasOpenHandles { return true }
        return state.withLock { $0.detached[node.key]?.contains { $0.openHandles.load(ordering: .relaxed) > 0 } ?? false }
    }

    func existing(_ key: BackingKey) -> Node? {
        state.withLock { $0.nodes[key] }
    }

    /// The node last seen as `name` in `parent`, if its backing item is the one with `key`.
    func existing(_ key: BackingKey, at parent: Node, name: UnsafePointer<CChar>) -> Node? {
        let bytes = UnsafeRawBufferPointer(start: name, count: strlen(name))
        return state.withLock { state in
            guard let node = state.nodes[key], node.isPlaced(in: parent, as: bytes) else { return nil }
            return node
        }
    }

    /// The inode number a listing shows for a backing inode.
    func exposedInode(device: UInt64, inode: UInt64) -> UInt64 {
        state.withLock { $0.exposedInode(for: BackingKey(device: device, inode: inode)) }
    }

    /// Records that `node` is about to be backed by the file with `key` (a publish renames
    /// it in). Done before the rename, so that a lookup racing with it finds this node, by either
    /// file until `finishRepublish`. Returns the previous key, for that or `abandonRepublish`.
    func republish(_ node: Node, as key: BackingKey) -> BackingKey {
        state.withLock { state in
            let previous = node.key
            state.aliases[previous] = nil
            node.beginReplacing(with: key)
            state.index(node, as: key)
            if key.inode != node.exposedInode {
                state.aliases[key] = node.exposedInode
                state.retired.insert(node.exposedInode)
            } else {
                // The filesystem gave the new file the item's own number back: no alias needed.
                state.retired.remove(node.exposedInode)
            }
            return previous
        }
    }

    /// The publish's rename is done: the previous file is gone.
    func finishRepublish(_ node: Node, previous: BackingKey) {
        state.withLock { state in
            if state.nodes[previous] === node { state.nodes[previous] = nil }
            replacements.add(1, ordering: .relaxed)
            node.endReplacing(renamed: true)
        }
    }

    /// Undoes `republish` when the rename did not happen.
    func abandonRepublish(_ node: Node, previous: BackingKey) {
        state.withLock { state in
            if state.nodes[node.key] === node { state.nodes[node.key] = nil }
            state.aliases[node.key] = nil
            node.endReplacing(renamed: false)
            if state.nodes[previous] == nil { state.nodes[previous] = node }
        }
    }

    /// Records a rename of `oldName` in `oldParent`, and returns the nodes whose zone changed. When
    /// the zone of a directory changes (moved out of the Inbox), the zones of the nodes below it change too.
    func didMove(_ key: BackingKey, from oldParent: Node, oldName: ArraySlice<UInt8>, to parent: Node, name: FileName,
                 zone: Zone) -> [Node] {
        state.withLock { state in
            // A node seen elsewhere last keeps its place: a hard link's other name, or an item gone.
            guard let moved = state.nodes[key],
                  moved.holdsItem || moved.parent === oldParent && moved.name.elementsEqual(oldName) else { return [] }
            let oldZone = moved.zone
            moved.setPlace(parent: parent, name: NodeName(name.bytes))
            moved.zone = zone
            moved.inPlaceAnswer.store(0, ordering: .relaxed)
            guard oldZone != zone else { return [] }
            // Renames move items only between zones whose items' children share the zone (data, tmp items).
            guard moved.isDirectory, zone.isInheritedByChildren else { return [moved] }
            let below = state.nodes.all.filter { $0.isWithin(moved) }
            for node in below { node.zone = zone }
            return below
        }
    }

    /// Runs `body` with the names from the top of `node`'s zone down to `node`, and the name of
    /// the container it is in (nil when the root is the container), as last seen.
    func withPlace<R>(of node: Node, _ body: ([[UInt8]], [UInt8]?) -> R) -> R {
        state.withLock { _ in
            var names: [[UInt8]] = []
            var current = node
            while current.zone == node.zone, let parent = current.parent {
                names.append(current.name.bytes)
                current = parent
            }
            let container = current.zone == .containerRoot && current !== root ? current.name.bytes : nil
            return body(names.reversed(), container)
        }
    }

    /// In a mount of the whole store, the name of the container that holds `node`: its ancestor's
    /// just below the root. Nil for the root.
    func containerName(of node: Node) -> [UInt8]? {
        state.withLock { _ in
            var current = node
            while let parent = current.parent {
                if parent === root { return current.name.bytes }
                current = parent
            }
            return nil
        }
    }

    /// The parent and name `node` was last seen under (nil for the root).
    func place(of node: Node) -> (parent: Node, name: NodeName)? { node.lastSeen }

    /// The item's path from the mount root, as coordination and presenters name it.
    func itemPath(of node: Node) -> ItemPath { itemPath(of: node, then: nil) }

    func itemPath<Name: Sequence<UInt8>>(of parent: Node, appending name: Name) -> ItemPath {
        itemPath(of: parent, then: PathComponent(bytes: Array(name)))
    }

    /// The path of `node`, then `last`: one array, filled from the end (every operation makes one).
    private func itemPath(of node: Node, then last: PathComponent?) -> ItemPath {
        state.withLock { _ in
            var components: [PathComponent] = []
            components.reserveCapacity(12)
            if let last { components.append(last) }
            var current = node
            while let parent = current.parent {
                if let component = PathComponent(bytes: current.name.bytes) { components.append(component) }
                current = parent
            }
            components.reverse()
            return ItemPath(components: components)
        }
    }

    /// Every node in the index now.
    func all() -> [Node] { state.withLock { $0.nodes.all } }
}
