import Crypto
import Foundation
import Glibc

/// One kept previous version of a file: the replaced file itself, moved aside (docs/versions.md).
public struct FileVersionRecord: Sendable, Equatable {
    /// Its name in the file's versions directory: `v-NANOSECONDS` (when it was replaced).
    public var name: String
    /// The versions directory it is in.
    public var directory: String
    /// When it stopped being the file's content.
    public var replacedAt: Date
    /// When its content was last changed (its own modification time).
    public var modifiedAt: Date
    public var size: UInt64
    /// What it takes on disk.
    public var allocatedBytes: UInt64

    public var path: String { directory + "/" + name }
}

/// The previous versions that atomic replace and replacing renames leave, kept in the store:
///
///     STORE/versions/                      mode 0700: versions hold what their files held
///     STORE/versions/CONTAINER/KEY/        one file's, KEY the SHA-256 of its path in the container
///     STORE/versions/CONTAINER/KEY/path    that path, for people and listings
///     STORE/versions/CONTAINER/KEY/v-NS    a version, replaced NS nanoseconds after 1970
///
/// Versions belong to a path, as an editor's saves do (a temporary file renamed over the document
/// keeps the document's versions). A file moved away leaves its versions at the old path.
public struct VersionStore: Sendable {
    public let root: String
    private let storeRoot: String

    public init(store: Store) {
        root = store.root + "/versions"
        storeRoot = store.root
    }

    public static let versionPrefix = "v-"
    static let pathFileName = "path"

    /// The versions directory of the item at `path` (slash-separated, relative to the container).
    public func directory(container: String, path: String) -> String {
        root + "/" + container + "/" + VersionStore.key(path)
    }

    static func key(_ path: String) -> String {
        SHA256.hash(data: Data(path.utf8)).prefix(16).map { String(format: "%02x", $0) }.joined()
    }

    /// Makes the file's versions directory (and the store's, private to its owner), recording its path.
    /// A daemon running as root gives what it makes to the store's owner, who lists and removes versions.
    public func prepare(container: String, path: String) throws -> String {
        let directory = directory(container: container, path: path)
        for (made, mode) in [(root, mode_t(0o700)), (root + "/" + container, 0o755), (directory, 0o755)] {
            if mkdir(made, mode) == 0 {
                try giveToOwner(made)
            } else if errno != EEXIST {
                throw posixError("mkdir", made)
            } else {
                continue
            }
            guard made == directory else { continue }
            let pathFile = directory + "/" + VersionStore.pathFileName
            do {
                try Data((path + "\n").utf8).write(to: URL(fileURLWithPath: pathFile))
            } catch {
                throw ContainerError("\(directory): cannot record the path of its versions (\(error.localizedDescription)).")
            }
            try giveToOwner(pathFile)
        }
        return directory
    }

    private func giveToOwner(_ path: String) throws {
        var owner = stat()
        guard stat(storeRoot, &owner) == 0 else { throw posixError("stat", storeRoot) }
        guard owner.st_uid != geteuid() else { return }
        guard lchown(path, owner.st_uid, owner.st_gid) == 0 else { throw posixError("chown", path) }
    }

    /// A name for a version replaced now, unused in `directory`.
    public static func newName(in directory: String, at date: Date = Date()) -> String {
        var nanoseconds = UInt64(max(0, date.timeIntervalSince1970) * 1_000_000_000)
        while access(directory + "/" + versionPrefix + String(nanoseconds), F_OK) == 0 { nanoseconds += 1 }
        return versionPrefix + String(nanoseconds)
    }

    /// The versions kept in `directory`, oldest first.
    public static func versions(in directory: String) -> [FileVersionRecord] {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
        return names.compactMap { name -> FileVersionRecord? in
            guard name.hasPrefix(versionPrefix), let nanoseconds = UInt64(name.dropFirst(versionPrefix.count)) else { return nil }
            var attributes = stat()
            guard lstat(directory + "/" + name, &attributes) == 0, attributes.st_mode & S_IFMT == S_IFREG else { return nil }
            return FileVersionRecord(name: name, directory: directory,
                                     replacedAt: Date(timeIntervalSince1970: Double(nanoseconds) / 1e9),
                                     modifiedAt: Date(attributes.st_mtim),
                                     size: UInt64(attributes.st_size), allocatedBytes: UInt64(attributes.st_blocks) * 512)
        }.sorted { $0.name.count != $1.name.count ? $0.name.count < $1.name.count : $0.name < $1.name }
    }

