import Foundation

/// Whole-container steps of an app's life: uninstalling, emptying tmp.
public enum Lifecycle {
    /// Removes an app: its record and seal first (so it stops being installed at once), then its
    /// container. Both are first moved into the store's work directory, so a crash midway leaves
    /// either the whole app or scratch to clear, never half a container that still looks installed.
    ///
    /// Refusing while the store is mounted is the caller's job: pass `mountCheck`, which throws to refuse.
    public static func uninstall(store: Store, id: AppID, mountCheck: (Store, AppID) throws -> Void = { _, _ in }) throws {
        guard store.isInstalled(id) || FileManager.default.fileExists(atPath: store.containerPath(id)) else {
            throw ContainerError("No app \(id) in the store \(store.root). `containerfs list \(store.root)` shows what is installed.")
        }
        try mountCheck(store, id)
        let trash = store.workPath + "/" + scratchName("uninstall-\(id.rawValue)")
        try FileManager.default.createDirectory(atPath: trash, withIntermediateDirectories: true)
        for (path, name) in [(store.recordDirectory(id), "record"), (store.containerPath(id), "container")] {
            guard rename(path, trash + "/" + name) == 0 || errno == ENOENT else { throw posixError("rename", path) }
        }
        try FileTree.remove(trash)
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
