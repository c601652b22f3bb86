import CFuse
import Synchronization

/// A filesystem served through libfuse's low-level API: one method per operation, as in
/// libfuse's `fuse_lowlevel_ops`. Each method must answer its request exactly once, now or later
/// from another thread. Pointers (names, buffers, file info) are valid only during the call:
/// copy what an answer given later needs.
///
/// Operations left out answer ENOSYS; locks are left to the kernel (see `FuseSession`).
public protocol LowLevelFileSystem: AnyObject {
    /// Called once the kernel connection is up; set capabilities in `connection.want` here.
    func initialize(connection: UnsafeMutablePointer<fuse_conn_info>)
    func destroy()

    func lookup(_ request: FuseRequest, parent: InodeNumber, name: FileName)
    /// The kernel dropped `count` references to `inode`. Takes no answer.
    func forget(_ inode: InodeNumber, count: UInt64)
    func getattr(_ request: FuseRequest, inode: InodeNumber, file: FileInfo?)
    func setattr(_ request: FuseRequest, inode: InodeNumber, attributes: UnsafeMutablePointer<stat>,
                 fields: AttributeFields, file: FileInfo?)
    func readlink(_ request: FuseRequest, inode: InodeNumber)
    func mknod(_ request: FuseRequest, parent: InodeNumber, name: FileName, mode: mode_t, device: dev_t)
    func mkdir(_ request: FuseRequest, parent: InodeNumber, name: FileName, mode: mode_t)
    func unlink(_ request: FuseRequest, parent: InodeNumber, name: FileName)
    func rmdir(_ request: FuseRequest, parent: InodeNumber, name: FileName)
    func symlink(_ request: FuseRequest, target: UnsafePointer<CChar>, parent: InodeNumber, name: FileName)
    func rename(_ request: FuseRequest, parent: InodeNumber, name: FileName,
                newParent: InodeNumber, newName: FileName, flags: UInt32)
    func link(_ request: FuseRequest, inode: InodeNumber, newParent: InodeNumber, newName: FileName)
    func open(_ request: FuseRequest, inode: InodeNumber, file: FileInfo)
    func read(_ request: FuseRequest, inode: InodeNumber, size: Int, offset: off_t, file: FileInfo)
    func write(_ request: FuseRequest, inode: InodeNumber, data: UnsafeMutablePointer<fuse_bufvec>,
               offset: off_t, file: FileInfo)
    func flush(_ request: FuseRequest, inode: InodeNumber, file: FileInfo)
    func release(_ request: FuseRequest, inode: InodeNumber, file: FileInfo)
    func fsync(_ request: FuseRequest, inode: InodeNumber, dataOnly: Bool, file: FileInfo)
    func opendir(_ request: FuseRequest, inode: InodeNumber, file: FileInfo)
    /// `plus` asks for readdirplus: each entry with its attributes, counted as a lookup.
    func readdir(_ request: FuseRequest, inode: InodeNumber, size: Int, offset: off_t, file: FileInfo, plus: Bool)
    func releasedir(_ request: FuseRequest, inode: InodeNumber, file: FileInfo)
    func fsyncdir(_ request: FuseRequest, inode: InodeNumber, dataOnly: Bool, file: FileInfo)
    func statfs(_ request: FuseRequest, inode: InodeNumber)
    func setxattr(_ request: FuseRequest, inode: InodeNumber, name: UnsafePointer<CChar>,
                  value: UnsafeRawBufferPointer, flags: Int32)
    func getxattr(_ request: FuseRequest, inode: InodeNumber, name: UnsafePointer<CChar>, size: Int)
    func listxattr(_ request: FuseRequest, inode: InodeNumber, size: Int)
    func removexattr(_ request: FuseRequest, inode: InodeNumber, name: UnsafePointer<CChar>)
    func access(_ request: FuseRequest, inode: InodeNumber, mask: Int32)
    func create(_ request: FuseRequest, parent: InodeNumber, name: FileName, mode: mode_t, file: FileInfo)
    /// 0 if the caller may reach `inode` at all, else the error to answer. Asked before every
    /// request that names a node by its inode or its parent's, and before reading a directory;
    /// not for requests on an open file (read, write, fstat, flush, fsync, release), which its
    /// open was asked for.
    func admit(_ request: FuseRequest, inode: InodeNumber) -> Int32
    /// Makes an unnamed file in `parent` and opens it (`open(O_TMPFILE)`), answering as `create`
    /// does; a `link` names it later. ENOSYS makes the kernel answer EOPNOTSUPP from then on.
    func tmpfile(_ request: FuseRequest, parent: InodeNumber, mode: mode_t, file: FileInfo)
    func fallocate(_ request: FuseRequest, inode: InodeNumber, mode: Int32, offset: off_t, length: off_t,
                   file: FileInfo)
    func lseek(_ request: FuseRequest, inode: InodeNumber, offset: off_t, whence: Int32, file: FileInfo)
}

