import Foundation

/// An open directory, reached without following symlinks; closed when released.
///
/// Everything that works on a container's backing files goes through these with `*at()` calls,
/// so a symlink planted in a container is never followed by the tools (docs/policy.md).
public final class DirectoryHandle: Sendable {
    public let fd: Int32
    /// The directory's path, for messages.
    public let path: String

    init(path: String) throws {
        let fd = Glibc.open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0 else { throw posixError("open", path) }
        self.fd = fd
        self.path = path
    }

    /// The subdirectory `name`, which must be a real directory (not a symlink to one).
    convenience init(in parent: DirectoryHandle, _ name: String) throws {
        guard let fd = DirectoryHandle.openDirectory(name, in: parent) else {
            throw posixError("open", parent.path + "/" + name)
        }
        self.init(adopting: fd, path: parent.path + "/" + name)
    }

    /// The subdirectory `name`, or nil when it has gone.
    static func ifPresent(in parent: DirectoryHandle, _ name: String) throws -> DirectoryHandle? {
        guard let fd = openDirectory(name, in: parent) else {
            if errno == ENOENT { return nil }
            throw posixError("open", parent.path + "/" + name)
        }
        return DirectoryHandle(adopting: fd, path: parent.path + "/" + name)
    }

    /// The subdirectory `name`, made with `mode` if it was missing (`made`); never a link.
    static func making(_ name: String, in parent: DirectoryHandle, mode: mode_t) throws -> (directory: DirectoryHandle, made: Bool) {
        let made = mkdirat(parent.fd, name, mode) == 0
        guard made || errno == EEXIST else { throw posixError("mkdir", parent.path + "/" + name) }
        return (try DirectoryHandle(in: parent, name), made)
    }

    private static func openDirectory(_ name: String, in parent: DirectoryHandle) -> Int32? {
        let fd = openat(parent.fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        return fd >= 0 ? fd : nil
    }

    private init(adopting fd: Int32, path: String) {
        self.fd = fd
        self.path = path
    }

    deinit { close(fd) }

    /// Descends `relativePath` ("a/b/c") one real directory at a time.
    func descend(_ relativePath: String) throws -> DirectoryHandle {
        var directory = self
        for component in relativePath.split(separator: "/") {
            directory = try DirectoryHandle(in: directory, String(component))
        }
        return directory
    }

    /// The names in the directory at `path`, sorted, or none if there is no directory there. A
    /// listing that fails throws: taken for an empty one, it would hide what is there.
    public static func names(ifPresentAt path: String) throws -> [String] {
        let fd = Glibc.open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0 else {
            if errno == ENOENT { return [] }
            throw posixError("open", path)
        }
        return try DirectoryHandle(adopting: fd, path: path).names()
    }

    /// The names in the directory, sorted, without `.` and `..`.
    func names() throws -> [String] {
        switch Self.names(of: fd) {
        case .success(let names): return names.sorted()
        case .failure(let error): throw posixError("listing", path, error.code.rawValue)
        }
    }

    /// The names in the directory open as `fd`, without `.` and `..`, or the errno of the call
    /// that failed.
    static func names(of fd: Int32) -> Result<[String], POSIXError> {
        let failure = { POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
        let listFD = dup(fd)
        guard listFD >= 0, let dir = fdopendir(listFD) else {
            let error = failure()
            if listFD >= 0 { close(listFD) }
            return .failure(error)
        }
        defer { closedir(dir) }
        // A dup shares the read position with `fd`: start from the top even if listed before.
        rewinddir(dir)
        var names: [String] = []
        // readdir's end and its failure look alike but for errno: a listing cut short must not
        // pass for the whole directory.
        errno = 0
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(cString: raw.bindMemory(to: CChar.self).baseAddress!)
            }
            if name != "." && name != ".." { names.append(name) }
            errno = 0
        }
        return errno == 0 ? .success(names) : .failure(failure())
    }

    /// `lstat` of the entry `name`, or nil when it does not exist.
    func status(of name: String) throws -> stat? {
        var info = stat()
        if fstatat(fd, name, &info, AT_SYMLINK_NOFOLLOW) == 0 { return info }
        if errno == ENOENT { return nil }
        throw posixError("stat", path + "/" + name)
    }

