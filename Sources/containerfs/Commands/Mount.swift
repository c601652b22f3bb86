import ArgumentParser
import CLinux
import ContainerFS
import Coordination
import Containers
import FileCoordination
import Foundation
import Logging

struct Mount: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Mount a store (every app) or one app's container.",
        discussion: """
        Runs in the background once mounted, unless -f. Unmount with \
        `containerfs unmount MOUNTPOINT`.

        -o takes libfuse's options (allow_other, default_permissions, ...) and these:
          app=ID                 mount only this app's container, as the root
          root=DIR               with app: mount the directory DIR of the container
                                 (such as Documents) as the root
          store=PATH             the store, when the first argument is only the
                                 name the mount table is to show
          subtype=NAME           the mount's type is fuse.NAME (subtype=: fuse)
          no_passthrough         every read and write goes through the daemon,
                                 never through FUSE passthrough
          no_io_uring            requests come through /dev/fuse even where the
                                 kernel offers io_uring (its fuse module's
                                 enable_uring)
          allow_overlap          mount even while another daemon serves some of
                                 the same containers (refused without it: the
                                 two would share no locks, presenters or caches)
          presenter_timeout=S    seconds a presenter may take to answer (2)
          purge_below=SIZE       purge Library/Caches, oldest first, when the
                                 store's free space falls below SIZE
          purge_interval=S       seconds between those checks (5)
          large_file=SIZE        on a store without reflinks, a write-only change
                                 of a file this large (64M) is logged and applied
                                 in place instead of copying the file
          versions=N             previous versions kept per file in Documents and
                                 Library (10; 0 keeps none)
          version_age=DAYS       how long they are kept (30)
          version_spacing=S      seconds between two versions a program keeps of a
                                 file: its burst of rewrites keeps the one from
                                 before it (1; 0 keeps every one)
          version_space=SIZE     the space all versions may take (1G)
          version_floor=SIZE     none is kept while the store has less free space
                                 (a tenth of its filesystem)

        The options mount(8) and /etc/fstab add (rw, defaults, noauto, nofail, \
        user, _netdev, x-systemd.*) are ignored.

        As root, a mount of what a running daemon shows whole (the store, an app, a \
        directory of it) that asks for none of the daemon's own options becomes a \
        bind mount of that daemon's mount, as a disk mounted twice is one \
        filesystem; its ro, noexec and noatime apply to it alone.
        """
    )

    @Flag(help: "Mount the demo store (created on first use in ~/.local/share/containerfs/demo).")
    var demo = false

    @Option(help: "Mount only this app's container, as the mount point's root.")
    var app: String?

    @Flag(name: [.customShort("f"), .long], help: "Stay in the foreground.")
    var foreground = false

    @Flag(name: [.customShort("d"), .long], help: "Print every FUSE request (implies -f).")
    var debug = false

    @Flag(name: [.customShort("s"), .customLong("single-threaded")], help: "Serve requests on one thread.")
    var singleThreaded = false

    @Option(name: .customShort("o"), help: ArgumentHelp("Mount options, comma-separated.", valueName: "options"))
    var options: [String] = []

    @Option(help: .hidden) var readyFD: Int32?

    @Argument(help: ArgumentHelp("STORE MOUNTPOINT, or just MOUNTPOINT with --demo.", valueName: "paths"))
    var paths: [String]

    func validate() throws {
        let expected = demo ? 1 : 2
        guard paths.count == expected else {
            throw ValidationError(demo ? "Give just the mount point with --demo: containerfs mount --demo MOUNTPOINT"
                                       : "Give the store and the mount point: containerfs mount STORE MOUNTPOINT")
        }
    }

    func run() throws {
        let parsed = try MountOptions(options)
        let store = demo ? try DemoStore.prepare() : try Store.open(parsed.store ?? paths[0])
        let appID = try (app ?? parsed.app).map(parseAppID)
        if !foreground && !debug && readyFD == nil {
            try BackgroundLauncher.relaunchInForeground()
        }
        Logging.bootstrap(debug: debug, toSyslog: readyFD != nil)
        var configuration = MountConfiguration(store: store, app: appID, mountPoint: paths.last!)
        if let directory = parsed.root {
            guard appID != nil else { throw ValidationError("root=\(directory.joined(separator: "/")) needs app=ID: it names a directory of one app's container.") }
            configuration.directory = directory
        }
        configuration.debug = debug
        configuration.singleThreaded = singleThreaded
        configuration.fuseOptions = parsed.fuseOptions
        // With store=PATH, the first argument is only the name the mount table shows.
        if parsed.store != nil, !demo { configuration.sourceName = paths[0] }
        configuration.readinessDescriptor = readyFD
        configuration.passthrough = parsed.passthrough
        configuration.ioUring = parsed.ioUring
        configuration.allowOverlap = parsed.allowOverlap
        configuration.purgeThreshold = parsed.purgeBelow
        if let interval = parsed.purgeInterval { configuration.purgeInterval = interval }
        if let timeout = parsed.presenterTimeout { configuration.presenterTimeout = .milliseconds(Int(timeout * 1000)) }
        configuration.versionLimits = parsed.versionLimits
        if let size = parsed.largeFile { configuration.largeFile = off_t(clamping: size) }
        try Daemon.run(configuration, logger: Logger(label: "containerfs"))
    }
}

