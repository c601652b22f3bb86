import ArgumentParser
import CLinux
import ContainerFS
import Containers
import Dispatch
import Foundation
import FileCoordination

/// `containerfs run`: a program started as an app, in a bubblewrap sandbox that shows it its own
/// containers through the mount and nothing else of the store (docs/island.md).
struct RunCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "run",
        abstract: "Run a program as an app: inside its containers and nowhere else.",
        discussion: """
        STORE_OR_MOUNT is the mount point of a mounted store, or a store that is mounted (the whole \
        store, or the app alone). The program sees the app's data container as HOME (Documents, \
        Library and tmp; TMPDIR and /tmp are its tmp), its bundle read-only at CONTAINERFS_BUNDLE, \
        its groups' shared containers in CONTAINERFS_GROUP_CONTAINERS (an app in a group needs a \
        mount of the whole store), the system's files read-only, and nothing else: no other app, \
        no user's home. The mount refuses its processes every other container, however they name \
        it. An app whose bundle changed since it was sealed does not start. tmp is emptied when the \
        app's last sandbox exits. Needs bubblewrap (bwrap), and user namespaces (as root, or where \
        the kernel allows them to all users).
        """
    )

    @Argument(help: "A mounted store's mount point, or a store that is mounted.") var place: String
    @Argument(help: "The app to run as.") var id: String
    @Argument(parsing: .postTerminator, help: "The program and its arguments, after --.") var command: [String] = []

    func validate() throws {
        guard !command.isEmpty else { throw ValidationError("Give the program after --: containerfs run STORE_OR_MOUNT ID -- COMMAND [ARGS...]") }
        guard AppID(id) != nil else { throw ValidationError("'\(id)' is not an app ID.") }
    }

    func run() throws {
        let app = AppID(id)!
        let (store, container, storeMount) = try locate(app)
        let groups = try store.record(app).groupIDs
        if !groups.isEmpty, storeMount == nil {
            throw ContainerError("\(app) belongs to \(groups.map(\.rawValue).joined(separator: ", ")), whose shared containers only a mount of the whole store shows: mount \(store.root) without -o app=, and run it there.")
        }
        let report = try Seal.check(store: store, id: app)
        guard report.isIntact else {
            for finding in report.findings { printError("\(app): \(report.bundleName)/\(finding)") }
            printError("\(app) was not started: its bundle changed since it was sealed. Reinstall it with `containerfs install \(store.root) PATH/TO/\(report.bundleName)`; its Documents and Library are kept.")
            throw ExitCode(1)
        }
        guard let bwrap = Sandbox.bubblewrap() else {
            throw ContainerError("bubblewrap (bwrap) is not installed: `apt-get install bubblewrap`, or scripts/setup.sh.")
        }
        let sandbox = Sandbox(app: app, container: container, bundleName: report.bundleName,
                              groups: groups.map { ($0, storeMount! + "/" + $0.rawValue) })
        let status = try sandbox.run(bwrap: bwrap, command: command, store: store)
        throw ExitCode(status)
    }

    /// The store, the app's data container as the mount shows it, and the mount point if the
    /// mount shows the whole store. A daemon's mounts are its own and the bind mounts a second
    /// mount of what it shows made (docs/lifecycle.md), which serve on after its own is unmounted.
    private func locate(_ app: AppID) throws -> (Store, String, String?) {
        let path = Store.absolute(place)
        if let store = try? Store.open(path) {
            let table = MountTable.entries()
            for mount in try MountRegistry.active(in: store) {
                let mine = table.filter { entry in mount.device.map { entry.device == $0 } ?? (entry.mountPoint == mount.mountPoint) }
                let own = mine.filter { $0.mountPoint == mount.mountPoint }, others = mine.filter { $0.mountPoint != mount.mountPoint }
                for entry in own + others.filter({ $0.root == "/" }) + others.filter({ $0.root != "/" }) {
                    if let places = entry.places(of: app, in: mount) { return (store, places.container, places.store) }
                }
            }
            throw ContainerError("\(store.root) has no mount that shows \(app)'s container whole. Mount it first: containerfs mount \(store.root) MOUNTPOINT")
        }
        // A mount point: the store is the source the mount table shows (STORE or STORE:ID).
        guard let entry = MountTable.mount(at: path), entry.type.hasPrefix("fuse") else {
            throw ContainerError("\(place) is neither a store nor a ContainerFS mount point.")
        }
        guard let store = Sandbox.store(mountedAs: entry.source),
              let mount = try MountRegistry.active(in: store).first(where: { $0.device.map { $0 == entry.device } ?? ($0.mountPoint == path) }) else {
            throw ContainerError("\(place): cannot find its store (the mount's source is '\(entry.source)'); give the store instead.")
        }
        guard let places = entry.places(of: app, in: mount) else {
            throw ContainerError("\(place) does not show \(app)'s container; give a mount of the whole store or of \(app).")
        }
        return (store, places.container, places.store)
    }
}

