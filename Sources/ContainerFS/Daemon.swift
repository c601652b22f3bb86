import Containers
import Coordination
import CLinux
import FUSELowLevel
import Foundation
import Logging

/// What to mount and how.
public struct MountConfiguration {
    public var store: Store
    /// Mount one app's container as the root, instead of the whole store.
    public var app: AppID?
    /// With `app`: a directory of its container to mount as the root (such as `Documents`), by
    /// its names from the container.
    public var directory: [String] = []
    public var mountPoint: String
    /// The name the mount table shows as the source; the store and app by default.
    public var sourceName: String?
    public var debug = false
    public var singleThreaded = false
    /// Options passed through to libfuse's `-o` (allow_other, default_permissions, ...).
    public var fuseOptions: [String] = []
    /// A descriptor to write "ready" to once mounted (how a background launch learns it worked).
    public var readinessDescriptor: Int32?
    /// Purge Library/Caches when the store's free space falls below this many bytes.
    public var purgeThreshold: UInt64?
    /// How often to check free space, in seconds.
    public var purgeInterval: Double = 5
    /// How long a presenter has to answer each message before it is marked unresponsive.
    public var presenterTimeout: Duration = .seconds(2)
    /// Let the kernel read unchanging files itself (FUSE passthrough), where it and the daemon's
    /// privileges allow.
    public var passthrough = true
    /// Take requests through io_uring where the kernel offers it (docs/io-uring.md).
    public var ioUring = true
    /// Mount even while another daemon serves some of the same containers (docs/lifecycle.md,
    /// "One daemon a container").
    public var allowOverlap = false
    /// How many previous versions of each file are kept, and for how long (docs/versions.md).
    public var versionLimits = VersionLimits()
    /// Files at least this large are rewritten through a redo log, where the store's filesystem
    /// cannot reflink them, when a writer changes part of them (docs/atomic-replace.md).
    public var largeFile: off_t = 64 << 20

    public init(store: Store, app: AppID?, mountPoint: String) {
        self.store = store
        self.app = app
        self.mountPoint = mountPoint
    }

    /// Whether it leaves every setting of the daemon's own at its default (what a mount sharing a
    /// running daemon's gets: `MountSharing`).
    var asksNoDaemonOptions: Bool {
        let defaults = MountConfiguration(store: store, app: app, mountPoint: mountPoint)
        return !debug && !singleThreaded && !allowOverlap && purgeThreshold == nil && purgeInterval == defaults.purgeInterval
            && presenterTimeout == defaults.presenterTimeout && passthrough && ioUring && versionLimits == defaults.versionLimits
            && largeFile == defaults.largeFile
    }
}