/// Splits `-o` options into ours and libfuse's.
struct MountOptions {
    var app: String?
    var root: [String]?
    var store: String?
    var purgeBelow: UInt64?
    var purgeInterval: Double?
    var presenterTimeout: Double?
    var passthrough = true
    var ioUring = true
    var allowOverlap = false
    var versionLimits = VersionLimits()
    var largeFile: UInt64?
    var fuseOptions: [String] = []

    /// Options of mount(8) and fstab that mean nothing to a FUSE daemon, or that it leaves out: a
    /// container never honours set-user-ID bits or device nodes (`suid`, `dev`), and the access-time
    /// variants libfuse 3.14 cannot pass on (it passes `atime`, `noatime`, `ro`, `noexec`, `sync`,
    /// `dirsync`) keep the kernel's default, relatime.
    static let ignored: Set<String> = ["rw", "defaults", "auto", "noauto", "nofail", "user", "users", "nouser",
                                       "_netdev", "dev", "suid", "exec", "async", "relatime", "norelatime",
                                       "diratime", "nodiratime", "strictatime", "nostrictatime", "lazytime",
                                       "nolazytime", "iversion", "noiversion", "silent", "loud"]

    /// `NAME=SIZE` for one of `names`, or nil for another option.
    private static func size(_ option: String, _ names: [String]) throws -> (String, UInt64)? {
        guard let name = names.first(where: { option.hasPrefix($0 + "=") }) else { return nil }
        let text = String(option.dropFirst(name.count + 1))
        guard let bytes = ByteCount.parse(text) else {
            throw ValidationError("\(name) takes a size such as 500M or 2G, not '\(text)'.")
        }
        return (name, bytes)
    }

    init(_ groups: [String]) throws {
        for option in groups.flatMap({ $0.split(separator: ",").map(String.init) }) where !option.isEmpty {
            if option.hasPrefix("app=") {
                app = String(option.dropFirst(4))
            } else if option.hasPrefix("root=") {
                let names = option.dropFirst(5).split(separator: "/").map(String.init)
                guard !names.isEmpty, !names.contains(where: { $0 == "." || $0 == ".." }) else {
                    throw ValidationError("root takes a directory of the app's container, such as root=Documents, not '\(option.dropFirst(5))'.")
                }
                root = names
            } else if option.hasPrefix("store=") {
                store = String(option.dropFirst(6))
            } else if let (_, bytes) = try MountOptions.size(option, ["purge_below"]) {
                purgeBelow = bytes
            } else if let (_, bytes) = try MountOptions.size(option, ["large_file"]) {
                largeFile = bytes
            } else if option.hasPrefix("presenter_timeout=") {
                guard let seconds = Double(option.dropFirst(18)), seconds > 0 else {
                    throw ValidationError("presenter_timeout takes a number of seconds, such as 2.")
                }
                presenterTimeout = seconds
            } else if option.hasPrefix("purge_interval=") {
                guard let seconds = Double(option.dropFirst(15)), seconds > 0 else {
                    throw ValidationError("purge_interval takes a number of seconds, such as 5.")
                }
                purgeInterval = seconds
            } else if option.hasPrefix("versions=") {
                guard let count = Int(option.dropFirst(9)), count >= 0 else {
                    throw ValidationError("versions takes how many previous versions of a file to keep, such as 10 (0 keeps none).")
                }
                versionLimits.count = count
            } else if option.hasPrefix("version_age=") {
                guard let days = Double(option.dropFirst(12)), days > 0 else {
                    throw ValidationError("version_age takes a number of days, such as 30.")
                }
                versionLimits.age = days * 86_400
            } else if option.hasPrefix("version_spacing=") {
                guard let seconds = Double(option.dropFirst(16)), seconds >= 0, seconds.isFinite else {
                    throw ValidationError("version_spacing takes a number of seconds, such as 1 (0 keeps every version).")
                }
                versionLimits.spacing = seconds
            } else if let (name, size) = try MountOptions.size(option, ["version_space", "version_floor"]) {
                if name == "version_space" { versionLimits.space = size } else { versionLimits.floor = size }
            } else if option == "no_passthrough" {
                passthrough = false
            } else if option == "no_io_uring" {
                ioUring = false
            } else if option == "allow_overlap" {
                allowOverlap = true
            } else if MountOptions.ignored.contains(option) || option.hasPrefix("x-") || option.hasPrefix("comment=") {
                continue
            } else {
                fuseOptions.append(option)
            }
        }
    }
}

