import ArgumentParser
import ContainerFS
import Containers
import Coordination
import FileCoordination
import Foundation

struct StatusCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "status",
        abstract: "Show a mount's coordination state: clients, presenters, accesses, write sessions.",
        discussion: """
        Asks the mount's daemon over its control socket. Lists connected clients (pid, uid), presenters \
        (unresponsive ones marked), active and waiting coordinated accesses, messages waiting for a \
        presenter's answer, open write sessions, and the apps running from the store (`containerfs \
        run`) with their processes. --json prints the daemon's status reply as JSON \
        (paths as lists of names, as in docs/control-protocol.md).
        """
    )

    @Flag(help: "Print JSON.") var json = false
    @Option(help: ArgumentHelp("Ask this control socket instead of finding it from the mount point.", valueName: "path"))
    var socket: String?
    @Argument(help: "The mount point (or any item in the mount).") var mountPoint: String?

    func validate() throws {
        guard (mountPoint == nil) != (socket == nil) else {
            throw ValidationError("Give the mount point, or --socket PATH.")
        }
    }

    func run() throws {
        let location: MountLocation
        if let socket {
            location = MountLocation(socketPath: socket, itemPath: .root, mountRoot: nil)
        } else {
            let mountPoint = self.mountPoint!
            guard let found = MountLocator().locate(URL(fileURLWithPath: mountPoint).standardizedFileURL) else {
                printError("\(mountPoint) is not in a ContainerFS mount (it has no \(MountLocator.socketAttribute) attribute).")
                throw ExitCode(1)
            }
            location = found
        }
        let status: CoordinationStatus
        let me: OwnerID
        do {
            let client = try ControlClient(socketPath: location.socketPath, clientName: "containerfs status")
            defer { client.close() }
            me = client.clientID
            status = try client.status()
        } catch {
            printError("containerfs status: \(error)")
            throw ExitCode(1)
        }
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .prettyPrinted, .withoutEscapingSlashes]
            print(String(decoding: try encoder.encode(status), as: UTF8.self))
        } else {
            print(StatusReport(status: status, excluding: me, view: location.view).text, terminator: "")
            if let mountPoint { print(RunningAppsReport(path: Store.absolute(mountPoint)).text, terminator: "") }
        }
    }
}

/// The apps running from the store of the mount that holds `path`, each sandbox with the
/// processes in it (the descendants of its `containerfs run`).
struct RunningAppsReport {
    let path: String

    var text: String {
        guard let resolved = realpath(path, nil) else { return "" }
        defer { free(resolved) }
        guard let source = MountTable.mount(holding: String(cString: resolved))?.source,
              let store = Sandbox.store(mountedAs: source)
        else { return "" }
        let running: [RunningApp]
        do { running = try RunningApps.list(in: store) } catch { return "Running apps: cannot be listed (\(error))\n" }
        guard !running.isEmpty else { return "Running apps: none\n" }
        let processes = Self.processes()
        var lines = ["Running apps:"]
        for app in running {
            var descendants: [(pid_t, String)] = []
            var frontier = [app.launcher]
            while let parent = frontier.popLast() {
                for (pid, entry) in processes where entry.parent == parent {
                    descendants.append((pid, entry.name))
                    frontier.append(pid)
                }
            }
            let list = descendants.sorted { $0.0 < $1.0 }.map { "\($0.0) \($0.1)" }.joined(separator: ", ")
            lines.append("  \(app.app): launched by pid \(app.launcher); processes: \(list.isEmpty ? "none" : list)")
        }
        return lines.joined(separator: "\n") + "\n"
    }

