import CFuse
import CLinux
import Containers
import Coordination
import FUSELowLevel
import Glibc
import Synchronization

/// How long the kernel may trust what it was told.
public struct CacheTimeouts: Sendable {
    public var attributes: Double = 1.0
    public var entries: Double = 1.0
    public init() {}
}

/// The mounted tree: backing files reached through `*at()` calls on held descriptors, never
/// through joined paths, with the container policy checked before every change.
///
/// Shared by libfuse's worker threads and the coordination callbacks. Unchecked: its state lives
/// in the node table (locks), the shadows and atomics, and its `var`s are set before the session
/// serves its first request and only read after.
public final class ContainerFileSystem: LowLevelFileSystem, @unchecked Sendable {
    let nodes: NodeTable
    let timeouts: CacheTimeouts
    let daemonIsRoot = geteuid() == 0
    /// Where to tell the kernel about changes it did not make itself; set once the session exists.
    public weak var kernel: KernelCacheNotifier?
    /// Versions the kernel reads itself; nil when the mount did not offer passthrough. Set before
    /// the session runs.
    var passthrough: PassthroughFiles?
    /// Bundles that failed their seal at mount, by app ID: their changed files answer EIO.
    let brokenSeals: [String: SealReport]
    /// The app ID of the root, when one app is mounted alone.
    let rootApp: String?
    let rootAppName: [UInt8]?
    /// Which processes are which app's; nil when the store's records cannot be watched (then
    /// `containerfs run` is refused: docs/island.md). Set before the session runs.
    var islands: Islands?
    /// The locks the kernel keeps on the mount's files; nil when the mount's device is unknown.
    /// Set before the session runs.
    var heldLocks: HeldLocks?
    let coordination: MountCoordination
    let shadows: Shadows
    /// The control socket's path, which every item tells clients in an extended attribute.
    public var controlSocketPath: [UInt8] = []
    /// Moves on whenever an in-place attribute is set or removed, or anything is renamed, through
    /// the mount: the answers of `writesInPlace` cached by nodes are then asked again.
    let inPlaceGeneration = Atomic<UInt64>(1)

    /// `rootDescriptor` is an `O_PATH` descriptor on the directory shown at the mount point, whose
    /// zone is `.mountRoot` (a whole store) or `.containerRoot` (one app).
    /// `shadowDirectory` is an open directory in the store's work space, on the store's filesystem.
    public init(rootDescriptor: Int32, rootZone: Zone, rootApp: AppID?, seals: [SealReport],
                coordination: MountCoordination, shadowDirectory: Int32, largeFile: off_t = 64 << 20,
                versions: VersionKeeper? = nil,
                timeouts: CacheTimeouts = CacheTimeouts()) throws {
        let (attributes, error) = Backing.attributes(of: rootDescriptor)
        guard error == 0 else { throw FuseError("cannot read the store's root: \(String(cString: strerror(error)))") }
        nodes = NodeTable(root: Node(descriptor: rootDescriptor, attributes: attributes, exposedInode: UInt64(attributes.st_ino),
                                     zone: rootZone, parent: nil, name: .empty))
        self.coordination = coordination
        shadows = Shadows(directory: shadowDirectory, logThreshold: largeFile, versions: versions)
        versions?.announce = { [coordination] version, path in coordination.announceVersion(version, of: path) }
        shadows.inUse = { [nodes] key in nodes.serves(key) }
        versions?.recycle = { [weak shadows] name, directory in shadows?.recycle(name, in: directory) ?? false }
        versions?.watchFloor(onFilesystemOf: shadowDirectory, every: 5)
        self.timeouts = timeouts
        self.rootApp = rootApp?.rawValue
        rootAppName = rootApp.map { Array($0.rawValue.utf8) }
        brokenSeals = Dictionary(seals.filter { !$0.isIntact }.map { ($0.id.rawValue, $0) }) { first, _ in first }
    }

