import CFuse
import CLinux
import Containers
import Coordination
import Dispatch
import FUSELowLevel
import Glibc

// Open files. A file open for writing writes to a shadow through its node's write session, unless it
// writes in place; every close publishes what was written, so the next open sees all of it.
extension ContainerFileSystem {
    /// Whether open flags ask to change the file.
    @inline(__always)
    private func opensForWriting(_ flags: Int32) -> Bool {
        flags & O_ACCMODE != O_RDONLY || flags & O_TRUNC != 0
    }

    public func open(_ request: FuseRequest, inode: InodeNumber, file: FileInfo) {
        let node = nodes.node(inode)
        let flags = file.flags
        let writing = opensForWriting(flags)
        if writing {
            let denied = Policy.write(node.zone)
            guard denied == 0 else { return request.reply(error: denied) }
        }
        guard sealAllowsReading(node) else { return request.reply(error: EIO) }
        // Replaced or removed in the store behind the daemon's back: ESTALE makes the kernel look
        // the name up again and retry.
        let named = attributesIfMayBeStale(node)
        guard (named?.1 ?? 0) == 0 else {
            if writing, let named { makeWay(at: named.0, forWriterWith: flags) }
            return request.reply(error: ESTALE)
        }
        guard let charge = nodes.chargeHandle(for: request.caller.uid) else { return request.reply(error: EMFILE) }
        endFreshSession(of: node)
        let info = FileInfoCopy(file)
        // A writer that does not truncate shares the file live, and so does every open while it does.
        let live = writing && Sharing.opensLive(flags)
        let seen = node.holdsItem ? nil : named?.0
        // A reader's kind is asked only if it does not pass through (`HandleOpening`).
        let writer = writing ? writerOpening(of: node, flags: flags, seen: seen) : nil
        let inPlace = writer != nil
        // A node left to cached readers, or that has some: the same, for a node of the writer's own,
        // before presenters are asked to make way (joinSession checks again). One written in place
        // shares the kernel's cache with its readers, but not their passthrough (see Node.openHandle).
        let wasDetached = node.isDetached
        if writing, node.withSession({ yieldsToCachedReaders(node, session: $0, inPlace: writer) }) {
            if wasDetached, let named { makeWay(at: named.0, forWriterWith: flags) }
            return request.reply(error: ESTALE)
        }
        if writing && !inPlace {
            return coordination.perform(.write(nodes.itemPath(of: node)), isDirectory: false, caller: request.caller) { access in
                var error = flags & O_TRUNC != 0 ? self.clearSetIDAfterTruncation(of: node, by: request.caller) : 0
                if error == 0 {
                    error = self.joinSession(of: node, truncating: flags & O_TRUNC != 0, by: request.caller.pid, access: access)
                }
                guard error == 0 else {
                    access.end(tookEffect: false)
                    return request.reply(error: error)
                }
                info.reply(request, with: self.sessionHandle(for: node, flags: flags, charge: charge), cache: .bypass)
            }
        }
        coordination.perform(writing ? .write(nodes.itemPath(of: node)) : .read(nodes.itemPath(of: node), options: []),
                             isDirectory: node.isDirectory, caller: request.caller) { access in
            // The O_PATH descriptor names a non-symlink here: the kernel resolved links before opening.
            // O_DIRECT stays with the kernel, which reads and writes such a handle without its page
            // cache: the daemon's own buffers are not aligned as O_DIRECT requires, and a descriptor
            // registered for passthrough serves later opens too.
            let openFlags = (flags & ~(O_NOFOLLOW | O_CREAT | O_EXCL | O_DIRECT)) | O_CLOEXEC
            let openFile = { (readWrite: Bool) in readWrite ? node.openForReadingAndWriting() : node.withProcPath { Glibc.open($0, openFlags) } }
            guard node.isRegularFile else {
                let descriptor = openFile(false)
                guard descriptor >= 0 else { return self.fail(request, errno, access: access) }
                return info.reply(request, with: OpenFile(descriptor: descriptor, node: node, access: access, charge: charge), cache: .refill)
            }
            if flags & O_TRUNC != 0 {
                let error = self.clearSetIDAfterTruncation(of: node, by: request.caller)
                guard error == 0 else { return self.fail(request, error, access: access) }
            }
            // A change in place goes to the file once its last publish's record is gone; a read
            // once the last logged change is applied (`Shadows.publishLater`).
            let error = writing ? self.shadows.unsynced.waitForData(of: node.currentKey)
                : self.shadows.unsynced.waitForRetirement(of: node.currentKey)
            guard error == 0 else { return self.fail(request, error, access: access) }
            // Each reader of an atomically replaced file keeps the version it opened (see Node.openHandle);
            // the state of a live file is the node's, which the session lock held there guards.
            let opening: HandleOpening = writing ? .writer(live ? .liveWriter : .inPlaceWriter)
                : .reader(inPlace: { self.writesInPlace(node, seen: seen, unlessLive: true) })
            guard let (descriptor, path) = node.openHandle(opening, passthrough: self.passthrough,
                                                           writable: Policy.write(node.zone) == 0,
                                                           mapsShared: flags & O_ACCMODE == O_RDWR, in: self.nodes,
                                                           openFile) else { return self.fail(request, ESTALE, access: access) }
            guard descriptor >= 0 else { return self.fail(request, errno, access: access) }
            self.reply(request, info: info, with: OpenFile(descriptor: descriptor, node: node, path: path, access: access, charge: charge),
                       writing: writing)
        }
    }

