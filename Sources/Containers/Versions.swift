import Crypto
import DequeModule
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
        try prepare(path: path, in: containerDirectory(container))
    }

    /// The versions directory of `container` (and the store's), made if need be, and open: what
    /// `prepare(path:in:)` makes a file's in.
    public func containerDirectory(_ container: String) throws -> DirectoryHandle {
        let owner = try self.owner()
        let (versions, madeVersions) = try DirectoryHandle.making("versions", in: DirectoryHandle(path: storeRoot), mode: 0o700)
        if madeVersions { try give(versions, to: owner) }
        let (parent, madeParent) = try DirectoryHandle.making(container, in: versions, mode: 0o755)
        if madeParent { try give(parent, to: owner) }
        return parent
    }

    /// `prepare` in a container's versions directory that `containerDirectory` opened.
    public func prepare(path: String, in parent: DirectoryHandle) throws -> DirectoryHandle {
        let (directory, made) = try DirectoryHandle.making(VersionStore.key(path), in: parent, mode: 0o755)
        guard made else { return directory }
        let owner = try self.owner()
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
        try open(directory, known: { _ in nil })
    }

    /// `open`, in the container's versions directory `known` gives when it has it open.
    public func open(_ directory: String, known: (String) -> DirectoryHandle?) throws -> DirectoryHandle {
        let (container, key) = try names(of: directory)
        return try DirectoryHandle(in: known(container) ?? DirectoryHandle(in: DirectoryHandle(path: root), container), key)
    }

    /// The open container directory of one of this store's versions directories, and its name in it.
    private func locate(_ directory: String) throws -> (DirectoryHandle, String) {
        let (container, key) = try names(of: directory)
        return (try DirectoryHandle(in: DirectoryHandle(path: root), container), key)
    }

    /// The container and the key of one of this store's versions directories.
    private func names(of directory: String) throws -> (container: String, key: String) {
        let components = directory.hasPrefix(root + "/") ? directory.dropFirst(root.count + 1).split(separator: "/") : []
        guard components.count == 2, !components.contains(where: { $0 == "." || $0 == ".." }) else {
            throw ContainerError("\(directory): not a versions directory of the store \(storeRoot).")
        }
        return (String(components[0]), String(components[1]))
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
    /// The versions one program replaces of a file are kept at least this far apart (0: every one).
    public var spacing: TimeInterval = 1

    public init() {}
}

/// Whether a version is kept, by the time since the last one kept at its place (a file and the
/// program replacing it): a program's burst of replacements keeps the version from before it, and
/// the file's older versions stay, where each rewrite would push one out. One value, which its
/// owner serializes; places whose last keep is past the spacing are let go.
public struct VersionSpacing<Place: Hashable & Sendable>: Sendable {
    /// Nanoseconds; 0 keeps every version.
    public let interval: UInt64
    private var lastKept: [Place: UInt64] = [:]
    private var pruneAt = 4096

    /// At most a year: longer would overflow the nanoseconds, and no burst lasts that long.
    public init(seconds: TimeInterval) {
        interval = UInt64((seconds.isNaN ? 0 : min(max(0, seconds), 365 * 86_400)) * 1_000_000_000)
    }

    /// Whether a version of `place` replaced at `moment` (monotonic nanoseconds) is kept; one that
    /// is becomes the place's last. Moments may come out of order (a save's keep is decided at
    /// once, a publish's on the background queue): either side of the last counts.
    public mutating func admits(_ place: Place, at moment: UInt64) -> Bool {
        guard interval > 0 else { return true }
        if let last = lastKept[place], (moment > last ? moment - last : last - moment) < interval { return false }
        if lastKept.count >= pruneAt {
            lastKept = lastKept.filter { moment > $0.value ? moment - $0.value < interval : true }
            pruneAt = max(4096, 2 * lastKept.count)
        }
        lastKept[place] = moment
        return true
    }

    var tracked: Int { lastKept.count }
}

/// Which versions go: one value, transitions that say what to remove (the caller removes them).
/// A keep costs in proportion to its file's versions, not the store's: each directory's versions
/// are queued apart, and the store-wide queue (oldest first, for age and space) skips the ones a
/// file's count took out of turn.
public struct VersionRetention: Sendable {
    /// What a transition gives up: versions, and the directories left without any.
    public struct Removal: Sendable, Equatable {
        public var versions: [FileVersionRecord] = []
        public var emptiedDirectories: [String] = []
    }

