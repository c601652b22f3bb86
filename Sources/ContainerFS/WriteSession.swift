import CLinux
import Containers
import Glibc
import Synchronization

/// A file's writes between the first open for writing and the last close, made to a shadow copy
/// and published by renaming the shadow over the file (container-semantics.md, section 4).
/// Guarded by its node's `session` lock.
final class WriteSession {
    /// The shadow, open for reading and writing; -1 between a publish and the next write.
    var shadow: Int32 = -1
    var shadowName: [CChar] = []
    /// Open write handles sharing the session.
    var writers = 0
    /// Whether the shadow holds writes not yet published.
    var dirty = false
    /// The error of a write that failed (a full disk): the shadow is then never published, and
    /// the writer's close reports it. The previous version stays.
    var failure: Int32 = 0
    /// The coordinated write, held until the first publish (presenters then hear "did change").
    var access: CoordinatedAccess?
    /// The lock owner (the writing process's file table) of the last write: its close publishes.
    /// Closes by others, such as a forked child dropping an inherited descriptor, do not.
    var lastWriter: UInt64 = 0
}

/// Makes, publishes and discards shadows in the daemon's own directory in the store's work space.
final class Shadows: @unchecked Sendable {
    /// An open directory on the store's filesystem (renames into the containers stay atomic).
    let directory: Int32
    private let counter = Atomic<UInt64>(0)

    init(directory: Int32) { self.directory = directory }

    /// Gives `session` a shadow of `node`'s published file: empty when `truncated`, else a copy
    /// (a reflink where the filesystem has them). The shadow keeps the file's mode, owner and xattrs.
    func prepare(_ session: WriteSession, of node: Node, truncated: Bool) -> Int32 {
        guard session.shadow < 0 else { return 0 }
        let number = counter.wrappingAdd(1, ordering: .relaxed).newValue
        var name = Array("shadow-\(number)".utf8CString)
        let shadow = openat(directory, &name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard shadow >= 0 else { return errno }
        let error = fill(shadow, from: node, copyingData: !truncated)
        guard error == 0 else {
            close(shadow)
            unlinkat(directory, &name, 0)
            return error
        }
        session.shadow = shadow
        session.shadowName = name
        return 0
    }

    private func fill(_ shadow: Int32, from node: Node, copyingData: Bool) -> Int32 {
        let original = node.withProcPath { open($0, O_RDONLY | O_CLOEXEC) }
        guard original >= 0 else { return errno }
        defer { close(original) }
        var attributes = stat()
        guard fstat(original, &attributes) == 0 else { return errno }
        if copyingData, attributes.st_size > 0, clinux_ficlone(shadow, original) != 0 {
            let error = copyData(from: original, to: shadow)
            if error != 0 { return error }
        }
        if fchmod(shadow, attributes.st_mode & 0o7777) != 0 { return errno }
        if geteuid() == 0, fchown(shadow, attributes.st_uid, attributes.st_gid) != 0 { return errno }
        return copyExtendedAttributes(from: original, to: shadow)
    }

    private func copyData(from source: Int32, to destination: Int32) -> Int32 {
        while true {
            let copied = clinux_copy_file_range(source, nil, destination, nil, 1 << 30, 0)
            if copied > 0 { continue }
            if copied == 0 { return 0 }
            if errno == EINTR { continue }
            return errno
        }
    }

    private func copyExtendedAttributes(from source: Int32, to destination: Int32) -> Int32 {
        let size = clinux_flistxattr(source, nil, 0)
        guard size > 0 else { return size < 0 && errno != ENOTSUP ? errno : 0 }
        var names = [CChar](repeating: 0, count: size)
        let listed = clinux_flistxattr(source, &names, size)
        guard listed >= 0 else { return errno }
        var value = [UInt8](repeating: 0, count: 65536)
        var start = 0
        while start < listed {
            let error = names.withUnsafeBufferPointer { buffer -> Int32 in
                let name = buffer.baseAddress! + start
                let length = clinux_fgetxattr(source, name, &value, value.count)
                guard length >= 0 else { return errno }
                return clinux_fsetxattr(destination, name, value, length, 0) == 0 ? 0 : errno
            }
            if error != 0 { return error }
            start += strlen(names.withUnsafeBufferPointer { $0.baseAddress! + start }) + 1
        }
        return 0
    }

    /// Renames the shadow over the file, so that every later open sees all of it at once. The node
    /// keeps its exposed inode number; its backing file becomes the shadow.
    /// When the file was deleted or replaced meanwhile, the writes go where an unlinked file's go.
    func publish(_ session: WriteSession, of node: Node, in nodes: NodeTable, durably: Bool) -> Int32 {
        guard session.shadow >= 0 else { return 0 }
        defer { discard(session) }
        guard session.failure == 0 else {
            let failure = session.failure
            session.failure = 0
            return failure
        }
        guard session.dirty else { return 0 }
        session.dirty = false
        if durably, fsync(session.shadow) != 0 { return errno }
        guard let (parent, name) = nodes.place(of: node) else { return 0 }
        var published = stat()
        guard fstat(session.shadow, &published) == 0 else { return errno }
        let renamed = Backing.withCName(name) { cName -> Bool in
            guard Backing.key(of: cName, in: parent.descriptor) == node.key else { return false }
            let previous = nodes.republish(node, as: published)
            guard renameat(directory, session.shadowName, parent.descriptor, cName) == 0 else {
                nodes.abandonRepublish(node, previous: previous)
                return false
            }
            nodes.finishRepublish(node, previous: previous)
            return true
        }
        guard renamed else { return 0 }
        session.shadowName = []
        if durably { _ = fsync(parent.descriptor) }
        return 0
    }

    /// Closes the shadow and removes it if it was not published.
    func discard(_ session: WriteSession) {
        if session.shadow >= 0 { close(session.shadow) }
        if !session.shadowName.isEmpty { unlinkat(directory, session.shadowName, 0) }
        session.shadow = -1
        session.shadowName = []
        session.dirty = false
    }

    /// Marks the session failed, so that nothing of it is published.
    func fail(_ session: WriteSession, with error: Int32) {
        session.failure = error
        session.dirty = false
    }
}