    public func initialize(connection: UnsafeMutablePointer<fuse_conn_info>) {
        let capable = connection.pointee.capable
        // Locks stay in the kernel (see FuseSession); the rest is what a local disk offers.
        var want = connection.pointee.want & ~UInt32(FUSE_CAP_POSIX_LOCKS | FUSE_CAP_FLOCK_LOCKS)
        // Not the older FUSE_HANDLE_KILLPRIV (libfuse asks for it by default), with which the kernel
        // would leave a chown's clearing to the daemon too: the daemon takes the newer protocol
        // (`FuseSession.takeOverSetIDClearing`).
        want &= ~UInt32(FUSE_CAP_HANDLE_KILLPRIV)
        // O_TRUNC arrives with the open, so a truncating open makes an empty shadow: no copy.
        for capability in [FUSE_CAP_ATOMIC_O_TRUNC, FUSE_CAP_EXPORT_SUPPORT, FUSE_CAP_SPLICE_READ, FUSE_CAP_SPLICE_WRITE,
                           FUSE_CAP_SPLICE_MOVE, FUSE_CAP_READDIRPLUS, FUSE_CAP_READDIRPLUS_AUTO,
                           FUSE_CAP_PARALLEL_DIROPS, FUSE_CAP_CACHE_SYMLINKS] {
            let flag = UInt32(capability)
            if capable & flag != 0 { want |= flag }
        }
        connection.pointee.want = want
    }

    public func destroy() { shadows.finishRemovals() }

    // MARK: Names and attributes

    /// Checks a name from a request: no `.`, `..` or over-long names ever reach the backing store.
    @inline(__always)
    func nameError(_ name: FileName) -> Int32 {
        if name.length > Int(NAME_MAX) { return ENAMETOOLONG }
        if name.length == 0 || name.isDotOrDotDot { return EINVAL }
        return 0
    }

    /// The links of the file with `attributes` that someone made: a new file's mark, or a record of
    /// its last publish, is a link nobody made.
    @inline(__always)
    func links(_ attributes: stat) -> nlink_t {
        attributes.st_nlink > 1 && attributes.st_mode & S_IFMT == S_IFREG && shadows.unsynced.hasLink(BackingKey(attributes))
            ? attributes.st_nlink - 1 : attributes.st_nlink
    }

    /// What `stat` shows: the backing attributes under the node's lasting inode number, with the
    /// write bits that policy takes away removed.
    @inline(__always)
    func visible(_ attributes: inout stat, of node: Node) {
        let mode = attributes.st_mode
        attributes.st_nlink = links(attributes)
        attributes.st_ino = ino_t(node.exposedInode)
        attributes.st_mode = Policy.visibleMode(mode, of: node.zone, isDirectory: mode & S_IFMT == S_IFDIR)
    }

    /// Looks `name` up in `parent` for a request of `uid`, counting a kernel reference to it on
    /// success. With `expected`, the name must still be that item (ESTALE if someone took it
    /// meanwhile; the kernel then looks it up again). EMFILE if it is a directory new to the
    /// table and `uid` holds its share of the daemon's descriptors (`DescriptorShares`).
    func lookupEntry(parent: Node, name: FileName, entry: inout fuse_entry_param, expected: BackingKey? = nil,
                     for uid: uid_t) -> Int32 {
        let zone = parent.zone.child(named: name.bytes)
        // A publish may rename a file over the name between the `fstatat` and the node's making: a
        // node of the file it replaced would be stale at once (two such in a row, by a listing and
        // by the kernel's retry, reached a reader's program as ESTALE). Looked up again then.
        for attempt in 0..<4 {
            let seen = attempt < 3 ? nodes.replacements.load(ordering: .acquiring) : nil
            var attributes = stat()
            guard fstatat(parent.descriptor, name.pointer, &attributes, AT_SYMLINK_NOFOLLOW) == 0 else { return errno }
            if let expected, BackingKey(attributes) != expected { return ESTALE }
            var descriptor: Int32 = -1
            if attributes.st_mode & S_IFMT == S_IFDIR {
                // A directory a node holds already (the kernel looking it up again) needs no descriptor.
                if let node = nodes.rememberHeld(attributes: attributes, zone: zone, parent: parent, name: name) {
                    fill(&entry, with: node, attributes: attributes)
                    return 0
                }
                // A new directory's node holds a descriptor: its attributes are those of what it holds.
                descriptor = Backing.openPath(name.pointer, in: parent.descriptor)
                guard descriptor >= 0 else { return errno }
                let error: Int32
                (attributes, error) = Backing.attributes(of: descriptor)
                if error != 0 || attributes.st_mode & S_IFMT != S_IFDIR {
                    close(descriptor)
                    return error != 0 ? error : ESTALE
                }
            }
            // Publishes replace files only: a directory's node holds what it was made for.
            let remembered = nodes.remember(descriptor: descriptor, attributes: attributes, zone: zone, parent: parent,
                                            name: name, for: uid, unlessReplacedSince: descriptor < 0 ? seen : nil)
            switch remembered {
            case .node(let node):
                fill(&entry, with: node, attributes: attributes)
                return 0
            case .overShare: return EMFILE
            case .raced: continue
            }
        }
        preconditionFailure("the last attempt is never raced")
    }

