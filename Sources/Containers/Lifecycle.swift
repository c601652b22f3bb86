import Foundation

/// Whole-container steps of an app's life: uninstalling, emptying tmp.
public enum Lifecycle {
    /// Removes an app: its record and seal first (so it stops being installed at once), then its
    /// container. Both are first moved into the store's work directory, so a crash midway leaves
    /// either the whole app or scratch to clear, never half a container that still looks installed.
    ///
    /// The shared container of a group goes with its last member, as on iOS.
    ///
    /// Refusing while the store is mounted is the caller's job: pass `mountCheck`, which throws to refuse.
    public static func uninstall(store: Store, id: AppID, mountCheck: (Store, AppID) throws -> Void = { _, _ in }) throws {
        guard !id.isGroup else {
            throw ContainerError("\(id) is an app group: its shared container is removed with the last of its apps (\(((try? store.members(of: id)) ?? []).map(\.id).joined(separator: ", "))).")
        }
        guard store.isInstalled(id) || FileManager.default.fileExists(atPath: store.containerPath(id)) else {
            throw ContainerError("No app \(id) in the store \(store.root). `containerfs list \(store.root)` shows what is installed.")
        }
        try mountCheck(store, id)
        let groups = (try? store.record(id))?.groupIDs ?? []
        let trash = store.workPath + "/" + scratchName("uninstall-\(id.rawValue)")
        try FileManager.default.createDirectory(atPath: trash, withIntermediateDirectories: true)
        func discard(_ path: String, as name: String) throws {
            guard rename(path, trash + "/" + name) == 0 || errno == ENOENT else { throw posixError("rename", path) }
        }
        try discard(store.recordDirectory(id), as: "record")
        try discard(store.containerPath(id), as: "container")
        try discard(VersionStore(store: store).root + "/" + id.rawValue, as: "versions")
        // Asked once the record is gone, so that the app no longer counts as a member.
        for group in groups where try store.members(of: group).isEmpty {
            try discard(store.containerPath(group), as: group.rawValue)
            try discard(VersionStore(store: store).root + "/" + group.rawValue, as: group.rawValue + ".versions")
        }
        try FileTree.remove(trash)
        // Removed for good once it says so: a power cut would otherwise bring the app back whole.
        try store.syncToDisk()
    }

    /// Empties the container's tmp directory, recreating it if it is missing. Called at every
    /// mount and unmount: tmp is volatile and never reaches a backup.
    public static func emptyTmp(store: Store, id: AppID) throws {
        let container = try DirectoryHandle(path: store.containerPath(id))
        if mkdirat(container.fd, ContainerLayout.tmp, 0o755) == 0 { return }
        guard errno == EEXIST else { throw posixError("mkdir", store.tmpPath(id)) }
        try FileTree.removeContents(of: DirectoryHandle(in: container, ContainerLayout.tmp))
    }

    /// Clears scratch left in the store's work directory by crashed installs, deliveries,
    /// uninstalls and restores. Only call it when nothing else uses the store.
    public static func clearWork(store: Store) throws {
        try FileTree.removeContents(of: DirectoryHandle(path: store.workPath))
    }
}
