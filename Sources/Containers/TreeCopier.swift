import CLinux
import Foundation

/// Copies a directory tree as it is: regular files, directories and symlinks (never followed),
/// with their modes and modification times. Other kinds of file are refused.
public enum TreeCopier {
    static func copy(from source: String, to destination: String) throws {
        let sourceFD = open(source, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard sourceFD >= 0 else { throw posixError("open", source) }
        defer { close(sourceFD) }
        var info = stat()
        guard fstat(sourceFD, &info) == 0 else { throw posixError("stat", source) }
        guard mkdir(destination, 0o700) == 0 else { throw posixError("mkdir", destination) }
        let destinationFD = open(destination, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard destinationFD >= 0 else { throw posixError("open", destination) }
        defer { close(destinationFD) }
        try copyContents(of: sourceFD, to: destinationFD, path: source)
        try applyMetadata(info, to: destinationFD, name: nil, path: destination)
    }

    private static func copyContents(of sourceDir: Int32, to destinationDir: Int32, path: String) throws {
        let listFD = dup(sourceDir)
        guard let dir = fdopendir(listFD) else { close(listFD); throw posixError("opendir", path) }
        defer { closedir(dir) }
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(cString: raw.bindMemory(to: CChar.self).baseAddress!)
            }
            if name == "." || name == ".." { continue }
            try copyEntry(name, from: sourceDir, to: destinationDir, path: path + "/" + name)
        }
    }

    private static func copyEntry(_ name: String, from sourceDir: Int32, to destinationDir: Int32, path: String) throws {
        var info = stat()
        guard fstatat(sourceDir, name, &info, AT_SYMLINK_NOFOLLOW) == 0 else { throw posixError("stat", path) }
        switch info.st_mode & S_IFMT {
        case S_IFDIR:
            guard mkdirat(destinationDir, name, 0o700) == 0 else { throw posixError("mkdir", path) }
            let from = openat(sourceDir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
            guard from >= 0 else { throw posixError("open", path) }
            defer { close(from) }
            let to = openat(destinationDir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
            guard to >= 0 else { throw posixError("open", path) }
            defer { close(to) }
            try copyContents(of: from, to: to, path: path)
            try applyMetadata(info, to: to, name: nil, path: path)
        case S_IFREG:
            let from = openat(sourceDir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
            guard from >= 0 else { throw posixError("open", path) }
            defer { close(from) }
            let to = openat(destinationDir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
            guard to >= 0 else { throw posixError("create", path) }
            defer { close(to) }
            try copyData(from: from, to: to, path: path)
            try applyMetadata(info, to: to, name: nil, path: path)
        case S_IFLNK:
            var target = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
            let length = readlinkat(sourceDir, name, &target, Int(PATH_MAX))
            guard length >= 0 else { throw posixError("readlink", path) }
            target[length] = 0
            guard symlinkat(target, destinationDir, name) == 0 else { throw posixError("symlink", path) }
            try applyMetadata(info, to: destinationDir, name: name, path: path)
        default:
            throw ContainerError("\(path): a device, socket or pipe cannot be part of a bundle; remove it and try again.")
        }
    }

    /// Copies file data: a reflink where the filesystem can, else in-kernel with sendfile.
    public static func copyData(from source: Int32, to destination: Int32, path: String) throws {
        if clinux_ficlone(destination, source) == 0 { return }
        while true {
            let copied = sendfile(destination, source, nil, 1 << 30)
            if copied == 0 { return }
            if copied > 0 { continue }
            if errno == EINTR { continue }
            if errno == EINVAL || errno == ENOSYS { break }
            throw posixError("copy", path)
        }
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        while true {
            let count = read(source, &buffer, buffer.count)
            if count == 0 { return }
            if count < 0 { if errno == EINTR { continue }; throw posixError("read", path) }
            var written = 0
            while written < count {
                let result = buffer.withUnsafeBytes { write(destination, $0.baseAddress! + written, count - written) }
                if result < 0 { if errno == EINTR { continue }; throw posixError("write", path) }
                written += result
            }
        }
    }

    private static func applyMetadata(_ info: stat, to fd: Int32, name: String?, path: String) throws {
        var times = [info.st_atim, info.st_mtim]
        if let name {
            // A symlink: only its times can be kept.
            _ = utimensat(fd, name, &times, AT_SYMLINK_NOFOLLOW)
            return
        }
        guard fchmod(fd, info.st_mode & 0o7777) == 0 else { throw posixError("chmod", path) }
        guard futimens(fd, &times) == 0 else { throw posixError("utimes", path) }
    }
}

func posixError(_ operation: String, _ path: String, _ code: Int32 = errno) -> ContainerError {
    ContainerError("\(path): \(operation) failed: \(String(cString: strerror(code)))")
}