    /// `lookupEntry`'s end, for an item whose attributes are known: a file just made or opened as
    /// `name` under a coordinated access, whose descriptor gave them (a look-up by name again
    /// would find the same file).
    func enter(parent: Node, name: FileName, descriptor: Int32 = -1, attributes: stat, entry: inout fuse_entry_param,
               for uid: uid_t) -> Int32 {
        let zone = parent.zone.child(named: name.bytes)
        guard case .node(let node) = nodes.remember(descriptor: descriptor, attributes: attributes, zone: zone, parent: parent,
                                                    name: name, for: uid) else { return EMFILE }
        fill(&entry, with: node, attributes: attributes)
        return 0
    }

    /// Fills in `entry` for `node`, whose backing attributes are `attributes`.
    private func fill(_ entry: inout fuse_entry_param, with node: Node, attributes: stat) {
        var attributes = attributes
        visible(&attributes, of: node)
        identify(node, in: &entry)
        entry.attr = attributes
        entry.attr_timeout = attributeTimeout(of: node)
        entry.entry_timeout = timeouts.entries
    }

    /// Looks up the directory that holds `node`, counting a kernel reference to it. The kernel asks
    /// (`..`) when it reconnects a directory that a file handle names (docs/conformance.md, "File
    /// handles"). The node was last seen in that directory; its name there is looked up again, so
    /// that a directory renamed or removed meanwhile answers ESTALE, not another one.
    func lookupParent(of node: Node, entry: inout fuse_entry_param, for uid: uid_t) -> Int32 {
        guard let (parent, _) = nodes.place(of: node) else { return ENOENT }
        guard let (grandparent, name) = nodes.place(of: parent) else {
            // The root, which the kernel never forgets.
            let (attributes, error) = currentAttributes(of: parent)
            guard error == 0 else { return error }
            fill(&entry, with: parent, attributes: attributes)
            return 0
        }
        var terminated = name.bytes
        terminated.append(0)
        return terminated.withUnsafeBufferPointer { bytes in
            bytes.withMemoryRebound(to: CChar.self) {
                lookupEntry(parent: grandparent, name: FileName($0.baseAddress!), entry: &entry,
                            expected: parent.currentKey, for: uid)
            }
        }
    }

    /// Names `node` in an entry for the kernel: its inode number and generation.
    func identify(_ node: Node, in entry: inout fuse_entry_param) {
        entry.ino = nodes.inodeNumber(of: node)
        entry.generation = UInt64(node.generation)
    }

    /// Answers a look-up of `name` in `parent` (`lookingUp`), or a request that made it, with its
    /// entry. A missing name looked up is answered as an entry without a node where the zone keeps
    /// one: the kernel keeps it as long as a found one, and the next `stat` or `open` of it
    /// (SQLite's journal checks, a compiler's include search) is answered without asking
    /// (docs/conformance.md, "Missing names").
    func replyEntry(_ request: FuseRequest, parent: Node, name: FileName, lookingUp: Bool) {
        var entry = fuse_entry_param()
        let error = lookupEntry(parent: parent, name: name, entry: &entry, for: request.caller.uid)
        if error == ENOENT, lookingUp, parent.zone.keepsMissingName(name.bytes) {
            entry = fuse_entry_param()
            entry.entry_timeout = timeouts.entries
            return request.reply(entry: &entry)
        }
        error == 0 ? request.reply(entry: &entry) : request.reply(error: error)
    }