    /// Answers an open with the handle of a regular file that `Node.openHandle` opened.
    private func reply(_ request: FuseRequest, info: FileInfoCopy, with handle: OpenFile, writing: Bool) {
        switch handle.path {
        case .pageCache?, .shared?, .live?, nil: info.reply(request, with: handle, cache: cacheUse(of: handle.node, descriptor: handle.descriptor))
        case .direct?: info.reply(request, with: handle, cache: .bypass)
        case .passthrough(let backingID)?, .passthroughLive(let backingID)?:
            if writing { handle.passesWritesThrough() }
            info.reply(request, with: handle, passthrough: backingID)
            // Attributes the kernel kept from before this live writer would hide what its
            // mappings change: from now on they are asked afresh (`attributeTimeout`).
            if case .passthroughLive? = handle.path {
                kernel?.invalidateInode(nodes.inodeNumber(of: handle.node), offset: -1, length: 0)
            }
        }
    }

    /// How a writer's open reaches the node's file in place (a live writer, or one in place), or nil
    /// when it writes a shadow that its close publishes. `seen`: the attributes its name showed.
    private func writerOpening(of node: Node, flags: Int32, seen: stat?) -> Sharing.Opening? {
        if Sharing.opensLive(flags) { return .liveWriter }
        return writesInPlace(node, seen: seen) || isLocked(node) ? .inPlaceWriter : nil
    }

    /// A writer's open found the kernel's node stale (left to its readers, or its name now another
    /// file's, `attributes`: a lookup answered just before a publish renamed its file away gives the
    /// kernel such a node). It answers ESTALE, and the kernel looks the name up again and retries
    /// once: the name's node makes way for the retry here, as the retry would have it do, since a
    /// second ESTALE reaches the program (docs/atomic-replace.md, "What readers see").
    private func makeWay(at attributes: stat, forWriterWith flags: Int32) {
        let key = BackingKey(attributes)
        guard let current = nodes.existing(key), !current.isDetached else {
            // The retry's lookup makes the node: it awaits the writer from the start.
            return nodes.awaitWriter(at: key)
        }
        let writer = writerOpening(of: current, flags: flags, seen: attributes)
        current.withSession { session in
            // A node left to its readers awaits it already. One whose session ends (its last
            // writer's release on its way) may take readers meanwhile: it awaits the writer too.
            guard !yieldsToCachedReaders(current, session: session, inPlace: writer) else { return }
            nodes.awaitWriter(at: key, on: current)
        }
    }

    /// Whether someone holds a lock on the node's file that a rewrite through a shadow would take
    /// from them: the rewrite then goes to the file itself, as on a disk. Asked only when such a
    /// writer would leave the node to its readers, since reading /proc/locks may wait milliseconds
    /// (docs/atomic-replace.md, "Files under locks").
    private func isLocked(_ node: Node) -> Bool {
        guard node.openHandles.load(ordering: .relaxed) > 0, let heldLocks, !node.isDetached,
              node.withSession({ node.sharing.shadowWriterLeaves(sessionRunning: $0 != nil) }) else { return false }
        return heldLocks.held(on: node.exposedInode)
    }

    /// Answers an open that failed with `error`, ending its coordinated access.
    private func fail(_ request: FuseRequest, _ error: Int32, access: CoordinatedAccess) {
        access.end(tookEffect: false)
        request.reply(error: error)
    }

    /// What an open needs to know whether the node lost its file behind the daemon's back: the
    /// attributes by name (ESTALE when the name it was last seen under leads to no file, or to
    /// another), or nil. A node that lost its name through the mount (an unlink, a rename over it)
    /// holds its file, and an open racing that opens it, as on a local disk. A detached node holds
    /// its file too, but opens by name get it only while the name leads there.
    private func attributesIfMayBeStale(_ node: Node) -> (stat, Int32)? {
        guard node.isRegularFile, !node.holdsItem || node.isDetached else { return nil }
        return node.attributesByName()
    }

