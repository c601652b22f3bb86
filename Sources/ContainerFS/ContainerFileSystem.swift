import CFuse
import CLinux
import Containers
import FUSELowLevel
import Glibc

/// How long the kernel may trust what it was told.
public struct CacheTimeouts: Sendable {
    public var attributes: Double = 1.0
    public var entries: Double = 1.0
    public init() {}
}

/// The mounted tree: backing files reached through `*at()` calls on held descriptors, never
/// through joined paths, with the container policy checked before every change.
public final class ContainerFileSystem: LowLevelFileSystem {
    let nodes: NodeTable
    let timeouts: CacheTimeouts
    private let daemonIsRoot = geteuid() == 0
    /// Where to tell the kernel about changes it did not make itself; set once the session exists.
    public weak var kernel: KernelCacheNotifier?
    /// Bundles that failed their seal at mount, by app ID: their changed files answer EIO.
    private let brokenSeals: [String: SealReport]
    /// The app ID of the root, when one app is mounted alone.
    private let rootApp: String?

    /// `rootDescriptor` is an `O_PATH` descriptor on the directory shown at the mount point, whose
    /// zone is `.mountRoot` (a whole store) or `.containerRoot` (one app).
    public init(rootDescriptor: Int32, rootZone: Zone, rootApp: AppID?, seals: [SealReport],
                timeouts: CacheTimeouts = CacheTimeouts()) throws {
        let (attributes, error) = Backing.attributes(of: rootDescriptor)
        guard error == 0 else { throw FuseError("cannot read the store's root: \(String(cString: strerror(error)))") }
        nodes = NodeTable(root: Node(descriptor: rootDescriptor, attributes: attributes, zone: rootZone, parent: nil, name: []))
        self.timeouts = timeouts
        self.rootApp = rootApp?.rawValue
        brokenSeals = Dictionary(seals.filter { !$0.isIntact }.map { ($0.id.rawValue, $0) }) { first, _ in first }
    }

    public func initialize(connection: UnsafeMutablePointer<fuse_conn_info>) {
        let capable = connection.pointee.capable
        // Locks stay in the kernel (see FuseSession); the rest is what a local disk offers.
        var want = connection.pointee.want & ~UInt32(FUSE_CAP_POSIX_LOCKS | FUSE_CAP_FLOCK_LOCKS)
        for capability in [FUSE_CAP_EXPORT_SUPPORT, FUSE_CAP_SPLICE_READ, FUSE_CAP_SPLICE_WRITE,
                           FUSE_CAP_SPLICE_MOVE, FUSE_CAP_READDIRPLUS, FUSE_CAP_READDIRPLUS_AUTO,
                           FUSE_CAP_PARALLEL_DIROPS, FUSE_CAP_CACHE_SYMLINKS] {
            let flag = UInt32(capability)
            if capable & flag != 0 { want |= flag }
        }
        connection.pointee.want = want
    }

    public func destroy() {}

    // MARK: Names and attributes

    /// Checks a name from a request: no `.`, `..` or over-long names ever reach the backing store.
    @inline(__always)
    private func nameError(_ name: FileName) -> Int32 {
        if name.length > Int(NAME_MAX) { return ENAMETOOLONG }
        if name.length == 0 || name.isDotOrDotDot { return EINVAL }
        return 0
    }

    /// What `stat` shows: the backing attributes, with the write bits that policy takes away removed.
    @inline(__always)
    private func visible(_ attributes: inout stat, zone: Zone) {
        let mode = attributes.st_mode
        attributes.st_mode = Policy.visibleMode(mode, of: zone, isDirectory: mode & S_IFMT == S_IFDIR)
    }

    /// Looks `name` up in `parent`, counting a kernel reference to it on success.
    private func lookupEntry(parent: Node, name: FileName, entry: inout fuse_entry_param) -> Int32 {
        let descriptor = Backing.openPath(name.pointer, in: parent.descriptor)
        guard descriptor >= 0 else { return errno }
        var (attributes, error) = Backing.attributes(of: descriptor)
        guard error == 0 else {
            close(descriptor)
            return error
        }
        let zone = parent.zone.child(named: name.bytes)
        let node = nodes.remember(descriptor: descriptor, attributes: attributes, zone: zone, parent: parent, name: name)
        visible(&attributes, zone: zone)
        entry.ino = nodes.inodeNumber(of: node)
        entry.attr = attributes
        entry.attr_timeout = timeouts.attributes
        entry.entry_timeout = timeouts.entries
        return 0
    }

