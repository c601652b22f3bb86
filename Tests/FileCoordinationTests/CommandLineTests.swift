import Coordination
import Foundation
import XCTest

/// The `containerfs` commands of the client side, run as a user would (no FUSE: outside a
/// mount, or against a ControlServer started by the test). Needs the built `containerfs`
/// executable next to the test bundle (`swift build` builds it; `swift test` does too).
final class CommandLineTests: XCTestCase {
    private var directory: URL!

    override func setUp() {
        directory = makeTemporaryDirectory()
    }

    override func tearDown() {
        try? FileManager.default.removeItem(at: directory)
    }

    private func executable() throws -> URL {
        var candidate = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
        for _ in 0..<3 {
            let binary = candidate.appendingPathComponent("containerfs")
            if FileManager.default.isExecutableFile(atPath: binary.path) { return binary }
            candidate = candidate.deletingLastPathComponent()
        }
        throw XCTSkip("the containerfs executable is not built next to the tests")
    }

    private struct Result {
        let status: Int32
        let output: String
        let errors: String
    }

    private func containerfs(_ arguments: [String]) throws -> Result {
        let process = Process()
        process.executableURL = try executable()
        process.arguments = arguments
        let output = Pipe()
        let errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        let outputData = output.fileHandleForReading.readDataToEndOfFile()
        let errorData = errors.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return Result(status: process.terminationStatus, output: String(decoding: outputData, as: UTF8.self),
                      errors: String(decoding: errorData, as: UTF8.self))
    }

    func testTheExampleAppIndexesAndAddsNotes() throws {
        try Data("Groceries\nmilk\n".utf8).write(to: directory.appendingPathComponent("groceries.txt"))
        try Data("Ideas\n".utf8).write(to: directory.appendingPathComponent("ideas.txt"))
        let run = try containerfs(["example-notes", "--once", "--add", "Call Mom", "--body", "on Sunday", directory.path])
        XCTAssertEqual(run.status, 0, run.errors)
        XCTAssertEqual(run.output, "added call-mom.txt\nindexed 3 notes\n")
        let index = try String(contentsOf: directory.appendingPathComponent("INDEX.md"), encoding: .utf8)
        XCTAssertEqual(index, "# Notes\n\n- Call Mom (call-mom.txt)\n- Groceries (groceries.txt)\n- Ideas (ideas.txt)\n")
    }

    func testCoordinateRunsTheCommandAndExitsWithItsStatus() throws {
        let file = directory.appendingPathComponent("todo.txt")
        try Data("milk\n".utf8).write(to: file)
        let appended = try containerfs(["coordinate", "--write", file.path, "--", "sh", "-c", "echo eggs >> \"$0\"", file.path])
        XCTAssertEqual(appended.status, 0, appended.errors)
        XCTAssertEqual(try String(contentsOf: file, encoding: .utf8), "milk\neggs\n")
        XCTAssertEqual(try containerfs(["coordinate", "--read", file.path, "--", "sh", "-c", "exit 7"]).status, 7)
        XCTAssertEqual(try containerfs(["coordinate", "--read", file.path, "--", "no-such-command-here"]).status, 127)
        // The command stays in the caller's process group (it keeps the terminal; Ctrl-C reaches it).
        let groups = try containerfs(["coordinate", "--read", file.path, "--", "sh", "-c",
                                      "cut -d' ' -f5 /proc/$$/stat /proc/$PPID/stat"])
        let lines = groups.output.split(separator: "\n")
        XCTAssertEqual(lines.count, 2, groups.errors)
        XCTAssertEqual(lines.first, lines.last, "the command's process group and coordinate's")
        XCTAssertEqual(try containerfs(["coordinate", "--read", file.path, "--", "sh", "-c", "kill -TERM $$"]).status, 128 + 15)
        let bad = try containerfs(["coordinate", "--read", "--write", file.path, "--", "true"])
        XCTAssertNotEqual(bad.status, 0)
        XCTAssertTrue(bad.errors.contains("exactly one"), bad.errors)
    }

    func testWatchAndStatusRefusePathsOutsideAMount() throws {
        let watch = try containerfs(["watch", directory.path])
        XCTAssertEqual(watch.status, 1)
        XCTAssertTrue(watch.errors.contains("not in a ContainerFS mount"), watch.errors)
        let status = try containerfs(["status", directory.path])
        XCTAssertEqual(status.status, 1)
        XCTAssertTrue(status.errors.contains("not in a ContainerFS mount"), status.errors)
    }