/// Mounts a store, serves it until unmounted or signalled, and takes the mount down cleanly.
public enum Daemon {
    public static func run(_ configuration: MountConfiguration, logger: Logger) throws {
        raiseOpenFileLimit(sharedWithOthers: configuration.fuseOptions.contains("allow_other"), logger: logger)
        try Preflight.checkFuseDevice()
        if geteuid() != 0 { try Preflight.checkFusermount() }
        let mountPoint = Store.absolute(configuration.mountPoint)
        try Preflight.prepareMountPoint(mountPoint)
        try Preflight.checkMountPointOutside(configuration.store.root, mountPoint: mountPoint)

        let store = configuration.store
        let apps = try configuration.app.map { [$0] } ?? store.apps().compactMap { AppID($0.id) }
        if let app = configuration.app, !store.isInstalled(app) {
            throw ContainerError("No app \(app) in the store \(store.root). `containerfs list \(store.root)` shows what is installed.")
        }
        let wanted = ActiveMount(mountPoint: mountPoint, app: configuration.app?.rawValue, pid: getpid(),
                                 root: configuration.directory.isEmpty ? nil : configuration.directory.joined(separator: "/"))
        let (shared, notShared) = try shareRunningMount(configuration, wanted, logger: logger)
        if shared {
            signalReady(configuration.readinessDescriptor)
            return
        }
        // Registered first: a mount refused as another daemon's overlap must not touch its containers.
        let lease = try MountRegistry.register(wanted, in: store, allowingOverlap: configuration.allowOverlap, notShared: notShared,
                                               isMounted: { running in running.device.map(MountTable.isMounted) ?? true })
        defer { close(lease) }
        try prepareContainers(apps, of: store)
        // Groups' containers show in a mount of the whole store; they have no tmp of their own.
        if configuration.app == nil { try store.groups().forEach(store.repairContainer) }

        let rootPath = configuration.app.map(store.containerPath) ?? store.containersPath
        var rootDescriptor = Glibc.open(rootPath, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard rootDescriptor >= 0 else {
            throw ContainerError("\(rootPath): cannot open (\(String(cString: strerror(errno)))); check the store with `containerfs list \(store.root)`.")
        }
        var rootZone: Zone = configuration.app == nil ? .mountRoot : .containerRoot
        for name in configuration.directory {
            let next = openat(rootDescriptor, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
            let error = errno
            close(rootDescriptor)
            guard next >= 0 else {
                throw ContainerError("\(rootPath)/\(configuration.directory.joined(separator: "/")): not a directory of the container (\(String(cString: strerror(error)))).")
            }
            rootDescriptor = next
            rootZone = rootZone.child(named: name)
        }
        let shadowDirectory = try prepareShadowDirectory(in: store)
        defer { close(shadowDirectory) }
        let socketPath = try ControlSocket.path(for: getpid())
        let served = FileSystemReference()
        let server = ControlServer(
            socketPath: socketPath,
            mayAccess: { peer, path, write in served.fileSystem?.mayAccess(peer, path, write: write) ?? false },
            writeSessions: { served.fileSystem?.writeSessionStatuses() ?? [] },
            log: { message in logger.info("\(message)") }
        ) { transport in
            // Container roots are named by app IDs, which have extensions; they are never packages.
            CoordinationEngine(transport: transport,
                               packageRule: PackageRule.anyExtension.fixing(depth: configuration.app == nil ? 1 : 0),
                               replyTimeout: configuration.presenterTimeout) { presenter, message in
                logger.warning("presenter did not answer in time; marked unresponsive", metadata: [
                    "presenter": "\(presenter)", "message": "\(message.name)"])
            }
        }
        do { try server.start() } catch {
            throw ContainerError("cannot open the control socket \(socketPath): \(error)")
        }
        defer { server.stop() }
        let coordination = MountCoordination(engine: server.engine)
        coordination.clientOf = { server.ownerOf(pid: $0) }
        coordination.hasClients = { server.hasClients }
        let fileSystem = try ContainerFileSystem(rootDescriptor: rootDescriptor,
                                                 rootZone: rootZone,
                                                 rootApp: configuration.app,
                                                 seals: checkSeals(apps, of: store, logger: logger),
                                                 coordination: coordination, shadowDirectory: shadowDirectory,
                                                 largeFile: configuration.largeFile,
                                                 versions: configuration.versionLimits.count == 0 ? nil
                                                     : VersionKeeper(store: store, limits: configuration.versionLimits,
                                                                     rootApp: configuration.app?.rawValue,
                                                                     rootDirectory: configuration.directory))

        fileSystem.controlSocketPath = Array(socketPath.utf8)
        fileSystem.islands = Islands(store: store)
        if fileSystem.islands == nil {
            logger.warning("cannot watch the store's running apps; `containerfs run` will not confine apps of this mount",
                           metadata: ["directory": "\(RunningApps.directory(of: store))"])
        }
        served.fileSystem = fileSystem
        let session = try FuseSession(options: fuseArguments(configuration), fileSystem: fileSystem)
        fileSystem.kernel = session
        try session.mount(at: mountPoint)
        // The device tells others whether the mount is still there, and where it shows.
        var registered = wanted
        registered.device = MountTable.device(at: mountPoint)
        do { try MountRegistry.update(lease, to: registered, in: store) } catch {
            logger.warning("cannot record the mount's device; a mount of the same containers will not share it", metadata: ["error": "\(error)"])
        }
        fileSystem.heldLocks = HeldLocks(ofMountAt: mountPoint)
        if fileSystem.heldLocks == nil {
            logger.warning("cannot find the mount's device; a rewrite of a file under locks will not keep them", metadata: ["mountpoint": "\(mountPoint)"])
        }
        // The daemon clears set-ID bits itself (on every write, truncation and allocation by a
        // caller without CAP_FSETID), and the kernel stops asking before each write
        // (docs/atomic-replace.md, "Set-ID bits").
        session.takeOverSetIDClearing()
        if configuration.passthrough { offerPassthrough(session, to: fileSystem, logger: logger) }
        let ioUring = configuration.ioUring && Self.kernelOffersIOUring
        if ioUring { session.offerIOUring() }
        let cacheWatch = configuration.purgeThreshold.map {
            CacheWatch(store: store, threshold: $0, every: configuration.purgeInterval, fileSystem: fileSystem, logger: logger)
        }
        let inboxWatch = InboxWatch(store: store, apps: apps.compactMap { app in
            let names = (configuration.app == nil ? [app.rawValue] : []) + ["Documents", "Inbox"]
            // An Inbox outside the mounted directory has nobody to tell.
            guard names.starts(with: configuration.directory) else { return nil }
            return (app, ItemPath(components: names.dropFirst(configuration.directory.count).compactMap { PathComponent($0) }))
        }, coordination: coordination)
        defer { withExtendedLifetime((cacheWatch, inboxWatch)) {} }
        try session.installSignalHandlers()
        logger.info("mounted", metadata: ["store": "\(store.root)", "mountpoint": "\(mountPoint)",
                                          "app": "\(configuration.app?.rawValue ?? "all")"])
        signalReady(configuration.readinessDescriptor)
        if ioUring { reportIOUring(of: session, logger: logger) }

        let status = session.run(multithreaded: !configuration.singleThreaded)
        // A mount of the same containers waits for a finishing daemon, and refuses one that serves
        // on with no mount (docs/lifecycle.md).
        registered.finishing = true
        do { try MountRegistry.update(lease, to: registered, in: store) } catch {
            logger.warning("cannot record that the daemon is finishing; a mount of the same containers is refused until it ends", metadata: ["error": "\(error)"])
        }
        session.unmount()
        // Now, not when libfuse destroys the session, which may be after the deferred closes of the
        // shadow directory and the mount's lease.
        fileSystem.destroy()
        // Every session ended with the kernel's files: nothing is left to keep (`containerfs check`
        // counts a shadow directory whose daemon is gone as a leftover).
        do { try store.workDirectory("shadows").map { try ShadowDirectory.remove(String(getpid()), in: $0) } } catch {
            logger.warning("could not remove the shadow directory", metadata: ["path": "\(store.workPath)/shadows/\(getpid())", "error": "\(error)"])
        }
        try? prepareContainers(apps, of: store, repairing: false)
        logger.info("unmounted", metadata: ["mountpoint": "\(mountPoint)", "status": "\(status)"])
        // libfuse reports the signal that stopped it; that is a clean stop.
        guard status == 0 || [SIGINT, SIGTERM, SIGHUP].contains(status) else {
            throw ContainerError("the FUSE session ended with an error (\(status)).")
        }
    }

    /// The node table holds a descriptor per directory the kernel knows, and each open file one:
    /// allow as many as the hard limit lets us (the administrator's to raise: the systemd unit sets
    /// LimitNOFILE). Shared with other users, a low limit is theirs to exhaust: say so.
    private static func raiseOpenFileLimit(sharedWithOthers: Bool, logger: Logger) {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else {
            return logger.warning("cannot read the descriptor limit", metadata: ["errno": "\(errno)"])
        }
        if limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max
            if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) != 0 {
                logger.warning("cannot raise the descriptor limit", metadata: ["errno": "\(errno)"])
            }
        }
        if sharedWithOthers, limit.rlim_max < 1 << 20 {
            logger.warning("""
                the daemon may hold \(limit.rlim_max) descriptors; with allow_other, one user who looks up \
                that many directories or holds that many files open makes others' opens fail (EMFILE). \
                Raise the hard limit (LimitNOFILE=1048576 in a systemd unit, prlimit --nofile).
                """)
        }
    }