    /// Answers a request that made `name` in `parent` with its entry.
    private func replyEntry(_ request: FuseRequest, parent: Node, name: FileName) {
        var entry = fuse_entry_param()
        let error = lookupEntry(parent: parent, name: name, entry: &entry)
        error == 0 ? request.reply(entry: &entry) : request.reply(error: error)
    }

    /// Gives a new item to the caller, as a local disk would, when the daemon runs as root.
    private func adoptOwnership(of name: FileName, in parent: Node, by caller: Caller) {
        guard daemonIsRoot, caller.uid != 0 || caller.gid != 0 else { return }
        // In a set-group-ID directory the new item keeps the directory's group.
        var parentAttributes = stat()
        let inheritsGroup = fstatat(parent.descriptor, "", &parentAttributes, AT_EMPTY_PATH) == 0
            && parentAttributes.st_mode & S_ISGID != 0
        _ = fchownat(parent.descriptor, name.pointer, caller.uid, inheritsGroup ? gid_t.max : caller.gid,
                     AT_SYMLINK_NOFOLLOW)
    }

    public func lookup(_ request: FuseRequest, parent: InodeNumber, name: FileName) {
        let error = nameError(name)
        guard error == 0 else { return request.reply(error: error) }
        replyEntry(request, parent: nodes.node(parent), name: name)
    }

    public func forget(_ inode: InodeNumber, count: UInt64) {
        nodes.forget(inode, count: count)
    }

    public func getattr(_ request: FuseRequest, inode: InodeNumber, file: FileInfo?) {
        let node = nodes.node(inode)
        var (attributes, error) = Backing.attributes(of: node.descriptor)
        guard error == 0 else { return request.reply(error: error) }
        visible(&attributes, zone: node.zone)
        request.reply(attributes: &attributes, validFor: timeouts.attributes)
    }

    public func setattr(_ request: FuseRequest, inode: InodeNumber, attributes: UnsafeMutablePointer<stat>,
                        fields: AttributeFields, file: FileInfo?) {
        let node = nodes.node(inode)
        var denied: Int32 = 0
        if !fields.isDisjoint(with: .metadata) { denied = Policy.changeMetadata(node.zone) }
        if denied == 0, fields.contains(.size) { denied = Policy.write(node.zone) }
        guard denied == 0 else { return request.reply(error: denied) }
        let error = applyAttributes(attributes.pointee, fields: fields, to: node,
                                    openDescriptor: file.map { Handle.get($0, as: OpenFile.self).descriptor })
        guard error == 0 else { return request.reply(error: error) }
        getattr(request, inode: inode, file: file)
    }

    /// Applies a setattr to the backing item, through the open descriptor when there is one.
    private func applyAttributes(_ new: stat, fields: AttributeFields, to node: Node, openDescriptor: Int32?) -> Int32 {
        let descriptor = node.descriptor
        if fields.contains(.mode) {
            let error = Backing.check(openDescriptor.map { fchmod($0, new.st_mode) }
                ?? Backing.withProcPath(descriptor) { chmod($0, new.st_mode) })
            if error != 0 { return error }
        }
        if !fields.isDisjoint(with: [.uid, .gid]) {
            let uid = fields.contains(.uid) ? new.st_uid : uid_t.max
            let gid = fields.contains(.gid) ? new.st_gid : gid_t.max
            let error = Backing.check(fchownat(descriptor, "", uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW))
            if error != 0 { return error }
        }
        if fields.contains(.size) {
            let error = Backing.check(openDescriptor.map { ftruncate($0, new.st_size) }
                ?? Backing.withProcPath(descriptor) { truncate($0, new.st_size) })
            if error != 0 { return error }
        }
        if !fields.isDisjoint(with: [.accessTime, .modificationTime]) {
            var times = [timespec(tv_sec: 0, tv_nsec: Int(UTIME_OMIT)), timespec(tv_sec: 0, tv_nsec: Int(UTIME_OMIT))]
            if fields.contains(.accessTimeNow) { times[0].tv_nsec = Int(UTIME_NOW) }
            else if fields.contains(.accessTime) { times[0] = new.st_atim }
            if fields.contains(.modificationTimeNow) { times[1].tv_nsec = Int(UTIME_NOW) }
            else if fields.contains(.modificationTime) { times[1] = new.st_mtim }
            let error = Backing.check(openDescriptor.map { futimens($0, times) }
                ?? (node.isSymlink
                    ? utimensat(descriptor, "", times, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW)
                    : Backing.withProcPath(descriptor) { utimensat(AT_FDCWD, $0, times, 0) }))
            if error != 0 { return error }
        }
        return 0
    }

