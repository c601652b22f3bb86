@testable import Containers
import Foundation
import Glibc
import XCTest

/// A dead daemon's shadow directory, removed by the next mount or `containerfs check`.
final class ShadowDirectoryTests: XCTestCase {
    /// `ShadowDirectory.remove` of the directory at `path`.
    private func removeShadowDirectory(at path: String) throws {
        try ShadowDirectory.remove((path as NSString).lastPathComponent, in: DirectoryHandle(path: (path as NSString).deletingLastPathComponent))
    }

    func testADirectoryWhoseNewFileCannotBeEmptiedStaysAndSaysWhy() throws {
        try XCTSkipIf(geteuid() != 0, "needs root to make a file immutable")
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("shadows-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer {
            _ = chattr("-i", directory + "/fresh-1")
            try? FileManager.default.removeItem(atPath: directory)
        }
        // A new file the daemon was writing in place: its mark says its published version is empty.
        try Data("unpublished".utf8).write(to: URL(fileURLWithPath: directory + "/fresh-1"))
        try XCTSkipIf(chattr("+i", directory + "/fresh-1") != 0, "the filesystem has no immutable files (chattr +i failed)")
        XCTAssertThrowsError(try removeShadowDirectory(at: directory)) { error in
            XCTAssertEqual((error as? POSIXError)?.code, .EPERM, "\(error)")
        }
        XCTAssertTrue(FileManager.default.fileExists(atPath: directory + "/fresh-1"), "the mark stays for the next attempt")
        XCTAssertEqual(chattr("-i", directory + "/fresh-1"), 0)
        try removeShadowDirectory(at: directory)
        XCTAssertFalse(FileManager.default.fileExists(atPath: directory))
    }

    /// Records of publishes whose data a power cut may have lost (`PublishRecord`): a version that
    /// reads as its record says stays; one that does not goes back to its previous version, or to
    /// empty for a new file; a record whose previous version is the file itself was never swapped in.
    func testRecordsKeepWholeVersionsAndPutBackTheRest() throws {
        try withShadowDirectory { directory, documents in
            func recorded(_ content: String) throws -> PublishRecord { try self.recorded(content, in: directory) }
            // Each file in `documents`, its record a second link in `directory` as the daemon makes it.
            let cases: [(file: String, now: String, recordedAs: String, previous: String?, expected: String)] = [
                ("whole-new", "new file\n", "new file\n", nil, "new file\n"),
                ("torn-new", "new", "new file\n", nil, ""),
                ("whole-rewrite", "version 2\n", "version 2\n", "version 1\n", "version 2\n"),
                ("torn-rewrite", "", "version 2\n", "version 1\n", "version 1\n"),
                ("zeros-rewrite", "\0\0\0\0\0\0\0\0\0\0", "version 2\n", "version 1\n", "version 1\n"),
            ]
            for (index, item) in cases.enumerated() {
                let file = documents + "/" + item.file
                try write(item.now, to: file)
                let record = try recorded(item.recordedAs)
                XCTAssertEqual(PublishRecord.parse(name("fresh-\(index)", record))?.record, record, "a name gives its record back")
                if let previous = item.previous {
                    try write(previous, to: directory + "/shadow-\(index)")
                    XCTAssertEqual(link(file, directory + "/" + PublishRecord.replacedPrefix + name("shadow-\(index)", record)), 0)
                } else {
                    XCTAssertEqual(link(file, directory + "/" + name("fresh-\(index)", record)), 0)
                }
            }
            // Not swapped in: the previous version is the record's file itself, which stays as it is.
            try write("shadow never published", to: directory + "/shadow-9")
            XCTAssertEqual(link(directory + "/shadow-9", directory + "/" + PublishRecord.replacedPrefix
                                + name("shadow-9", PublishRecord(size: 1, checksum: 2))), 0)
            XCTAssertNil(PublishRecord.parse("fresh-3"), "a mark without a record")
            XCTAssertNil(PublishRecord.parse("shadow-3.zz.1"))

            try removeShadowDirectory(at: directory)
            for item in cases {
                XCTAssertEqual(read(documents + "/" + item.file), item.expected, item.file)
            }
            XCTAssertFalse(FileManager.default.fileExists(atPath: directory))
        }
    }

