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

    /// Makes the file's versions directory (and the store's, private to its owner), recording its
    /// path, and opens it. A daemon running as root gives what it makes to the store's owner, who
    /// lists and removes versions. Everything below the store's root is reached one real directory
    /// at a time: the owner owns these directories, and a link planted among them must not lead a
    /// daemon running as root out of the store (docs/versions.md, "Who owns them").
    public func prepare(container: String, path: String) throws -> DirectoryHandle {
        let owner = try self.owner()
        let (versions, madeVersions) = try DirectoryHandle.making("versions", in: DirectoryHandle(path: storeRoot), mode: 0o700)
        if madeVersions { try give(versions, to: owner) }
        let (parent, madeParent) = try DirectoryHandle.making(container, in: versions, mode: 0o755)
        if madeParent { try give(parent, to: owner) }
        let (directory, made) = try DirectoryHandle.making(VersionStore.key(path), in: parent, mode: 0o755)
        guard made else { return directory }
        // Written before the directory is the owner's: nothing of theirs is in it yet.
        let pathFile = openat(directory.fd, VersionStore.pathFileName, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o644)
        guard pathFile >= 0 else { throw posixError("create", directory.path + "/" + VersionStore.pathFileName) }
        defer { close(pathFile) }
        let text = Array((path + "\n").utf8)
        guard write(pathFile, text, text.count) == text.count else {
            throw ContainerError("\(directory.path): cannot record the path of its versions (\(String(cString: strerror(errno)))).")
        }
        if let owner, fchown(pathFile, owner.st_uid, owner.st_gid) != 0 {
            throw posixError("chown", directory.path + "/" + VersionStore.pathFileName)
        }
        try give(directory, to: owner)
        return directory
    }

    /// The store's owner, when it is not this process's user (a daemon running as root).
    private func owner() throws -> stat? {
        var owner = stat()
        guard stat(storeRoot, &owner) == 0 else { throw posixError("stat", storeRoot) }
        return owner.st_uid != geteuid() ? owner : nil
    }

    private func give(_ directory: DirectoryHandle, to owner: stat?) throws {
        guard let owner else { return }
        guard fchown(directory.fd, owner.st_uid, owner.st_gid) == 0 else { throw posixError("chown", directory.path) }
    }

    /// Opens one of this store's versions directories (`ROOT/CONTAINER/KEY`, as records name them)
    /// one real directory at a time, as `prepare` does.
    public func open(_ directory: String) throws -> DirectoryHandle {
        let (container, key) = try locate(directory)
        return try DirectoryHandle(in: container, key)
    }

    /// The open container directory of one of this store's versions directories, and its name in it.
    private func locate(_ directory: String) throws -> (DirectoryHandle, String) {
        let components = directory.hasPrefix(root + "/") ? directory.dropFirst(root.count + 1).split(separator: "/") : []
        guard components.count == 2, !components.contains(where: { $0 == "." || $0 == ".." }) else {
            throw ContainerError("\(directory): not a versions directory of the store \(storeRoot).")
        }
        return (try DirectoryHandle(in: DirectoryHandle(path: root), String(components[0])), String(components[1]))
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
        (try? DirectoryHandle(path: directory)).map(versions(in:)) ?? []
    }

    /// The versions kept in the open `directory`, oldest first.
    public static func versions(in directory: DirectoryHandle) -> [FileVersionRecord] {
        ((try? directory.names()) ?? []).compactMap { record(named: $0, in: directory) }
            .sorted { $0.name.count != $1.name.count ? $0.name.count < $1.name.count : $0.name < $1.name }
    }

    /// The version `name` in `directory`, if it is one.
    public static func record(named name: String, in directory: String) -> FileVersionRecord? {
        (try? DirectoryHandle(path: directory)).flatMap { record(named: name, in: $0) }
    }

    /// The version `name` in the open `directory`, if it is one.
    public static func record(named name: String, in directory: DirectoryHandle) -> FileVersionRecord? {
        guard name.hasPrefix(versionPrefix), let nanoseconds = UInt64(name.dropFirst(versionPrefix.count)),
              let attributes = try? directory.status(of: name), attributes.st_mode & S_IFMT == S_IFREG else { return nil }
        return FileVersionRecord(name: name, directory: directory.path,
                                 replacedAt: Date(timeIntervalSince1970: Double(nanoseconds) / 1e9),
                                 modifiedAt: Date(attributes.st_mtim),
                                 size: UInt64(attributes.st_size), allocatedBytes: UInt64(attributes.st_blocks) * 512)
    }

    /// Every version in the store, oldest first, for retention across files. What is not a real
    /// directory (a link planted there) holds none.
    public func allVersions() -> [FileVersionRecord] {
        guard let versions = try? DirectoryHandle(path: root) else { return [] }
        var all: [FileVersionRecord] = []
        for container in (try? versions.names()) ?? [] {
            guard let folder = try? DirectoryHandle(in: versions, container) else { continue }
            for key in (try? folder.names()) ?? [] {
                if let directory = try? DirectoryHandle(in: folder, key) { all += VersionStore.versions(in: directory) }
            }
        }
        return all.sorted { $0.replacedAt < $1.replacedAt }
    }

    /// Removes a version; its directory too once it holds no other.
    public static func remove(_ version: FileVersionRecord) throws {
        guard unlink(version.path) == 0 || errno == ENOENT else { throw posixError("unlink", version.path) }
        if versions(in: version.directory).isEmpty, let parent = try? DirectoryHandle(path: (version.directory as NSString).deletingLastPathComponent) {
            removeDirectory((version.directory as NSString).lastPathComponent, in: parent)
        }
    }

    /// Removes one of this store's versions directories that holds no version, reached as `open`
    /// reaches it.
    public func removeDirectory(_ directory: String) {
        guard let (container, key) = try? locate(directory) else { return }
        VersionStore.removeDirectory(key, in: container)
    }

    /// Removes the versions directory `name` in `parent` if it holds no version. One that got a
    /// version meanwhile stays (rmdir fails), without its path file: listings do not need it.
    private static func removeDirectory(_ name: String, in parent: DirectoryHandle) {
        guard let directory = try? DirectoryHandle(in: parent, name) else { return }
        unlinkat(directory.fd, pathFileName, 0)
        unlinkat(parent.fd, name, AT_REMOVEDIR)
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
