import CLinux
import Foundation
import Glibc

/// A failure a user can act on: the message says what went wrong and what to do.
public struct ContainerError: Error, CustomStringConvertible, Equatable {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// What the store records about an installed app.
public struct AppRecord: Codable, Sendable, Equatable {
    public var id: String
    /// The bundle's directory name in the container root, such as `Notes.app`.
    public var bundleName: String
    public var installedAt: Date
    /// The app groups whose shared containers the app reaches (absent in records made before groups).
    public var groups: [String]?

    public init(id: String, bundleName: String, installedAt: Date, groups: [String]? = nil) {
        self.id = id
        self.bundleName = bundleName
        self.installedAt = installedAt
        self.groups = groups
    }

    /// The groups, as identifiers (any a damaged record names that is not a group's is left out).
    public var groupIDs: [AppID] { (groups ?? []).compactMap(AppID.init).filter(\.isGroup) }
}

/// A store: an ordinary directory holding installed apps.
///
/// On disk (documented in docs/store-format.md):
///
///     STORE/containerfs-store.json   marks the directory as a store; holds the format version
///     STORE/containers/ID/           each container exactly as the mount shows it (apps' and groups')
///     STORE/apps/ID/app.json         what the store knows of the app (bundle name, install date, seal)
///     STORE/work/                    the daemon's scratch space on the same filesystem (shadows, staging)
public struct Store: Sendable {
    public static let formatVersion = 1
    public static let markerName = "containerfs-store.json"

    /// The store's absolute path.
    public let root: String

    public var markerPath: String { root + "/" + Store.markerName }
    public var containersPath: String { root + "/containers" }
    public var appsPath: String { root + "/apps" }
    public var workPath: String { root + "/work" }

    public func containerPath(_ id: AppID) -> String { containersPath + "/" + id.rawValue }
    public func recordDirectory(_ id: AppID) -> String { appsPath + "/" + id.rawValue }
    public func recordPath(_ id: AppID) -> String { recordDirectory(id) + "/app.json" }

    private struct Marker: Codable {
        var format: Int
        var kind: String
    }

    private init(root: String) { self.root = root }

    /// Opens an existing store, or explains why `path` is not one.
    public static func open(_ path: String) throws -> Store {
        let root = absolute(path)
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: root, isDirectory: &isDirectory) else {
            throw ContainerError("\(path): no such store. Create one with `containerfs install \(path) PATH/TO/Name.app`, or mount the demo with `containerfs mount --demo MOUNTPOINT`.")
        }
        guard isDirectory.boolValue else {
            throw ContainerError("\(path): not a directory, so not a store.")
        }
        let store = Store(root: root)
        guard let data = FileManager.default.contents(atPath: store.markerPath) else {
            throw ContainerError("\(path) is not a ContainerFS store (it has no \(Store.markerName)). Create a store with `containerfs install \(path) PATH/TO/Name.app`.")
        }
        guard let marker = try? JSONDecoder().decode(Marker.self, from: data), marker.kind == "containerfs-store" else {
            throw ContainerError("\(store.markerPath) is damaged: it is not the JSON a store marker holds. Restore it or recreate the store.")
        }
        guard marker.format <= formatVersion else {
            throw ContainerError("\(path) is a store of format \(marker.format), newer than this containerfs understands (\(formatVersion)). Upgrade containerfs.")
        }
        try store.repair()
        return store
    }

    /// Opens the store at `path`, creating it there if the path is missing or an empty directory.
    public static func openOrCreate(_ path: String) throws -> Store {
        let root = absolute(path)
        let fm = FileManager.default
        if fm.fileExists(atPath: root + "/" + markerName) { return try open(root) }
        if fm.fileExists(atPath: root) {
            let entries = (try? fm.contentsOfDirectory(atPath: root)) ?? []
            guard entries.isEmpty else {
                throw ContainerError("\(path) is not empty and not a ContainerFS store; choose a new or empty directory for the store.")
            }
        }
        let store = Store(root: root)
        try fm.createDirectory(atPath: root, withIntermediateDirectories: true)
        let marker = try JSONEncoder().encode(Marker(format: formatVersion, kind: "containerfs-store"))
        try store.repair()
        try marker.write(to: URL(fileURLWithPath: store.markerPath), options: .atomic)
        return store
    }

    /// The directory `name` in the store's work directory (`mounts`, `running`, `shadows`), reached
    /// one real directory at a time from the store's root: the store's owner owns them, and a
    /// daemon running as root must not follow a link planted there (docs/store-format.md). Nil
    /// when it does not exist.
    public func workDirectory(_ name: String) throws -> DirectoryHandle? {
        guard let work = try DirectoryHandle.ifPresent(in: DirectoryHandle(path: root), "work") else { return nil }
        return try DirectoryHandle.ifPresent(in: work, name)
    }