    /// Gives the item the daemon just made, open on `descriptor` (an `O_PATH` one will do), to the
    /// caller, as a local disk would, when the daemon runs as root. The very inode made is changed,
    /// never a name, which someone else may have taken meanwhile. Returns 0 or the errno.
    func adoptOwnership(of descriptor: Int32, in parent: Node, by caller: Caller) -> Int32 {
        guard daemonIsRoot, caller.uid != 0 || caller.gid != 0 else { return 0 }
        // In a set-group-ID directory the new item keeps the directory's group.
        var parentAttributes = stat()
        guard fstatat(parent.descriptor, "", &parentAttributes, AT_EMPTY_PATH) == 0 else { return errno }
        let group = parentAttributes.st_mode & S_ISGID != 0 ? gid_t.max : caller.gid
        return Backing.check(fchownat(descriptor, "", caller.uid, group, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW))
    }

    public func lookup(_ request: FuseRequest, parent: InodeNumber, name: FileName) {
        if name.isDotOrDotDot { return lookupDots(request, of: parent, parentOfIt: name.length == 2) }
        let error = nameError(name)
        guard error == 0 else { return request.reply(error: error) }
        replyEntry(request, parent: nodes.node(parent), name: name, lookingUp: true)
    }

    /// With export support (`FUSE_CAP_EXPORT_SUPPORT`) the kernel asks for `..` of a directory it
    /// holds, to reconnect it, and for `.` of a node a file handle names and it no longer holds.
    /// That node was forgotten: its number is a freed address, never to be followed, so the handle
    /// is stale (docs/conformance.md, "File handles").
    private func lookupDots(_ request: FuseRequest, of inode: InodeNumber, parentOfIt: Bool) {
        guard parentOfIt else { return request.reply(error: ESTALE) }
        var entry = fuse_entry_param()
        let error = lookupParent(of: nodes.node(inode), entry: &entry, for: request.caller.uid)
        error == 0 ? request.reply(entry: &entry) : request.reply(error: error)
    }

    public func forget(_ inode: InodeNumber, count: UInt64) {
        nodes.forget(inode, count: count)
    }

    public func getattr(_ request: FuseRequest, inode: InodeNumber, file: FileInfo?) {
        let node = nodes.node(inode)
        // The kernel names the handle when a read or seek on it needs the size (regular files only).
        var (attributes, error) = file.map { self.attributes(seenThrough: Handle.get($0, as: OpenFile.self)) }
            ?? currentAttributes(of: node, seenBy: request.caller.pid)
        guard error == 0 else { return request.reply(error: error) }
        visible(&attributes, of: node)
        request.reply(attributes: &attributes, validFor: attributeTimeout(of: node))
    }

    /// How long the kernel may keep `node`'s attributes: not at all while they vary
    /// (`Node.attributesVary`).
    @inline(__always)
    func attributeTimeout(of node: Node) -> Double {
        node.isRegularFile && node.attributesVary ? 0 : timeouts.attributes
    }

    /// A file being rewritten shows its writers their writes (the shadow), as `fstat` after a write
    /// does on a disk, and everyone else the published version whole, as they read it: `tar` and
    /// `rsync` copy as many bytes as `stat` says (docs/atomic-replace.md, "What readers see").
    /// `thread`: the thread asking by name; nil for a handle of the session. A caller outside the
    /// mount's process namespace (thread 0) cannot be told from a writer, and sees what one would.
    func currentAttributes(of node: Node, seenBy thread: pid_t? = nil) -> (stat, Int32) {
        if node.isRegularFile {
            let shadowAttributes = node.withSession { session -> stat? in
                guard let session, session.shadow >= 0 else { return nil }
                if let thread, thread > 0, session.hidesWrites, !session.writerProcesses.includes(thread) { return nil }
                var attributes = stat()
                if let log = session.log {
                    // A logged rewrite: the file, at the size the writer made it.
                    guard fstat(log.original, &attributes) == 0 else { return nil }
                    attributes.st_size = log.size
                    return attributes
                }
                guard fstat(session.shadow, &attributes) == 0 else { return nil }
                return attributes
            }
            if let shadowAttributes { return (shadowAttributes, 0) }
        }
        return node.attributes()
    }