    /// Every process's parent and name, from /proc/PID/stat.
    private static func processes() -> [pid_t: (parent: pid_t, name: String)] {
        var table: [pid_t: (parent: pid_t, name: String)] = [:]
        for name in (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? [] {
            guard let pid = pid_t(name), let stat = try? String(contentsOfFile: "/proc/\(name)/stat", encoding: .utf8),
                  let open = stat.firstIndex(of: "("), let close = stat.lastIndex(of: ")") else { continue }
            let fields = stat[stat.index(close, offsetBy: 2)...].split(separator: " ")
            guard fields.count > 1, let parent = pid_t(fields[1]) else { continue }
            table[pid] = (parent, String(stat[stat.index(after: open)..<close]))
        }
        return table
    }
}

/// The human-readable status.
struct StatusReport {
    let status: CoordinationStatus
    let excluding: OwnerID?
    /// Where the mount asked shows the daemon's items; paths it does not show are the daemon's.
    let view: MountView?

    private func show(_ path: ItemPath) -> String {
        view?.url(for: path)?.path ?? path.description
    }

    private func client(_ owner: OwnerID) -> String {
        if owner == .ordinaryPrograms { return "filesystem" }
        guard let record = status.clients?.first(where: { $0.owner == owner }) else { return "client \(owner.rawValue)" }
        return "client \(owner.rawValue) (pid \(record.processID))"
    }

    private func more(_ count: Int?) -> [String] {
        guard let count, count > 0 else { return [] }
        return ["  ... and \(count) more, not shown (the status is larger than one control message)"]
    }

    var text: String {
        var lines: [String] = []
        let omitted = status.omitted
        let clients = (status.clients ?? []).filter { $0.owner != excluding }
        lines.append("Clients: \(clients.count + (omitted?.clients ?? 0))")
        for record in clients {
            lines.append("  \(record.owner.rawValue)  pid \(record.processID)  uid \(record.userID)  \(record.clientName ?? "")")
        }
        lines += more(omitted?.clients)
        lines.append("Presenters: \(status.presenters.count + (omitted?.presenters ?? 0))")
        for presenter in status.presenters {
            let mark = presenter.isUnresponsive ? "  UNRESPONSIVE" : ""
            lines.append("  \(show(presenter.path))  \(client(presenter.owner))  \(presenter.purpose)\(mark)")
        }
        lines += more(omitted?.presenters)
        let active = status.accesses.filter { $0.state == .active }
        let waiting = status.accesses.filter { $0.state == .waiting }
        for (title, accesses) in [("Active accesses", active), ("Waiting accesses", waiting)] {
            lines.append("\(title): \(accesses.count)")
            for access in accesses {
                let options = access.kind.optionNames
                let kind = (access.kind.isWrite ? "write" : "read") + (options.isEmpty ? "" : " (\(options.joined(separator: ", ")))")
                lines.append("  \(kind)  \(show(access.path))  \(client(access.owner))  ticket \(access.ticket.rawValue)")
            }
        }
        lines += more(omitted?.accesses)
        lines.append("Messages awaiting an answer: \(status.pendingMessages.count)")
        for pending in status.pendingMessages {
            lines.append("  \(pending.message.name) to \(client(pending.presenter.owner)) \(pending.presenter.purpose)")
        }
        lines += more(omitted?.pendingMessages)
        let sessions = status.writeSessions ?? []
        lines.append("Write sessions: \(status.writeSessions == nil ? "not reported by this daemon" : String(sessions.count))")
        for session in sessions {
            var line = "  \(show(session.path))"
            if !session.processIDs.isEmpty { line += "  pids \(session.processIDs.map(String.init).joined(separator: ","))" }
            if let bytes = session.shadowBytes { line += "  \(bytes) bytes written" }
            if session.inPlace { line += "  in place" }
            lines.append(line)
        }
        lines += more(omitted?.writeSessions)
        let unresponsive = status.unresponsivePresenters
        lines.append("Unresponsive presenters: \(unresponsive.count)")
        for presenter in unresponsive {
            lines.append("  \(show(presenter.path))  \(client(presenter.owner))  \(presenter.purpose)")
        }
        return lines.joined(separator: "\n") + "\n"
    }
}
