import Foundation
import XCTest

/// The quick part of the power-loss harness (scripts/powerloss.sh runs all of it): a store on an
/// ext4 image and on a btrfs one, the power cut right after chosen fsyncs (and after a close without
/// one that another file's fsync made durable), after a restore, and at random points of a
/// concurrent workload, each also on the image's filesystem directly, which must agree with the
/// model. And the disk-failure harness (scripts/diskfail.sh), whole.
final class PowerLossTests: XCTestCase {
    func testWhatFsyncPromisedSurvivesAPowerCut() throws {
        let output = try harness("powerloss.py", "--quick")
        XCTAssertTrue(output.contains("lost 0, torn 0, unclean checks 0"), output)
        XCTAssertTrue(output.contains("ext4 containerfs"), "the mount was cut too: \(output)")
        if Shell.run("command -v mkfs.btrfs").status == 0 {
            XCTAssertTrue(output.contains("btrfs containerfs"), "btrfs was cut too: \(output)")
        }
    }

    /// The store's disk dies (the image it lives in is shut down); every change made then is
    /// reported to its writer and leaves the previous version; the disk comes back with every
    /// synced version, and a clean check.
    func testAChangeTheDiskCannotTakeIsReportedAndLeavesThePreviousVersion() throws {
        let output = try harness("diskfail.py")
        XCTAssertTrue(output.contains("problems 0"), output)
        XCTAssertTrue(output.contains("ext4 containerfs   a new file, fsync"), "the mount's disk died too: \(output)")
    }

    /// Runs one of the scripts' harnesses on this build's binary; its output, once it exited 0.
    private func harness(_ name: String, _ arguments: String = "") throws -> String {
        guard geteuid() == 0 else { throw XCTSkip("loop-mounted images, and shutting them down, need root") }
        // Each check after a cut, or after the disk came back, follows a clean unmount.
        guard Shell.run("command -v mkfs.ext4 && losetup -f").status == 0 else {
            throw XCTSkip("no mkfs.ext4 or no free loop device on this machine")
        }
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("scripts/" + name).path
        let result = Shell.run("python3 \(Shell.quote(script)) \(arguments) --binary \(Shell.quote(MountedStore.executable))",
                               limit: 300)
        print(result.output)
        XCTAssertEqual(result.status, 0, result.output + result.error)
        return result.output
    }
}