struct Unmount: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Unmount a ContainerFS mount (through fusermount3 -u).")

    @Flag(name: [.customShort("z"), .long], help: "Detach now even if busy; cleanup happens when it is no longer used.")
    var lazy = false

    /// Prints the pid of the daemon serving the mount point (what `daemonAnswering` asks a child for).
    @Flag(help: .hidden) var printDaemon = false

    @Argument(help: "The mount point.") var mountPoint: String

    func run() throws {
        if printDaemon {
            if let daemon = Self.daemon(serving: mountPoint) { print(daemon) }
            return
        }
        let (daemon, stuck) = lazy ? (nil, false) : try Self.daemonAnswering(for: mountPoint)
        // A question the daemon took and never answered keeps the mount busy: detached instead.
        let lazy = lazy || stuck
        // Bind mounts of the same mount share its daemon, which serves until the last one goes.
        let device = MountTable.device(at: Store.absolute(mountPoint))
        // A mount is busy for a moment while anyone walks the mount table (`df`, `findmnt`):
        // tried again for a second before saying so.
        var message = ""
        for attempt in 0..<6 {
            if attempt > 0 { usleep(200_000) }
            let process = Process()
            let errors = Pipe()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
            process.arguments = ["fusermount3", "-u"] + (lazy ? ["-z"] : []) + [mountPoint]
            process.standardError = errors
            try process.run()
            let output = errors.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            if process.terminationStatus == 0 {
                if let daemon, !(device.map(MountTable.isMounted) ?? false) { Self.waitForExit(of: daemon) }
                return
            }
            message = String(decoding: output, as: UTF8.self)
            guard message.contains("busy") else { break }
        }
        FileHandle.standardError.write(Data(message.utf8))
        throw ContainerError("could not unmount \(mountPoint) (see fusermount3's message above). If it is busy, close what uses it (`fuser -vm \(mountPoint)` lists them), or use --lazy.")
    }

    /// The daemon serving `mountPoint`, asked by a child process: the question is a request to the
    /// daemon (an extended attribute of the mount's root), which a stopped or hung daemon never
    /// answers, and a process waiting for it keeps the mount busy until killed. Nil, said on
    /// standard error, when no answer comes within `seconds`: the unmount goes on without waiting
    /// for the daemon. `stuck` when the child outlives its kill: the daemon had taken the question
    /// (requests through io_uring are taken at once), and a process waiting for an answer to a
    /// request taken cannot be killed, so the mount stays busy until the daemon answers or ends.
    private static func daemonAnswering(for mountPoint: String, within seconds: Double = 2) throws -> (pid: pid_t?, stuck: Bool) {
        let asking = Process()
        asking.executableURL = URL(fileURLWithPath: try BackgroundLauncher.executablePath())
        asking.arguments = ["unmount", "--print-daemon", mountPoint]
        let answer = Pipe()
        asking.standardOutput = answer
        asking.standardError = FileHandle.nullDevice
        try asking.run()
        let deadline = Date().addingTimeInterval(seconds)
        while asking.isRunning, Date() < deadline { usleep(5_000) }
        if asking.isRunning {
            // A fatal signal is the one that ends a wait for a FUSE answer not yet taken.
            kill(asking.processIdentifier, SIGKILL)
            let killed = Date().addingTimeInterval(1)
            while asking.isRunning, Date() < killed { usleep(5_000) }
            let stuck = asking.isRunning
            FileHandle.standardError.write(Data("""
                containerfs: the daemon serving \(mountPoint) did not answer within \(Int(seconds)) s (stopped or hung); \
                unmounting without waiting for it\(stuck ? ", detached: it took the question and keeps it until it answers or ends" : "").\n
                """.utf8))
            return (nil, stuck)
        }
        let output = answer.fileHandleForReading.readDataToEndOfFile()
        return (pid_t(String(decoding: output, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)), false)
    }

    /// The daemon serving `mountPoint`, as the kernel names it to its control socket's callers;
    /// nil if the mount does not say, or if the daemon runs in a process namespace this command
    /// does not see into (the socket's name, `PID-NAMESPACE.sock`, holds its pid there, not here).
    private static func daemon(serving mountPoint: String) -> pid_t? {
        var buffer = [UInt8](repeating: 0, count: 4096)
        let length = clinux_getxattr(mountPoint, MountLocator.socketAttribute, &buffer, buffer.count)
        guard length > 0, let pid = controlServerProcess(at: String(decoding: buffer[..<length], as: UTF8.self)) else { return nil }
        return pid > 0 ? pid : nil
    }

    /// Waits (up to 10 s) for the daemon to exit: after the kernel's unmount it still removes its
    /// shadows and empties tmp, and the store's own disk stays busy until it is gone (an `umount`
    /// of it right after failed).
    private static func waitForExit(of daemon: pid_t) {
        for _ in 0..<1000 {
            // Gone, or a zombie its parent has not reaped yet.
            if kill(daemon, 0) != 0 && errno == ESRCH { return }
            if let stat = try? String(contentsOfFile: "/proc/\(daemon)/stat", encoding: .utf8),
               let close = stat.lastIndex(of: ")"), stat[close...].dropFirst(2).first == "Z" { return }
            usleep(10_000)
        }
        FileHandle.standardError.write(Data("containerfs: unmounted; its daemon (pid \(daemon)) is still finishing with the store.\n".utf8))
    }
}

