@testable import ContainerFS
import Containers
import Foundation
import XCTest

/// Which app a process is (`Islands`), without a mount: a process in a namespace nested in a
/// recorded sandbox's is that app's, and one whose namespace cannot be traced is refused.
final class IslandsTests: XCTestCase {
    private var directory: String!
    private var sandbox: Process?

    override func setUpWithError() throws {
        try XCTSkipIf(access("/usr/bin/unshare", X_OK) != 0, "unshare (util-linux) is not installed")
        var template = Array("/tmp/containerfs-islands-XXXXXX".utf8CString)
        guard mkdtemp(&template) != nil else { throw XCTSkip("cannot make a temporary directory: \(String(cString: strerror(errno)))") }
        directory = String(cString: template)
    }

    override func tearDown() {
        sandbox?.terminate()
        sandbox?.waitUntilExit()
        if let directory { try? FileManager.default.removeItem(atPath: directory) }
    }

    /// A process as bubblewrap leaves an app's: in a user namespace nested in the sandbox's. Returns
    /// its pid and the sandbox's namespace.
    private func startNested() throws -> (pid: pid_t, sandbox: UInt64) {
        let outer = directory + "/outer"
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/unshare")
        process.arguments = ["--user", "--map-root-user", "sh", "-c",
                             "stat -L -c %i /proc/self/ns/user > \"$0.tmp\" && mv \"$0.tmp\" \"$0\" && exec unshare --user sleep 60", outer]
        try process.run()
        sandbox = process
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline {
            if let text = try? String(contentsOfFile: outer, encoding: .utf8),
               let namespace = UInt64(text.trimmingCharacters(in: .whitespacesAndNewlines)),
               let now = RunningApps.userNamespace(of: process.processIdentifier), now != namespace {
                return (process.processIdentifier, namespace)
            }
            usleep(10_000)
        }
        throw XCTSkip("could not make nested user namespaces here")
    }

    func testAProcessWhoseNamespaceCannotBeTracedIsRefusedNotLetOut() throws {
        let store = try Store.openOrCreate(directory + "/store")
        let (pid, namespace) = try startNested()
        try RunningApps.record(RunningApp(namespace: namespace, app: "com.example.notes", launcher: getpid()), in: store)
        let islands = try XCTUnwrap(Islands(store: store))
        let notes = Islands.Identity.app(Islands.Reach(app: Array("com.example.notes".utf8)))
        XCTAssertEqual(islands.identity(of: pid), notes, "nested in the sandbox's namespace")

        // No descriptor left for the namespace's parent: the trace cannot say, so the process is refused.
        XCTAssertEqual(try islands.reload(), 1)
        let traced = try withOneDescriptorFree { islands.identity(of: pid) }
        XCTAssertEqual(traced, .unknown)
        // And traced again once it can be.
        XCTAssertEqual(islands.identity(of: pid), notes)
    }

    /// Runs `body` with every descriptor but one taken, so that its second open fails with EMFILE.
    private func withOneDescriptorFree<R>(_ body: () -> R) throws -> R {
        var saved = rlimit()
        XCTAssertEqual(getrlimit(Int32(RLIMIT_NOFILE.rawValue), &saved), 0)
        var lowered = saved
        lowered.rlim_cur = min(saved.rlim_cur, 4096)
        XCTAssertEqual(setrlimit(Int32(RLIMIT_NOFILE.rawValue), &lowered), 0)
        var taken: [Int32] = []
        defer {
            for descriptor in taken { close(descriptor) }
            setrlimit(Int32(RLIMIT_NOFILE.rawValue), &saved)
        }
        while true {
            let descriptor = open("/dev/null", O_RDONLY | O_CLOEXEC)
            guard descriptor >= 0 else { break }
            taken.append(descriptor)
        }
        guard errno == EMFILE, let last = taken.popLast() else { throw XCTSkip("could not fill the descriptor table") }
        close(last)
        return body()
    }
}
