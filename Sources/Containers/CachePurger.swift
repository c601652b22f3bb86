import Foundation

/// Free space on the filesystem that holds a path.
public enum FreeSpace {
    /// Bytes an unprivileged process can still allocate there (`statvfs`'s `f_bavail`).
    public static func available(at path: String) throws -> UInt64 {
        var info = statvfs()
        guard statvfs(path, &info) == 0 else { throw posixError("statvfs", path) }
        return UInt64(info.f_bavail) * UInt64(info.f_frsize)
    }

    /// Whether free space at `path` has fallen below `threshold` bytes: time to purge caches.
    public static func isLow(at path: String, threshold: UInt64) throws -> Bool {
        try available(at: path) < threshold
    }
}

/// A file in some app's `Library/Caches`.
public struct CachedFile: Sendable, Equatable {
    public let app: AppID
    /// The backing file's absolute path in the store.
    public let path: String
    /// The bytes it occupies on disk (what removing it frees).
    public let allocatedBytes: UInt64
    /// The later of its access and modification times, in nanoseconds since 1970.
    public let lastUsed: Int64
}

/// What a purge did.
public struct PurgeReport: Sendable {
    public var removed: [CachedFile] = []
    /// Files left alone because they were open.
    public var skippedOpen: [CachedFile] = []
    public var freedBytes: UInt64 { removed.reduce(0) { $0 + $1.allocatedBytes } }
    /// Whether free space reached the target (always true without one).
    public var reachedTarget = true
}

/// Removes files from apps' `Library/Caches`, least recently used first, until the store has
/// enough free space, as iOS does when a device runs low. A file that is open is never removed.
public struct CachePurger {
    public let store: Store
    /// Whether the backing file at this absolute path is open (the daemon knows its own handles;
    /// `OpenFileTable` asks /proc).
    public var isOpen: (String) -> Bool
    /// Free bytes at a path; replaceable so tests can simulate a nearly full disk.
    public var freeSpace: (String) throws -> UInt64

    public init(store: Store, isOpen: @escaping (String) -> Bool,
                freeSpace: @escaping (String) throws -> UInt64 = FreeSpace.available(at:)) {
        self.store = store
        self.isOpen = isOpen
        self.freeSpace = freeSpace
    }

    /// The cache files of `apps` (every installed app and group by default), least recently used first.
    public func cachedFiles(of apps: [AppID]? = nil) throws -> [CachedFile] {
        let ids = try apps ?? store.apps().compactMap { AppID($0.id) } + store.groups()
        var files: [CachedFile] = []
        for id in ids {
            guard let caches = try? DirectoryHandle(path: store.cachesPath(id)) else { continue }
            try FileTree.walk(caches) { entry in
                if entry.kind == .file || entry.kind == .symlink {
                    files.append(CachedFile(app: id, path: entry.fullPath,
                                            allocatedBytes: UInt64(entry.info.st_blocks) * 512,
                                            lastUsed: max(entry.info.st_atim.nanoseconds, entry.info.st_mtim.nanoseconds)))
                }
                return true
            }
        }
        return files.sorted { ($0.lastUsed, $0.path) < ($1.lastUsed, $1.path) }
    }

    /// Removes cache files, oldest first, until `targetFreeBytes` are free; with no target,
    /// removes every cache file that is not open. Directories are kept: apps expect their layout.
    public func purge(targetFreeBytes: UInt64? = nil, apps: [AppID]? = nil) throws -> PurgeReport {
        var report = PurgeReport()
        func enoughFree() throws -> Bool {
            guard let target = targetFreeBytes else { return false }
            return try freeSpace(store.root) >= target
        }
        for file in try cachedFiles(of: apps) {
            if try enoughFree() { return report }
            if isOpen(file.path) { report.skippedOpen.append(file); continue }
            guard unlink(file.path) == 0 || errno == ENOENT else { throw posixError("unlink", file.path) }
            report.removed.append(file)
        }
        report.reachedTarget = try targetFreeBytes == nil || enoughFree()
        return report
    }
}

/// The files some process has open, by device and inode, read from /proc/PID/fd.
///
/// Without root, only the caller's own processes can be seen; the daemon, which knows its
/// handles, should pass its own predicate instead.
public struct OpenFileTable: Sendable {
    private struct FileKey: Hashable, Sendable { let device: UInt64; let inode: UInt64 }
    private let open: Set<FileKey>

    public static func snapshot() -> OpenFileTable {
        var keys: Set<FileKey> = []
        let processes = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        for pid in processes where pid.allSatisfy(\.isNumber) {
            let fdDirectory = "/proc/\(pid)/fd"
            for fd in (try? FileManager.default.contentsOfDirectory(atPath: fdDirectory)) ?? [] {
                var info = stat()
                // stat follows the fd's magic link to the open file itself.
                if stat(fdDirectory + "/" + fd, &info) == 0 {
                    keys.insert(FileKey(device: UInt64(info.st_dev), inode: UInt64(info.st_ino)))
                }
            }
        }
        return OpenFileTable(open: keys)
    }

    public func contains(path: String) -> Bool {
        var info = stat()
        guard lstat(path, &info) == 0 else { return false }
        return open.contains(FileKey(device: UInt64(info.st_dev), inode: UInt64(info.st_ino)))
    }
}