/// Holds the filesystem for the C trampolines, which find it through the session's user data.
final class FileSystemBox {
    let fileSystem: any LowLevelFileSystem
    /// Set while the session's next reply is the one to the kernel's INIT, to be amended: shared
    /// mappings of direct-I/O files, passthrough if offered (`FuseSession.offerPassthrough`), and
    /// the daemon's clearing of set-ID bits if taken over.
    let amendsInitReply = Atomic<Bool>(true)
    let offersPassthrough = Atomic<Bool>(false)
    /// `FuseSession.takeOverSetIDClearing`.
    let clearsSetID = Atomic<Bool>(false)
    /// `FuseSession.offerIOUring`: the entries of each queue, 0 when not offered.
    let ringDepth = Atomic<UInt32>(0)
    /// The session, for the ring started once the kernel took the INIT answer (bit patterns of
    /// `fuse_session *` and `cfuse_ring *`, 0 for none).
    let session = Atomic<UInt>(0)
    let ring = Atomic<UInt>(0)
    init(_ fileSystem: any LowLevelFileSystem) { self.fileSystem = fileSystem }
}

@inline(__always)
private func fileSystem(_ request: fuse_req_t?) -> any LowLevelFileSystem {
    Unmanaged<FileSystemBox>.fromOpaque(fuse_req_userdata(request)!).takeUnretainedValue().fileSystem
}

@inline(__always)
private func optionalFile(_ info: UnsafeMutablePointer<fuse_file_info>?) -> FileInfo? {
    info.map(FileInfo.init)
}

extension LowLevelFileSystem {
    public func admit(_ request: FuseRequest, inode: InodeNumber) -> Int32 { 0 }
}

/// Whether the filesystem admits the caller to `inode` (and `other`); if not, answers the request.
@inline(__always)
private func admitted(_ request: fuse_req_t?, _ inode: fuse_ino_t, _ other: fuse_ino_t? = nil) -> Bool {
    let fs = fileSystem(request)
    var error = fs.admit(FuseRequest(request!), inode: inode)
    if error == 0, let other { error = fs.admit(FuseRequest(request!), inode: other) }
    if error == 0 { return true }
    fuse_reply_err(request, error)
    return false
}