    public func setattr(_ request: FuseRequest, inode: InodeNumber, attributes: UnsafeMutablePointer<stat>,
                        fields: AttributeFields, file: FileInfo?) {
        let node = nodes.node(inode)
        var denied: Int32 = 0
        if !fields.isDisjoint(with: .metadata) { denied = Policy.changeMetadata(node.zone) }
        if denied == 0, fields.contains(.size) { denied = Policy.write(node.zone) }
        guard denied == 0 else { return request.reply(error: denied) }
        let new = attributes.pointee
        coordination.perform(fields.contains(.size) ? .write(nodes.itemPath(of: node)) : .metadataChange(nodes.itemPath(of: node)),
                             isDirectory: node.isDirectory, caller: request.caller) { access in
            var published = false
            var error: Int32 = 0
            if fields.contains(.size) {
                error = self.truncate(node, to: new.st_size, through: file.map { Handle.get($0, as: OpenFile.self) },
                                      by: request.caller.pid, throughHandle: file != nil, published: &published)
            }
            if error == 0 { error = self.applyMetadata(new, fields: fields, to: node) }
            if error == 0, fields.contains(.size) { error = self.clearSetIDAfterTruncation(of: node, by: request.caller) }
            access.end(tookEffect: error == 0)
            error == 0 ? self.getattr(request, inode: inode, file: nil) : request.reply(error: error)
            if published { self.didPublish(node, inPlace: false) }
            self.shadows.unsynced.startRetirements()
        }
    }

    /// Truncates a file: in place, in its write session, or as a write session of its own.
    /// `handle`: the descriptor it is truncated through (`ftruncate`), if any; `truncater`: the
    /// thread that truncates, through a descriptor of the session if `throughHandle`.
    private func truncate(_ node: Node, to size: off_t, through handle: OpenFile?, by truncater: pid_t,
                          throughHandle: Bool, published: inout Bool) -> Int32 {
        // A descriptor opened in place (the file was live then) truncates in place, as it writes,
        // even once the file is live no more: as a session's writer, its own open would count as
        // a reader to leave the node to, and `ftruncate` never retries an ESTALE.
        let inPlaceDescriptor = handle.flatMap { !$0.writesThroughSession && $0.descriptor >= 0 ? $0.descriptor : nil }
        if inPlaceDescriptor != nil || writesInPlace(node) {
            let error = shadows.unsynced.waitForData(of: node.currentKey)
            guard error == 0 else { return error }
            return Backing.check(inPlaceDescriptor.map { ftruncate($0, size) } ?? node.withProcPath { Glibc.truncate($0, size) })
        }
        return node.withSession { current in
            // truncate(2) looks the name up again on ESTALE, for a node of its own.
            if yieldsToCachedReaders(node, session: current) { return ESTALE }
            let session = current ?? WriteSession()
            var error = shadows.prepare(session, of: node, truncated: size == 0, mayLog: true)
            if error == 0 {
                error = session.log != nil ? shadows.logTruncate(session, to: size)
                    : Backing.check(session.changeShadow { ftruncate($0, size) })
            }
            guard error == 0 else { return error }
            session.dirty = true
            guard current == nil else {
                // It joins the rewrite, and sees it.
                session.writerProcesses.add(truncater)
                if throughHandle { session.truncater = truncater }
                return 0
            }
            published = true
            node.sharing.noticeDecided()
            return shadows.publish(session, of: node, in: nodes, durably: false)
        }
    }

    /// A truncation by someone without CAP_FSETID (told by uid, as for writes) drops set-ID bits as
    /// a write does (`SetID`). The kernel leaves it to the daemon when an open truncates (atomic
    /// `O_TRUNC`), and clears set-group-ID by the older rule alone otherwise: the file and its
    /// shadow both lose them, and the kernel's cached mode is dropped.
    func clearSetIDAfterTruncation(of node: Node, by caller: Caller) -> Int32 {
        guard caller.uid != 0, node.isRegularFile else { return 0 }
        let (attributes, error) = node.attributes()
        guard error == 0 else { return error }
        var cleared = attributes
        cleared.st_mode = SetID.mode(attributes.st_mode, group: attributes.st_gid, afterChangeBy: caller)
        guard cleared.st_mode != attributes.st_mode else { return 0 }
        let changed = applyMetadata(cleared, fields: .mode, to: node)
        kernel?.invalidateInode(nodes.inodeNumber(of: node), offset: -1, length: 0)
        return changed
    }