    /// Whether a writer (a session starting on `node`, none running) must leave the node to the
    /// readers holding its pages: it then detaches the node, and the writer's ESTALE makes the
    /// kernel look the name up again, for a node of the writer's own.
    func yieldsToCachedReaders(_ node: Node, session: WriteSession?, inPlace opening: Sharing.Opening? = nil) -> Bool {
        if node.isDetached { return true }
        let yields = opening.map { node.sharing.admit($0, passesThrough: passthrough != nil) == .detach }
            ?? node.sharing.shadowWriterLeaves(sessionRunning: session != nil)
        guard session == nil, yields else { return false }
        nodes.detach(node)
        return true
    }

    /// Adds a write handle to the node's write session, starting one (with its shadow) if none runs.
    /// A new session keeps `access` until its first publish; a running one holds its own already.
    private func joinSession(of node: Node, truncating: Bool, by opener: pid_t, access: CoordinatedAccess?) -> Int32 {
        node.withSession { current in
            if yieldsToCachedReaders(node, session: current) { return ESTALE }
            if node.sharing.writerJoined() { nodes.writerArrived(at: node.key) }
            let session = current ?? WriteSession()
            if truncating {
                shadows.discard(session)
                // A new version begins: the close of the process that wrote the last one (its
                // release still on its way) must not publish the truncation before anything of
                // this one is written (a shell's `echo b > f` right after `echo a > f`).
                session.lastWriter = nil
                session.truncater = 0
            }
            // A truncating writer's shadow is a new, empty file; a large file's writers share a log
            // (each only writes through it), a writer joining a closed one not yet released too:
            // a copy of the whole file cost seconds and its size in space (docs/atomic-replace.md).
            let error = shadows.prepare(session, of: node, truncated: truncating, mayLog: true)
            if error == 0, truncating { session.dirty = true }
            guard error == 0 else {
                if current == nil { shadows.discard(session) }
                return error
            }
            if current == nil {
                session.access = access
                current = session
            } else {
                access?.end(tookEffect: false)
            }
            session.writers += 1
            session.writerProcesses.add(opener)
            return 0
        }
    }

    /// A handle writing through its node's session. Writers bypass the page cache: their writes go
    /// to the shadow, never to pages of the published version.
    private func sessionHandle(for node: Node, flags: Int32, charge: DescriptorCharge) -> OpenFile {
        OpenFile(descriptor: -1, node: node, writesThroughSession: true, appends: flags & O_APPEND != 0, access: nil,
                 charge: charge)
    }