    public func readlink(_ request: FuseRequest, inode: InodeNumber) {
        let node = nodes.node(inode)
        guard sealAllowsReading(node) else { return request.reply(error: EIO) }
        withUnsafeTemporaryAllocation(of: CChar.self, capacity: Int(PATH_MAX) + 1) { buffer in
            let length = readlinkat(node.descriptor, "", buffer.baseAddress!, Int(PATH_MAX))
            guard length >= 0 else { return request.reply(error: errno) }
            buffer[length] = 0
            request.reply(linkTarget: buffer.baseAddress!)
        }
    }

    // MARK: Making and removing names

    /// The checks every operation that makes a name shares: a valid name, in a place that allows it.
    private func creationError(in parent: Node, name: FileName) -> Int32 {
        let error = nameError(name)
        return error != 0 ? error : Policy.create(in: parent.zone)
    }

    /// Makes a name with `make`, gives it to the caller and answers with its entry.
    private func makeItem(_ request: FuseRequest, parent: InodeNumber, name: FileName, _ make: (Node) -> Int32) {
        let parentNode = nodes.node(parent)
        let denied = creationError(in: parentNode, name: name)
        guard denied == 0 else { return request.reply(error: denied) }
        let error = Backing.check(make(parentNode))
        guard error == 0 else { return request.reply(error: error) }
        adoptOwnership(of: name, in: parentNode, by: request.caller)
        replyEntry(request, parent: parentNode, name: name)
    }

    public func mknod(_ request: FuseRequest, parent: InodeNumber, name: FileName, mode: mode_t, device: dev_t) {
        // Device nodes have no place in an app container.
        let type = mode & S_IFMT
        guard type == S_IFREG || type == S_IFIFO || type == S_IFSOCK else { return request.reply(error: EPERM) }
        makeItem(request, parent: parent, name: name) { mknodat($0.descriptor, name.pointer, mode, 0) }
    }

    public func mkdir(_ request: FuseRequest, parent: InodeNumber, name: FileName, mode: mode_t) {
        makeItem(request, parent: parent, name: name) { mkdirat($0.descriptor, name.pointer, mode) }
    }

    public func symlink(_ request: FuseRequest, target: UnsafePointer<CChar>, parent: InodeNumber, name: FileName) {
        makeItem(request, parent: parent, name: name) { symlinkat(target, $0.descriptor, name.pointer) }
    }

    public func link(_ request: FuseRequest, inode: InodeNumber, newParent: InodeNumber, newName: FileName) {
        let node = nodes.node(inode)
        let parentNode = nodes.node(newParent)
        var denied = nameError(newName)
        if denied == 0 { denied = Policy.link(node.zone, into: parentNode.zone) }
        guard denied == 0 else { return request.reply(error: denied) }
        let error = Backing.check(Backing.withProcPath(node.descriptor) {
            linkat(AT_FDCWD, $0, parentNode.descriptor, newName.pointer, AT_SYMLINK_FOLLOW)
        })
        guard error == 0 else { return request.reply(error: error) }
        replyEntry(request, parent: parentNode, name: newName)
    }

    public func unlink(_ request: FuseRequest, parent: InodeNumber, name: FileName) {
        remove(request, parent: parent, name: name, flags: 0)
    }

    public func rmdir(_ request: FuseRequest, parent: InodeNumber, name: FileName) {
        remove(request, parent: parent, name: name, flags: AT_REMOVEDIR)
    }

    private func remove(_ request: FuseRequest, parent: InodeNumber, name: FileName, flags: Int32) {
        let parentNode = nodes.node(parent)
        var denied = nameError(name)
        if denied == 0 { denied = Policy.remove(parentNode.zone.child(named: name.bytes)) }
        guard denied == 0 else { return request.reply(error: denied) }
        request.reply(error: Backing.check(unlinkat(parentNode.descriptor, name.pointer, flags)))
    }