    /// Applies chmod, chown and utimes to the file, and to its shadow so that a publish keeps them.
    private func applyMetadata(_ new: stat, fields: AttributeFields, to node: Node) -> Int32 {
        let metadata = fields.intersection(.metadata)
        guard !metadata.isEmpty else { return 0 }
        // A new file written in place is its session's descriptor (one inode, nobody else's): no
        // look-up by name (`tar` sets three attributes of each file it makes).
        if node.isRegularFile, let error = node.withSession({ session -> Int32? in
            guard let session, session.fresh, session.shadow >= 0 else { return nil }
            return applyAttributes(new, fields: metadata, to: session.shadow, isSymlink: false, isOpen: true)
        }) {
            return error
        }
        var error: Int32 = 0
        if node.withDescriptor({ error = applyAttributes(new, fields: metadata, to: $0, isSymlink: node.isSymlink); return 0 }) < 0 {
            error = errno
        }
        guard error == 0, node.isRegularFile else { return error }
        return node.withSession { session in
            // A log holds no attributes: the file it applies to took them.
            guard let session, session.shadow >= 0, !session.fresh, session.log == nil else { return 0 }
            return applyAttributes(new, fields: metadata, to: session.shadow, isSymlink: false, isOpen: true)
        }
    }

    /// Applies a setattr's metadata to the item behind an `O_PATH` descriptor, or (`isOpen`) a
    /// regular file's descriptor open for reading and writing (a session's), which needs no path.
    private func applyAttributes(_ new: stat, fields: AttributeFields, to descriptor: Int32, isSymlink: Bool,
                                 isOpen: Bool = false) -> Int32 {
        if fields.contains(.mode) {
            let error = Backing.check(isOpen ? fchmod(descriptor, new.st_mode)
                                             : Backing.withProcPath(descriptor) { chmod($0, new.st_mode) })
            if error != 0 { return error }
        }
        if !fields.isDisjoint(with: [.uid, .gid]) {
            let uid = fields.contains(.uid) ? new.st_uid : uid_t.max
            let gid = fields.contains(.gid) ? new.st_gid : gid_t.max
            let error = Backing.check(fchownat(descriptor, "", uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW))
            if error != 0 { return error }
        }
        if !fields.isDisjoint(with: [.accessTime, .modificationTime]) {
            var times = [timespec(tv_sec: 0, tv_nsec: Int(UTIME_OMIT)), timespec(tv_sec: 0, tv_nsec: Int(UTIME_OMIT))]
            if fields.contains(.accessTimeNow) { times[0].tv_nsec = Int(UTIME_NOW) }
            else if fields.contains(.accessTime) { times[0] = new.st_atim }
            if fields.contains(.modificationTimeNow) { times[1].tv_nsec = Int(UTIME_NOW) }
            else if fields.contains(.modificationTime) { times[1] = new.st_mtim }
            let error = Backing.check(isOpen ? futimens(descriptor, times)
                : isSymlink ? utimensat(descriptor, "", times, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW)
                : Backing.withProcPath(descriptor) { utimensat(AT_FDCWD, $0, times, 0) })
            if error != 0 { return error }
        }
        return 0
    }

    /// The extended attribute that opts a file, or everything below a directory, into in-place writes.
    static let inPlaceAttribute = "user.containerfs.write-in-place"