    public func create(_ request: FuseRequest, parent: InodeNumber, name: FileName, mode: mode_t, file: FileInfo) {
        let parentNode = nodes.node(parent)
        var denied = nameError(name)
        if denied == 0 { denied = Policy.create(in: parentNode.zone) }
        guard denied == 0 else { return request.reply(error: denied) }
        let owned = OwnedName(name)
        let caller = request.caller
        guard let charge = nodes.chargeHandle(for: caller.uid) else { return request.reply(error: EMFILE) }
        let flags = (file.flags | O_CREAT | O_NOFOLLOW | O_CLOEXEC) & ~(O_PATH | O_DIRECT)
        let info = FileInfoCopy(file)
        coordination.perform(.create(nodes.itemPath(of: parentNode, appending: owned.bytes)), isDirectory: false,
                             caller: caller) { access in
            owned.withPointer { pointer in
                let name = FileName(pointer)
                // Made here, the file can be read and written through one descriptor (see startFreshSession).
                // A file that will be written through atomic replace is made from a spare (its inode made ahead).
                var spareName: [CChar] = []
                var descriptor: Int32 = -1
                var taken = false
                let live = Sharing.opensLive(flags)
                if !live, self.startsFresh(in: parentNode, name: name) {
                    descriptor = self.shadows.createFromSpare(pointer, in: parentNode.descriptor, mode: mode, spareName: &spareName)
                    taken = descriptor < 0 && errno == EEXIST
                }
                if descriptor < 0, !taken {
                    descriptor = openat(parentNode.descriptor, pointer, (flags & ~O_ACCMODE) | O_RDWR | O_EXCL, mode)
                }
                let made = descriptor >= 0
                var error: Int32 = made ? 0 : errno
                if !made, error == EEXIST, flags & O_EXCL == 0 {
                    // Made by someone else first: an open of a published file, which O_TRUNC must not
                    // empty in place. The kernel checks no permission for what it asked to create.
                    descriptor = openat(parentNode.descriptor, pointer, flags & ~O_TRUNC, mode)
                    error = descriptor < 0 ? errno : Permissions.check(opening: flags, descriptor, by: caller)
                } else if made {
                    error = self.adoptOwnership(of: descriptor, in: parentNode, by: caller)
                    if error == 0, spareName.isEmpty { error = Backing.restorePermissions(descriptor, requested: mode) }
                    if error != 0, unlinkat(parentNode.descriptor, pointer, 0) != 0 { error = errno }
                }
                guard error == 0 else {
                    if descriptor >= 0 { close(descriptor) }
                    self.shadows.dropSpareLink(spareName)
                    access.end(tookEffect: false)
                    return request.reply(error: error)
                }
                // The entry is the item just opened and checked, whatever holds the name now.
                let opened = Backing.attributes(of: descriptor)
                let key = BackingKey(opened.0)
                // A spare's name in the shadow directory is a link nobody made: the entry counts it
                // out, as every later `stat` does (the kernel keeps the entry's count of links).
                if !spareName.isEmpty, opened.1 == 0 { self.shadows.unsynced.linked(key) }
                var entry = fuse_entry_param()
                error = opened.1 != 0 ? opened.1 : self.enter(parent: parentNode, name: name, attributes: opened.0, entry: &entry,
                                                                     for: caller.uid)
                guard error == 0 else {
                    close(descriptor)
                    self.shadows.dropSpareLink(spareName, of: opened.1 == 0 ? key : nil)
                    access.end(tookEffect: false)
                    return request.reply(error: error)
                }
                let node = self.nodes.node(entry.ino)
                // A file just made carries no capability (nor does a spare: `Shadows.recycle`).
                if made { node.noteNoCapability(asOf: node.capabilityStamp) }
                let truncating = !made && flags & O_TRUNC != 0
                if truncating {
                    error = self.clearSetIDAfterTruncation(of: node, by: caller)
                    guard error == 0 else {
                        close(descriptor)
                        access.end(tookEffect: false)
                        self.forget(entry.ino, count: 1)
                        return request.reply(error: error)
                    }
                }
                // (A spare's second link would make it look hard-linked; startsFresh asked already.)
                if spareName.isEmpty, live || self.writesInPlace(node) {
                    let waited = made ? 0 : self.shadows.unsynced.waitForData(of: key)
                    guard waited == 0 else {
                        close(descriptor)
                        access.end(tookEffect: false)
                        self.forget(entry.ino, count: 1)
                        return request.reply(error: waited)
                    }
                    guard let (writtenNode, path) = self.countWriterInPlace(descriptor, live: live, flags: flags, on: node,
                                                                            entry: &entry, in: parentNode, name: name) else {
                        close(descriptor)
                        access.end(tookEffect: false)
                        return request.reply(error: ESTALE)
                    }
                    let handle = OpenFile(descriptor: descriptor, node: writtenNode, path: path, access: access, charge: charge)
                    if truncating, ftruncate(descriptor, 0) != 0 {
                        let error = errno
                        writtenNode.closeHandle(path, passthrough: self.passthrough)
                        access.end(tookEffect: false)
                        self.forget(entry.ino, count: 1)
                        return request.reply(error: error)
                    }
                    // As an open's writer in place: through passthrough when it may (see open).
                    switch path {
                    case .passthrough(let backingID), .passthroughLive(let backingID):
                        handle.passesWritesThrough()
                        if case .passthroughLive = path { entry.attr_timeout = 0 }
                        return info.replyCreated(request, entry: &entry, with: handle, passthrough: backingID)
                    default:
                        return info.replyCreated(request, entry: &entry, with: handle, cache: .refill)
                    }
                }
                // The new, empty file is a complete first version; what is written next is published at
                // close, and only then do presenters hear that the file appeared.
                var sessionError: Int32 = 0
                var writtenNode = node
                if !(made && self.startFreshSession(of: node, file: descriptor, key: key, spareName: spareName, by: caller.pid,
                                                    announcing: access)) {
                    close(descriptor)
                    self.shadows.dropSpareLink(spareName, of: key)
                    access.end(tookEffect: true)
                    sessionError = self.joinSession(of: node, truncating: truncating, by: caller.pid, access: nil)
                    if sessionError == ESTALE, node.isDetached {
                        // Left to its cached readers: the name gets a node for this writer.
                        self.forget(entry.ino, count: 1)
                        sessionError = self.lookupEntry(parent: parentNode, name: name, entry: &entry, expected: key,
                                                        for: caller.uid)
                        guard sessionError == 0 else { return request.reply(error: sessionError) }
                        writtenNode = self.nodes.node(entry.ino)
                        sessionError = self.joinSession(of: writtenNode, truncating: truncating, by: caller.pid, access: nil)
                    }
                }
                guard sessionError == 0 else {
                    self.forget(entry.ino, count: 1)
                    return request.reply(error: sessionError)
                }
                info.replyCreated(request, entry: &entry, with: self.sessionHandle(for: writtenNode, flags: flags, charge: charge),
                                  cache: .bypass)
            }
        }
    }

