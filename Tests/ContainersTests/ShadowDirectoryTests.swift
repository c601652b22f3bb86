import Containers
import Foundation
import Glibc
import XCTest

/// A dead daemon's shadow directory, removed by the next mount or `containerfs check`.
final class ShadowDirectoryTests: XCTestCase {
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
        XCTAssertThrowsError(try ShadowDirectory.remove(atPath: directory)) { error in
            XCTAssertEqual((error as? POSIXError)?.code, .EPERM, "\(error)")
        }
        XCTAssertTrue(FileManager.default.fileExists(atPath: directory + "/fresh-1"), "the mark stays for the next attempt")
        XCTAssertEqual(chattr("-i", directory + "/fresh-1"), 0)
        try ShadowDirectory.remove(atPath: directory)
        XCTAssertFalse(FileManager.default.fileExists(atPath: directory))
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
