import Containers
import Coordination
import Dispatch
import Foundation
import Glibc

/// Keeps the previous versions of files in Documents and Library, in the store's versions
/// directory (docs/versions.md), within the mount's limits: the file a publish swaps out, and the
/// file an editor's save renames a new one over.
public final class VersionKeeper: @unchecked Sendable {
    private let store: VersionStore
    let limits: VersionLimits
    /// The container of the mount's root, when one app is mounted alone, and the directory the
    /// root is in it (`root=DIR`).
    private let rootContainer: String?
    private let rootDirectory: [String]

    private struct State {
        /// Loaded from the store when the first version is kept.
        var retention: VersionRetention?
        /// Versions directories made and open, by their item's place: a keep then makes none, and
        /// links by name in the directory. A few (the files being edited): a descriptor each.
        var directories: [ItemPath: Directory] = [:]
        /// The containers' versions directories, open: a file's is made and opened in its
        /// container's without a walk from the store's root.
        var containers: [String: DirectoryHandle] = [:]
    }
    private static let directoriesKept = 8
    private static let containersKept = 16

    /// A versions directory, open for linking into while a keep may use it.
    final class Directory: Sendable {
        let handle: DirectoryHandle
        var path: String { handle.path }
        var descriptor: Int32 { handle.fd }

        init(_ handle: DirectoryHandle) { self.handle = handle }
    }

    /// Where a replaced version is kept, and the thread that replaced it (its last writer, or the
    /// renamer). The spacing counts per writer: one program's burst keeps one version, and another
    /// program's replacement (a restore, a script's next command) is kept whenever it comes.
    struct Place: Hashable, Sendable {
        let path: ItemPath
        let writer: pid_t
    }

    /// A version linked into its directory.
    struct Kept: Sendable {
        let directory: Directory
        let nanoseconds: UInt64

        var name: String { VersionStore.withName(nanoseconds) { String(cString: $0) } }
    }
    private let state = Locked(State())
    /// When each program last had a version of a file kept (`VersionLimits.spacing`).
    private let spacing: Locked<VersionSpacing<Place>>
    /// Tells presenters of a version kept, by its name and the item's path; set before the
    /// session runs.
    var announce: @Sendable (String, ItemPath) -> Void = { _, _ in }
    /// Takes a version the limits remove (its name, its open directory) as a spare shadow
    /// (`Shadows.recycle`), or says no; set before the session runs.
    var recycle: @Sendable (String, Int32) -> Bool = { _, _ in false }
    /// Moves versions aside and removes what the limits no longer allow, off the requests' threads,
    /// one at a time (a directory is never removed while a version goes into it).
    private let queue = DispatchQueue(label: "containerfs.versions", qos: .utility)

    public init(store: Store, limits: VersionLimits, rootApp: String?, rootDirectory: [String]) {
        self.store = VersionStore(store: store)
        self.limits = limits
        spacing = Locked(VersionSpacing(seconds: limits.spacing))
        rootContainer = rootApp
        self.rootDirectory = rootDirectory
    }

    /// Where `node`'s versions go, if they are kept: files in Documents and Library (not Caches,
    /// tmp or the Inbox). Asked when it is replaced, since a later rename changes it. (A mount that
    /// keeps no versions has no keeper.)
    func place(of node: Node, in nodes: NodeTable) -> ItemPath? {
        guard node.zone == .data else { return nil }
        return nodes.itemPath(of: node)
    }

    /// Where the versions of the item `name` in `parent` go, if they are kept.
    func place(ofName name: [UInt8], in parent: Node, nodes: NodeTable) -> ItemPath? {
        guard name.withUnsafeBytes({ parent.zone.child(named: $0) }) == .data else { return nil }
        return nodes.itemPath(of: parent, appending: name)
    }

    /// The container and the path in it of an item at `itemPath` from the mount's root.
    private func split(_ itemPath: ItemPath) -> (container: String, path: String)? {
        var names = itemPath.components.map { String(decoding: $0.bytes, as: UTF8.self) }
        if let rootContainer { return (rootContainer, (rootDirectory + names).joined(separator: "/")) }
        guard names.count > 1 else { return nil }
        let container = names.removeFirst()
        return (container, names.joined(separator: "/"))
    }

    /// The directory that holds (or will hold) `node`'s versions.
    func directory(of node: Node, in nodes: NodeTable) -> String? {
        place(of: node, in: nodes).flatMap(split).map { store.directory(container: $0.container, path: $0.path) }
    }

