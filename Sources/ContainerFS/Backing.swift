import CLinux
import Coordination
import Dispatch
import FUSELowLevel
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

    /// Clears the set-ID bits that a change of the file's data by `caller` drops (`SetID`): the
    /// daemon writes as root, so the backing filesystem would keep them, and the kernel leaves
    /// clearing them to the daemon (`FuseSession.takeOverSetIDClearing`). Returns 0 or the errno,
    /// and whether it cleared any (the kernel's cached mode then no longer holds).
    static func clearSetID(_ descriptor: Int32, changedBy caller: Caller) -> (error: Int32, cleared: Bool) {
        guard caller.uid != 0 else { return (0, false) }
        var attributes = stat()
        guard fstat(descriptor, &attributes) == 0 else { return (errno, false) }
        let cleared = SetID.mode(attributes.st_mode, group: attributes.st_gid, afterChangeBy: caller)
        guard cleared != attributes.st_mode else { return (0, false) }
        return fchmod(descriptor, cleared & 0o7777) == 0 ? (0, true) : (errno, false)
    }

    /// The backing file open as `descriptor`; nil (errno set) when it cannot be read.
    static func key(of descriptor: Int32) -> BackingKey? { identity(of: descriptor)?.key }

    /// The file's key and size, its times left unread (`clinux_identity`), or nil with errno set.
    static func identity(of descriptor: Int32) -> (key: BackingKey, size: off_t)? {
        var device: UInt64 = 0, inode: UInt64 = 0, size: Int64 = 0
        guard clinux_identity(descriptor, &device, &inode, &size) == 0 else { return nil }
        return (BackingKey(device: device, inode: inode), off_t(size))
    }

    /// A descriptor on `name` in `directory` (an `O_PATH` one unless `flags` say otherwise),
    /// never following a symlink.
    @inline(__always)
    static func openPath(_ name: UnsafePointer<CChar>, in directory: Int32, flags: Int32 = O_PATH) -> Int32 {
        openat(directory, name, flags | O_NOFOLLOW | O_CLOEXEC)
    }

    /// Runs `body` with a NUL-terminated copy of a name kept as bytes.
    static func withCName<Name: Collection<UInt8>, R>(_ name: Name, _ body: (UnsafePointer<CChar>) -> R) -> R {
        withUnsafeTemporaryAllocation(of: CChar.self, capacity: name.count + 1) { buffer in
            for (index, byte) in name.enumerated() { buffer[index] = CChar(bitPattern: byte) }
            buffer[name.count] = 0
            return body(buffer.baseAddress!)
        }
    }

    /// A descriptor that can sync the directory behind `descriptor` (which may be `O_PATH`), or -1.
    static func openDirectory(_ descriptor: Int32) -> Int32 {
        openat(descriptor, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    }

    /// Makes a directory's entries durable: `fsync` on the directory behind `descriptor`, which may
    /// be an `O_PATH` descriptor (on which `fsync` itself fails with EBADF). Returns 0 or the errno.
    static func syncDirectory(_ descriptor: Int32) -> Int32 {
        let directory = openDirectory(descriptor)
        guard directory >= 0 else { return errno }
        defer { close(directory) }
        return fsync(directory) == 0 ? 0 : errno
    }

    /// Syncs (`fsync`) every one of `descriptors` at once: the calling thread the first, threads of
    /// `syncers` the others. A disk flushes the cache once for syncs that wait together, where syncs
    /// one after another flush it each. Returns each one's 0 or errno, in order.
    static func syncTogether(_ descriptors: [Int32]) -> [Int32] {
        RequestThreads.willWait()
        let results = Locked([Int32](repeating: 0, count: descriptors.count))
        let group = DispatchGroup()
        for index in descriptors.indices.dropFirst() {
            let descriptor = descriptors[index]
            syncers.async(group: group) {
                let error: Int32 = fsync(descriptor) == 0 ? 0 : errno
                results.withLock { $0[index] = error }
            }
        }
        if let first = descriptors.first {
            let error: Int32 = fsync(first) == 0 ? 0 : errno
            results.withLock { $0[0] = error }
        }
        group.wait()
        return results.withLock { $0 }
    }

    /// Concurrent: a sync waits for the disk, and each must start at once.
    private static let syncers = DispatchQueue(label: "containerfs.syncers", attributes: .concurrent)

    /// Whether a file's fsync on the filesystem of `descriptor` also makes durable every earlier
    /// change of names that touched the file (links made to it, links removed): true of XFS and of
    /// ext4 with a journal, whose journals commit in order, so that a sync of the file commits them
    /// too. False elsewhere (ext4 without a journal writes each directory on its own sync), and
    /// when it cannot be told (docs/atomic-replace.md, "Durability").
    static func fileSyncCarriesNames(onFileSystemOf descriptor: Int32) -> Bool {
        switch clinux_fs_type(descriptor) {
        case 0x5846_5342: return true  // XFS
        case 0xEF53: break  // ext2, ext3 and ext4 share it: the journal is told in sysfs
        default: return false
        }
        var attributes = stat()
        guard fstat(descriptor, &attributes) == 0 else { return false }
        // /sys/dev/block/MAJOR:MINOR leads to the device, whose name ext4 uses in /sys/fs/ext4.
        let device = "/sys/dev/block/\(clinux_major(attributes.st_dev)):\(clinux_minor(attributes.st_dev))"
        var target = [CChar](repeating: 0, count: Int(PATH_MAX))
        let length = readlink(device, &target, target.count - 1)
        guard length > 0 else { return false }
        let name = String(decoding: target[0..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
            .split(separator: "/").last.map(String.init) ?? ""
        // The journal's thread, or "<none>" without a journal; absent for ext2 and ext3 drivers.
        let task = open("/sys/fs/ext4/\(name)/journal_task", O_RDONLY | O_CLOEXEC)
        guard task >= 0 else { return false }
        defer { close(task) }
        var value = [UInt8](repeating: 0, count: 32)
        let read = Glibc.read(task, &value, value.count)
        return read > 0 && value[0] >= UInt8(ascii: "0") && value[0] <= UInt8(ascii: "9")
    }

    /// Whether a file's data written and waited for (`sync_file_range`, no sync) is part of every
    /// later journal commit that makes a rename of the file durable: true of ext4 and XFS, whose
    /// blocks become the file's when the writes end, in transactions that commit in order. False
    /// on btrfs, where anyone's fsync of a directory logs a rename into it without the renamed
    /// file's data (a cut then leaves it empty, natively too), and where it cannot be told
    /// (`RenameCommits`; docs/atomic-replace.md, "btrfs").
    static func writtenDataOrdersRenames(onFileSystemOf descriptor: Int32) -> Bool {
        switch clinux_fs_type(descriptor) {
        case 0x5846_5342, 0xEF53: return true  // XFS; ext2, ext3 and ext4
        default: return false
        }
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
