import ArgumentParser
import FileCoordination
import Foundation

struct CoordinateCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "coordinate",
        abstract: "Run a command inside a coordinated read or write of an item, as flock(1) does with a lock.",
        discussion: """
        Waits for the access, runs COMMAND, ends the access when it exits, and exits with its status \
        (1 if the access could not be had, 127 if the command could not be run, 128+N if signal N \
        killed it). Inside a ContainerFS mount the daemon arbitrates, and the command's own file \
        operations through the mount count as this access's (they do not wait for it). Example:
          cd ~/mnt/com.example.notes/Documents
          containerfs coordinate --write todo.txt -- sh -c 'echo milk >> todo.txt'
        """
    )

    @Flag(help: "Coordinate a read.") var read = false
    @Flag(help: "Coordinate a write.") var write = false
    @Flag(help: "Reading without asking presenters to save first.") var withoutChanges = false
    @Flag(help: "A write that deletes the item.") var deleting = false
    @Flag(help: "A write that moves the item.") var moving = false
    @Flag(help: "A write that replaces the item.") var replacing = false
    @Option(help: "Give up after waiting this many seconds (exit status 1).") var timeout: Double?
    @Argument(help: "The item.") var path: String
    @Argument(parsing: .postTerminator, help: "The command and its arguments, after --.") var command: [String] = []

    func validate() throws {
        guard read != write else { throw ValidationError("Give exactly one of --read and --write.") }
        guard !command.isEmpty else { throw ValidationError("Give the command to run after --.") }
        if read && (deleting || moving || replacing) {
            throw ValidationError("--deleting, --moving and --replacing go with --write.")
        }
        if write && withoutChanges { throw ValidationError("--without-changes goes with --read.") }
    }

    func run() throws {
        let url = URL(fileURLWithPath: path).standardizedFileURL
        let coordinator = FileCoordinator()
        coordinator.timeout = timeout
        let status: Int32
        do {
            if read {
                status = try coordinator.coordinate(readingItemAt: url, options: withoutChanges ? [.withoutChanges] : []) { _ in
                    runCommand()
                }
            } else {
                var options: FileCoordinator.WritingOptions = []
                if deleting { options.insert(.forDeleting) }
                if moving { options.insert(.forMoving) }
                if replacing { options.insert(.forReplacing) }
                status = try coordinator.coordinate(writingItemAt: url, options: options) { _ in runCommand() }
            }
        } catch {
            printError("containerfs coordinate: \(path): \(error)")
            throw ExitCode(1)
        }
        throw ExitCode(status)
    }

    /// Runs the command as system(3) does: in this process group, so that it keeps the terminal
    /// and Ctrl-C reaches it, while this process ignores SIGINT and SIGQUIT and passes SIGTERM and
    /// SIGHUP on, so the access is not released while the command still runs.
    private func runCommand() -> Int32 {
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for signal in [SIGINT, SIGQUIT, SIGTERM, SIGHUP] { sigaddset(&defaults, signal) }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGDEF))
        let interrupt = signal(SIGINT, SIG_IGN)
        let quit = signal(SIGQUIT, SIG_IGN)
        defer {
            signal(SIGINT, interrupt)
            signal(SIGQUIT, quit)
        }
        var arguments = command.map { strdup($0) } + [nil]
        defer { arguments.forEach { free($0) } }
        var pid: pid_t = 0
        let spawned = posix_spawnp(&pid, command[0], nil, &attributes, &arguments, environ)
        guard spawned == 0 else {
            printError("containerfs coordinate: cannot run \(command[0]): \(String(cString: strerror(spawned)))")
            return 127
        }
        commandProcess = pid
        for passedOn in [SIGTERM, SIGHUP] {
            signal(passedOn) { received in if commandProcess > 0 { kill(commandProcess, received) } }
        }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 {
            guard errno == EINTR else {
                printError("containerfs coordinate: waiting for \(command[0]): \(String(cString: strerror(errno)))")
                return 1
            }
        }
        let signalNumber = status & 0x7f
        return signalNumber == 0 ? (status >> 8) & 0xff : 128 + signalNumber
    }
}

/// The command's process, for the handlers that pass signals on.
nonisolated(unsafe) private var commandProcess: pid_t = 0