    /// A directory tree dressed up as a mount: real `user.containerfs.*` xattrs on real files
    /// (ext4 and tmpfs take user xattrs), so the commands find a ControlServer the test runs.
    private func fakeMount() throws -> (root: URL, server: ControlServer) {
        let root = directory.appendingPathComponent("mnt")
        let socketPath = directory.path + "/control"
        try FileManager.default.createDirectory(at: root.appendingPathComponent("Documents"), withIntermediateDirectories: true)
        try Data("note\n".utf8).write(to: root.appendingPathComponent("Documents/note.txt"))
        for relative in ["", "Documents", "Documents/note.txt"] {
            let path = relative.isEmpty ? root.path : root.path + "/" + relative
            guard setAttribute(path, "user.containerfs.control-socket", socketPath),
                  setAttribute(path, "user.containerfs.path", relative) else {
                throw XCTSkip("this filesystem takes no user xattrs")
            }
        }
        let server = ControlServer(socketPath: socketPath, mayAccess: { _, _, _ in true }) {
            CoordinationEngine(transport: $0, replyTimeout: .seconds(2))
        }
        try server.start()
        return (root, server)
    }

    private func begin(_ operation: CoordinatedOperation, on server: ControlServer) -> Events.Sessions {
        let sessions = Events.Sessions()
        server.engine.begin(operation, owner: .ordinaryPrograms, purpose: PurposeID("fuse-\(UUID())"),
                            timeout: .seconds(10)) { result in
            if case .success(let session) = result { sessions.add(session) }
        }
        return sessions
    }

    func testWatchPrintsWhatPresentersHearAndRunsItsCommands() throws {
        let binary = try executable()
        let (root, server) = try fakeMount()
        defer { server.stop() }
        let saved = directory.appendingPathComponent("saved-by-watch")
        let process = Process()
        process.executableURL = binary
        process.arguments = ["watch", "--json", "--on-save", "sleep 0.3; echo \"$CONTAINERFS_EVENT\" > '\(saved.path)'",
                             root.path + "/Documents/note.txt", root.path + "/Documents"]
        let output = Pipe()
        process.standardOutput = output
        let lines = Events()
        let buffer = LineBuffer()
        output.fileHandleForReading.readabilityHandler = { handle in
            for line in buffer.add(handle.availableData) { lines.append(line) }
        }
        try process.run()
        defer {
            process.terminate()
            process.waitUntilExit()
            output.fileHandleForReading.readabilityHandler = nil
        }
        eventually("both presenters registered") { server.engine.registry.all().count == 2 }
        XCTAssertEqual(server.clients().first?.clientName, "containerfs")

        let write = begin(.write(ItemPath("Documents/note.txt")!), on: server)
        eventually("write granted") { write.first != nil }
        write.first?.end(tookEffect: true)
        let note = root.path + "/Documents/note.txt"
        eventually("published") { lines.all.count >= 4 }
        let events = try lines.all.map { line -> [String: String] in
            try JSONDecoder().decode([String: String].self, from: Data(line.utf8))
        }
        XCTAssertEqual(events.filter { $0["watched"] == note }.map { $0["event"]! },
                       ["relinquishPresentedItemToWriter", "presentedItemDidChange", "reacquirePresentedItem"])
        XCTAssertTrue(events.contains { $0["event"] == "presentedSubitemDidChange" && $0["path"] == note })
        XCTAssertTrue(events.allSatisfy { $0["path"] != nil })

        // A read asks to save: the daemon waits until --on-save's command has ended.
        let read = begin(.read(ItemPath("Documents/note.txt")!), on: server)
        eventually("read granted") { read.first != nil }
        XCTAssertEqual(try? String(contentsOf: saved, encoding: .utf8), "savePresentedItemChanges\n",
                       "answered only once the command ended")
        read.first?.end(tookEffect: true)

        lines.clear()
        let move = begin(.move(from: ItemPath("Documents/note.txt")!, to: ItemPath("Documents/moved.txt")!,
                               replacesDestination: false), on: server)
        eventually("move granted") { move.first != nil }
        move.first?.end(tookEffect: true)
        eventually("move told") { lines.all.contains { $0.contains("presentedItemDidMove") } }
        let moved = try XCTUnwrap(lines.all.first { $0.contains("presentedItemDidMove") })
        let fields = try JSONDecoder().decode([String: String].self, from: Data(moved.utf8))
        XCTAssertEqual(fields["path"], note)
        XCTAssertEqual(fields["newPath"], root.path + "/Documents/moved.txt")

        // status finds the daemon from the mount point alone.
        let status = try containerfs(["status", root.path])
        XCTAssertEqual(status.status, 0, status.errors)
        XCTAssertTrue(status.output.contains("Presenters: 2"), status.output)
        XCTAssertTrue(status.output.contains(root.path + "/Documents/moved.txt"), status.output)

        server.stop()
        process.waitUntilExit()
        XCTAssertEqual(process.terminationStatus, 1, "watch ends when the daemon goes away")
    }

