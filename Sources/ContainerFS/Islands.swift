import CLinux
import Containers
import Coordination
import Dispatch
import FUSELowLevel
import Glibc
import Synchronization

/// Which processes are which app's: the store's running-app records (`RunningApps`), watched with
/// inotify, map user namespaces to apps. A process in a recorded namespace reaches only its app's
/// container and its groups' (from the app's record); every other process is not confined
/// (docs/island.md).
final class Islands: @unchecked Sendable {
    enum Identity: Equatable {
        /// Not in any app's sandbox: mode bits and policy decide, as before.
        case unconfined
        /// A process of an app.
        case app(Reach)
        /// A process whose namespace cannot be read (it is gone): refused.
        case unknown
    }

    /// The containers an app's processes reach: its own, and its groups' shared ones.
    struct Reach: Equatable {
        var app: [UInt8]
        var groups: [[UInt8]] = []

        func contains(_ container: [UInt8]?) -> Bool {
            guard let container else { return false }
            return container == app || groups.contains(container)
        }
    }

    private struct State {
        /// The recorded namespaces (a sandbox's own; its processes may be in one nested in it).
        var recorded: [UInt64: Reach] = [:]
        /// Namespaces already traced to a record or to none, until the records change.
        var resolved: [UInt64: Identity] = [:]
    }

    private let store: Store
    private let directory: String
    private let descriptor: Int32
    private let source: DispatchSourceRead
    private let state = Locked(State())
    /// The daemon's own user namespace: its processes, and all of a machine without sandboxes.
    private let home: UInt64?
    /// Whether any app runs: requests skip the lookup of the caller's namespace when none does.
    let active = Atomic<Bool>(false)

    init?(store: Store) {
        self.store = store
        directory = RunningApps.directory(of: store)
        home = RunningApps.userNamespace(of: getpid())
        guard (try? RunningApps.prepare(store)) != nil else { return nil }
        descriptor = inotify_init1(Int32(IN_CLOEXEC | IN_NONBLOCK))
        guard descriptor >= 0 else { return nil }
        let mask = UInt32(IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_ONLYDIR | IN_DONT_FOLLOW)
        guard inotify_add_watch(descriptor, directory, mask) >= 0 else {
            close(descriptor)
            return nil
        }
        source = DispatchSource.makeReadSource(fileDescriptor: descriptor, queue: DispatchQueue(label: "containerfs.islands"))
        let descriptor = self.descriptor
        source.setEventHandler { [unowned self] in
            var buffer = [UInt8](repeating: 0, count: 4096)
            while read(descriptor, &buffer, buffer.count) > 0 {}
            reloadOnWatch()
        }
        source.setCancelHandler { close(descriptor) }
        source.resume()
        // Read once watched, so that no record made meanwhile is missed.
        guard (try? reload()) != nil else { return nil }
    }

    /// A reload that fails keeps the records read before; `containerfs run` asks again itself.
    private func reloadOnWatch() {
        do { _ = try reload() } catch {}
    }

    deinit { source.cancel() }

    /// Reads the records again: on the watch's word, and when `containerfs run` asks through the
    /// mount (`runningAppsAttribute`) before its program starts, so that no request of it comes
    /// first. Returns how many there are. A listing that fails throws and changes nothing: read
    /// in part, it would leave an app's processes unconfined.
    func reload() throws -> Int {
        let recorded = try Islands.records(in: store)
        install(recorded)
        return recorded.count
    }

    /// The recorded sandboxes' reaches, by namespace.
    private static func records(in store: Store) throws -> [UInt64: Reach] {
        var recorded: [UInt64: Reach] = [:]
        for (namespace, app) in try RunningApps.recorded(in: store) {
            // An app whose record cannot be read reaches its own container only.
            let groups = AppID(app).flatMap { try? store.record($0) }?.groupIDs ?? []
            recorded[namespace] = Reach(app: Array(app.utf8), groups: groups.map { Array($0.rawValue.utf8) })
        }
        return recorded
    }

    private func install(_ recorded: [UInt64: Reach]) {
        state.withLock { $0 = State(recorded: recorded, resolved: [:]) }
        active.store(!recorded.isEmpty, ordering: .releasing)
    }

    /// The identity of the process `pid` (a request's caller, a control client).
    func identity(of pid: pid_t) -> Identity {
        guard pid > 0 else { return .unconfined }
        guard let namespace = RunningApps.userNamespace(of: pid) else { return .unknown }
        if namespace == home { return .unconfined }
        if let known = state.withLock({ $0.resolved[namespace] }) { return known }
        let identity = trace(pid)
        // One that could not be traced (no descriptor left) is refused now and traced again next time.
        if identity != .unknown { state.withLock { $0.resolved[namespace] = identity } }
        return identity
    }

    /// Follows `pid`'s user namespace up through its parents to a recorded one (bubblewrap runs
    /// the program in a namespace nested in the sandbox's), or to the daemon's own.
    private func trace(_ pid: pid_t) -> Identity {
        var current = open("/proc/\(pid)/ns/user", O_RDONLY | O_CLOEXEC)
        guard current >= 0 else { return .unknown }
        defer { close(current) }
        for _ in 0..<32 {
            var attributes = stat()
            guard fstat(current, &attributes) == 0 else { return .unknown }
            let namespace = UInt64(attributes.st_ino)
            if namespace == home { return .unconfined }
            if let app = state.withLock({ $0.recorded[namespace] }) { return .app(app) }
            let parent = clinux_ns_parent(current)
            // EPERM: above the daemon's own namespace; nothing there is recorded. Any other failure
            // (EMFILE) says nothing of where the namespace is: refused, as an app's would be.
            guard parent >= 0 else { return errno == EPERM ? .unconfined : .unknown }
            close(current)
            current = parent
        }
        return .unknown
    }
}

extension ContainerFileSystem {
    /// A process of an app reaches only that app's container: any other node is EACCES, however
    /// the process came to name it (a passed descriptor, another mount of the store).
    public func admit(_ request: FuseRequest, inode: InodeNumber) -> Int32 {
        guard let islands, islands.active.load(ordering: .acquiring) else { return 0 }
        return admits(islands.identity(of: request.caller.pid), to: container(of: nodes.node(inode))) ? 0 : EACCES
    }

    func admits(_ identity: Islands.Identity, to container: [UInt8]?) -> Bool {
        switch identity {
        case .unconfined: return true
        case .unknown: return false
        case .app(let reach): return reach.contains(container)
        }
    }

    /// The app whose container holds `node`: the mount's own app, or in a mount of the whole store
    /// the name below the root (nil for the root itself).
    func container(of node: Node) -> [UInt8]? {
        rootAppName ?? nodes.containerName(of: node)
    }
}
