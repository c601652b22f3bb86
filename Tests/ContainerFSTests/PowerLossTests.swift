import Foundation
import XCTest

/// The quick part of the power-loss harness (scripts/powerloss.sh runs all of it): a store on an
/// ext4 image and on a btrfs one, the power cut right after chosen fsyncs (and after a close without
/// one that another file's fsync made durable), after a restore, and at random points of a
/// concurrent workload, each also on the image's filesystem directly, which must agree with the
/// model. And the disk-failure harness (scripts/diskfail.sh), whole, and the quick fault sweep.
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

    /// The quick part of the fault sweep (scripts/faultsweep.sh runs all of it): the first call of
    /// each system call that makes, removes or renames a name fails in the daemon during each kind
    /// of operation (on files, names and directories), an fsync'd change follows, the daemon
    /// crashes: what it reported holds after the next mount.
    func testOneFailedCallLosesNothingTheDaemonReportedDone() throws {
        let output = try faultSweep("--quick")
        XCTAssertFalse(output.contains("model:"), "the checks' model failed on a plain directory or the mount: \(output)")
        XCTAssertGreaterThan(injectedFailures(in: output), 10, "strace was to fail calls: \(output)")
    }

    /// The fault sweep with a presenter connected (`--presented`): the daemon's sends to it fail
    /// (first and second call) during new files, rewrites, saves and unlinks; no operation hangs,
    /// and what the daemon reported holds after it crashes.
    func testAPresenterTheDaemonCannotReachCostsNoFileItsVersion() throws {
        let output = try faultSweep("--presented --kinds create,rewrite,save,unlink --calls sendto --nths 1,2")
        XCTAssertTrue(output.contains("Documents presented"), output)
        XCTAssertGreaterThan(injectedFailures(in: output), 0, "the daemon sent to the presenter, and strace failed sends: \(output)")
    }

    /// Runs the fault sweep with `arguments`; its output, once it found nothing bad.
    private func faultSweep(_ arguments: String) throws -> String {
        guard Shell.run("command -v strace").status == 0 else { throw XCTSkip("strace is missing (scripts/setup.sh installs it)") }
        let output = try harness("faultsweep.py", arguments)
        XCTAssertTrue(output.contains(", 0 bad"), output)
        return output
    }

    /// How many of a sweep's cases made a call that failed.
    private func injectedFailures(in output: String) -> Int {
        output.range(of: #"(\d+) injected a failure"#, options: .regularExpression)
            .flatMap { Int(output[$0].split(separator: " ")[0]) } ?? 0
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
