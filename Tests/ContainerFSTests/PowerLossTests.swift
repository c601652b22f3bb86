import Foundation
import XCTest

/// The quick part of the power-loss harness (scripts/powerloss.sh runs all of it): a store on an
/// ext4 image and on a btrfs one, the power cut right after chosen fsyncs (and after a close without
/// one that another file's fsync made durable), after a restore, and at random points of a
/// concurrent workload, each also on the image's filesystem directly, which must agree with the
/// model.
final class PowerLossTests: XCTestCase {
    func testWhatFsyncPromisedSurvivesAPowerCut() throws {
        guard geteuid() == 0 else { throw XCTSkip("cutting the power of a loop-mounted image needs root") }
        guard Shell.run("command -v mkfs.ext4 && losetup -f").status == 0 else {
            throw XCTSkip("no mkfs.ext4 or no free loop device on this machine")
        }
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("scripts/powerloss.py").path
        let result = Shell.run("python3 \(Shell.quote(script)) --quick --binary \(Shell.quote(MountedStore.executable))", limit: 300)
        print(result.output)
        XCTAssertEqual(result.status, 0, result.output + result.error)
        XCTAssertTrue(result.output.contains("lost 0, torn 0, unclean checks 0"), result.output)
        XCTAssertTrue(result.output.contains("ext4 containerfs"), "the mount was cut too: \(result.output)")
        if Shell.run("command -v mkfs.btrfs").status == 0 {
            XCTAssertTrue(result.output.contains("btrfs containerfs"), "btrfs was cut too: \(result.output)")
        }
    }

    /// scripts/diskfail.py: the store's disk dies (the image it lives in is shut down); every change
    /// made then is reported to its writer and leaves the previous version; the disk comes back
    /// with every synced version, and a clean check.
    func testAChangeTheDiskCannotTakeIsReportedAndLeavesThePreviousVersion() throws {
        guard geteuid() == 0 else { throw XCTSkip("killing a loop-mounted image needs root") }
        guard Shell.run("command -v mkfs.ext4 && losetup -f").status == 0 else {
            throw XCTSkip("no mkfs.ext4 or no free loop device on this machine")
        }
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("scripts/diskfail.py").path
        let result = Shell.run("python3 \(Shell.quote(script)) --binary \(Shell.quote(MountedStore.executable))", limit: 300)
        print(result.output)
        XCTAssertEqual(result.status, 0, result.output + result.error)
        XCTAssertTrue(result.output.contains("problems 0"), result.output)
        XCTAssertTrue(result.output.contains("ext4 containerfs   a new file, fsync"), "the mount's disk died too: \(result.output)")
    }
}