    /// The same, made (with `mode`) if it does not exist.
    public func makeWorkDirectory(_ name: String, mode: mode_t = 0o755) throws -> DirectoryHandle {
        let work = try DirectoryHandle.making("work", in: DirectoryHandle(path: root), mode: 0o755).directory
        return try DirectoryHandle.making(name, in: work, mode: mode).directory
    }

    /// Makes sure the store's own directories exist.
    public func repair() throws {
        for directory in [containersPath, appsPath, workPath] {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        }
    }

    /// The installed apps, sorted by ID.
    /// A listing that fails throws: taken for empty, it would hide every app.
    public func apps() throws -> [AppRecord] {
        try DirectoryHandle.names(ifPresentAt: appsPath).compactMap(AppID.init).sorted().map(record)
    }

    public func record(_ id: AppID) throws -> AppRecord {
        guard let data = FileManager.default.contents(atPath: recordPath(id)) else {
            throw ContainerError("No app \(id) in the store \(root). `containerfs list \(root)` shows what is installed.")
        }
        do {
            return try JSONDecoder.store.decode(AppRecord.self, from: data)
        } catch {
            throw ContainerError("\(recordPath(id)) is damaged (\(error)). Reinstall the app to repair it.")
        }
    }

    /// The app groups that have a shared container, sorted.
    public func groups() throws -> [AppID] {
        try DirectoryHandle.names(ifPresentAt: containersPath).compactMap(AppID.init).filter(\.isGroup).sorted()
    }

    /// The names in STORE/containers: every app's and group's container, and anything else there.
    public func containerNames() throws -> [String] {
        try DirectoryHandle.names(ifPresentAt: containersPath)
    }

    /// The installed apps that belong to `group`.
    public func members(of group: AppID) throws -> [AppRecord] {
        try apps().filter { $0.groupIDs.contains(group) }
    }

    public func isInstalled(_ id: AppID) -> Bool {
        FileManager.default.fileExists(atPath: recordPath(id))
    }

    func write(_ record: AppRecord) throws {
        guard let id = AppID(record.id) else { throw ContainerError("invalid app ID \(record.id)") }
        try FileManager.default.createDirectory(atPath: recordDirectory(id), withIntermediateDirectories: true)
        try JSONEncoder.store.encode(record).write(to: URL(fileURLWithPath: recordPath(id)), options: .atomic)
    }

    /// Makes everything written to the store's filesystem durable (`syncfs`): an install, a
    /// delivery, a restore or an uninstall reports success only once a power cut can no longer
    /// undo it.
    func syncToDisk() throws {
        let descriptor = Glibc.open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard descriptor >= 0 else { throw ContainerError("\(root): cannot open to sync (\(String(cString: strerror(errno)))).") }
        defer { close(descriptor) }
        guard clinux_syncfs(descriptor) == 0 else {
            throw ContainerError("\(root): syncing to disk failed (\(String(cString: strerror(errno)))); the disk may be failing.")
        }
    }

    /// Recreates any missing fixed directory of a container (an app's or a group's).
    /// Made one real directory at a time: the store's owner owns the containers, and a daemon
    /// running as root makes nothing through a link planted there.
    public func repairContainer(_ id: AppID) throws {
        let containers = try DirectoryHandle.making("containers", in: DirectoryHandle(path: root), mode: 0o755).directory
        let container = try DirectoryHandle.making(id.rawValue, in: containers, mode: 0o755).directory
        for directory in ContainerLayout.directories(of: id) {
            var parent = container
            for name in directory.split(separator: "/") {
                parent = try DirectoryHandle.making(String(name), in: parent, mode: 0o755).directory
            }
        }
    }

    /// `path` made absolute by its names alone, `.` and `..` taken away: nothing is looked at, so a
    /// mount point whose daemon does not answer does not hold it up (`containerfs unmount`).
    public static func absolute(_ path: String) -> String {
        var names: [Substring] = []
        for name in ((path.hasPrefix("/") ? "" : FileManager.default.currentDirectoryPath + "/") + path).split(separator: "/") {
            if name == ".." { _ = names.popLast() } else if name != "." { names.append(name) }
        }
        return "/" + names.joined(separator: "/")
    }
}

extension JSONEncoder {
    static var store: JSONEncoder {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        encoder.dateEncodingStrategy = .iso8601
        return encoder
    }
}

extension JSONDecoder {
    static var store: JSONDecoder {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return decoder
    }
}