    /// Puts the previous version named `name` in `directory` (the shadows') among the versions of
    /// the item at `place`, after the writer's close; removes it instead when none may be kept (the
    /// store is below its free-space floor) or a call fails (a shadow left behind goes at the next
    /// mount), and reuses it as a spare within its writer's spacing. An empty file is not kept:
    /// there is nothing to put back (an editor that truncates before it writes publishes one for a
    /// moment).
    /// `replaced` and `moment`: when it was replaced (a publish kept waiting for its data keeps its
    /// version later: `UnsyncedPublish`).
    func keep(_ name: [CChar], in directory: Int32, at place: Place, replacedAt replaced: Date = Date(),
              moment: UInt64 = DispatchTime.now().uptimeNanoseconds) {
        queue.asyncInBackground { [self] in
            var attributes = stat()
            if fstatat(directory, name, &attributes, AT_SYMLINK_NOFOLLOW) == 0, attributes.st_size > 0 {
                // Within a burst the version from before it stays the file's last kept: this one
                // becomes a spare, as a version nobody keeps does.
                guard spacing.withLock({ $0.admits(place, at: moment) }) else {
                    return reuseOrRemove(String(cString: name), in: directory)
                }
                // Linked, then unlinked from the shadows: a rename out of their directory would take
                // the lock of two directories, and contend with every publish's.
                if let kept = link(name, in: directory, at: place.path, replacedAt: replaced) {
                    Shadows.removePrevious(name, in: directory)
                    return retain(kept, of: place.path)
                }
            }
            Shadows.removePrevious(name, in: directory)
        }
    }

    /// Before an editor's save renames a file over `name` in `parent`, links the file it replaces
    /// into its versions (unless the renamer had one of it kept within the spacing). Returns the
    /// version, to remove if the rename fails.
    func keepReplaced(_ name: UnsafePointer<CChar>, in parent: Int32, at place: Place) -> Kept? {
        guard spacing.withLock({ $0.admits(place, at: DispatchTime.now().uptimeNanoseconds) }) else { return nil }
        return link(name, in: parent, at: place.path, replacedAt: Date())
    }

    /// Links `name` in `directory` into the versions of the item at `place`, by names relative to
    /// open directories (an editor's save waits for this): the version, or nil. A versions
    /// directory removed since it was made (its last version removed through the client library
    /// or the command) is made again, once.
    private func link(_ name: UnsafePointer<CChar>, in directory: Int32, at place: ItemPath, replacedAt: Date) -> Kept? {
        // Named when it was replaced; a name taken (two replaced in one nanosecond) takes the next.
        var nanoseconds = UInt64(max(0, replacedAt.timeIntervalSince1970) * 1_000_000_000)
        attempts: for _ in 0..<2 {
            guard spaceAllowsVersions(onFilesystemOf: directory), let versions = versionsDirectory(of: place) else { return nil }
            while VersionStore.withName(nanoseconds, { linkat(directory, name, versions.descriptor, $0, 0) }) != 0 {
                let error = errno
                guard error == EEXIST else {
                    forgetDirectories { $0 === versions }
                    if error == ENOENT { continue attempts }
                    return nil
                }
                nanoseconds += 1
            }
            return Kept(directory: versions, nanoseconds: nanoseconds)
        }
        return nil
    }

    /// The save renamed over the version's file: it is kept now.
    func replaced(_ version: Kept, of place: ItemPath) {
        queue.asyncInBackground { self.retain(version, of: place) }
    }

    /// Waits for the versions being put aside (at unmount: a later mount would remove them).
    func finish() {
        queue.sync {}
    }

    /// The save failed: the file is still in place, and needs no version. One that cannot be
    /// removed now is counted as kept, so that the limits remove it in turn.
    func notReplaced(_ version: Kept, of place: ItemPath) {
        let removed = VersionStore.withName(version.nanoseconds) { unlinkat(version.directory.descriptor, $0, 0) }
        if removed != 0 && errno != ENOENT { replaced(version, of: place) }
    }

    /// Checks the free-space floor between keeps too, on the filesystem of `directory` (open for
    /// the daemon's life): while other writes fill it, the oldest versions go within `interval`
    /// seconds, and at once when a write finds it full (`spaceRanOut`) (docs/versions.md, "Limits").
    func watchFloor(onFilesystemOf directory: Int32, every interval: Double) {
        floorDirectory = directory
        floorTimer.schedule(deadline: .now() + interval, repeating: interval, leeway: .seconds(1))
        floorTimer.setEventHandler { [weak self] in _ = self?.spaceAllowsVersions(onFilesystemOf: directory) }
        floorTimer.resume()
    }

