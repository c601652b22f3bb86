import Foundation
import XCTest
@testable import ContainerFS

/// Which filesystems commit a file's changes of links with the file's own fsync, so that the daemon
/// may leave their directories unsynced (docs/atomic-replace.md, "Durability"). The power-loss
/// harness checks what the answer is used for; this checks the answer on images of each kind.
final class FileSyncTests: XCTestCase {
    func testJournalsAreToldApartFromFileSystemsWithout() throws {
        guard geteuid() == 0 else { throw XCTSkip("mounting loop images needs root") }
        guard Shell.run("command -v mkfs.ext4 && losetup -f").status == 0 else {
            throw XCTSkip("no mkfs.ext4 or no free loop device on this machine")
        }
        let work = NSTemporaryDirectory() + "filesync-\(getpid())"
        try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: work) }
        var kinds: [(mkfs: String, journals: Bool)] = [("mkfs.ext4 -q -F", true), ("mkfs.ext4 -q -F -O ^has_journal", false)]
        if Shell.run("command -v mkfs.xfs").status == 0 {
            kinds.append(("mkfs.xfs -q -f", true))
        } else {
            print("FileSyncTests: XFS left out, mkfs.xfs is not installed")
        }
        for (index, kind) in kinds.enumerated() {
            let image = "\(work)/\(index).img", mountPoint = "\(work)/\(index)"
            try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: true)
            let made = Shell.run("truncate -s 320M \(image) && \(kind.mkfs) \(image) && mount -o loop \(image) \(mountPoint)")
            XCTAssertEqual(made.status, 0, made.error)
            guard made.status == 0 else { continue }
            defer { _ = Shell.run("umount \(mountPoint)") }
            let directory = open(mountPoint, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            XCTAssertGreaterThanOrEqual(directory, 0)
            defer { close(directory) }
            XCTAssertEqual(Backing.fileSyncCarriesNames(onFileSystemOf: directory), kind.journals, kind.mkfs)
        }
        let tmpfs = open("/dev/shm", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        defer { close(tmpfs) }
        XCTAssertFalse(Backing.fileSyncCarriesNames(onFileSystemOf: tmpfs), "tmpfs")
    }

    /// The daemon reads a file's key and size without its times (`Backing.identity`): a stat that
    /// reads them makes the file's next write take a fine-grained timestamp, which ext4 journals,
    /// and the fdatasync after it waits for that commit (docs/atomic-replace.md, "In-place writes").
    func testTheDaemonsLookAtAFileLeavesItsTimesUnread() throws {
        let path = NSTemporaryDirectory() + "identity-\(getpid())"
        let file = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        XCTAssertGreaterThanOrEqual(file, 0)
        defer {
            close(file)
            unlink(path)
        }
        /// How many of 20 second writes, each after `look`, changed the file's time of change:
        /// one that read the times forces a new one (later than a clock read before it), one
        /// that did not leaves the first write's, unless the coarse clock ticked meanwhile or
        /// another file took a fine-grained time (the clock's floor).
        func movedTimes(after look: () -> Void) -> Int {
            var moved = 0
            for _ in 0..<20 {
                var attributes = stat()
                XCTAssertEqual(fstat(file, &attributes), 0)
                XCTAssertEqual(pwrite(file, "a", 1, 0), 1)
                var before = timespec()
                clock_gettime(CLOCK_REALTIME, &before)
                look()
                XCTAssertEqual(pwrite(file, "b", 1, 0), 1)
                XCTAssertEqual(fstat(file, &attributes), 0)
                let after = attributes.st_ctim
                if after.tv_sec > before.tv_sec || after.tv_sec == before.tv_sec && after.tv_nsec > before.tv_nsec { moved += 1 }
            }
            return moved
        }
        let byStat = movedTimes { var attributes = stat(); _ = fstat(file, &attributes) }
        guard byStat == 20 else {
            throw XCTSkip("the filesystem of \(path) keeps coarse times however they are read (kernels before 6.13, no multigrain timestamps): \(byStat) of 20 moved")
        }
        let expected = Backing.key(of: file)
        let byIdentity = movedTimes { XCTAssertEqual(Backing.identity(of: file)?.key, expected) }
        XCTAssertLessThan(byIdentity, 10, "second writes whose time moved after the daemon's look at the file")
        XCTAssertEqual(Backing.identity(of: file)?.size, 1)
    }
}
