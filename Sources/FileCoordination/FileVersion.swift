import Containers
import Coordination
import Foundation
import Glibc

/// A version of a file in a ContainerFS mount, as Apple's `NSFileVersion`: the current one, or a
/// previous one the mount kept when the file was replaced (by a whole-file write or a save).
///
/// The mount names where a file's versions are (the attribute `user.containerfs.versions`); they
/// are in its store, which the store's owner reaches. Inside `containerfs run` the store is out of
/// reach, and an item has no other versions (docs/versions.md).
public final class FileVersion: @unchecked Sendable, Equatable, CustomStringConvertible {
    public struct ReplacingOptions: OptionSet, Sendable {
        public let rawValue: UInt
        public init(rawValue: UInt) { self.rawValue = rawValue }
        /// Move the version's contents instead of copying them: the version is gone afterwards.
        public static let byMoving = ReplacingOptions(rawValue: 1 << 0)
    }

    /// The attribute through which a mount says where a file's versions are kept.
    public static let versionsAttribute = "user.containerfs.versions"

    /// Where to read this version: the item itself for the current version.
    public let url: URL
    /// When its contents were last changed.
    public let modificationDate: Date?
    /// Names the version among the item's: `v-NANOSECONDS` (when it was replaced), or
    /// `current`. Pass it to `version(itemAt:forPersistentIdentifier:)`.
    public let persistentIdentifier: String
    /// When it stopped being the item's contents (nil for the current version).
    public let replacementDate: Date?
    private let record: FileVersionRecord?

    /// Conflict versions are the `Document` class's conflict copies, beside the item; the mount
    /// keeps none, so every version is resolved and none is a conflict.
    public let isConflict = false
    public var isResolved = true
    /// Every version may be removed when space runs low or it ages out (the mount's limits).
    public var isDiscardable = true
    /// Versions are always on this disk.
    public let hasLocalContents = true
    public let hasThumbnail = false
    /// This computer's name: every version was saved on it.
    public var localizedNameOfSavingComputer: String? { ProcessInfo.processInfo.hostName }
    /// The item's name, as Apple's versions show it.
    public let localizedName: String?

    private init(url: URL, modificationDate: Date?, persistentIdentifier: String, replacementDate: Date?,
                 record: FileVersionRecord?, localizedName: String?) {
        self.url = url
        self.modificationDate = modificationDate
        self.persistentIdentifier = persistentIdentifier
        self.replacementDate = replacementDate
        self.record = record
        self.localizedName = localizedName
    }

    public var description: String {
        "FileVersion(\(persistentIdentifier), modified \(modificationDate.map { "\($0)" } ?? "?"))"
    }

    public static func == (lhs: FileVersion, rhs: FileVersion) -> Bool {
        lhs.url == rhs.url && lhs.persistentIdentifier == rhs.persistentIdentifier
    }

    /// The item's contents now; nil if it does not exist.
    public class func currentVersionOfItem(at url: URL) -> FileVersion? {
        var attributes = stat()
        guard stat(url.path, &attributes) == 0 else { return nil }
        return FileVersion(url: url, modificationDate: Date(attributes.st_mtim), persistentIdentifier: "current",
                           replacementDate: nil, record: nil, localizedName: url.lastPathComponent)
    }

    /// The item's previous versions, oldest first; nil if the item does not exist. Empty for an
    /// item whose mount keeps no versions, or whose store this process cannot reach.
    public class func otherVersionsOfItem(at url: URL) -> [FileVersion]? {
        guard access(url.path, F_OK) == 0 else { return nil }
        guard let directory = versionsDirectory(of: url) else { return [] }
        return VersionStore.versions(in: directory).map { FileVersion(record: $0, of: url) }
    }

    /// The mount keeps no conflict versions: always empty (nil if the item does not exist).
    public class func unresolvedConflictVersionsOfItem(at url: URL) -> [FileVersion]? {
        access(url.path, F_OK) == 0 ? [] : nil
    }