    /// An unnamed file (`open(O_TMPFILE)`), made in the parent's backing directory and written in
    /// place: nobody else reaches it until a `link` names it, which publishes it whole, as a
    /// creation (docs/atomic-replace.md, "Unnamed files").
    public func tmpfile(_ request: FuseRequest, parent: InodeNumber, mode: mode_t, file: FileInfo) {
        let parentNode = nodes.node(parent)
        let denied = Policy.create(in: parentNode.zone)
        guard denied == 0 else { return request.reply(error: denied) }
        let caller = request.caller
        guard let charge = nodes.chargeHandle(for: caller.uid) else { return request.reply(error: EMFILE) }
        let flags = file.flags
        // O_EXCL stays: it keeps the file from ever being linked.
        let descriptor = openat(parentNode.descriptor, ".", (flags & ~(O_CREAT | O_TRUNC | O_NOFOLLOW | O_DIRECT)) | O_TMPFILE | O_CLOEXEC, mode)
        guard descriptor >= 0 else { return request.reply(error: errno) }
        var error = adoptOwnership(of: descriptor, in: parentNode, by: caller)
        if error == 0 { error = Backing.restorePermissions(descriptor, requested: mode) }
        var (attributes, statError) = Backing.attributes(of: descriptor)
        if error == 0 { error = statError }
        let pin = error == 0 ? Backing.withProcPath(descriptor) { Glibc.open($0, O_PATH | O_CLOEXEC) } : -1
        if error == 0, pin < 0 { error = errno }
        guard error == 0 else {
            close(descriptor)
            return request.reply(error: error)
        }
        let node = nodes.rememberUnnamed(pin: pin, attributes: attributes,
                                         zone: parentNode.zone.child(named: "/"), parent: parentNode)
        let opening: Sharing.Opening = Sharing.opensLive(flags) ? .liveWriter : .inPlaceWriter
        // A node nobody else knows has no readers to leave it to.
        let path: OpenPath = node.openHandle(.writer(opening), passthrough: nil, in: nodes) { _ in descriptor }?.path ?? .shared
        visible(&attributes, of: node)
        var entry = fuse_entry_param()
        identify(node, in: &entry)
        entry.attr = attributes
        entry.attr_timeout = timeouts.attributes
        entry.entry_timeout = timeouts.entries
        FileInfoCopy(file).replyCreated(request, entry: &entry, with: OpenFile(descriptor: descriptor, node: node, path: path,
                                                                              access: nil, charge: charge), cache: .refill)
    }

    /// Counts `descriptor`, open on the file `entry` names, as a writer in place of its node. A
    /// node that passthrough readers hold is left to them, and `entry` then names a node of the
    /// writer's own, as an open's ESTALE would make the kernel find. Nil if none could be had (the
    /// kernel's reference `entry` counted is forgotten then).
    private func countWriterInPlace(_ descriptor: Int32, live: Bool, flags: Int32, on node: Node, entry: inout fuse_entry_param,
                                    in parent: Node, name: FileName) -> (Node, OpenPath)? {
        var node = node
        for attempt in 0..<2 {
            if let (_, path) = node.openHandle(.writer(live ? .liveWriter : .inPlaceWriter), passthrough: passthrough,
                                               writable: Policy.write(node.zone) == 0, mapsShared: flags & O_ACCMODE == O_RDWR,
                                               in: nodes, { _ in descriptor }) {
                return (node, path)
            }
            forget(entry.ino, count: 1)
            // A regular file: no descriptor for it, so nobody's share to count against.
            guard attempt == 0, lookupEntry(parent: parent, name: name, entry: &entry, for: 0) == 0 else { break }
            node = nodes.node(entry.ino)
        }
        return nil
    }

    /// Whether a file made as `name` in `parent` is written through atomic replace, as a new file
    /// is unless its zone or an opted-in directory above writes in place.
    private func startsFresh(in parent: Node, name: FileName) -> Bool {
        !parent.zone.child(named: name.bytes).writesInPlaceByDefault
            && !optsIntoInPlace(parent, generation: inPlaceGeneration.load(ordering: .acquiring))
    }

    /// Starts the write session of a file that `create` made, writing it in place until its first
    /// publish or until someone else opens it (`endFreshSession`). False if a session runs already.
    private func startFreshSession(of node: Node, file: Int32, key: BackingKey, spareName: [CChar], by creator: pid_t,
                                   announcing creation: CoordinatedAccess) -> Bool {
        node.withSession { current in
            guard current == nil else { return false }
            let session = WriteSession()
            guard shadows.adoptFresh(session, file: file, key: key, spareName: spareName) == 0 else { return false }
            session.access = creation
            session.announcesCreation = true
            session.writers = 1
            session.writerProcesses.add(creator)
            current = session
            return true
        }
    }

    /// Ends the in-place writing of a new file that someone else opens: they see its published
    /// version, its size included (the kernel heard the writer's).
    func endFreshSession(of node: Node) {
        guard node.isRegularFile, !node.zone.writesInPlaceByDefault else { return }
        if node.withSession({ session in session.map { shadows.endFresh($0, of: node, in: nodes) } ?? false }) {
            kernel?.invalidateInode(nodes.inodeNumber(of: node), offset: -1, length: 0)
        }
    }