    /// Whether writes to `node` go straight to the file: tmp and Caches, live files (`Sharing`),
    /// hard-linked files (a rename would part the links), files whose node holds them because they
    /// have no name to publish under (unlinked, or unnamed: O_TMPFILE), and items opted out with
    /// `inPlaceAttribute`. `seen`: the node's attributes, read just now by the caller.
    /// `unlessLive`: leave out whether programs share the file live, for a caller that holds the
    /// node's session lock (`Node.openHandle`, whose readers of a live file share it either way).
    func writesInPlace(_ node: Node, seen: stat? = nil, unlessLive: Bool = false) -> Bool {
        guard node.isRegularFile, !node.zone.writesInPlaceByDefault, unlessLive || !node.isLive else { return true }
        if node.holdsItem, !node.isDetached { return true }
        let (attributes, error) = seen.map { ($0, 0) } ?? node.attributes()
        if error == 0, attributes.st_nlink > 1, userLinks(of: node, attributes) > 1 { return true }
        return optsIntoInPlace(node, generation: inPlaceGeneration.load(ordering: .acquiring))
    }

    /// How many links of the file with `attributes` (at least two) someone made: a new file's mark,
    /// or the record of its last publish, is the daemon's. A link the daemon removed since those
    /// attributes were read may be in their count: they are read again then.
    private func userLinks(of node: Node, _ attributes: stat) -> nlink_t {
        var attributes = attributes
        // A publish may swap another file in meanwhile: its own marks count then.
        for _ in 0..<4 {
            switch shadows.unsynced.mark(of: BackingKey(attributes)) {
            case .linked?: return attributes.st_nlink - 1
            case nil: return attributes.st_nlink
            case .unlinked?:
                let (again, error) = node.attributes()
                guard error == 0 else { return attributes.st_nlink }
                if BackingKey(again) == BackingKey(attributes) { return again.st_nlink }
                attributes = again
            }
        }
        return attributes.st_nlink
    }

    /// Whether `node` or a directory above it carries `inPlaceAttribute`. Each node asks once a
    /// generation (see `inPlaceGeneration`), so a new file costs one getxattr: its parent knows.
    func optsIntoInPlace(_ node: Node, generation: UInt64) -> Bool {
        let asked = UInt32(truncatingIfNeeded: generation) << 1
        let cached = node.inPlaceAnswer.load(ordering: .relaxed)
        if cached & ~1 == asked, asked != 0 { return cached & 1 == 1 }
        var opted = node.withProcPath { clinux_getxattr($0, ContainerFileSystem.inPlaceAttribute, nil, 0) } >= 0
        if !opted, let (parent, _) = nodes.place(of: node) { opted = optsIntoInPlace(parent, generation: generation) }
        node.inPlaceAnswer.store(asked | (opted ? 1 : 0), ordering: .relaxed)
        return opted
    }

    /// False for a bundle file that changed since it was sealed: it is not served as if intact.
    @inline(__always)
    func sealAllowsReading(_ node: Node) -> Bool {
        guard node.zone == .bundle, !brokenSeals.isEmpty else { return true }
        return nodes.withPlace(of: node) { names, containerName in
            // names: from the bundle directory down to the node.
            guard let app = containerName.map({ String(decoding: $0, as: UTF8.self) }) ?? rootApp,
                  let report = brokenSeals[app] else { return true }
            let relative = names.dropFirst().map { String(decoding: $0, as: UTF8.self) }.joined(separator: "/")
            return report.allowsReading(relative)
        }
    }

    public func readlink(_ request: FuseRequest, inode: InodeNumber) {
        let node = nodes.node(inode)
        guard sealAllowsReading(node) else { return request.reply(error: EIO) }
        withUnsafeTemporaryAllocation(of: CChar.self, capacity: Int(PATH_MAX) + 1) { buffer in
            let length = node.withDescriptor { readlinkat($0, "", buffer.baseAddress!, Int(PATH_MAX)) }
            guard length >= 0 else { return request.reply(error: errno) }
            buffer[length] = 0
            request.reply(linkTarget: buffer.baseAddress!)
        }
    }
}

extension ContainerFileSystem {
    /// Tells the kernel that the name a node was last seen under is gone (removed behind its back):
    /// its attributes go, so the next `stat` asks, finds the name gone (ESTALE) and the kernel looks
    /// it up again. Not the entry itself: the kernel takes the directory's lock for that notice,
    /// and one waiting for a request the daemon serves would never end if the daemon died (its
    /// process could not exit, nor the mount's requests be aborted).
    func forgetName(of node: Node) {
        kernel?.invalidateInode(nodes.inodeNumber(of: node), offset: -1, length: 0)
    }
}
