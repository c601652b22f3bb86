import Containers
import Coordination
import Dispatch
import Foundation
import Glibc
import Synchronization

/// Keeps the previous versions of files in Documents and Library, in the store's versions
/// directory (docs/versions.md), within the mount's limits: the file a publish swaps out, and the
/// file an editor's save renames a new one over.
public final class VersionKeeper: @unchecked Sendable {
    /// Where a file's versions go: its container, and its path in it.
    struct Place {
        var container: String
        var path: String
    }

    private let store: VersionStore
    let limits: VersionLimits
    /// The container of the mount's root, when one app is mounted alone, and the directory the
    /// root is in it (`root=DIR`).
    private let rootContainer: String?
    private let rootDirectory: [String]
    /// Loaded from the store when the first version is kept.
    private let retention = Mutex<VersionRetention?>(nil)
    /// Removes what the limits no longer allow, off the requests' threads.
    private let queue = DispatchQueue(label: "containerfs.versions", qos: .utility)

    public init(store: Store, limits: VersionLimits, rootApp: String?, rootDirectory: [String]) {
        self.store = VersionStore(store: store)
        self.limits = limits
        rootContainer = rootApp
        self.rootDirectory = rootDirectory
    }

    /// Where `node`'s versions go, if they are kept: files in Documents and Library (not Caches,
    /// tmp or the Inbox). Asked when it is replaced, since a later rename changes it.
    func place(of node: Node, in nodes: NodeTable) -> Place? {
        guard limits.count > 0, node.zone == .data else { return nil }
        return place(nodes.itemPath(of: node))
    }

    /// Where the versions of the item `name` in `parent` go, if they are kept.
    func place(ofName name: [UInt8], in parent: Node, nodes: NodeTable) -> Place? {
        guard limits.count > 0, name.withUnsafeBytes({ parent.zone.child(named: $0) }) == .data else { return nil }
        return place(nodes.itemPath(of: parent, appending: name))
    }

    private func place(_ itemPath: ItemPath) -> Place? {
        var names = itemPath.components.map { String(decoding: $0.bytes, as: UTF8.self) }
        if let rootContainer { return Place(container: rootContainer, path: (rootDirectory + names).joined(separator: "/")) }
        guard names.count > 1 else { return nil }
        let container = names.removeFirst()
        return Place(container: container, path: names.joined(separator: "/"))
    }

    /// The directory that holds (or will hold) `node`'s versions.
    func directory(of node: Node, in nodes: NodeTable) -> String? {
        place(of: node, in: nodes).map { store.directory(container: $0.container, path: $0.path) }
    }

    /// Moves the previous version named `name` in `directory` (the shadows') into the file's
    /// versions. False if it was not kept (the store is below its free-space floor, or a call
    /// failed): the caller removes it.
    func keep(_ name: [CChar], in directory: Int32, at place: Place) -> Bool {
        guard let destination = prepare(place, onFilesystemOf: directory) else { return false }
        guard renameat(directory, name, AT_FDCWD, destination) == 0 else { return false }
        retain(destination)
        return true
    }

    /// Before an editor's save renames a file over `name` in `parent`, links the file it replaces
    /// into its versions. Returns the version's path, to remove if the rename fails.
    func keepReplaced(_ name: UnsafePointer<CChar>, in parent: Int32, at place: Place) -> String? {
        guard let destination = prepare(place, onFilesystemOf: parent) else { return nil }
        guard linkat(parent, name, AT_FDCWD, destination, 0) == 0 else { return nil }
        return destination
    }

    /// The save renamed over the version's file: it is kept now.
    func replaced(_ version: String) {
        queue.async { self.retain(version) }
    }

    /// The save failed: the file is still in place, and needs no version.
    func notReplaced(_ version: String) {
        unlink(version)
    }

    /// A new version's path in the place's versions directory, or nil when none may be kept now.
    private func prepare(_ place: Place, onFilesystemOf directory: Int32) -> String? {
        var disk = statvfs()
        guard fstatvfs(directory, &disk) == 0 else { return nil }
        let free = UInt64(disk.f_bavail) * UInt64(disk.f_frsize)
        let floor = limits.floor ?? UInt64(disk.f_blocks) * UInt64(disk.f_frsize) / 10
        if free < floor {
            let removed = withRetention { $0.freeSpace(needed: floor - free) }
            queue.async { VersionKeeper.remove(removed) }
            return nil
        }
        guard let versions = try? store.prepare(container: place.container, path: place.path) else { return nil }
        return versions + "/" + VersionStore.newName(in: versions)
    }

    /// Counts a kept version, and removes what the limits no longer allow.
    private func retain(_ path: String) {
        let directory = (path as NSString).deletingLastPathComponent
        let name = (path as NSString).lastPathComponent
        guard let version = VersionStore.versions(in: directory).first(where: { $0.name == name }) else { return }
        VersionKeeper.remove(withRetention { $0.kept(version) })
    }

    private func withRetention<R>(_ body: (inout VersionRetention) -> R) -> R {
        retention.withLock { state in
            var current = state ?? VersionRetention(limits: limits, existing: store.allVersions())
            defer { state = current }
            return body(&current)
        }
    }

    private static func remove(_ versions: [FileVersionRecord]) {
        // A version someone removed already (the shell, the client library) is gone either way.
        for version in versions { try? VersionStore.remove(version) }
    }
}
