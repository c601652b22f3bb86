@testable import ContainerFS
import XCTest

/// /proc/locks read for a mount's inode (docs/atomic-replace.md, "Files under locks").
final class HeldLocksTests: XCTestCase {
    func testALockIsFoundByTheMountsDeviceAndTheInode() {
        let locks = HeldLocks(major: 0, minor: 0x12b)
        XCTAssertEqual(locks.device, "00:12b")
        let text = """
        1: POSIX  ADVISORY  WRITE 4242 00:12b:77 0 EOF
        1: -> POSIX  ADVISORY  WRITE 4243 00:12b:78 0 EOF
        2: FLOCK  ADVISORY  WRITE 4244 08:01:79 0 EOF
        3: OFDLCK ADVISORY  READ  -1 00:12b:7 0 EOF

        """
        XCTAssertTrue(locks.lists(77, in: text))
        XCTAssertTrue(locks.lists(78, in: text), "a lock waited for is one the rewrite must keep too")
        XCTAssertTrue(locks.lists(7, in: text))
        XCTAssertFalse(locks.lists(79, in: text), "another device's inode")
        XCTAssertFalse(locks.lists(777, in: text))
    }
}