    /// At every mount the containers' fixed directories are repaired and tmp is emptied; at unmount tmp is emptied.
    private static func prepareContainers(_ apps: [AppID], of store: Store, repairing: Bool = true) throws {
        // Another daemon's programs may be using tmp (-o allow_overlap): it is that daemon's to empty,
        // and none starts meanwhile.
        try MountRegistry.excludingRegistrations(in: store) { _ in
            let others = try MountRegistry.active(in: store).filter { $0.pid != getpid() }
            for app in apps {
                if repairing { try store.repairContainer(app) }
                if !others.contains(where: { $0.covers(app) }) { try Lifecycle.emptyTmp(store: store, id: app) }
            }
        }
    }

    /// The daemon's own directory for shadows, STORE/work/shadows/PID, after removing those of
    /// daemons that died (their unpublished writes; the files they shadowed are intact, and new
    /// files they were writing are empty again).
    private static func prepareShadowDirectory(in store: Store) throws -> Int32 {
        let shadows = store.workPath + "/shadows"
        let directory: DirectoryHandle
        do { directory = try store.makeWorkDirectory("shadows") } catch {
            throw ContainerError("\(shadows): cannot be made or opened (\(error)). It must be a directory, not a link.")
        }
        let leftovers: [String]
        do { leftovers = try ShadowDirectory.left(in: store) } catch {
            throw ContainerError("""
                \(shadows): cannot tell what daemons that stopped left there (\(error)); it may put files \
                right, and would be skipped. Fix what the error names (the store's disk), then mount again.
                """)
        }
        for leftover in leftovers {
            do { try ShadowDirectory.remove(leftover, in: directory) } catch let error as ShadowDirectory.UnappliedLog {
                // A committed rewrite of a large file must reach its file before anyone reads it.
                throw ContainerError("""
                    \(shadows)/\(leftover): a rewrite of a large file was committed but cannot be applied \
                    (\(error)); until it is, that file may be incomplete. Fix what the error names (the store's \
                    disk), then mount again.
                    """)
            } catch {
                throw ContainerError("""
                    \(shadows)/\(leftover): what a daemon that stopped left cannot be put right (\(error)); \
                    until it is, a file it was writing may read as what a power cut left of it. Fix what the \
                    error names (the store's disk, an immutable file), then mount again.
                    """)
            }
        }
        let own = String(getpid())
        // The daemon's alone: a shadow holds what its file holds, away from the folders whose
        // permissions keep others out of it.
        let descriptor = mkdirat(directory.fd, own, 0o700) == 0 || errno == EEXIST
            ? openat(directory.fd, own, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1
        guard descriptor >= 0, fchmod(descriptor, 0o700) == 0 else {
            let error = errno
            if descriptor >= 0 { close(descriptor) }
            throw ContainerError("\(shadows)/\(own): cannot make or open (\(String(cString: strerror(error)))).")
        }
        return descriptor
    }

    /// Checks every bundle's seal. A bundle that fails is still mounted, but its changed files answer
    /// EIO; one that cannot be checked answers EIO for all of them, as one without a seal does.
    private static func checkSeals(_ apps: [AppID], of store: Store, logger: Logger) -> [SealReport] {
        apps.map { app in
            do {
                let report = try Seal.check(store: store, id: app)
                for finding in report.findings {
                    logger.error("bundle fails its seal; changed files answer EIO", metadata: [
                        "app": "\(app)", "finding": "\(finding)"])
                }
                return report
            } catch {
                logger.error("cannot check the seal; the bundle's files answer EIO until a mount checks it",
                             metadata: ["app": "\(app)", "error": "\(error)"])
                return SealReport.unchecked(app, bundleName: (try? store.record(app))?.bundleName ?? "", because: error)
            }
        }
    }

    /// Mounts `wanted` as a bind mount of a running daemon's mount that shows all of it, if one
    /// does (`MountSharing`): only as root, who may bind, and for a mount in the background (`-f`
    /// asks for a daemon of its own). When not shared, why not where a running mount shows it.
    private static func shareRunningMount(_ configuration: MountConfiguration, _ wanted: ActiveMount,
                                          logger: Logger) throws -> (shared: Bool, whyNot: String?) {
        guard geteuid() == 0, !configuration.allowOverlap else { return (false, nil) }
        // Root binds what a record names: another user's record could name another daemon's mount.
        guard let mounts = try MountRegistry.active(in: configuration.store, writableOnlyBy: 0) else {
            return (false, "its record is not root's alone")
        }
        guard let running = mounts.first(where: { $0.overlaps(wanted) }), let place = running.place(of: wanted) else { return (false, nil) }
        guard configuration.readinessDescriptor != nil else { return (false, "it runs in the foreground") }
        // Any mount of the daemon that shows the place: its own, or a bind mount of it.
        let within = String(place.dropFirst(running.mountPoint.count))
        guard let device = running.device, let (entry, shown) = MountTable.entries().reversed().lazy
            .compactMap({ entry in entry.device == device ? entry.showing(within).map { (entry, $0) } : nil }).first else {
            return (false, "no mount of that daemon shows it now")
        }
        switch MountSharing.flags(for: configuration, sharing: entry) {
        case .failure(let refusal): return (false, refusal.reason)
        case .success(let flags):
            guard try MountSharing.bind(shown, of: running.pid, in: entry, to: wanted.mountPoint, flags: flags) else {
                return (false, "\(shown) is not that daemon's mount any more")
            }
            logger.info("mounted as a bind mount of a running daemon's", metadata: ["mountpoint": "\(wanted.mountPoint)",
                                                                                  "shows": "\(shown)", "daemon": "\(running.pid)"])
            return (true, nil)
        }
    }

    private static func fuseArguments(_ configuration: MountConfiguration) -> [String] {
        let source = configuration.sourceName ?? configuration.app.map {
            configuration.store.root + ":" + ([$0.rawValue] + configuration.directory).joined(separator: "/")
        } ?? configuration.store.root
        let given = configuration.fuseOptions.flatMap { $0.split(separator: ",") }
        var options = ["fsname=" + escapeOption(source)]
        // A subtype given replaces ours; an empty one mounts as plain "fuse", the type xfstests
        // checks for (docs/conformance.md).
        if !given.contains(where: { $0.hasPrefix("subtype=") }) { options.append("subtype=containerfs") }
        // Mode bits are the kernel's to check; policy is ours on top. A root daemon whose mount only
        // root may enter is spared the checks: they can deny root nothing, and each change to a
        // directory costs a GETATTR of it at the next check.
        if geteuid() != 0 || given.contains("allow_other") || given.contains("allow_root") {
            options.insert("default_permissions", at: 0)
        }
        options += given.filter { $0 != "subtype=" }.map(String.init)
        var arguments = ["-o", options.joined(separator: ",")]
        if configuration.debug { arguments.append("-d") }
        return arguments
    }

    /// Whether the fuse module takes requests through io_uring: its `enable_uring`, which is off
    /// unless an administrator turned it on (docs/io-uring.md).
    static var kernelOffersIOUring: Bool {
        let descriptor = open("/sys/module/fuse/parameters/enable_uring", O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return false }
        defer { close(descriptor) }
        var byte: UInt8 = 0
        return read(descriptor, &byte, 1) == 1 && byte == UInt8(ascii: "Y")
    }

    /// Logs, once the rings had time to register, whether requests come through them.
    private static func reportIOUring(of session: FuseSession, logger: Logger) {
        // `ioUringState` reads only atomics.
        nonisolated(unsafe) weak let session = session
        DispatchQueue.global().asyncAfter(deadline: .now() + 1) {
            guard let session else { return }
            switch session.ioUringState {
            case true?: logger.info("requests come through io_uring")
            case false?: logger.notice("io_uring not serving (a queue could not register); requests come through /dev/fuse")
            case nil: logger.notice("the kernel did not take io_uring; requests come through /dev/fuse")
            }
        }
    }

    /// Readers of atomically replaced files then read their version at the speed of the disk.
    private static func offerPassthrough(_ session: FuseSession, to fileSystem: ContainerFileSystem, logger: Logger) {
        session.offerPassthrough()
        fileSystem.passthrough = PassthroughFiles(registry: session, refused: { error in
            logger.notice("passthrough refused; reads go through the daemon", metadata: [
                "error": "\(String(cString: strerror(error)))", "why": "\(passthroughRefusal(error))",
            ])
        }, notClosed: { id, error in
            // The kernel keeps the file open until the mount ends: a leak, which says a count is wrong.
            logger.error("a passthrough backing file was not closed", metadata: [
                "backing id": "\(id)", "error": "\(String(cString: strerror(error)))",
            ])
        })
    }

    private static func passthroughRefusal(_ error: Int32) -> String {
        switch error {
        case EPERM:
            return "registering a file for passthrough needs CAP_SYS_ADMIN, and CAP_SETGID to register it as its group: run the daemon as root"
        case ELOOP: return "the store is on a stacked filesystem (overlayfs or another FUSE mount)"
        default: return "this kernel has no FUSE passthrough (it needs Linux 6.9 or later, with CONFIG_FUSE_PASSTHROUGH)"
        }
    }

    /// libfuse splits options on commas; a backslash keeps one in a value.
    private static func escapeOption(_ value: String) -> String {
        value.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: ",", with: "\\,")
    }