/// The operations table handed to `fuse_session_new`: C trampolines into the Swift filesystem.
func makeOperations() -> fuse_lowlevel_ops {
    var ops = fuse_lowlevel_ops()
    ops.`init` = { userdata, connection in
        Unmanaged<FileSystemBox>.fromOpaque(userdata!).takeUnretainedValue().fileSystem.initialize(connection: connection!)
    }
    ops.destroy = { userdata in
        Unmanaged<FileSystemBox>.fromOpaque(userdata!).takeUnretainedValue().fileSystem.destroy()
    }
    ops.lookup = { req, parent, name in
        guard admitted(req, parent) else { return }
        fileSystem(req).lookup(FuseRequest(req!), parent: parent, name: FileName(name!))
    }
    ops.forget = { req, inode, count in
        fileSystem(req).forget(inode, count: count)
        fuse_reply_none(req)
    }
    ops.forget_multi = { req, count, forgets in
        let fs = fileSystem(req)
        for index in 0..<count {
            fs.forget(forgets![index].ino, count: forgets![index].nlookup)
        }
        fuse_reply_none(req)
    }
    ops.getattr = { req, inode, info in
        // fstat of an open file is asked with its handle, as a read is.
        guard info != nil || admitted(req, inode) else { return }
        fileSystem(req).getattr(FuseRequest(req!), inode: inode, file: optionalFile(info))
    }
    ops.setattr = { req, inode, attributes, fields, info in
        guard admitted(req, inode) else { return }
        fileSystem(req).setattr(FuseRequest(req!), inode: inode, attributes: attributes!,
                                fields: AttributeFields(rawValue: fields), file: optionalFile(info))
    }
    ops.readlink = { req, inode in
        guard admitted(req, inode) else { return }
        fileSystem(req).readlink(FuseRequest(req!), inode: inode)
    }
    ops.mknod = { req, parent, name, mode, device in
        guard admitted(req, parent) else { return }
        fileSystem(req).mknod(FuseRequest(req!), parent: parent, name: FileName(name!), mode: mode, device: device)
    }
    ops.mkdir = { req, parent, name, mode in
        guard admitted(req, parent) else { return }
        fileSystem(req).mkdir(FuseRequest(req!), parent: parent, name: FileName(name!), mode: mode)
    }
    ops.unlink = { req, parent, name in
        guard admitted(req, parent) else { return }
        fileSystem(req).unlink(FuseRequest(req!), parent: parent, name: FileName(name!))
    }
    ops.rmdir = { req, parent, name in
        guard admitted(req, parent) else { return }
        fileSystem(req).rmdir(FuseRequest(req!), parent: parent, name: FileName(name!))
    }
    ops.symlink = { req, target, parent, name in
        guard admitted(req, parent) else { return }
        fileSystem(req).symlink(FuseRequest(req!), target: target!, parent: parent, name: FileName(name!))
    }
    ops.rename = { req, parent, name, newParent, newName, flags in
        guard admitted(req, parent, newParent) else { return }
        fileSystem(req).rename(FuseRequest(req!), parent: parent, name: FileName(name!),
                               newParent: newParent, newName: FileName(newName!), flags: flags)
    }
    ops.link = { req, inode, newParent, newName in
        guard admitted(req, inode, newParent) else { return }
        fileSystem(req).link(FuseRequest(req!), inode: inode, newParent: newParent, newName: FileName(newName!))
    }
    ops.open = { req, inode, info in
        guard admitted(req, inode) else { return }
        fileSystem(req).open(FuseRequest(req!), inode: inode, file: FileInfo(info!))
    }
    ops.read = { req, inode, size, offset, info in
        fileSystem(req).read(FuseRequest(req!), inode: inode, size: size, offset: offset, file: FileInfo(info!))
    }
    ops.write_buf = { req, inode, data, offset, info in
        fileSystem(req).write(FuseRequest(req!), inode: inode, data: data!, offset: offset, file: FileInfo(info!))
    }
    ops.flush = { req, inode, info in
        fileSystem(req).flush(FuseRequest(req!), inode: inode, file: FileInfo(info!))
    }
    ops.release = { req, inode, info in
        fileSystem(req).release(FuseRequest(req!), inode: inode, file: FileInfo(info!))
    }
    ops.fsync = { req, inode, dataOnly, info in
        fileSystem(req).fsync(FuseRequest(req!), inode: inode, dataOnly: dataOnly != 0, file: FileInfo(info!))
    }
    ops.opendir = { req, inode, info in
        guard admitted(req, inode) else { return }
        fileSystem(req).opendir(FuseRequest(req!), inode: inode, file: FileInfo(info!))
    }
    ops.readdir = { req, inode, size, offset, info in
        guard admitted(req, inode) else { return }
        fileSystem(req).readdir(FuseRequest(req!), inode: inode, size: size, offset: offset,
                                file: FileInfo(info!), plus: false)
    }
    ops.readdirplus = { req, inode, size, offset, info in
        guard admitted(req, inode) else { return }
        fileSystem(req).readdir(FuseRequest(req!), inode: inode, size: size, offset: offset,
                                file: FileInfo(info!), plus: true)
    }
    ops.releasedir = { req, inode, info in
        fileSystem(req).releasedir(FuseRequest(req!), inode: inode, file: FileInfo(info!))
    }
    ops.fsyncdir = { req, inode, dataOnly, info in
        fileSystem(req).fsyncdir(FuseRequest(req!), inode: inode, dataOnly: dataOnly != 0, file: FileInfo(info!))
    }
    ops.statfs = { req, inode in fileSystem(req).statfs(FuseRequest(req!), inode: inode) }
    ops.setxattr = { req, inode, name, value, size, flags in
        guard admitted(req, inode) else { return }
        fileSystem(req).setxattr(FuseRequest(req!), inode: inode, name: name!,
                                 value: UnsafeRawBufferPointer(start: value, count: size), flags: flags)
    }
    ops.getxattr = { req, inode, name, size in
        guard admitted(req, inode) else { return }
        fileSystem(req).getxattr(FuseRequest(req!), inode: inode, name: name!, size: size)
    }
    ops.listxattr = { req, inode, size in
        guard admitted(req, inode) else { return }
        fileSystem(req).listxattr(FuseRequest(req!), inode: inode, size: size)
    }
    ops.removexattr = { req, inode, name in
        guard admitted(req, inode) else { return }
        fileSystem(req).removexattr(FuseRequest(req!), inode: inode, name: name!)
    }
    ops.access = { req, inode, mask in
        guard admitted(req, inode) else { return }
        fileSystem(req).access(FuseRequest(req!), inode: inode, mask: mask)
    }
    ops.create = { req, parent, name, mode, info in
        guard admitted(req, parent) else { return }
        // "/": a FUSE_TMPFILE that cfuse_io_read handed on as a creation.
        if name![0] == 0x2F, name![1] == 0 {
            return fileSystem(req).tmpfile(FuseRequest(req!), parent: parent, mode: mode, file: FileInfo(info!))
        }
        fileSystem(req).create(FuseRequest(req!), parent: parent, name: FileName(name!), mode: mode,
                               file: FileInfo(info!))
    }
    ops.fallocate = { req, inode, mode, offset, length, info in
        fileSystem(req).fallocate(FuseRequest(req!), inode: inode, mode: mode, offset: offset, length: length,
                                  file: FileInfo(info!))
    }
    ops.lseek = { req, inode, offset, whence, info in
        fileSystem(req).lseek(FuseRequest(req!), inode: inode, offset: offset, whence: whence, file: FileInfo(info!))
    }
    return ops
}