    /// Where a handle's writes go now.
    private enum WriteTarget {
        /// Its own descriptor.
        case descriptor(Int32)
        /// Its session's shadow.
        case shadow(WriteSession)
        /// Its session's log (`Shadows.logWrite`).
        case log(WriteSession)
    }

    /// Runs `body` with the descriptor a handle reads and writes now: its own, or its session's shadow
    /// (made again after a publish). The session stays locked meanwhile, so no publish closes it.
    /// With a `writer`, `body` changes the file.
    private func withDescriptor(of handle: OpenFile, writer: (owner: UInt64, thread: pid_t)? = nil,
                                _ body: (Int32) -> Void) -> Int32 {
        withTarget(of: handle, writer: writer, logging: false) { target in
            switch target {
            case .descriptor(let descriptor): body(descriptor)
            case .shadow(let session): writer == nil ? body(session.shadow) : session.changeShadow(body)
            case .log: break
            }
        }
    }

    /// As `withDescriptor`; with `logging` (a write), a session may keep (or start, for a writer
    /// alone) a log instead of a shadow. Reads, seeks and fallocate need the file's data: a logged
    /// rewrite becomes an ordinary one for them.
    /// `writer`: the lock owner and thread of a change.
    private func withTarget(of handle: OpenFile, writer: (owner: UInt64, thread: pid_t)?, logging: Bool,
                            _ body: (WriteTarget) -> Void) -> Int32 {
        guard handle.writesThroughSession else {
            body(.descriptor(handle.descriptor))
            return 0
        }
        return handle.node.withSession { current in
            guard let session = current else { return EBADF }
            if session.log != nil, !logging {
                let error = shadows.convertLog(session, of: handle.node)
                if error != 0 { return error }
            }
            if session.shadow < 0 {
                let error = shadows.prepare(session, of: handle.node, truncated: false, mayLog: logging)
                if error != 0 { return error }
            }
            if let writer {
                session.dirty = true
                session.lastWriter = writer
                session.writerProcesses.add(writer.thread)
            }
            body(session.log != nil ? .log(session) : .shadow(session))
            return 0
        }
    }

    public func read(_ request: FuseRequest, inode: InodeNumber, size: Int, offset: off_t, file: FileInfo) {
        let error = withDescriptor(of: Handle.get(file, as: OpenFile.self)) {
            request.reply(dataFrom: $0, size: size, offset: offset)
        }
        if error != 0 { request.reply(error: error) }
    }

    public func write(_ request: FuseRequest, inode: InodeNumber, data: UnsafeMutablePointer<fuse_bufvec>,
                      offset: off_t, file: FileInfo) {
        let handle = Handle.get(file, as: OpenFile.self)
        handle.wrote = true
        var written = 0
        var cleared = false
        let error = withTarget(of: handle, writer: (file.lockOwner, request.caller.pid), logging: !handle.appends) { target in
            // Every write, as the kernel would: the bits may have been set since the last one.
            if request.caller.uid != 0 {
                let outcome: (error: Int32, cleared: Bool)
                switch target {
                case .descriptor(let descriptor): outcome = Backing.clearSetID(descriptor, changedBy: request.caller)
                case .shadow(let session): outcome = Backing.clearSetID(session.shadow, changedBy: request.caller)
                case .log(let session): outcome = session.log.map { Backing.clearSetID($0.original, changedBy: request.caller) } ?? (0, false)
                }
                guard outcome.error == 0 else { return written = -Int(outcome.error) }
                cleared = outcome.cleared
            }
            switch target {
            case .log(let session):
                written = shadows.logWrite(session, data, at: offset)
            case .descriptor(let descriptor):
                // An appending writer's offset is the kernel's size, which a reader of the previous version
                // seeking to its end sets back to its own (see attributes(seenThrough:)): appends go to
                // the shadow's end.
                written = cfuse_write_buf_to_fd(data, descriptor, handle.appends ? Glibc.lseek(descriptor, 0, SEEK_END) : offset)
            case .shadow(let session):
                written = session.write(data, at: handle.appends ? Glibc.lseek(session.shadow, 0, SEEK_END) : offset)
            }
        }
        if error != 0 { return request.reply(error: error) }
        guard written >= 0 else {
            failSession(of: handle, with: Int32(-written))
            if written == -Int(ENOSPC) { shadows.versions?.spaceRanOut() }
            return request.reply(error: Int32(-written))
        }
        request.reply(written: written)
        if cleared { kernel?.invalidateInode(inode, offset: -1, length: 0) }
    }

    /// A write that failed (a full disk) spoils the session's shadow: none of it is published.
    private func failSession(of handle: OpenFile, with error: Int32) {
        guard handle.writesThroughSession else { return }
        handle.node.withSession { if let session = $0 { shadows.fail(session, with: error) } }
    }