    /// Tells a waiting launcher the mount is up, then lets go of the launcher's terminal.
    private static func signalReady(_ descriptor: Int32?) {
        guard let descriptor else { return }
        _ = "ready\n".withCString { write(descriptor, $0, 6) }
        close(descriptor)
        let null = Glibc.open("/dev/null", O_RDWR)
        if null >= 0 {
            for standard: Int32 in 0...2 { dup2(null, standard) }
            close(null)
        }
    }
}

/// Lets the control server's closures reach the filesystem made after it.
private final class FileSystemReference: @unchecked Sendable {
    weak var fileSystem: ContainerFileSystem?
}

/// Where a daemon's control socket lives: /run/containerfs for root, else the user's runtime
/// directory. Named by the daemon's pid and its process namespace (`PID-NAMESPACE.sock`): daemons
/// in namespaces of their own share pids (each may be 1). Clients find a socket through the
/// mount (`MountLocator`), never by its name.
enum ControlSocket {
    static func path(for pid: pid_t) throws -> String {
        let environment = ProcessInfo.processInfo.environment
        let wanted: String
        if geteuid() == 0 {
            wanted = "/run/containerfs"
        } else if let runtime = environment["XDG_RUNTIME_DIR"], !runtime.isEmpty {
            wanted = runtime + "/containerfs"
        } else {
            wanted = "/tmp/containerfs-\(geteuid())"
        }
        let directory = try ownDirectory(wanted)
        let namespace = processNamespace()
        removeStale(in: directory, namespace: namespace)
        return directory + "/" + (namespace.map { "\(pid)-\($0).sock" } ?? "\(pid).sock")
    }

