import CLinux
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
        // Read a few bytes at a time into a small buffer, as a long listing is: a line that
        // straddles two reads is found, and one piece's end is not matched with the next's start.
        for piece in 1...9 {
            XCTAssertTrue(locks.lists(77, in: text, piece: piece, chunk: 24), "pieces of \(piece)")
            XCTAssertTrue(locks.lists(7, in: text, piece: piece, chunk: 24), "pieces of \(piece)")
            XCTAssertFalse(locks.lists(79, in: text, piece: piece, chunk: 24), "pieces of \(piece)")
            XCTAssertFalse(locks.lists(777, in: text, piece: piece, chunk: 24), "pieces of \(piece)")
        }
        XCTAssertTrue(locks.lists(12_345_678_901_234_567_890, in: "1: POSIX  ADVISORY  WRITE 1 00:12b:12345678901234567890 0 EOF\n",
                                  piece: 5, chunk: 30))
    }

    func testTheListingOfThisMachineIsRead() throws {
        // A lock this process takes on a file of its own shows in /proc/locks.
        let path = NSTemporaryDirectory() + "held-locks-\(getpid())"
        let file = open(path, O_RDWR | O_CREAT, 0o600)
        XCTAssertGreaterThanOrEqual(file, 0)
        defer { close(file); unlink(path) }
        var attributes = stat()
        XCTAssertEqual(fstat(file, &attributes), 0)
        let locks = HeldLocks(major: clinux_major(attributes.st_dev), minor: clinux_minor(attributes.st_dev))
        XCTAssertFalse(locks.held(on: UInt64(attributes.st_ino)))
        XCTAssertEqual(flock(file, LOCK_EX), 0)
        XCTAssertTrue(locks.held(on: UInt64(attributes.st_ino)))
    }
}
