@testable import ContainerFS
import Coordination
import Foundation
import Glibc
import XCTest

/// Which closes may publish without waiting for their data, without a mount
/// (docs/atomic-replace.md, "Closes without a sync").
final class UnsyncedPublishesTests: XCTestCase {
    /// Runs `body` with a new directory's path and a descriptor open on it, removed afterwards.
    private func withDirectory(_ body: (String, Int32) throws -> Void) throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("unsynced-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: path) }
        let directory = open(path, O_RDONLY | O_DIRECTORY)
        XCTAssertGreaterThanOrEqual(directory, 0)
        defer { close(directory) }
        try body(path, directory)
    }

    /// A new file `name` in `path`, written with `content`, its mark renamed to a record of its
    /// size (`NAME.SIZE.0`) as a publish leaves it: its descriptor and key.
    private func recordedFile(_ name: String, _ content: String, in path: String) -> (file: Int32, key: BackingKey) {
        let file = open(path + "/" + name, O_RDWR | O_CREAT, 0o600)
        XCTAssertGreaterThanOrEqual(file, 0)
        XCTAssertEqual(write(file, content, content.utf8.count), content.utf8.count)
        XCTAssertEqual(rename(path + "/" + name, path + "/\(name).\(content.utf8.count).0"), 0)
        var attributes = stat()
        XCTAssertEqual(fstat(file, &attributes), 0)
        return (file, BackingKey(attributes))
    }

    func testLargeFilesAreRecordedOnlyWhenTheirWritesChecksummedThemAndWithinTheBudget() throws {
        try withDirectory { path, directory in
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

    /// A rename may give a version waiting for its data a previous version (`Shadows.renameUnwritten`),
    /// until the data is written: what the background removes then is what the names say by then.
    func testNamesChangeOnlyUntilTheDataIsWrittenAndTheBackgroundRemovesThoseNames() throws {
        try withDirectory { path, directory in
            let file = open(path + "/fresh-1", O_RDWR | O_CREAT, 0o600)
            XCTAssertGreaterThanOrEqual(file, 0)
            XCTAssertEqual(write(file, "new", 3), 3)
            XCTAssertEqual(close(open(path + "/previous", O_RDWR | O_CREAT, 0o600)), 0)
            var attributes = stat()
            XCTAssertEqual(fstat(file, &attributes), 0)
            let publish = UnsyncedPublish(key: BackingKey(attributes), size: 3, file: file, record: Array("fresh-1.3.0".utf8CString),
                                          previous: nil, versionPlace: nil)
            XCTAssertEqual(rename(path + "/fresh-1", path + "/fresh-1.3.0"), 0)
            let renamed: Bool? = publish.withNamesIfUnwritten { names in
                XCTAssertEqual(rename(path + "/fresh-1.3.0", path + "/record-previous.3.0"), 0)
                names.record = Array("record-previous.3.0".utf8CString)
                names.previous = Array("previous".utf8CString)
                return true
            }
            XCTAssertEqual(renamed, true)
            XCTAssertNil(publish.withNamesIfUnwritten { _ in true }, "it has a previous version now")

            let unsynced = UnsyncedPublishes(directory: directory, renameCommits: RenameCommits(needed: false) { 0 }, versions: nil)
            let removed = Locked<[String]>([])
            unsynced.removePrevious = { name in removed.withLock { $0.append(String(cString: name)) } }
            unsynced.add(publish)
            unsynced.finishAll()
            XCTAssertFalse(FileManager.default.fileExists(atPath: path + "/record-previous.3.0"), "the record it was given went")
            XCTAssertEqual(removed.withLock { $0 }, ["previous"], "then its previous version")
            XCTAssertNil(publish.withNamesIfUnwritten { _ in true }, "the data is written")
        }
    }

    /// A loop's closes are written as one batch, once it has gathered (`gathering`): their records
    /// wait until then, and one sync of the filesystem lets them all go.
    func testABatchGathersAndOneSyncWritesIt() throws {
        try withDirectory { path, directory in
            let unsynced = UnsyncedPublishes(directory: directory, renameCommits: RenameCommits(needed: false) { 0 },
                                             versions: nil, gathering: .seconds(3600))
            let count = UnsyncedPublishes.syncedTogether + 2
            for index in 0..<count {
                let (file, key) = recordedFile("fresh-\(index)", "data", in: path)
                unsynced.linked(key)
                unsynced.add(UnsyncedPublish(key: key, size: 4, file: file,
                                             record: Array("fresh-\(index).4.0".utf8CString), previous: nil, versionPlace: nil))
            }
            let records = { (try? FileManager.default.contentsOfDirectory(atPath: path))?.filter { $0.contains(".4.0") }.count ?? -1 }
            XCTAssertEqual(records(), count, "the batch is still gathering")
            unsynced.finishAll()
            XCTAssertEqual(records(), 0, "written together, every record went")
            XCTAssertFalse(unsynced.hasFailed)
        }
    }

    /// A version its own fsync wrote (`synced`) takes no previous version from a rename, and a
    /// rename or link (`waitForWrite`) leaves its record to the background, where a change in place
    /// (`waitForData`) removes it first.
    func testASyncedVersionIsWrittenAndOnlyAChangeInPlaceTakesItsRecordAway() throws {
        try withDirectory { path, directory in
            let unsynced = UnsyncedPublishes(directory: directory, renameCommits: RenameCommits(needed: false) { 0 },
                                             versions: nil, gathering: .seconds(3600))
            let (file, key) = recordedFile("fresh-1", "new", in: path)
            unsynced.linked(key)
            let publish = UnsyncedPublish(key: key, size: 3, file: file, record: Array("fresh-1.3.0".utf8CString),
                                          previous: nil, versionPlace: nil, synced: true)
            XCTAssertEqual(fcntl(file, F_GETFD), -1, "the publish closed the file it no longer writes")
            XCTAssertEqual(publish.written, 0)
            XCTAssertNil(publish.withNamesIfUnwritten { _ in true }, "a rename gives it no previous version")
            unsynced.add(publish)

            XCTAssertEqual(unsynced.waitForWrite(of: key), 0)
            XCTAssertTrue(FileManager.default.fileExists(atPath: path + "/fresh-1.3.0"), "a rename leaves the record")
            XCTAssertTrue(unsynced.hasLink(key))
            XCTAssertEqual(unsynced.waitForData(of: key), 0)
            XCTAssertFalse(FileManager.default.fileExists(atPath: path + "/fresh-1.3.0"), "a change in place waits for its removal")
            XCTAssertFalse(unsynced.hasLink(key))
            XCTAssertFalse(unsynced.hasFailed)
        }
    }
}
