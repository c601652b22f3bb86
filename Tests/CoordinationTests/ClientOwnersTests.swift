import Glibc
import XCTest
@testable import Coordination

/// `ClientOwners` on its own, with a process tree of its test's making: no socket, no /proc.
final class ClientOwnersTests: XCTestCase {
    /// pid → (thread group, parent).
    private let tree: [pid_t: (tgid: pid_t, ppid: pid_t)] = [
        100: (100, 1), 101: (100, 1),   // a client's process and one of its threads
        200: (200, 100), 201: (201, 200),   // its child and grandchild
        300: (300, 1),                  // an unrelated process
    ]

    private func owners(asked: EventLog<pid_t>? = nil) -> ClientOwners {
        let tree = tree
        return ClientOwners { pid in
            asked?.append(pid)
            return tree[pid]
        }
    }

    func testThreadsAndDescendantsBelongToTheClientAndOthersToNoOne() {
        let owners = owners()
        XCTAssertNil(owners.owner(of: 100), "no clients")
        owners.connected(OwnerID(1), pid: 100)
        XCTAssertEqual(owners.owner(of: 100), OwnerID(1))
        XCTAssertEqual(owners.owner(of: 101), OwnerID(1), "a thread of the client")
        XCTAssertEqual(owners.owner(of: 201), OwnerID(1), "a grandchild")
        XCTAssertNil(owners.owner(of: 300))
        XCTAssertNil(owners.owner(of: 999), "a process that is gone")
    }

    func testTheOldestConnectionOfAProcessOwnsIt() {
        let owners = owners()
        owners.connected(OwnerID(7), pid: 100)
        owners.connected(OwnerID(3), pid: 100)
        XCTAssertEqual(owners.owner(of: 200), OwnerID(3))
        owners.disconnected(OwnerID(3), pid: 100)
        XCTAssertEqual(owners.owner(of: 200), OwnerID(7), "the cached answer went with the client")
        owners.disconnected(OwnerID(7), pid: 100)
        XCTAssertNil(owners.owner(of: 200))
    }

    func testAnswersAreCachedUntilAClientComesOrGoes() {
        let asked = EventLog<pid_t>()
        let owners = owners(asked: asked)
        owners.connected(OwnerID(1), pid: 100)
        XCTAssertEqual(owners.owner(of: 201), OwnerID(1))
        XCTAssertEqual(asked.all, [201, 200])
        XCTAssertEqual(owners.owner(of: 201), OwnerID(1))
        XCTAssertEqual(owners.owner(of: 200), OwnerID(1))
        XCTAssertEqual(asked.all, [201, 200], "both answers were kept")
        owners.connected(OwnerID(2), pid: 300)
        XCTAssertEqual(owners.owner(of: 201), OwnerID(1))
        XCTAssertEqual(asked.all, [201, 200, 201, 200], "asked afresh after a client came")
    }
}
