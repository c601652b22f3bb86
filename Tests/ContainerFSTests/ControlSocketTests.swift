@testable import ContainerFS
import Coordination
import Foundation
import Glibc
import XCTest

/// Control sockets' names, and which a starting daemon takes as left by a dead one.
final class ControlSocketTests: XCTestCase {
    private var directory: String!

    override func setUpWithError() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("containerfs-sockets-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    }

    override func tearDown() {
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// A socket bound at `name` in the directory: listening, or closed at once (a dead daemon's).
    private func socketFile(_ name: String, listening: Bool) -> Int32 {
        let descriptor = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        XCTAssertEqual(withSocketAddress(directory + "/" + name) { bind(descriptor, $0, $1) }, 0)
        if listening {
            XCTAssertEqual(listen(descriptor, 4), 0)
            return descriptor
        }
        close(descriptor)
        return -1
    }

    func testOnlyTheSocketsOfDeadDaemonsGo() throws {
        let here = try XCTUnwrap(ControlSocket.processNamespace())
        let elsewhere = here + 1
        var dead: pid_t = 4_000_000
        while kill(dead, 0) == 0 || errno != ESRCH { dead -= 1 }
        // Pids of another namespace say nothing here: only whether someone listens does.
        let listener = socketFile("1-\(elsewhere).sock", listening: true)
        defer { close(listener) }
        _ = socketFile("1.sock", listening: false)
        _ = socketFile("2-\(elsewhere).sock", listening: false)
        // This namespace's: the pid says it.
        _ = socketFile("\(dead)-\(here).sock", listening: false)
        _ = socketFile("\(getpid())-\(here).sock", listening: false)
        ControlSocket.removeStale(in: directory, namespace: here, settle: 0)
        let left = try FileManager.default.contentsOfDirectory(atPath: directory).sorted()
        XCTAssertEqual(left, ["1-\(elsewhere).sock", "\(getpid())-\(here).sock"].sorted())
    }

    func testASocketJustMadeStays() throws {
        let here = try XCTUnwrap(ControlSocket.processNamespace())
        // Bound, not yet listening: a daemon starting up.
        _ = socketFile("1-\(here + 1).sock", listening: false)
        ControlSocket.removeStale(in: directory, namespace: here)
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: directory), ["1-\(here + 1).sock"])
    }

    /// Where no runtime directory is set, the sockets' directory is /tmp/containerfs-UID, a name
    /// anyone can take first: another user's directory there (or a link, or one others may write)
    /// is not used, since they could put their own socket in the daemon's place.
    func testADirectoryAnotherUserMadeFirstIsNotUsed() throws {
        try XCTSkipIf(geteuid() != 0, "making a directory another user's needs root")
        let fresh = directory + "/fresh"
        let mask = umask(0o077)
        defer { umask(mask) }
        XCTAssertEqual(try ControlSocket.ownDirectory(fresh), fresh)
        var attributes = stat()
        XCTAssertEqual(lstat(fresh, &attributes), 0)
        XCTAssertEqual(attributes.st_mode & 0o7777, 0o755)
        XCTAssertEqual(try ControlSocket.ownDirectory(fresh), fresh, "one of its own, again")
        // Made narrower (by an admin, a tmpfiles rule): others could not reach the socket.
        XCTAssertEqual(chmod(fresh, 0o700), 0)
        XCTAssertEqual(try ControlSocket.ownDirectory(fresh), fresh)
        XCTAssertEqual(lstat(fresh, &attributes), 0)
        XCTAssertEqual(attributes.st_mode & 0o7777, 0o755, "searchable by others again")

        let squatted = directory + "/squatted"
        XCTAssertEqual(mkdir(squatted, 0o777), 0)
        XCTAssertEqual(chown(squatted, 4243, 4243), 0)
        XCTAssertEqual(chmod(squatted, 0o777), 0)
        let linked = directory + "/linked"
        XCTAssertEqual(symlink(fresh, linked), 0)
        let open = directory + "/open"
        XCTAssertEqual(mkdir(open, 0o755), 0)
        XCTAssertEqual(chmod(open, 0o775), 0)
        for taken in [squatted, linked, open] {
            let chosen = try ControlSocket.ownDirectory(taken)
            XCTAssertNotEqual(chosen, taken)
            XCTAssertTrue(chosen.hasPrefix(taken + "-"), chosen)
            XCTAssertEqual(lstat(chosen, &attributes), 0)
            XCTAssertEqual(attributes.st_mode & S_IFMT, S_IFDIR)
            XCTAssertEqual(attributes.st_uid, geteuid())
            XCTAssertEqual(attributes.st_mode & 0o7777, 0o755, "no one else's to write; others reach the socket")
        }
    }
}
