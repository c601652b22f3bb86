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
}
