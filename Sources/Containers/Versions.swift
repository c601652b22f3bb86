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
        let digits = Array("0123456789abcdef".utf8)
        var hex: [UInt8] = []
        hex.reserveCapacity(32)
        for byte in SHA256.hash(data: Data(path.utf8)).prefix(16) {
            hex.append(digits[Int(byte >> 4)])
            hex.append(digits[Int(byte & 0xf)])
        }
        return String(decoding: hex, as: UTF8.self)
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

    /// Runs `body` with the name of the version replaced `nanoseconds` after 1970, `v-NANOSECONDS`,
    /// as a C string made without a String (an editor's save links one).
    public static func withName<R>(_ nanoseconds: UInt64, _ body: (UnsafePointer<CChar>) -> R) -> R {
        withUnsafeTemporaryAllocation(of: CChar.self, capacity: 24) { buffer in
            var digits = 0, rest = nanoseconds
            repeat { digits += 1; rest /= 10 } while rest > 0
            buffer[0] = CChar(UInt8(ascii: "v"))
            buffer[1] = CChar(UInt8(ascii: "-"))
            rest = nanoseconds
            for index in stride(from: digits + 1, to: 1, by: -1) {
                buffer[index] = CChar(48 + rest % 10)
                rest /= 10
            }
            buffer[digits + 2] = 0
            return body(buffer.baseAddress!)
        }
    }

    /// The versions kept in `directory`, oldest first.
    public static func versions(in directory: String) -> [FileVersionRecord] {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
        return names.compactMap { record(named: $0, in: directory) }
            .sorted { $0.name.count != $1.name.count ? $0.name.count < $1.name.count : $0.name < $1.name }
    }

    /// The version `name` in `directory`, if it is one.
    public static func record(named name: String, in directory: String) -> FileVersionRecord? {
        guard name.hasPrefix(versionPrefix), let nanoseconds = UInt64(name.dropFirst(versionPrefix.count)) else { return nil }
        var attributes = stat()
        guard lstat(directory + "/" + name, &attributes) == 0, attributes.st_mode & S_IFMT == S_IFREG else { return nil }
        return FileVersionRecord(name: name, directory: directory,
                                 replacedAt: Date(timeIntervalSince1970: Double(nanoseconds) / 1e9),
                                 modifiedAt: Date(attributes.st_mtim),
                                 size: UInt64(attributes.st_size), allocatedBytes: UInt64(attributes.st_blocks) * 512)
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
        if versions(in: version.directory).isEmpty { removeDirectory(version.directory) }
    }

    /// Removes a versions directory that holds no version. One that got a version meanwhile stays
    /// (rmdir fails), without its path file: listings do not need it.
    public static func removeDirectory(_ directory: String) {
        unlink(directory + "/" + pathFileName)
        rmdir(directory)
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
    /// What a transition gives up: versions, and the directories left without any.
    public struct Removal: Sendable, Equatable {
        public var versions: [FileVersionRecord] = []
        public var emptiedDirectories: [String] = []
    }

    public let limits: VersionLimits
    /// Every kept version the daemon knows, oldest first.
    private var kept: [FileVersionRecord]
    private var countByDirectory: [String: Int] = [:]
    private(set) var totalBytes: UInt64 = 0

    public init(limits: VersionLimits, existing: [FileVersionRecord]) {
        self.limits = limits
        kept = existing.sorted { $0.replacedAt < $1.replacedAt }
        for version in kept {
            countByDirectory[version.directory, default: 0] += 1
            totalBytes += version.allocatedBytes
        }
    }

    public var count: Int { kept.count }

    /// A version was kept: what must go now, by the file's count, age, and the store's space.
    public mutating func kept(_ version: FileVersionRecord, now: Date = Date()) -> Removal {
        // Versions arrive in time order but for clocks and queues: insert from the end.
        var index = kept.endIndex
        while index > kept.startIndex, kept[index - 1].replacedAt > version.replacedAt { index -= 1 }
        // Counted already: the first keep loads the store's versions, the one just kept among them.
        var same = index
        while same > kept.startIndex, kept[same - 1].replacedAt == version.replacedAt {
            if kept[same - 1].path == version.path { return Removal() }
            same -= 1
        }
        kept.insert(version, at: index)
        countByDirectory[version.directory, default: 0] += 1
        totalBytes += version.allocatedBytes
        var removal = Removal()
        if countByDirectory[version.directory, default: 0] > limits.count,
           let oldest = kept.firstIndex(where: { $0.directory == version.directory }) {
            take(at: oldest, into: &removal)
        }
        while let first = kept.first, now.timeIntervalSince(first.replacedAt) > limits.age { take(at: 0, into: &removal) }
        let more = freeSpace(needed: 0)
        removal.versions += more.versions
        removal.emptiedDirectories += more.emptiedDirectories
        return removal
    }

    /// Removes the oldest versions until their total fits `space` and `needed` more bytes are gained.
    public mutating func freeSpace(needed: UInt64) -> Removal {
        var removal = Removal()
        var gained: UInt64 = 0
        while let first = kept.first, totalBytes > limits.space || gained < needed {
            gained += first.allocatedBytes
            take(at: 0, into: &removal)
        }
        return removal
    }

    /// Versions removed by someone else (the shell, the client library).
    public mutating func forget(_ versions: [FileVersionRecord]) {
        let paths = Set(versions.map(\.path))
        var ignored = Removal()
        while let index = kept.firstIndex(where: { paths.contains($0.path) }) { take(at: index, into: &ignored) }
    }

    private mutating func take(at index: Int, into removal: inout Removal) {
        let version = kept.remove(at: index)
        totalBytes -= min(totalBytes, version.allocatedBytes)
        removal.versions.append(version)
        let left = countByDirectory[version.directory, default: 1] - 1
        countByDirectory[version.directory] = left > 0 ? left : nil
        if left <= 0 { removal.emptiedDirectories.append(version.directory) }
    }
}

extension Date {
    /// A file time from `stat`.
    public init(_ time: timespec) {
        self.init(timeIntervalSince1970: Double(time.tv_sec) + Double(time.tv_nsec) / 1e9)
    }
}
