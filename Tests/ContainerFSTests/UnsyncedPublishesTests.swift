@testable import ContainerFS
import Foundation
import Glibc
import XCTest

/// Which closes may publish without waiting for their data, without a mount
/// (docs/atomic-replace.md, "Closes without a sync").
final class UnsyncedPublishesTests: XCTestCase {
    func testLargeFilesAreRecordedOnlyWhenTheirWritesChecksummedThemAndWithinTheBudget() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("unsynced-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: path) }
        let directory = open(path, O_RDONLY | O_DIRECTORY)
        XCTAssertGreaterThanOrEqual(directory, 0)
        defer { close(directory) }
        let unsynced = UnsyncedPublishes(directory: directory, renameCommits: RenameCommits(needed: false) { 0 }, versions: nil)
        let small = UnsyncedPublishes.largestRecorded, budget = UnsyncedPublishes.recordedBytes
        XCTAssertTrue(unsynced.mayRecord(size: small, checksummed: false))
        XCTAssertFalse(unsynced.mayRecord(size: small + 1, checksummed: false), "its record would read all of it")
        XCTAssertTrue(unsynced.mayRecord(size: budget, checksummed: true))
        XCTAssertFalse(unsynced.mayRecord(size: budget + 1, checksummed: true), "the next mount would read too much")

        // A version waiting for its data counts against the budget until its record goes.
        let file = open(path + "/version", O_RDWR | O_CREAT, 0o600)
        XCTAssertGreaterThanOrEqual(file, 0)
        XCTAssertEqual(ftruncate(file, budget / 2), 0)
        XCTAssertEqual(linkat(directory, "version", directory, "record-version", 0), 0)
        var attributes = stat()
        XCTAssertEqual(fstat(file, &attributes), 0)
        unsynced.add(UnsyncedPublish(key: BackingKey(attributes), size: budget / 2, file: file,
                                     record: Array("record-version".utf8CString), previous: nil, versionPlace: nil))
        unsynced.finishAll()
        XCTAssertFalse(FileManager.default.fileExists(atPath: path + "/record-version"), "the record went")
        XCTAssertTrue(unsynced.mayRecord(size: budget, checksummed: true), "what was written no longer counts")
        XCTAssertFalse(unsynced.hasFailed)
    }
}