    /// The version of the item named `persistentIdentifier`, if it is still kept.
    public class func version(itemAt url: URL, forPersistentIdentifier persistentIdentifier: Any) -> FileVersion? {
        guard let identifier = persistentIdentifier as? String else { return nil }
        if identifier == "current" { return currentVersionOfItem(at: url) }
        // One lookup, not a listing: a presenter asks for each version as the mount keeps it.
        guard let directory = versionsDirectory(of: url),
              let record = VersionStore.record(named: identifier, in: directory) else { return nil }
        return FileVersion(record: record, of: url)
    }

    private convenience init(record: FileVersionRecord, of item: URL) {
        // A record is a regular file's: told so, the URL needs no stat (`fileURL`).
        self.init(url: URL(fileURLWithPath: record.path, isDirectory: false), modificationDate: record.modifiedAt,
                  persistentIdentifier: record.name, replacementDate: record.replacedAt, record: record,
                  localizedName: item.lastPathComponent)
    }

    /// Puts this version's contents in place of the item at `url` (usually the item it is a version
    /// of), and returns `url`. In a mount the write is one atomic replace, so the contents it
    /// replaces become a version in turn. Coordinate a write of `url` around it, as on Apple's systems.
    @discardableResult
    public func replaceItem(at url: URL, options: ReplacingOptions = []) throws -> URL {
        guard record != nil else { return url }
        let source = Glibc.open(self.url.path, O_RDONLY | O_CLOEXEC)
        guard source >= 0 else { throw FileVersion.error(errno, self.url) }
        defer { close(source) }
        var attributes = stat()
        guard fstat(source, &attributes) == 0 else { throw FileVersion.error(errno, self.url) }
        let destination = Glibc.open(url.path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, attributes.st_mode & 0o7777)
        guard destination >= 0 else { throw FileVersion.error(errno, url) }
        var failure: (any Error)?
        do { try TreeCopier.copyData(from: source, to: destination, path: url.path) } catch { failure = error }
        // The close publishes in a mount: its error is the replacement's.
        if close(destination) != 0, failure == nil { failure = FileVersion.error(errno, url) }
        if let failure {
            throw failure is CocoaError ? failure
                : CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: url.path, NSUnderlyingErrorKey: failure])
        }
        if options.contains(.byMoving) { try remove() }
        return url
    }

    /// Removes this previous version. The current version cannot be removed this way (as on
    /// Apple's systems, remove the item instead).
    public func remove() throws {
        guard let record else {
            throw CocoaError(.fileWriteNoPermission, userInfo: [NSFilePathErrorKey: url.path])
        }
        do { try VersionStore.remove(record) } catch { throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: url.path, NSUnderlyingErrorKey: error]) }
    }

    /// Removes every previous version of the item.
    public class func removeOtherVersionsOfItem(at url: URL) throws {
        for version in otherVersionsOfItem(at: url) ?? [] { try version.remove() }
    }

    /// The directory the mount names for the item's versions, if it keeps them and it is reachable.
    public static func versionsDirectory(of url: URL) -> String? {
        let now = DispatchTime.now().uptimeNanoseconds
        if let known = knownDirectories.withLock({ $0[url.path] }), known.until > now { return known.directory }
        guard case .value(let bytes) = MountLocator.getxattrReader(url.path, versionsAttribute), !bytes.isEmpty else { return nil }
        let directory = String(decoding: bytes, as: UTF8.self)
        knownDirectories.withLock { known in
            if known.count >= 1024 { known.removeAll() }
            known[url.path] = (directory, now + 1_000_000_000)
        }
        return directory
    }

    /// Versions directories the mounts named in the last second, by item path: a presenter hears
    /// of each version kept, and each answer was a request to the daemon. (A path's directory does
    /// not change while its mount runs.)
    private static let knownDirectories = Locked<[String: (directory: String, until: UInt64)]>([:])

    private static func error(_ code: Int32, _ url: URL) -> Error {
        CocoaError(code == ENOENT ? .fileNoSuchFile : code == EACCES || code == EPERM ? .fileWriteNoPermission : .fileWriteUnknown,
                   userInfo: [NSFilePathErrorKey: url.path, NSUnderlyingErrorKey: POSIXError(POSIXErrorCode(rawValue: code) ?? .EIO)])
    }
}