    /// Every version in the store, oldest first, for retention across files.
    public func allVersions() -> [FileVersionRecord] {
        var all: [FileVersionRecord] = []
        for container in (try? FileManager.default.contentsOfDirectory(atPath: root)) ?? [] {
            for key in (try? FileManager.default.contentsOfDirectory(atPath: root + "/" + container)) ?? [] {
                all += VersionStore.versions(in: root + "/" + container + "/" + key)
            }
        }
        return all.sorted { $0.replacedAt < $1.replacedAt }
    }

    /// Removes a version; its directory too once it holds no other.
    public static func remove(_ version: FileVersionRecord) throws {
        guard unlink(version.path) == 0 || errno == ENOENT else { throw posixError("unlink", version.path) }
        if versions(in: version.directory).isEmpty {
            unlink(version.directory + "/" + pathFileName)
            rmdir(version.directory)
        }
    }
}

/// How many versions are kept, and for how long (mount options, docs/versions.md).
public struct VersionLimits: Sendable, Equatable {
    /// Per file; 0 keeps none.
    public var count: Int = 10
    /// Older versions go.
    public var age: TimeInterval = 30 * 86_400
    /// All of the store's versions together, on disk.
    public var space: UInt64 = 1 << 30
    /// No version is kept while the store's filesystem has less free space than this (nil: a
    /// tenth of the filesystem).
    public var floor: UInt64?

    public init() {}
}

/// Which versions go: one value, transitions that say what to remove (the caller removes them).
public struct VersionRetention: Sendable {
    public let limits: VersionLimits
    /// Every kept version the daemon knows, oldest first.
    private(set) var kept: [FileVersionRecord]
    private(set) var totalBytes: UInt64

    public init(limits: VersionLimits, existing: [FileVersionRecord]) {
        self.limits = limits
        kept = existing.sorted { $0.replacedAt < $1.replacedAt }
        totalBytes = kept.reduce(0) { $0 + $1.allocatedBytes }
    }

    public var count: Int { kept.count }

    /// A version was kept: what must go now, by the file's count, age, and the store's space.
    public mutating func kept(_ version: FileVersionRecord, now: Date = Date()) -> [FileVersionRecord] {
        kept.append(version)
        totalBytes += version.allocatedBytes
        let sameFile = kept.filter { $0.directory == version.directory }
        let surplus = Set(sameFile.prefix(max(0, sameFile.count - limits.count)).map(\.path))
        let removed = kept.filter { surplus.contains($0.path) || now.timeIntervalSince($0.replacedAt) > limits.age }
        forget(removed)
        return removed + freeSpace(needed: 0)
    }

    /// Removes the oldest versions until their total fits `space` and `needed` more bytes are gained.
    public mutating func freeSpace(needed: UInt64) -> [FileVersionRecord] {
        var removed: [FileVersionRecord] = []
        var gained: UInt64 = 0
        var index = 0
        while index < kept.count, totalBytes - gained > limits.space || gained < needed {
            removed.append(kept[index])
            gained += kept[index].allocatedBytes
            index += 1
        }
        forget(removed)
        return removed
    }

    /// Versions removed by someone else (the shell, the client library).
    public mutating func forget(_ versions: [FileVersionRecord]) {
        guard !versions.isEmpty else { return }
        let paths = Set(versions.map(\.path))
        kept.removeAll { version in
            guard paths.contains(version.path) else { return false }
            totalBytes -= min(totalBytes, version.allocatedBytes)
            return true
        }
    }
}

extension Date {
    /// A file time from `stat`.
    public init(_ time: timespec) {
        self.init(timeIntervalSince1970: Double(time.tv_sec) + Double(time.tv_nsec) / 1e9)
    }
}