    /// `path`, made if missing, when it is a directory of this user's that no one else may write;
    /// else a new directory beside it (`path-XXXXXX`): a user who made /tmp/containerfs-UID first
    /// could otherwise put a socket of their own in the daemon's place, and hear its clients.
    /// Either way others may search it (mode 0755): they reach a root daemon's socket through it,
    /// whatever the umask or whoever made it narrower.
    static func ownDirectory(_ path: String) throws -> String {
        let parent = (path as NSString).deletingLastPathComponent
        try FileManager.default.createDirectory(atPath: parent, withIntermediateDirectories: true)
        guard mkdir(path, 0o755) == 0 || errno == EEXIST else { throw directoryError(path) }
        var attributes = stat()
        if lstat(path, &attributes) == 0, attributes.st_mode & S_IFMT == S_IFDIR, attributes.st_uid == geteuid(),
           attributes.st_mode & 0o022 == 0 {
            return try searchable(path, attributes.st_mode)
        }
        var template = Array((path + "-XXXXXX").utf8CString)
        guard mkdtemp(&template) != nil else { throw directoryError(path + "-XXXXXX") }
        return try searchable(String(decoding: template.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self), 0o700)
    }

    /// `directory`, whose mode is `mode`, made 0755 where it is not.
    private static func searchable(_ directory: String, _ mode: mode_t) throws -> String {
        guard mode & 0o7777 == 0o755 || chmod(directory, 0o755) == 0 else { throw directoryError(directory) }
        return directory
    }

