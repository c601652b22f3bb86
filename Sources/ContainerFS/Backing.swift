import Glibc

/// Small helpers for system calls on backing files: no Foundation, no String per request.
enum Backing {
    /// Runs `body` with `/proc/self/fd/N` for `descriptor`, the race-free way to reach the item
    /// behind an `O_PATH` descriptor with calls that take a path (as passthrough_ll does).
    @inline(__always)
    static func withProcPath<R>(_ descriptor: Int32, _ body: (UnsafePointer<CChar>) -> R) -> R {
        withUnsafeTemporaryAllocation(of: CChar.self, capacity: 32) { buffer in
            let prefix: StaticString = "/proc/self/fd/"
            var length = prefix.utf8CodeUnitCount
            UnsafeMutableRawPointer(buffer.baseAddress!).copyMemory(from: prefix.utf8Start, byteCount: length)
            var count = 0
            var value = Int(descriptor)
            repeat {
                buffer[length + count] = CChar(48 + value % 10)
                value /= 10
                count += 1
            } while value > 0
            // The digits went in backwards.
            var low = length, high = length + count - 1
            while low < high { buffer.swapAt(low, high); low += 1; high -= 1 }
            length += count
            buffer[length] = 0
            return body(buffer.baseAddress!)
        }
    }

    /// `fstatat` on the item itself, never following a symlink.
    @inline(__always)
    static func attributes(of descriptor: Int32) -> (stat, Int32) {
        var attributes = stat()
        let result = fstatat(descriptor, "", &attributes, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW)
        return (attributes, result == 0 ? 0 : errno)
    }

    /// Clears the set-user-ID bit, and the set-group-ID bit of a group-executable file, as a write
    /// by someone without CAP_FSETID does on a local disk. The daemon writes as root, so the
    /// backing filesystem would keep them, and the kernel leaves it to the daemon for writes that
    /// bypass its cache. Returns 0 or the errno.
    static func clearSetID(_ descriptor: Int32) -> Int32 {
        var attributes = stat()
        guard fstat(descriptor, &attributes) == 0 else { return errno }
        var cleared = attributes.st_mode & ~S_ISUID
        if attributes.st_mode & S_IXGRP != 0 { cleared &= ~S_ISGID }
        guard cleared != attributes.st_mode else { return 0 }
        return fchmod(descriptor, cleared & 0o7777) == 0 ? 0 : errno
    }

    /// An `O_PATH` descriptor on `name` in `directory`, never following a symlink.
    @inline(__always)
    static func openPath(_ name: UnsafePointer<CChar>, in directory: Int32) -> Int32 {
        openat(directory, name, O_PATH | O_NOFOLLOW | O_CLOEXEC)
    }

    /// Runs `body` with a NUL-terminated copy of a name kept as bytes.
    static func withCName<R>(_ name: [UInt8], _ body: (UnsafePointer<CChar>) -> R) -> R {
        withUnsafeTemporaryAllocation(of: CChar.self, capacity: name.count + 1) { buffer in
            for index in 0..<name.count { buffer[index] = CChar(bitPattern: name[index]) }
            buffer[name.count] = 0
            return body(buffer.baseAddress!)
        }
    }

    /// Makes a directory's entries durable: `fsync` on the directory behind `descriptor`, which may
    /// be an `O_PATH` descriptor (on which `fsync` itself fails with EBADF). Returns 0 or the errno.
    static func syncDirectory(_ descriptor: Int32) -> Int32 {
        let directory = openat(descriptor, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard directory >= 0 else { return errno }
        defer { close(directory) }
        return fsync(directory) == 0 ? 0 : errno
    }

    /// The errno of the last failed call, or 0 when `result` says it succeeded.
    @inline(__always)
    static func check(_ result: Int32) -> Int32 { result == -1 ? errno : 0 }

    /// The daemon's umask, which openat, mkdirat and mknodat apply to what they make. The kernel
    /// has applied the caller's umask to the mode it sends already (no FUSE_CAP_DONT_MASK).
    static let creationMask: mode_t = {
        let mask = umask(0o022)
        umask(mask)
        return mask
    }()

    /// Gives back the permission bits of `mode` that the daemon's umask took from the item just
    /// made, so that it has the mode the caller asked for (with umask 0, 0777 is 0777). Returns 0
    /// or the errno.
    static func restorePermissions(_ descriptor: Int32, requested mode: mode_t) -> Int32 {
        let taken = mode & 0o777 & creationMask
        guard taken != 0 else { return 0 }
        let (attributes, error) = attributes(of: descriptor)
        guard error == 0 else { return error }
        guard attributes.st_mode & S_IFMT != S_IFLNK else { return 0 }
        return withProcPath(descriptor) { check(chmod($0, (attributes.st_mode & 0o7777) | taken)) }
    }
}
