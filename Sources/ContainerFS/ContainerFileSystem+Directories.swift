import CFuse
import CLinux
import Containers
import FUSELowLevel
import Glibc

// Directories, and the calls that are not about one file.
extension ContainerFileSystem {
    public func opendir(_ request: FuseRequest, inode: InodeNumber, file: FileInfo) {
        guard let charge = nodes.chargeHandle(for: request.caller.uid) else { return request.reply(error: EMFILE) }
        let descriptor = openat(nodes.node(inode).descriptor, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard descriptor >= 0 else { return request.reply(error: errno) }
        guard let stream = fdopendir(descriptor) else {
            let error = errno
            close(descriptor)
            return request.reply(error: error)
        }
        Handle.store(DirectoryStream(stream: stream, charge: charge), in: file)
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
                             nextOffset: entry.pointee.d_off, parent: parent, plus: plus, for: request.caller.uid,
                             to: &buffer)
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
                          plus: Bool, for uid: uid_t, to buffer: inout DirectoryBuffer) -> Bool {
        let fileName = FileName(name)
        guard buffer.fits(nameLength: fileName.length, plus: plus) else { return false }
        guard plus else {
            var attributes = stat()
            // Files replaced by a publish keep the number they had.
            attributes.st_ino = ino_t(nodes.exposedInode(device: parent.key.device, inode: UInt64(ino)))
            attributes.st_mode = mode_t(type) << 12
            return buffer.add(name: name, attributes: &attributes, nextOffset: nextOffset)
        }
        var entry = fuse_entry_param()
        let error = fileName.isDotOrDotDot ? 0 : lookupEntry(parent: parent, name: fileName, entry: &entry, for: uid)
        if fileName.isDotOrDotDot || error == EMFILE {
            // Listed without a lookup (node id 0; past the user's share of descriptors too): the
            // kernel keeps no inode for it.
            entry = fuse_entry_param()
            entry.attr.st_ino = ino
            entry.attr.st_mode = mode_t(type) << 12
        } else if error != 0 {
            // Gone since it was listed: leave it out.
            return true
        }
        return buffer.add(name: name, entry: &entry, nextOffset: nextOffset)
    }

    public func releasedir(_ request: FuseRequest, inode: InodeNumber, file: FileInfo) {
        Handle.take(file, as: DirectoryStream.self)
        request.replySuccess()
    }

    public func fsyncdir(_ request: FuseRequest, inode: InodeNumber, dataOnly: Bool, file: FileInfo) {
        let descriptor = dirfd(Handle.get(file, as: DirectoryStream.self).stream)
        request.reply(error: shadows.renameCommits.syncing {
            Backing.check(dataOnly ? fdatasync(descriptor) : Glibc.fsync(descriptor))
        })
    }

    public func statfs(_ request: FuseRequest, inode: InodeNumber) {
        var statistics = statvfs()
        guard nodes.node(inode).withDescriptor({ fstatvfs($0, &statistics) }) == 0 else { return request.reply(error: errno) }
        request.reply(statistics: &statistics)
    }

    public func access(_ request: FuseRequest, inode: InodeNumber, mask: Int32) {
        let node = nodes.node(inode)
        if mask & W_OK != 0 {
            let denied = node.isDirectory ? Policy.create(in: node.zone) : Policy.write(node.zone)
            guard denied == 0 else { return request.reply(error: denied) }
        }
        request.reply(error: Backing.check(node.withProcPath { Glibc.access($0, mask) }))
    }
}
