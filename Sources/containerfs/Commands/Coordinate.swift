import ArgumentParser
import FileCoordination
import Foundation

struct CoordinateCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "coordinate",
        abstract: "Run a command inside a coordinated read or write of an item, as flock(1) does with a lock.",
        discussion: """
        Waits for the access, runs COMMAND, ends the access when it exits, and exits with its status
        (1 if the access could not be had, 127 if the command could not be run, 128+N if signal N
        killed it). Inside a ContainerFS mount the daemon arbitrates, and the command's own file
        operations through the mount count as this access's (they do not wait for it). Example:
          containerfs coordinate --write ~/mnt/com.example.notes/Documents/todo.txt -- sh -c 'echo milk >> "$0"' ~/mnt/com.example.notes/Documents/todo.txt
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

    private func runCommand() -> Int32 {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = command
        do {
            try process.run()
        } catch {
            printError("containerfs coordinate: cannot run \(command[0]): \(error)")
            return 127
        }
        process.waitUntilExit()
        if process.terminationReason == .uncaughtSignal { return 128 + process.terminationStatus }
        return process.terminationStatus
    }
}
