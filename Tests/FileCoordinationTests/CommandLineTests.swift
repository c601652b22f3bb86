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