    func testStatusShowsTheDaemonsState() throws {
        _ = try executable()
        let socketPath = directory.path + "/control"
        let server = ControlServer(socketPath: socketPath, mayAccess: { _, _, _ in true },
                                   writeSessions: { [WriteSessionStatus(path: ItemPath("Documents/draft.txt")!, processIDs: [42])] }) {
            CoordinationEngine(transport: $0)
        }
        try server.start()
        defer { server.stop() }
        server.engine.registry.add(PresenterKey(owner: OwnerID(77), purpose: PurposeID("editor")), path: ItemPath("Documents/note.txt")!)
        server.engine.registry.setUnresponsive(PresenterKey(owner: OwnerID(77), purpose: PurposeID("editor")))
        server.engine.arbiter.request([.write(ItemPath("Documents/note.txt")!)], owner: .ordinaryPrograms,
                                      purpose: PurposeID("fuse-1")) { _ in }
        server.engine.arbiter.request([.read(ItemPath("Documents/note.txt")!)], owner: .ordinaryPrograms,
                                      purpose: PurposeID("fuse-2")) { _ in }

        let text = try containerfs(["status", "--socket", socketPath])
        XCTAssertEqual(text.status, 0, text.errors)
        XCTAssertTrue(text.output.contains("Presenters: 1\n  Documents/note.txt  client 77  editor  UNRESPONSIVE"), text.output)
        XCTAssertTrue(text.output.contains("Active accesses: 1\n  write  Documents/note.txt  filesystem"), text.output)
        XCTAssertTrue(text.output.contains("Waiting accesses: 1\n  read  Documents/note.txt  filesystem"), text.output)
        XCTAssertTrue(text.output.contains("Write sessions: 1\n  Documents/draft.txt  pids 42"), text.output)
        XCTAssertTrue(text.output.contains("Unresponsive presenters: 1"), text.output)
        XCTAssertTrue(text.output.contains("Clients: 0"), "the status command leaves itself out: \(text.output)")

        let json = try containerfs(["status", "--json", "--socket", socketPath])
        XCTAssertEqual(json.status, 0, json.errors)
        let decoded = try JSONDecoder().decode(CoordinationStatus.self, from: Data(json.output.utf8))
        XCTAssertEqual(decoded.presenters.map(\.isUnresponsive), [true])
        XCTAssertEqual(decoded.accesses.map(\.state), [.active, .waiting])
        XCTAssertEqual(decoded.writeSessions?.first?.processIDs, [42])
        XCTAssertEqual(decoded.clients?.count, 1)
    }
}

/// Splits a byte stream into lines.
private final class LineBuffer: @unchecked Sendable {
    private let lock = NSLock()
    private var pending = Data()

    func add(_ data: Data) -> [String] {
        lock.withLock {
            pending.append(data)
            var lines: [String] = []
            while let newline = pending.firstIndex(of: 0x0A) {
                lines.append(String(decoding: pending[pending.startIndex..<newline], as: UTF8.self))
                pending = Data(pending[(newline + 1)...])
            }
            return lines
        }
    }
}

private typealias SetxattrFunction = @convention(c) (
    UnsafePointer<CChar>, UnsafePointer<CChar>, UnsafeRawPointer?, Int, Int32) -> Int32

private func setAttribute(_ path: String, _ name: String, _ value: String) -> Bool {
    guard let symbol = dlsym(dlopen(nil, RTLD_NOW), "setxattr") else { return false }
    let setxattr = unsafeBitCast(symbol, to: SetxattrFunction.self)
    let bytes = Array(value.utf8)
    return bytes.withUnsafeBytes { setxattr(path, name, $0.baseAddress, bytes.count, 0) } == 0
}
