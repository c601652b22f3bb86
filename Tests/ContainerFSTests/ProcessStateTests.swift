@testable import ContainerFS
import Coordination
import Foundation
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

    func testStatFilesKeepTheLastThreadsAndHandBackWhatTheyLetGo() {
        var files = StatFiles()
        for thread in 1...Int32(StatFiles.limit) { XCTAssertNil(files.put(thread, thread + 100)) }
        XCTAssertEqual(files.take(3), 103, "taken out while it is read")
        XCTAssertNil(files.take(3), "and no one else's meanwhile")
        XCTAssertNil(files.put(3, 103))
        XCTAssertEqual(files.put(9, 109), 101, "the longest unused goes")
        XCTAssertEqual(files.put(9, 209), 109, "a thread keeps one: the one it had goes")
        XCTAssertEqual(files.kept.map(\.thread), [2, 4, 5, 6, 7, 8, 3, 9])
    }

    func testAThreadThatIsGoneIsNotDyingAndItsDescriptorGoes() throws {
        let child = Process()
        child.executableURL = URL(fileURLWithPath: "/bin/sleep")
        child.arguments = ["5"]
        try child.run()
        let pid = child.processIdentifier
        XCTAssertFalse(ProcessState.isDyingFromSignal(pid), "alive, and its /proc/PID/stat kept open")
        let opened = { () -> Int in
            let fds = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
            return fds.filter { (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/" + $0)) == "/proc/\(pid)/stat" }.count
        }
        XCTAssertEqual(opened(), 1)
        kill(pid, SIGKILL)
        child.waitUntilExit()
        XCTAssertFalse(ProcessState.isDyingFromSignal(pid), "gone: ESRCH through the kept descriptor, no such process by number")
        XCTAssertEqual(opened(), 0, "the kept descriptor is closed")
    }

    /// The calling thread's id, as a request names its caller ("PID/task/TID").
    private static func currentThread() -> pid_t {
        let path = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/thread-self")) ?? ""
        return pid_t(path.split(separator: "/").last ?? "") ?? 0
    }

    func testAThreadBelongsToItsProcessAndAChildIsAProcessOfItsOwn() throws {
        let process = getpid()
        XCTAssertEqual(ProcessState.threadGroup(of: process), process, "the first thread")
        let other = Locked<pid_t?>(nil)
        let thread = Thread { other.withLock { $0 = ProcessState.threadGroup(of: Self.currentThread()) } }
        thread.start()
        while other.withLock({ $0 }) == nil { usleep(1000) }
        XCTAssertEqual(other.withLock { $0 }, process, "another thread, told by /proc")
        let child = Process()
        child.executableURL = URL(fileURLWithPath: "/bin/sleep")
        child.arguments = ["5"]
        try child.run()
        defer { child.terminate(); child.waitUntilExit() }
        XCTAssertEqual(ProcessState.threadGroup(of: child.processIdentifier), child.processIdentifier)
        XCTAssertNil(ProcessState.threadGroup(of: 0))
        XCTAssertNil(ProcessState.threadGroup(of: Int32.max), "no such thread")
        let status = Array("Name:\tpython3\nUmask:\t0022\nState:\tS\nTgid:\t4321\nPid:\t4330\n".utf8)
        XCTAssertEqual(status.withUnsafeBufferPointer { ProcStatus.value(of: "Tgid:", in: $0) }, 4321)
        XCTAssertNil(status.withUnsafeBufferPointer { ProcStatus.value(of: "PPid:", in: $0) }, "no such line")
    }

    /// The writers of a session are told by their threads' processes: another thread of a
    /// writer's process is one, another process (a child) is not until it writes.
    func testAWritersOtherThreadsSeeItsWritesAndOtherProcessesDoNot() throws {
        var writers = WriterProcesses()
        let other = Locked<pid_t>(0)
        let thread = Thread { other.withLock { $0 = Self.currentThread() }; sleep(5) }
        thread.start()
        while other.withLock({ $0 }) == 0 { usleep(1000) }
        let child = Process()
        child.executableURL = URL(fileURLWithPath: "/bin/sleep")
        child.arguments = ["5"]
        try child.run()
        defer { child.terminate(); child.waitUntilExit() }
        let pid = child.processIdentifier
        XCTAssertFalse(writers.includes(Self.currentThread()), "no writer yet")
        writers.add(Self.currentThread())
        XCTAssertTrue(writers.includes(Self.currentThread()))
        XCTAssertTrue(writers.includes(other.withLock { $0 }), "a thread of the writer's process")
        XCTAssertFalse(writers.includes(pid), "another process")
        XCTAssertFalse(writers.includes(0))
        writers.add(pid)
        XCTAssertTrue(writers.includes(pid), "once it writes")
    }
}