    /// A write found the store's filesystem full.
    func spaceRanOut() {
        queue.asyncInBackground { [self] in
            if floorDirectory >= 0 { _ = spaceAllowsVersions(onFilesystemOf: floorDirectory) }
        }
    }

    /// Set by `watchFloor` before the session runs.
    private var floorDirectory: Int32 = -1
    private lazy var floorTimer = DispatchSource.makeTimerSource(queue: queue)

    deinit {
        if floorDirectory >= 0 { floorTimer.cancel() }
    }

    /// Whether the store's filesystem has room for versions now (its free-space floor); if not,
    /// the oldest versions go, off the caller's thread.
    private func spaceAllowsVersions(onFilesystemOf directory: Int32) -> Bool {
        var disk = statvfs()
        guard fstatvfs(directory, &disk) == 0 else { return false }
        let free = UInt64(disk.f_bavail) * UInt64(disk.f_frsize)
        let floor = limits.floor ?? UInt64(disk.f_blocks) * UInt64(disk.f_frsize) / 10
        guard free < floor else { return true }
        let removal = withRetention { $0.freeSpace(needed: floor - free) }
        queue.asyncInBackground { self.remove(removal) }
        return false
    }

    /// The item's versions directory, made and opened the first time.
    private func versionsDirectory(of place: ItemPath) -> Directory? {
        if let known = state.withLock({ $0.directories[place] }) { return known }
        guard let (container, path) = split(place) else { return nil }
        // A container's directory removed by hand since it was opened is made again.
        let made: DirectoryHandle
        if let parent = state.withLock({ $0.containers[container] }), let found = try? store.prepare(path: path, in: parent) {
            made = found
        } else {
            guard let parent = try? store.containerDirectory(container), let found = try? store.prepare(path: path, in: parent) else { return nil }
            state.withLock { $0.containers.set(parent, for: container, keepingAtMost: Self.containersKept) }
            made = found
        }
        let opened = Directory(made)
        state.withLock { $0.directories.set(opened, for: place, keepingAtMost: Self.directoriesKept) }
        return opened
    }

    /// Closes the directories that turned out to be gone (removed by hand, or emptied by the
    /// limits) once nobody links into them: made again next time.
    private func forgetDirectories(where gone: (Directory) -> Bool) {
        state.withLock { state in state.directories = state.directories.filter { !gone($0.value) } }
    }

    /// Counts a kept version, tells presenters, and removes what the limits no longer allow.
    private func retain(_ kept: Kept, of place: ItemPath) {
        guard let version = VersionStore.record(named: kept.name, in: kept.directory.handle) else { return }
        announce(version.name, place)
        remove(withRetention { $0.kept(version) })
    }

    private func withRetention<R>(_ body: (inout VersionRetention) -> R) -> R {
        // The store's versions are listed outside the lock, which a save's rename takes too: a
        // store of many versions takes a while. A version kept meanwhile is counted once (`kept`).
        if state.withLock({ $0.retention == nil }) {
            let listed = VersionRetention(limits: limits, existing: store.allVersions())
            state.withLock { state in if state.retention == nil { state.retention = listed } }
        }
        return state.withLock { state in
            var retention = state.retention ?? VersionRetention(limits: limits, existing: [])
            // Taken out, so that it is changed in place rather than copied.
            state.retention = nil
            defer { state.retention = retention }
            return body(&retention)
        }
    }

    /// Makes a version no one keeps a spare shadow (`recycle`), or removes it.
    private func reuseOrRemove(_ name: String, in directory: Int32) {
        if !recycle(name, directory) { unlinkat(directory, name, 0) }
    }

    /// On `queue`. A version someone removed already (the shell, the client library) is gone either
    /// way. Its directory is reached as the store made it, never through a link planted there.
    private func remove(_ removal: VersionRetention.Removal) {
        let containers = state.withLock { $0.containers }
        for version in removal.versions {
            // The directory of a file being rewritten is open already: the keep just linked into it.
            let known = state.withLock { $0.directories.values.first { $0.path == version.directory }?.handle }
            guard let directory = known ?? (try? store.open(version.directory, known: { containers[$0] })) else { continue }
            reuseOrRemove(version.name, in: directory.fd)
        }
        for directory in removal.emptiedDirectories {
            forgetDirectories { $0.path == directory }
            store.removeDirectory(directory)
        }
    }
}

private extension Dictionary {
    /// Sets `value` for `key`, dropping any one other entry first when `limit` are held: the
    /// keeper's caches of open directories, a descriptor each.
    mutating func set(_ value: Value, for key: Key, keepingAtMost limit: Int) {
        if self[key] == nil, count >= limit, let any = keys.first { self[any] = nil }
        self[key] = value
    }
}