    /// A version and the number it was counted under (names can come back; numbers do not).
    private struct Entry {
        let serial: UInt64
        let version: FileVersionRecord
    }

    public let limits: VersionLimits
    /// Every version counted, oldest first, with entries already taken (not in `live`) among them.
    private var order: Deque<Entry> = []
    /// Each directory's versions, oldest first.
    private var byDirectory: [String: Deque<Entry>] = [:]
    private var live: Set<UInt64> = []
    private var nextSerial: UInt64 = 0
    private(set) var totalBytes: UInt64 = 0

    public init(limits: VersionLimits, existing: [FileVersionRecord]) {
        self.limits = limits
        for version in existing.sorted(by: { $0.replacedAt < $1.replacedAt }) { insert(version) }
    }

    public var count: Int { live.count }

    /// A version was kept: what must go now, by the file's count, age, and the store's space.
    public mutating func kept(_ version: FileVersionRecord, now: Date = Date()) -> Removal {
        // Counted already: the first keep loads the store's versions, the one just kept among them.
        if let queue = byDirectory[version.directory],
           queue.reversed().prefix(while: { $0.version.replacedAt >= version.replacedAt }).contains(where: { $0.version.name == version.name }) {
            return Removal()
        }
        insert(version)
        var removal = Removal()
        if let queue = byDirectory[version.directory], queue.count > limits.count, let oldest = queue.first {
            take(oldest, into: &removal)
        }
        while let first = oldest(), now.timeIntervalSince(first.version.replacedAt) > limits.age { take(first, into: &removal) }
        let more = freeSpace(needed: 0)
        removal.versions += more.versions
        removal.emptiedDirectories += more.emptiedDirectories
        return removal
    }

    /// Removes the oldest versions until their total fits `space` and `needed` more bytes are gained.
    public mutating func freeSpace(needed: UInt64) -> Removal {
        var removal = Removal()
        var gained: UInt64 = 0
        while let first = oldest(), totalBytes > limits.space || gained < needed {
            gained += first.version.allocatedBytes
            take(first, into: &removal)
        }
        return removal
    }

    /// Versions removed by someone else (the shell, the client library).
    public mutating func forget(_ versions: [FileVersionRecord]) {
        var ignored = Removal()
        for version in versions {
            if let entry = byDirectory[version.directory]?.first(where: { $0.version.name == version.name }) {
                take(entry, into: &ignored)
            }
        }
    }

    /// Counts `version` in, in time order (they arrive in it but for clocks and queues: from the end).
    private mutating func insert(_ version: FileVersionRecord) {
        let entry = Entry(serial: nextSerial, version: version)
        nextSerial += 1
        live.insert(entry.serial)
        Self.insert(entry, into: &order)
        Self.insert(entry, into: &byDirectory[version.directory, default: []])
        totalBytes += version.allocatedBytes
    }

    private static func insert(_ entry: Entry, into queue: inout Deque<Entry>) {
        var index = queue.endIndex
        while index > queue.startIndex, queue[index - 1].version.replacedAt > entry.version.replacedAt { index -= 1 }
        queue.insert(entry, at: index)
    }

    /// The oldest version still counted, dropping the entries taken out of turn before it.
    private mutating func oldest() -> Entry? {
        while let first = order.first, !live.contains(first.serial) { order.removeFirst() }
        return order.first
    }

    private mutating func take(_ entry: Entry, into removal: inout Removal) {
        guard live.remove(entry.serial) != nil else { return }
        let directory = entry.version.directory
        if var queue = byDirectory.removeValue(forKey: directory) {
            if let index = queue.firstIndex(where: { $0.serial == entry.serial }) { queue.remove(at: index) }
            if queue.isEmpty { removal.emptiedDirectories.append(directory) } else { byDirectory[directory] = queue }
        }
        totalBytes -= min(totalBytes, entry.version.allocatedBytes)
        removal.versions.append(entry.version)
        // Entries taken out of turn wait in `order` until they come first: compacted when they
        // outnumber the counted ones, so that a file rewritten all day holds no more than its count.
        if order.count > 2 * live.count + 64 { order.removeAll { !live.contains($0.serial) } }
    }
}

extension Date {
    /// A file time from `stat`.
    public init(_ time: timespec) {
        self.init(timeIntervalSince1970: Double(time.tv_sec) + Double(time.tv_nsec) / 1e9)
    }
}