    private static func directoryError(_ path: String) -> ContainerError {
        ContainerError("\(path): cannot make the control socket's directory (\(String(cString: strerror(errno)))).")
    }

    /// The inode number of this process's pid namespace (`/proc/self/ns/pid`); nil without /proc.
    static func processNamespace() -> UInt64? {
        var attributes = stat()
        return stat("/proc/self/ns/pid", &attributes) == 0 ? UInt64(attributes.st_ino) : nil
    }

    /// Removes the sockets of daemons that were killed: one named in this namespace whose pid is
    /// gone, and any other that refuses connections and was made more than `settle` seconds ago (a
    /// daemon binds, then listens). A pid of another namespace means nothing here: a daemon in a
    /// namespace of its own sees no process outside it, and took every other daemon's socket.
    static func removeStale(in directory: String, namespace: UInt64?, settle: Int = 10) {
        for name in (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? [] where name.hasSuffix(".sock") {
            let path = directory + "/" + name
            let parts = name.dropLast(5).split(separator: "-")
            if parts.count == 2, let owner = pid_t(parts[0]), let space = UInt64(parts[1]), space == namespace {
                if kill(owner, 0) != 0, errno == ESRCH { unlink(path) }
            } else if refusesConnections(path, settledFor: settle) {
                unlink(path)
            }
        }
    }

    /// Whether the socket at `path`, made more than `seconds` ago, has no one listening.
    static func refusesConnections(_ path: String, settledFor seconds: Int) -> Bool {
        var attributes = stat()
        guard lstat(path, &attributes) == 0, attributes.st_mode & S_IFMT == S_IFSOCK,
              attributes.st_ctim.tv_sec + seconds <= time(nil) else { return false }
        return isValidSocketPath(path) && connectionError(at: path) == ECONNREFUSED
    }
}
