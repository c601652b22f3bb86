import Foundation
import XCTest

/// A short run of the load test (stress/stress.py); `scripts/stress.sh` runs it for minutes.
final class StressTests: MountedTestCase {
    func testMixedLoadLosesNothingAndHoldsNothing() throws {
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("stress/stress.py").path
        let result = Shell.run("python3 \(Shell.quote(script)) Documents --seconds 4 --workers 4 --daemon-pid \(mounted.daemonPID!)",
                               in: home, limit: 180)
        print(result.output)
        XCTAssertEqual(result.status, 0, result.output + result.error)
        XCTAssertTrue(result.output.contains(", 0 lost, 0 failures"), result.output)
    }
}