    /// A cut can leave two records in a row: an unsynced rewrite's, and the next rewrite's, whose
    /// previous version is the first one's file (its sync cut short). Neither reads as recorded:
    /// the first must be put back before the second copies it (the power-loss harness found a file
    /// read empty, twice in 100 cuts, when the directory listed the second first).
    func testChainedRecordsArePutBackOldestFirst() throws {
        XCTAssertEqual(ShadowDirectory.restoreOrder([1, 2, nil]), [2, 1, 0])
        XCTAssertEqual(ShadowDirectory.restoreOrder([nil, 0, 1]), [0, 1, 2])
        XCTAssertEqual(ShadowDirectory.restoreOrder([0, 2, 1]), [0, 2, 1], "itself, or a cycle, names none first")

        try withShadowDirectory { directory, documents in
            // Eight files, so that a listing's order puts every chain right by chance once in 256 runs.
            for chain in 0..<8 {
                let file = documents + "/file-\(chain)"
                // The second version, torn, is the previous version of the third (at `shadow-B`).
                let second = directory + "/shadow-\(chain)B"
                try write("\0\0\0\0\0\0", to: second)
                if chain % 2 == 0 {
                    // A rewrite of a synced first version.
                    try write("version 1 of \(chain)\n", to: directory + "/shadow-\(chain)A")
                    XCTAssertEqual(link(second, directory + "/" + PublishRecord.replacedPrefix
                                        + name("shadow-\(chain)A", try recorded("version 2 of \(chain)\n", in: directory))), 0)
                } else {
                    // A new file, not synced: its published version is the empty one.
                    XCTAssertEqual(link(second, directory + "/" + name("fresh-\(chain)", try recorded("version 2 of \(chain)\n", in: directory))), 0)
                }
                try write("", to: file)
                XCTAssertEqual(link(file, directory + "/" + PublishRecord.replacedPrefix
                                    + name("shadow-\(chain)B", try recorded("version 3 of \(chain)\n", in: directory))), 0)
            }
            try removeShadowDirectory(at: directory)
            for chain in 0..<8 {
                XCTAssertEqual(read(documents + "/file-\(chain)"), chain % 2 == 0 ? "version 1 of \(chain)\n" : "", "file-\(chain)")
            }
        }
    }

    /// Runs `body` with a new shadow directory and a directory for the files its records name,
    /// removed afterwards.
    private func withShadowDirectory(_ body: (_ directory: String, _ documents: String) throws -> Void) throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("shadows-\(UUID().uuidString)").path
        let documents = directory + "-documents"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: documents, withIntermediateDirectories: true)
        defer {
            try? FileManager.default.removeItem(atPath: directory)
            try? FileManager.default.removeItem(atPath: documents)
        }
        try body(directory, documents)
    }

    private func write(_ content: String, to path: String) throws { try Data(content.utf8).write(to: URL(fileURLWithPath: path)) }

    private func read(_ path: String) -> String? { FileManager.default.contents(atPath: path).map { String(decoding: $0, as: UTF8.self) } }

    /// The record of `content`, read from a scratch file in `directory`.
    private func recorded(_ content: String, in directory: String) throws -> PublishRecord {
        let path = directory + "/scratch"
        try write(content, to: path)
        let descriptor = open(path, O_RDONLY)
        defer { close(descriptor); unlink(path) }
        return try XCTUnwrap(PublishRecord.of(descriptor, size: UInt64(content.utf8.count)).0)
    }

    /// `base.SIZE.CRC`, as the daemon names a record.
    private func name(_ base: String, _ record: PublishRecord) -> String {
        String(decoding: record.name(after: Array(base.utf8CString)).dropLast().map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    private func chattr(_ flag: String, _ path: String) -> Int32 {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/chattr")
        process.arguments = [flag, path]
        process.standardError = FileHandle.nullDevice
        guard (try? process.run()) != nil else { return -1 }
        process.waitUntilExit()
        return process.terminationStatus
    }
}