    public func rename(_ request: FuseRequest, parent: InodeNumber, name: FileName,
                       newParent: InodeNumber, newName: FileName, flags: UInt32) {
        let from = nodes.node(parent)
        let to = nodes.node(newParent)
        guard flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE) == 0 else { return request.reply(error: EINVAL) }
        var denied = nameError(name)
        if denied == 0 { denied = nameError(newName) }
        if denied == 0 { denied = renameDenial(from: from, name: name, to: to, newName: newName, flags: flags) }
        guard denied == 0 else { return request.reply(error: denied) }
        let error = Backing.check(clinux_renameat2(from.descriptor, name.pointer, to.descriptor, newName.pointer, flags))
        guard error == 0 else { return request.reply(error: error) }
        noteMoved(name: newName, in: to)
        if flags & RENAME_EXCHANGE != 0 { noteMoved(name: name, in: from) }
        request.replySuccess()
    }

    private func renameDenial(from: Node, name: FileName, to: Node, newName: FileName, flags: UInt32) -> Int32 {
        let source = from.zone.child(named: name.bytes)
        let destination = to.zone.child(named: newName.bytes)
        if flags & RENAME_EXCHANGE != 0 {
            return Policy.exchange(source, in: from.zone, with: destination, in: to.zone)
        }
        var existing = stat()
        let replacing = flags & RENAME_NOREPLACE == 0
            && fstatat(to.descriptor, newName.pointer, &existing, AT_SYMLINK_NOFOLLOW) == 0
        return Policy.rename(source, to: destination, in: to.zone, replacing: replacing)
    }

    /// Keeps the node of a renamed item in step with its new place. When its zone changed (out of
    /// the Inbox), the kernel's cached attributes showed the old zone's mode bits: they are dropped.
    private func noteMoved(name: FileName, in parent: Node) {
        var attributes = stat()
        guard fstatat(parent.descriptor, name.pointer, &attributes, AT_SYMLINK_NOFOLLOW) == 0 else { return }
        let changed = nodes.didMove(BackingKey(attributes), to: parent, name: name, zone: parent.zone.child(named: name.bytes))
        for node in changed {
            kernel?.invalidateInode(nodes.inodeNumber(of: node), offset: -1, length: 0)
        }
    }

    // MARK: Files

    /// Whether open flags ask to change the file.
    @inline(__always)
    private func opensForWriting(_ flags: Int32) -> Bool {
        flags & O_ACCMODE != O_RDONLY || flags & O_TRUNC != 0
    }

    public func open(_ request: FuseRequest, inode: InodeNumber, file: FileInfo) {
        let node = nodes.node(inode)
        if opensForWriting(file.flags) {
            let denied = Policy.write(node.zone)
            guard denied == 0 else { return request.reply(error: denied) }
        }
        guard sealAllowsReading(node) else { return request.reply(error: EIO) }
        // The O_PATH descriptor names a non-symlink here: the kernel resolved links before opening.
        let flags = (file.flags & ~(O_NOFOLLOW | O_CREAT | O_EXCL)) | O_CLOEXEC
        let descriptor = Backing.withProcPath(node.descriptor) { Glibc.open($0, flags) }
        guard descriptor >= 0 else { return request.reply(error: errno) }
        Handle.store(OpenFile(descriptor: descriptor, node: node), in: file)
        request.reply(opened: file)
    }

    public func create(_ request: FuseRequest, parent: InodeNumber, name: FileName, mode: mode_t, file: FileInfo) {
        let parentNode = nodes.node(parent)
        let denied = creationError(in: parentNode, name: name)
        guard denied == 0 else { return request.reply(error: denied) }
        let flags = (file.flags | O_CREAT | O_NOFOLLOW | O_CLOEXEC) & ~O_PATH
        let descriptor = openat(parentNode.descriptor, name.pointer, flags, mode)
        guard descriptor >= 0 else { return request.reply(error: errno) }
        adoptOwnership(of: name, in: parentNode, by: request.caller)
        var entry = fuse_entry_param()
        let error = lookupEntry(parent: parentNode, name: name, entry: &entry)
        guard error == 0 else {
            close(descriptor)
            return request.reply(error: error)
        }
        Handle.store(OpenFile(descriptor: descriptor, node: nodes.node(entry.ino)), in: file)
        request.reply(created: &entry, file: file)
    }

    public func read(_ request: FuseRequest, inode: InodeNumber, size: Int, offset: off_t, file: FileInfo) {
        request.reply(dataFrom: Handle.get(file, as: OpenFile.self).descriptor, size: size, offset: offset)
    }

    public func write(_ request: FuseRequest, inode: InodeNumber, data: UnsafeMutablePointer<fuse_bufvec>,
                      offset: off_t, file: FileInfo) {
        let written = cfuse_write_buf_to_fd(data, Handle.get(file, as: OpenFile.self).descriptor, offset)
        written < 0 ? request.reply(error: Int32(-written)) : request.reply(written: written)
    }

    public func flush(_ request: FuseRequest, inode: InodeNumber, file: FileInfo) {
        request.replySuccess()
    }

    public func release(_ request: FuseRequest, inode: InodeNumber, file: FileInfo) {
        Handle.release(file, as: OpenFile.self)
        request.replySuccess()
    }

    public func fsync(_ request: FuseRequest, inode: InodeNumber, dataOnly: Bool, file: FileInfo) {
        let descriptor = Handle.get(file, as: OpenFile.self).descriptor
        request.reply(error: Backing.check(dataOnly ? fdatasync(descriptor) : Glibc.fsync(descriptor)))
    }

    public func fallocate(_ request: FuseRequest, inode: InodeNumber, mode: Int32, offset: off_t, length: off_t,
                          file: FileInfo) {
        let denied = Policy.write(nodes.node(inode).zone)
        guard denied == 0 else { return request.reply(error: denied) }
        let descriptor = Handle.get(file, as: OpenFile.self).descriptor
        request.reply(error: Backing.check(clinux_fallocate(descriptor, mode, offset, length)))
    }

    public func lseek(_ request: FuseRequest, inode: InodeNumber, offset: off_t, whence: Int32, file: FileInfo) {
        let result = Glibc.lseek(Handle.get(file, as: OpenFile.self).descriptor, offset, whence)
        result < 0 ? request.reply(error: errno) : request.reply(offset: result)
    }

    /// False for a bundle file that changed since it was sealed: it is not served as if intact.
    @inline(__always)
    private func sealAllowsReading(_ node: Node) -> Bool {
        guard node.zone == .bundle, !brokenSeals.isEmpty else { return true }
        return nodes.withPlace(of: node) { names, containerName in
            // names: from the bundle directory down to the node.
            guard let app = containerName.map({ String(decoding: $0, as: UTF8.self) }) ?? rootApp,
                  let report = brokenSeals[app] else { return true }
            let relative = names.dropFirst().map { String(decoding: $0, as: UTF8.self) }.joined(separator: "/")
            return report.allowsReading(relative)
        }
    }

    // MARK: Directories

    public func opendir(_ request: FuseRequest, inode: InodeNumber, file: FileInfo) {
        let descriptor = openat(nodes.node(inode).descriptor, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard descriptor >= 0 else { return request.reply(error: errno) }
        guard let stream = fdopendir(descriptor) else {
            let error = errno
            close(descriptor)
            return request.reply(error: error)
        }
        Handle.store(DirectoryStream(stream: stream), in: file)
        request.reply(opened: file)
    }

    public func readdir(_ request: FuseRequest, inode: InodeNumber, size: Int, offset: off_t, file: FileInfo,
                        plus: Bool) {
        let directory = Handle.get(file, as: DirectoryStream.self)
        let parent = nodes.node(inode)
        if offset != directory.offset {
            seekdir(directory.stream, Int(offset))
            directory.pending = nil
            directory.offset = offset
        }
        var buffer = DirectoryBuffer(for: request, size: size)
        while true {
            if directory.pending == nil {
                errno = 0
                directory.pending = Glibc.readdir(directory.stream)
                guard directory.pending != nil else {
                    if errno != 0, buffer.used == 0 { return request.reply(error: errno) }
                    break
                }
            }
            let entry = directory.pending!
            let added = withUnsafePointer(to: &entry.pointee.d_name) {
                $0.withMemoryRebound(to: CChar.self, capacity: 256) { name in
                    addEntry(name, ino: entry.pointee.d_ino, type: entry.pointee.d_type,
                             nextOffset: entry.pointee.d_off, parent: parent, plus: plus, to: &buffer)
                }
            }
            guard added else { break }
            directory.pending = nil
            directory.offset = entry.pointee.d_off
        }
        buffer.send()
    }

    /// Adds one entry to a listing; for readdirplus it is also a lookup. False when it does not fit.
    private func addEntry(_ name: UnsafePointer<CChar>, ino: ino_t, type: UInt8, nextOffset: off_t, parent: Node,
                          plus: Bool, to buffer: inout DirectoryBuffer) -> Bool {
        let fileName = FileName(name)
        guard buffer.fits(nameLength: fileName.length, plus: plus) else { return false }
        guard plus else {
            var attributes = stat()
            attributes.st_ino = ino
            attributes.st_mode = mode_t(type) << 12
            return buffer.add(name: name, attributes: &attributes, nextOffset: nextOffset)
        }
        var entry = fuse_entry_param()
        if fileName.isDotOrDotDot {
            entry.attr.st_ino = ino
            entry.attr.st_mode = mode_t(type) << 12
        } else if lookupEntry(parent: parent, name: fileName, entry: &entry) != 0 {
            // Gone since it was listed: leave it out.
            return true
        }
        return buffer.add(name: name, entry: &entry, nextOffset: nextOffset)
    }

    public func releasedir(_ request: FuseRequest, inode: InodeNumber, file: FileInfo) {
        Handle.release(file, as: DirectoryStream.self)
        request.replySuccess()
    }

    public func fsyncdir(_ request: FuseRequest, inode: InodeNumber, dataOnly: Bool, file: FileInfo) {
        let descriptor = dirfd(Handle.get(file, as: DirectoryStream.self).stream)
        request.reply(error: Backing.check(dataOnly ? fdatasync(descriptor) : Glibc.fsync(descriptor)))
    }

    public func statfs(_ request: FuseRequest, inode: InodeNumber) {
        var statistics = statvfs()
        guard fstatvfs(nodes.node(inode).descriptor, &statistics) == 0 else { return request.reply(error: errno) }
        request.reply(statistics: &statistics)
    }

    public func access(_ request: FuseRequest, inode: InodeNumber, mask: Int32) {
        let node = nodes.node(inode)
        if mask & W_OK != 0 {
            let denied = node.isDirectory ? Policy.create(in: node.zone) : Policy.write(node.zone)
            guard denied == 0 else { return request.reply(error: denied) }
        }
        request.reply(error: Backing.check(Backing.withProcPath(node.descriptor) { Glibc.access($0, mask) }))
    }

    // MARK: Extended attributes

    public func setxattr(_ request: FuseRequest, inode: InodeNumber, name: UnsafePointer<CChar>,
                         value: UnsafeRawBufferPointer, flags: Int32) {
        let node = nodes.node(inode)
        let denied = Policy.changeMetadata(node.zone)
        guard denied == 0 else { return request.reply(error: denied) }
        // No race-free way to reach a symlink's own attributes; Linux allows user ones on none anyway.
        guard !node.isSymlink else { return request.reply(error: EPERM) }
        request.reply(error: Backing.check(Backing.withProcPath(node.descriptor) {
            clinux_setxattr($0, name, value.baseAddress, value.count, flags)
        }))
    }

    public func getxattr(_ request: FuseRequest, inode: InodeNumber, name: UnsafePointer<CChar>, size: Int) {
        let node = nodes.node(inode)
        guard !node.isSymlink else { return request.reply(error: ENODATA) }
        replyAttributeData(request, size: size) { buffer, capacity in
            Backing.withProcPath(node.descriptor) { clinux_getxattr($0, name, buffer, capacity) }
        }
    }

    public func listxattr(_ request: FuseRequest, inode: InodeNumber, size: Int) {
        let node = nodes.node(inode)
        guard !node.isSymlink else {
            return size == 0 ? request.reply(extendedAttributeSize: 0) : request.reply(buffer: UnsafeRawBufferPointer(start: nil, count: 0))
        }
        replyAttributeData(request, size: size) { buffer, capacity in
            Backing.withProcPath(node.descriptor) { clinux_listxattr($0, buffer?.assumingMemoryBound(to: CChar.self), capacity) }
        }
    }

    /// The two shapes of an xattr answer: the size alone when asked with size 0, else the bytes.
    private func replyAttributeData(_ request: FuseRequest, size: Int,
                                    _ fetch: (UnsafeMutableRawPointer?, Int) -> Int) {
        guard size > 0 else {
            let needed = fetch(nil, 0)
            return needed < 0 ? request.reply(error: errno) : request.reply(extendedAttributeSize: needed)
        }
        withUnsafeTemporaryAllocation(byteCount: size, alignment: 8) { buffer in
            let count = fetch(buffer.baseAddress, size)
            count < 0 ? request.reply(error: errno)
                : request.reply(buffer: UnsafeRawBufferPointer(rebasing: buffer[0..<count]))
        }
    }

    public func removexattr(_ request: FuseRequest, inode: InodeNumber, name: UnsafePointer<CChar>) {
        let node = nodes.node(inode)
        let denied = Policy.changeMetadata(node.zone)
        guard denied == 0 else { return request.reply(error: denied) }
        guard !node.isSymlink else { return request.reply(error: EPERM) }
        request.reply(error: Backing.check(Backing.withProcPath(node.descriptor) { clinux_removexattr($0, name) }))
    }
}
