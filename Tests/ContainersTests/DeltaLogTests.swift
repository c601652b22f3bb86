@testable import Containers
import Foundation
import Glibc
import XCTest

/// The redo log of a large file's rewrite, without a mount.
final class DeltaLogTests: XCTestCase {
    /// `DeltaLog.recover` in the test's directory.
    private func recover() -> Int32 {
        guard let handle = try? DirectoryHandle(path: directory) else { return errno }
        return withExtendedLifetime(handle) { DeltaLog.recover(in: handle.fd) }
    }

    private var directory = ""

    override func setUpWithError() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("deltalog-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    }

    override func tearDown() {
        try? FileManager.default.removeItem(atPath: directory)
    }

    private func file(_ name: String, _ content: String) -> Int32 {
        let descriptor = open(directory + "/" + name, O_RDWR | O_CREAT | O_TRUNC, 0o600)
        XCTAssertEqual(pwrite(descriptor, content, content.utf8.count, 0), content.utf8.count)
        return descriptor
    }

    private func contents(_ name: String) -> String {
        (try? String(contentsOfFile: directory + "/" + name, encoding: .utf8)) ?? "<none>"
    }

    /// A log of `writes` (offset, text) then an optional truncation, committed or not.
    private func log(_ name: String, _ writes: [(off_t, String)], truncatingTo size: off_t? = nil, committed: Bool) -> Int32 {
        let log = open(directory + "/" + name, O_RDWR | O_CREAT | O_TRUNC, 0o600)
        var end: off_t = 0
        for (offset, text) in writes {
            XCTAssertEqual(pwrite(log, text, text.utf8.count, end + off_t(DeltaLog.headerSize)), text.utf8.count)
            XCTAssertEqual(DeltaLog.writeHeader(log, at: end, kind: .write, offset: offset, length: off_t(text.utf8.count)), 0)
            end += off_t(DeltaLog.headerSize + text.utf8.count)
        }
        if let size { XCTAssertEqual(DeltaLog.appendTruncate(log, end: &end, size: size), 0) }
        var synced: Int32 = -1
        if committed {
            XCTAssertEqual(DeltaLog.commit(log, named: name.utf8, end: &end) { synced = $0; return 0 }, 0)
            XCTAssertEqual(synced, log)
        }
        return log
    }

    /// The records of `log`, as a log named `name` (its commit's digest covers the name).
    private func recordsOf(_ log: Int32, _ name: String = "delta-1") -> (records: [DeltaLog.Record], committed: Bool, error: Int32) {
        DeltaLog.records(of: log, named: name.utf8)
    }

    /// Where a write record's data and the commit record start in a log of one write of `length` bytes.
    private func commitPosition(afterWriteOf length: Int) -> off_t { off_t(DeltaLog.headerSize + length) }

    func testRecordsApplyInTheOrderTheyWereWritten() {
        let target = file("target", "0123456789")
        let log = log("delta-1", [(2, "ab"), (8, "XYZW"), (3, "c")], truncatingTo: 11, committed: false)
        let (records, committed, error) = recordsOf(log)
        XCTAssertEqual(error, 0)
        XCTAssertFalse(committed)
        XCTAssertEqual(records.map(\.kind), [.write, .write, .write, .truncate])
        XCTAssertEqual(DeltaLog.apply(records, of: log, to: target), 0)
        XCTAssertEqual(contents("target"), "01ac4567XYZ")
        // Applying again gives the same file.
        XCTAssertEqual(DeltaLog.apply(records, of: log, to: target), 0)
        XCTAssertEqual(contents("target"), "01ac4567XYZ")
        close(log)
        close(target)
    }

    func testATornRecordEndsTheLog() {
        let log = log("delta-1", [(0, "whole")], committed: true)
        let commit = commitPosition(afterWriteOf: 5)
        let end = commit + off_t(DeltaLog.headerSize + 32)
        // Garbage after the commit record (a later record that never made it) changes nothing.
        XCTAssertEqual(pwrite(log, "garbage", 7, end), 7)
        let (records, committed, _) = recordsOf(log)
        XCTAssertEqual(records.count, 1)
        XCTAssertTrue(committed, "the commit record right after the first write still counts")
        XCTAssertEqual(ftruncate(log, end - 1), 0)
        let torn = recordsOf(log)
        XCTAssertEqual(torn.records.count, 1)
        XCTAssertFalse(torn.committed, "a commit record cut short is no commit")
        close(log)
    }

    /// The log is synced once, with its commit record: a cut during that sync can leave the
    /// record on the disk without a block of what it commits, which must then not count.
    func testACommitWhoseLogDidNotReachTheDiskWholeDoesNotCount() {
        close(file("file", "aaaaaaaaaa"))
        let log = log("delta-1", [(1, "NEW")], committed: true)
        XCTAssertTrue(recordsOf(log).committed)
        // The write's data as a block that never reached the disk reads back: zeros.
        XCTAssertEqual(pwrite(log, [UInt8](repeating: 0, count: 3), 3, off_t(DeltaLog.headerSize)), 3)
        XCTAssertFalse(recordsOf(log).committed)
        close(log)
        XCTAssertEqual(link(directory + "/file", directory + "/delta-1.target"), 0)
        XCTAssertEqual(recover(), 0)
        XCTAssertEqual(contents("file"), "aaaaaaaaaa", "the file keeps its previous version")
        XCTAssertEqual((try? FileManager.default.contentsOfDirectory(atPath: directory))?.sorted(), ["file"])
    }

    /// A log's file may become a later log's (a retired log is kept as a spare shadow, and a spare
    /// becomes a log). A power cut can keep the later log's names, its link to its file included,
    /// and lose its content, leaving the earlier log's, whole and committed: on ext4 without a
    /// journal, metadata reaches the disk in no order (`scripts/powerloss.sh`: an older change
    /// applied over the synced version of a file, once in 236 cuts). Its commit names it.
    func testACommittedLogFoundUnderAnotherNameIsNotApplied() {
        close(file("file", "aaaaaaaaaa"))
        let log = log("delta-1", [(1, "OLD")], committed: true)
        XCTAssertTrue(recordsOf(log, "delta-1").committed)
        XCTAssertFalse(recordsOf(log, "delta-7").committed)
        close(log)
        XCTAssertEqual(rename(directory + "/delta-1", directory + "/delta-7"), 0)
        XCTAssertEqual(link(directory + "/file", directory + "/delta-7.target"), 0)
        XCTAssertEqual(recover(), 0)
        XCTAssertEqual(contents("file"), "aaaaaaaaaa", "the file keeps the version it has")
        XCTAssertEqual((try? FileManager.default.contentsOfDirectory(atPath: directory))?.sorted(), ["file"])
    }

    /// Logs committed before their commits named them (`checkedCommit`) count under any name, as
    /// they did: a mount after an upgrade applies what the last daemon committed.
    func testACommitThatNamesNoLogStillCounts() throws {
        close(file("file", "aaaaaaaaaa"))
        let log = log("delta-1", [(1, "NEW")], committed: false)
        let end = commitPosition(afterWriteOf: 3)
        let digest = try XCTUnwrap(DeltaLog.digest(of: log, upTo: end, named: nil).digest)
        XCTAssertEqual(DeltaLog.writeHeader(log, at: end, kind: .checkedCommit, offset: 0, length: off_t(digest.count)), 0)
        XCTAssertEqual(pwrite(log, digest, digest.count, end + off_t(DeltaLog.headerSize)), digest.count)
        XCTAssertTrue(recordsOf(log, "delta-7").committed)
        close(log)
        XCTAssertEqual(link(directory + "/file", directory + "/delta-1.target"), 0)
        XCTAssertEqual(recover(), 0)
        XCTAssertEqual(contents("file"), "aNEWaaaaaa")
    }

    /// Logs of earlier versions synced their records before appending a commit without a digest.
    func testACommitOfAnEarlierVersionStillCounts() {
        close(file("file", "aaaaaaaaaa"))
        let log = log("delta-1", [(1, "NEW")], committed: false)
        XCTAssertEqual(DeltaLog.writeHeader(log, at: commitPosition(afterWriteOf: 3), kind: .commit, offset: 0, length: 0), 0)
        XCTAssertTrue(recordsOf(log).committed)
        close(log)
        XCTAssertEqual(link(directory + "/file", directory + "/delta-1.target"), 0)
        XCTAssertEqual(recover(), 0)
        XCTAssertEqual(contents("file"), "aNEWaaaaaa")
    }

    /// By default the commit syncs the log alone.
    func testACommitSyncsTheLog() {
        let log = log("delta-1", [(1, "NEW")], committed: false)
        var end = commitPosition(afterWriteOf: 3)
        XCTAssertEqual(DeltaLog.commit(log, named: "delta-1".utf8, end: &end), 0)
        XCTAssertEqual(end, commitPosition(afterWriteOf: 3) + off_t(DeltaLog.headerSize + 32))
        XCTAssertTrue(recordsOf(log).committed)
        close(log)
    }

    func testRecoveryAppliesCommittedLogsAndDropsTheOthers() {
        close(file("committed-file", "aaaaaaaaaa"))
        close(file("uncommitted-file", "bbbbbbbbbb"))
        close(log("delta-1", [(1, "NEW")], committed: true))
        close(log("delta-2", [(1, "NEW")], committed: false))
        // A committed log whose link is gone was being retired: its file was synced already.
        close(log("delta-3", [(5, "LATE")], committed: true))
        XCTAssertEqual(link(directory + "/committed-file", directory + "/delta-1.target"), 0)
        XCTAssertEqual(link(directory + "/uncommitted-file", directory + "/delta-2.target"), 0)
        XCTAssertEqual(recover(), 0)
        XCTAssertEqual(contents("committed-file"), "aNEWaaaaaa")
        XCTAssertEqual(contents("uncommitted-file"), "bbbbbbbbbb")
        let left = (try? FileManager.default.contentsOfDirectory(atPath: directory))?.sorted()
        XCTAssertEqual(left, ["committed-file", "uncommitted-file"])
    }

    func testReservingBlocksKeepsTheSize() {
        let target = file("target", "0123456789")
        let log = log("delta-1", [(4096 * 4, "far")], committed: false)
        XCTAssertEqual(DeltaLog.reserve(recordsOf(log).records, in: target), 0)
        var attributes = stat()
        XCTAssertEqual(fstat(target, &attributes), 0)
        XCTAssertEqual(attributes.st_size, 10)
        close(log)
        close(target)
    }
}