    /// Opens the regular file `name` for reading, refusing symlinks and anything that is not a
    /// regular file (O_NONBLOCK: a pipe swapped in after the walk's lstat must not hang us).
    func openFile(_ name: String) throws -> Int32 {
        let fd = openat(self.fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else { throw posixError("open", path + "/" + name) }
        var info = stat()
        guard fstat(fd, &info) == 0, EntryKind(info) == .file else {
            close(fd)
            throw ContainerError("\(path)/\(name) changed into something other than a regular file while being read; try again.")
        }
        return fd
    }

    func readLink(_ name: String) throws -> String {
        var target = [CChar](repeating: 0, count: Int(PATH_MAX))
        let length = readlinkat(fd, name, &target, Int(PATH_MAX))
        guard length >= 0 else { throw posixError("readlink", path + "/" + name) }
        return String(decoding: target[..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}

/// The kind of a directory entry, from its `lstat` mode.
enum EntryKind: String, Codable, Sendable {
    case file, directory, symlink, other

    init(_ info: stat) {
        switch info.st_mode & S_IFMT {
        case S_IFREG: self = .file
        case S_IFDIR: self = .directory
        case S_IFLNK: self = .symlink
        default: self = .other
        }
    }
}

/// Walks and removes directory trees without following symlinks.
enum FileTree {
    struct Entry {
        /// The path below the walk's root, "a/b/c".
        let path: String
        let name: String
        let info: stat
        let parent: DirectoryHandle
        var kind: EntryKind { EntryKind(info) }
        var fullPath: String { parent.path + "/" + name }
    }

    /// Calls `visit` for everything below `root` in sorted pre-order. `visit` answers whether to
    /// descend into a directory. Entries that vanish during the walk are skipped.
    static func walk(_ root: DirectoryHandle, prefix: String = "", _ visit: (Entry) throws -> Bool) throws {
        for name in try root.names() {
            guard let info = try root.status(of: name) else { continue }
            let entry = Entry(path: prefix.isEmpty ? name : prefix + "/" + name, name: name, info: info, parent: root)
            guard try visit(entry), entry.kind == .directory else { continue }
            guard let child = try DirectoryHandle.ifPresent(in: root, name) else { continue }
            try walk(child, prefix: entry.path, visit)
        }
    }

    /// The bytes held by the regular files below `root`, for progress totals.
    static func totalFileBytes(_ root: DirectoryHandle) throws -> Int64 {
        var total: Int64 = 0
        try walk(root) { entry in
            if entry.kind == .file { total += Int64(entry.info.st_size) }
            return true
        }
        return total
    }

    /// Removes everything inside `directory`, leaving it empty. Read-only directories
    /// (as a bundle may have) are made writable first.
    static func removeContents(of directory: DirectoryHandle) throws {
        for name in try directory.names() {
            try removeEntry(name, in: directory)
        }
    }

    /// Removes the entry `name` of `parent`, whatever it is; a missing entry is fine.
    static func removeEntry(_ name: String, in parent: DirectoryHandle) throws {
        guard let info = try parent.status(of: name) else { return }
        if EntryKind(info) == .directory {
            if info.st_mode & 0o700 != 0o700 { _ = fchmodat(parent.fd, name, 0o700, 0) }
            guard let child = try DirectoryHandle.ifPresent(in: parent, name) else { return }
            try removeContents(of: child)
            guard unlinkat(parent.fd, name, AT_REMOVEDIR) == 0 || errno == ENOENT else {
                throw posixError("rmdir", parent.path + "/" + name)
            }
        } else {
            guard unlinkat(parent.fd, name, 0) == 0 || errno == ENOENT else {
                throw posixError("unlink", parent.path + "/" + name)
            }
        }
    }

    /// Removes the tree at `path` (a file, symlink or directory); a missing path is fine.
    static func remove(_ path: String) throws {
        let parentPath = (path as NSString).deletingLastPathComponent
        let parent = try DirectoryHandle(path: parentPath.isEmpty ? "." : parentPath)
        try removeEntry((path as NSString).lastPathComponent, in: parent)
    }
}

/// A unique name for scratch items in the store's work directory.
func scratchName(_ purpose: String) -> String {
    "\(purpose)-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
}

extension timespec {
    var nanoseconds: Int64 { Int64(tv_sec) * 1_000_000_000 + Int64(tv_nsec) }
}