/// The sandbox of one run: what bubblewrap is asked to show, and the record that tells the
/// daemons which processes are the app's.
struct Sandbox {
    let app: AppID
    /// The data container through the mount.
    let container: String
    let bundleName: String
    /// The app's groups, each with its shared container through the mount.
    let groups: [(id: AppID, container: String)]

    /// Where the program finds things, as on iOS.
    var home: String { "/var/mobile/Containers/Data/Application/" + app.rawValue }
    var bundle: String { "/var/containers/Bundle/Application/" + app.rawValue + "/" + bundleName }
    static let groupContainers = "/var/mobile/Containers/Shared/AppGroup"

    static func bubblewrap() -> String? {
        for directory in ["/usr/bin", "/bin", "/usr/local/bin"] where access(directory + "/bwrap", X_OK) == 0 {
            return directory + "/bwrap"
        }
        return nil
    }

    /// The store of a mount whose source the mount table shows as STORE or STORE:ID[/DIR].
    static func store(mountedAs source: String) -> Store? {
        try? Store.open(String(source.split(separator: ":", maxSplits: 1).first ?? ""))
    }

    /// bubblewrap's arguments, the program's last. Descriptor 3 gets the sandbox's pid; the program
    /// starts when descriptor 4 is readable, after the record names its namespace.
    func arguments(command: [String], controlSocket: String?) -> [String] {
        // New namespaces for users (the identity the daemons check; no further ones inside), pids,
        // IPC and host name; the network stays.
        var arguments = ["--unshare-user", "--disable-userns", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
                         "--unshare-cgroup-try", "--die-with-parent", "--new-session"]
        // The system, read-only: /usr and its links, /etc, /opt.
        for path in ["/usr", "/etc", "/opt"] where FileManager.default.fileExists(atPath: path) {
            arguments += ["--ro-bind", path, path]
        }
        for path in ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"] {
            if let target = try? FileManager.default.destinationOfSymbolicLink(atPath: path) {
                arguments += ["--symlink", target, path]
            } else if FileManager.default.fileExists(atPath: path) {
                arguments += ["--ro-bind", path, path]
            }
        }
        arguments += ["--proc", "/proc", "--dev", "/dev"]
        // The app's containers, through the mount.
        for name in ["Documents", "Library", "tmp"] {
            arguments += ["--bind", container + "/" + name, home + "/" + name]
        }
        arguments += ["--bind", container + "/tmp", "/tmp", "--ro-bind", container + "/" + bundleName, bundle]
        for group in groups {
            arguments += ["--bind", group.container, Sandbox.groupContainers + "/" + group.id.rawValue]
        }
        // Presenters and coordinators inside reach the daemon; it scopes them to the app.
        if let controlSocket { arguments += ["--bind", controlSocket, controlSocket] }
        arguments += ["--clearenv", "--setenv", "HOME", home, "--setenv", "TMPDIR", home + "/tmp",
                      "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
                      "--setenv", AppContainer.appIDVariable, app.rawValue, "--setenv", AppContainer.bundleVariable, bundle]
        if !groups.isEmpty { arguments += ["--setenv", AppContainer.groupContainersVariable, Sandbox.groupContainers] }
        for name in ["LANG", "LC_ALL", "TERM"] {
            if let value = ProcessInfo.processInfo.environment[name] { arguments += ["--setenv", name, value] }
        }
        arguments += ["--chdir", home, "--info-fd", "3", "--block-fd", "4", "--"] + command
        return arguments
    }

    /// Runs the program to its end; returns its exit status.
    func run(bwrap: String, command: [String], store: Store) throws -> Int32 {
        let socket = controlSocket()
        var info: [Int32] = [0, 0], block: [Int32] = [0, 0]
        guard pipe(&info) == 0, pipe(&block) == 0 else {
            throw ContainerError("pipe: \(String(cString: strerror(errno)))")
        }
        // Only the copies spawn makes as 3 and 4 reach bwrap.
        for descriptor in info + block where fcntl(descriptor, F_SETFD, FD_CLOEXEC) != 0 {
            let error = errno
            for descriptor in info + block { close(descriptor) }
            throw ContainerError("fcntl(FD_CLOEXEC): \(String(cString: strerror(error)))")
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, info[1], 3)
        posix_spawn_file_actions_adddup2(&actions, block[0], 4)
        clinux_spawn_close_from(&actions, 5)
        let argv = [bwrap] + arguments(command: command, controlSocket: socket)
        var cArguments = argv.map { strdup($0) } + [nil]
        defer { cArguments.forEach { free($0) } }
        var pid: pid_t = 0
        let spawned = posix_spawn(&pid, bwrap, &actions, nil, &cArguments, environ)
        close(info[1])
        close(block[0])
        guard spawned == 0 else {
            close(info[0]); close(block[1])
            throw ContainerError("could not start bwrap: \(String(cString: strerror(spawned)))")
        }
        // Ctrl-C and termination go to the sandbox, so that this process outlives it and removes the record.
        let signals = [SIGINT, SIGTERM, SIGHUP].map { number -> DispatchSourceSignal in
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler { kill(pid, SIGTERM) }
            source.resume()
            return source
        }
        defer { signals.forEach { $0.cancel() } }

        let started = Sandbox.readChildPid(info[0])
        close(info[0])
        let (record, registrationRefusal) = started.map { register($0, in: store) } ?? (nil, nil)
        defer {
            if let record { RunningApps.remove(record, in: store) }
        }
        var refusal = registrationRefusal
        if record != nil {
            var go: UInt8 = 1
            if write(block[1], &go, 1) != 1 { refusal = "bwrap stopped before the program could start (\(String(cString: strerror(errno))))." }
        }
        // Unless the mount knows the sandbox the program never starts. bwrap takes the pipe's end
        // for a go as well, so the sandbox's first process, still waiting on it, is killed first
        // (or bwrap itself, which takes the sandbox with it: --die-with-parent).
        if record == nil || refusal != nil, kill(started ?? pid, SIGKILL) != 0 {
            let error = errno
            if error != ESRCH {
                refusal = (refusal ?? "its sandbox's namespace could not be read.")
                    + " The sandbox could not be stopped (\(String(cString: strerror(error)))): its program may run unconfined; stop it."
            }
        }
        close(block[1])
        let status = Sandbox.wait(pid)
        if started == nil || refusal != nil {
            printError(started == nil
                ? "\(app) was not started: bwrap could not make the sandbox (see its message above). It needs user namespaces: run as root, or allow them (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0)."
                : "\(app) was not started: \(refusal ?? "its sandbox's namespace could not be read.")")
            return status == 0 ? 1 : status
        }
        emptyTemporaryIfLast(store, besides: record)
        return status
    }

    /// Records the sandbox whose first process is `child`, and makes the mount read the record
    /// before the program can ask it anything. Nil and why, if the program must not start.
    private func register(_ child: pid_t, in store: Store) -> (RunningApp?, String?) {
        // bwrap binds the containers, reaching them through the mount as their owner, before it
        // waits for descriptor 4: recorded sooner, it would be refused its own binds.
        guard Sandbox.waitForNewRoot(of: child) else {
            return (nil, "bwrap did not finish making its sandbox.")
        }
        guard let namespace = RunningApps.userNamespace(of: child), namespace != RunningApps.userNamespace(of: getpid()) else {
            return (nil, "its sandbox has no user namespace of its own, by which the mount would know its processes.")
        }
        let running = RunningApp(namespace: namespace, app: app.rawValue, launcher: getpid())
        do {
            try RunningApps.record(running, in: store)
        } catch {
            return (nil, "its sandbox could not be recorded for the mount: \(error)")
        }
        var answer = [UInt8](repeating: 0, count: 32)
        guard clinux_getxattr(container, ContainerFileSystem.runningAppsAttribute, &answer, answer.count) > 0 else {
            let error = errno
            RunningApps.remove(running, in: store)
            return (nil, "the mount at \(container) does not confine apps (\(String(cString: strerror(error)))); remount the store with this version of containerfs.")
        }
        return (running, nil)
    }

    /// The mount's control socket, if the container names one.
    private func controlSocket() -> String? {
        var buffer = [UInt8](repeating: 0, count: 4096)
        let length = clinux_getxattr(container, MountLocator.socketAttribute, &buffer, buffer.count)
        guard length > 0 else { return nil }
        return String(decoding: buffer[..<length], as: UTF8.self)
    }

    /// Waits (up to 30 s) until `child` has changed its root, which bwrap does once every bind is
    /// made; false if it died first.
    static func waitForNewRoot(of child: pid_t) -> Bool {
        var own = stat(), theirs = stat()
        guard stat("/", &own) == 0 else { return false }
        let root = "/proc/\(child)/root/"
        for _ in 0..<30_000 {
            guard stat(root, &theirs) == 0 else { return false }
            if theirs.st_dev != own.st_dev || theirs.st_ino != own.st_ino { return true }
            usleep(1000)
        }
        return false
    }

    /// bubblewrap writes `{"child-pid": N}` to the info descriptor once the sandbox exists.
    private static func readChildPid(_ descriptor: Int32) -> pid_t? {
        var text: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 256)
        while !text.contains(UInt8(ascii: "}")) {
            let count = read(descriptor, &buffer, buffer.count)
            if count < 0, errno == EINTR { continue }
            guard count > 0 else { return nil }
            text += buffer[..<count]
        }
        guard let object = try? JSONSerialization.jsonObject(with: Data(text)) as? [String: Any],
              let pid = object["child-pid"] as? Int else { return nil }
        return pid_t(pid)
    }

    private static func wait(_ pid: pid_t) -> Int32 {
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 {
            guard errno == EINTR else { return 1 }
        }
        if status & 0x7f == 0 { return (status >> 8) & 0xff }
        return 128 + (status & 0x7f)
    }

    /// tmp is emptied when the app's last sandbox ends, through the mount (presenters hear it).
    private func emptyTemporaryIfLast(_ store: Store, besides own: RunningApp?) {
        let running: [RunningApp]
        do { running = try RunningApps.list(in: store) } catch {
            printError("\(app): tmp is left as it is: whether another sandbox of the app runs cannot be told (\(error)).")
            return
        }
        guard !running.contains(where: { $0.app == app.rawValue && $0 != own }) else { return }
        let tmp = container + "/tmp"
        for name in (try? FileManager.default.contentsOfDirectory(atPath: tmp)) ?? [] {
            do {
                try FileManager.default.removeItem(atPath: tmp + "/" + name)
            } catch {
                printError("\(app): could not empty tmp: \(tmp)/\(name): \(error.localizedDescription)")
            }
        }
    }
}