    /// Every close publishes (flush is synchronous with close(2), release is not), so that a program
    /// that wrote a file and closed it sees its writes when it opens the file again.
    public func flush(_ request: FuseRequest, inode: InodeNumber, file: FileInfo) {
        let handle = Handle.get(file, as: OpenFile.self)
        guard handle.writesThroughSession else { return request.replySuccess() }
        // Only the closes of the process that wrote publish. A shell's redirection closes its first
        // descriptor before anything is written; the truncation of an `O_TRUNC` open alone is
        // published at release, one by `ftruncate` at its thread's close. A close after an fsync
        // that published everything has nothing to decide.
        let (wrote, pending) = handle.node.withSession { session -> (Bool, Bool) in
            guard let session else { return (false, false) }
            let wrote = session.lastWriter.map { $0.owner != 0 && $0.owner == file.lockOwner } ?? false
                || session.truncater != 0 && session.truncater == request.caller.pid
            return (wrote, session.dirty || session.failure != 0)
        }
        guard wrote, pending else { return request.replySuccess() }
        if ProcessState.isDyingFromSignal(request.caller.pid) {
            // A writer killed mid-session leaves the previous version.
            handle.node.withSession { if let session = $0 { shadows.discard(session) } }
            return request.replySuccess()
        }
        let (error, published) = publish(handle.node, durably: false)
        // The next open asks the daemon anyway: the close need not wait for the kernel's cache.
        request.reply(error: error)
        if let published { didPublish(handle.node, inPlace: published == .inPlace) }
        shadows.unsynced.startRetirements()
    }

    public func fsync(_ request: FuseRequest, inode: InodeNumber, dataOnly: Bool, file: FileInfo) {
        let handle = Handle.get(file, as: OpenFile.self)
        guard handle.writesThroughSession else {
            // A change in place made since a record of the file's last publish went: that
            // removal is made durable first, or a cut could bring the record back over the change.
            var error: Int32 = 0
            if handle.node.isRegularFile { error = Backing.key(of: handle.descriptor).map { shadows.unsynced.settle($0) } ?? errno }
            guard error == 0 else { return request.reply(error: error) }
            return request.reply(error: shadows.renameCommits.syncing {
                Backing.check(dataOnly ? fdatasync(handle.descriptor) : Glibc.fsync(handle.descriptor))
            })
        }
        let (error, published) = publish(handle.node, durably: true)
        request.reply(error: error)
        if let published { didPublish(handle.node, inPlace: published == .inPlace) }
        shadows.unsynced.startRetirements()
    }

    /// How a session's writes became the published file.
    enum Published {
        /// A shadow took the file's place.
        case replaced
        /// A new file written in place (`WriteSession.fresh`) is published as it is.
        case inPlace
    }

    /// Gives handles closed just before a large file's logged change is published a moment for their
    /// release (`whileReleasesArrive`): a log applies in place only while no other handle has the
    /// file open, and otherwise becomes a copy of the whole file. The kernel releases a closed file
    /// after close(2) returns, so a program that closes its reader, then its writer (`rsync
    /// --inplace`: the basis file, then the output) copied the file at one close in three.
    private func awaitReleases(beforeLogOf node: Node) {
        guard node.withSession({ $0?.log != nil }) else { return }
        _ = Self.whileReleasesArrive { !node.withSession { _ in nodes.othersHaveOpen(node) } }
    }

    /// Runs `attempt` until it is done (true) or of no use again (nil), every 100 µs for at
    /// most 5 ms, handing an io_uring queue over before the first wait; whether it was done. Closed
    /// handles' releases arrive so late after their close(2), and a copy of a file large enough to
    /// be logged (64 MiB) takes tens of milliseconds at least.
    static func whileReleasesArrive(_ attempt: () -> Bool?) -> Bool {
        var deadline: UInt64 = 0
        while true {
            guard let done = attempt() else { return false }
            if done { return true }
            let now = DispatchTime.now().uptimeNanoseconds
            if deadline == 0 {
                deadline = now + 5_000_000
                RequestThreads.willWait()
            }
            guard now < deadline else { return false }
            usleep(100)
        }
    }

    /// Publishes a session's unpublished writes; nil when nothing was published. The first publish
    /// ends the session's coordinated write, so presenters hear "did change" once the change is
    /// there to read.
    private func publish(_ node: Node, durably: Bool) -> (Int32, Published?) {
        awaitReleases(beforeLogOf: node)
        return node.withSession { current in
            guard let session = current, session.dirty || session.failure != 0 else { return (0, nil) }
            let published = session.publishes
            let error = shadows.publish(session, of: node, in: nodes, durably: durably)
            session.access?.end(tookEffect: error == 0)
            session.access = nil
            guard error == 0 else { return (error, nil) }
            session.kernelMayHoldWriters = false
            if published == .replaced { node.sharing.noticeDecided() }
            return (0, published)
        }
    }

