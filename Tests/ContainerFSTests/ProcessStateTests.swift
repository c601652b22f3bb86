@testable import ContainerFS
import Glibc
import XCTest

/// `ProcessState` reading /proc/PID/stat lines: PF_EXITING (field 9) and the exit code (field 52),
/// counted from the last `)`, since a name may hold both.
final class ProcessStateTests: XCTestCase {
    /// A line of 52 fields as Linux writes it, with `name`, `flags` and `exitCode`.
    private func line(name: String, flags: UInt64, exitCode: Int) -> [UInt8] {
        var fields = ["1234", "(\(name))", "R"] + (4...52).map { _ in "0" }
        fields[8] = String(flags)
        fields[51] = String(exitCode)
        fields[6] = "-1"  // tty_nr may be negative
        return Array((fields.joined(separator: " ") + "\n").utf8)
    }

    private func dying(_ bytes: [UInt8]) -> Bool {
        bytes.withUnsafeBufferPointer { ProcessState.dyingFromSignal(stat: $0) }
    }

    func testOnlyAnExitingProcessKilledByASignalIsDying() {
        XCTAssertFalse(dying(line(name: "python3", flags: 0x400100, exitCode: 0)), "alive")
        XCTAssertTrue(dying(line(name: "python3", flags: 0x400104, exitCode: 9)), "killed by SIGKILL")
        XCTAssertFalse(dying(line(name: "python3", flags: 0x400104, exitCode: 0x100)), "exit(1)")
        XCTAssertFalse(dying(line(name: "python3", flags: 0x400100, exitCode: 9)), "not exiting")
        XCTAssertTrue(dying(line(name: "a) b (c)", flags: 0x4, exitCode: 15)), "a name with spaces and parentheses")
        XCTAssertFalse(dying(Array("1234 (cut short) R 1 2".utf8)), "a line cut short")
    }

    func testThisProcessIsNotDyingAndAMissingOneIsNot() {
        XCTAssertFalse(ProcessState.isDyingFromSignal(getpid()))
        XCTAssertFalse(ProcessState.isDyingFromSignal(0))
        XCTAssertFalse(ProcessState.isDyingFromSignal(Int32.max))
    }
}