/// Background mode without fork: the daemon is the same program started again in the foreground,
/// in a new session, and it says "ready" on a pipe once mounted. Forking a running Swift program is
/// not safe (libdispatch refuses work after fork).
enum BackgroundLauncher {
    static func relaunchInForeground() throws -> Never {
        var pipeEnds: [Int32] = [0, 0]
        guard pipe(&pipeEnds) == 0 else { throw ContainerError("pipe: \(String(cString: strerror(errno)))") }
        let readyDescriptor: Int32 = 3
        let executable = try executablePath()
        let arguments = [executable] + CommandLine.arguments.dropFirst() + ["--foreground", "--ready-fd", String(readyDescriptor)]

        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        // Close the read end first: it may hold the very number the write end is moved to.
        posix_spawn_file_actions_addclose(&actions, pipeEnds[0])
        posix_spawn_file_actions_adddup2(&actions, pipeEnds[1], readyDescriptor)
        // Nothing else is inherited: a stray descriptor (a caller's pipe) would stay open for the daemon's life.
        clinux_spawn_close_from(&actions, readyDescriptor + 1)
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        posix_spawnattr_setflags(&attributes, clinux_POSIX_SPAWN_SETSID)

        var cArguments = arguments.map { strdup($0) } + [nil]
        defer { cArguments.forEach { free($0) } }
        var pid: pid_t = 0
        let spawned = posix_spawn(&pid, executable, &actions, &attributes, &cArguments, environ)
        close(pipeEnds[1])
        guard spawned == 0 else { throw ContainerError("could not start the daemon: \(String(cString: strerror(spawned)))") }

        var buffer = [UInt8](repeating: 0, count: 16)
        let count = read(pipeEnds[0], &buffer, buffer.count)
        if count > 0, buffer.starts(with: Array("ready".utf8)) { Foundation.exit(0) }
        // The daemon failed before mounting and said why on our shared stderr.
        var status: Int32 = 0
        waitpid(pid, &status, 0)
        Foundation.exit(status & 0x7f == 0 ? max((status >> 8) & 0xff, 1) : 1)
    }

    static func executablePath() throws -> String {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let length = readlink("/proc/self/exe", &buffer, Int(PATH_MAX))
        guard length > 0 else { throw ContainerError("cannot find my own executable in /proc/self/exe") }
        return String(decoding: buffer[0..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