    public func release(_ request: FuseRequest, inode: InodeNumber, file: FileInfo) {
        let handle = Handle.take(file, as: OpenFile.self)
        guard handle.writesThroughSession else {
            if let path = handle.path { handle.node.closeHandle(path, passthrough: passthrough) }
            handle.access?.end(tookEffect: handle.hasWritten)
            return request.replySuccess()
        }
        let (published, discarded): (Published?, Bool) = handle.node.withSession { current in
            guard let session = current else { return (nil, false) }
            session.writers -= 1
            guard session.writers == 0 else { return (nil, false) }
            let wasDirty = session.dirty
            let published = session.publishes
            let error = shadows.publish(session, of: handle.node, in: nodes, durably: false)
            session.access?.end(tookEffect: (wasDirty || session.announcesCreation) && error == 0)
            current = nil
            if wasDirty && error == 0 {
                if published == .replaced { handle.node.sharing.noticeDecided() }
                return (published, false)
            }
            // Nothing published now: the kernel hears only of a view of the writers' it may hold
            // still (a discarded session's size, a shadow's times), not of one a publish in flush
            // told it of already.
            guard session.kernelMayHoldWriters else { return (nil, false) }
            handle.node.sharing.noticeDecided()
            return (nil, true)
        }
        request.replySuccess()
        if let published { didPublish(handle.node, inPlace: published == .inPlace) } else if discarded { didDiscard(handle.node) }
        shadows.unsynced.startRetirements()
    }

    public func fallocate(_ request: FuseRequest, inode: InodeNumber, mode: Int32, offset: off_t, length: off_t,
                          file: FileInfo) {
        let denied = Policy.write(nodes.node(inode).zone)
        guard denied == 0 else { return request.reply(error: denied) }
        var result: Int32 = 0
        var cleared = false
        let handle = Handle.get(file, as: OpenFile.self)
        let caller = request.caller
        let error = withDescriptor(of: handle, writer: (file.lockOwner, caller.pid)) {
            // As a write.
            let outcome = Backing.clearSetID($0, changedBy: caller)
            result = outcome.error
            cleared = outcome.cleared
            if result == 0 { result = Backing.check(clinux_fallocate($0, mode, offset, length)) }
        }
        if cleared { kernel?.invalidateInode(inode, offset: -1, length: 0) }
        if result == ENOSPC { failSession(of: handle, with: result) }
        request.reply(error: error != 0 ? error : result)
    }

    public func lseek(_ request: FuseRequest, inode: InodeNumber, offset: off_t, whence: Int32, file: FileInfo) {
        var result: off_t = -1
        var seekError: Int32 = 0
        let error = withDescriptor(of: Handle.get(file, as: OpenFile.self)) {
            result = Glibc.lseek($0, offset, whence)
            if result < 0 { seekError = errno }
        }
        if error != 0 { return request.reply(error: error) }
        result < 0 ? request.reply(error: seekError) : request.reply(offset: result)
    }
}

/// What an open's answer needs of its `fuse_file_info`, copied so that it can be given later from
/// another thread (the kernel's structure lives only as long as the request's callback).
struct FileInfoCopy: @unchecked Sendable {
    private var info: fuse_file_info

    init(_ file: FileInfo) { info = file.raw.pointee }

    func reply(_ request: FuseRequest, with handle: OpenFile, cache: CacheUse) {
        var info = prepared(handle, cache: cache)
        withUnsafeMutablePointer(to: &info) { request.reply(opened: FileInfo($0)) }
    }

    func reply(_ request: FuseRequest, with handle: OpenFile, passthrough backingID: Int32) {
        withPassthroughInfo(handle) { request.reply(opened: $0, passthrough: backingID) }
    }

    func replyCreated(_ request: FuseRequest, entry: inout fuse_entry_param, with handle: OpenFile, passthrough backingID: Int32) {
        withPassthroughInfo(handle) { request.reply(created: &entry, file: $0, passthrough: backingID) }
    }

    /// The file info of an answer through passthrough.
    private func withPassthroughInfo(_ handle: OpenFile, _ body: (FileInfo) -> Void) {
        var info = self.info
        withUnsafeMutablePointer(to: &info) { pointer in
            let file = FileInfo(pointer)
            Handle.store(handle, in: file)
            // A reader's flush does nothing (see flush).
            file.noFlush = true
            body(file)
        }
    }

    func replyCreated(_ request: FuseRequest, entry: inout fuse_entry_param, with handle: OpenFile, cache: CacheUse) {
        var info = prepared(handle, cache: cache)
        withUnsafeMutablePointer(to: &info) { request.reply(created: &entry, file: FileInfo($0)) }
    }

    private func prepared(_ handle: OpenFile, cache: CacheUse) -> fuse_file_info {
        var info = self.info
        withUnsafeMutablePointer(to: &info) { pointer in
            let file = FileInfo(pointer)
            Handle.store(handle, in: file)
            file.directIO = cache == .bypass
            file.keepCache = cache == .keep
        }
        return info
    }
}
