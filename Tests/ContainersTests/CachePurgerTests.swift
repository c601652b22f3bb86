import Foundation
import XCTest
@testable import Containers

final class CachePurgerTests: XCTestCase {
    /// Caches of 4 KiB files whose last use is `age` days ago.
    private func makeCaches(_ box: Sandbox, _ ages: [String: Int]) throws {
        let caches = box.store.cachesPath(box.id)
        let now = time(nil)
        for (name, age) in ages {
            try box.write(name, String(repeating: "c", count: 4096), under: caches)
            let when = timespec(tv_sec: now - age * 86_400, tv_nsec: 0)
            var times = [when, when]
            XCTAssertEqual(utimensat(AT_FDCWD, caches + "/" + name, &times, 0), 0)
        }
    }

    func testPurgeRemovesOldestFirstUntilTargetAndSkipsOpenFiles() throws {
        let box = try Sandbox(self)
        try box.install()
        try makeCaches(box, ["thumbs/a.jpg": 30, "thumbs/b.jpg": 20, "feed.json": 10, "open.db": 40, "fresh.json": 1])
        let caches = box.store.cachesPath(box.id)
        // A disk that starts full and gains 4 KiB per removed file; the target is 3 files' worth.
        let filesAtStart = 5
        let purger = CachePurger(store: box.store, isOpen: { $0.hasSuffix("/open.db") }, freeSpace: { _ in
            let remaining = try FileManager.default.subpathsOfDirectory(atPath: caches).filter { $0 != "thumbs" }.count
            return UInt64(filesAtStart - remaining) * 4096
        })
        XCTAssertEqual(try purger.cachedFiles().map { ($0.path as NSString).lastPathComponent },
                       ["open.db", "a.jpg", "b.jpg", "feed.json", "fresh.json"])

        let report = try purger.purge(targetFreeBytes: 3 * 4096)
        XCTAssertEqual(report.removed.map { ($0.path as NSString).lastPathComponent }, ["a.jpg", "b.jpg", "feed.json"])
        XCTAssertEqual(report.skippedOpen.map { ($0.path as NSString).lastPathComponent }, ["open.db"])
        XCTAssertTrue(report.reachedTarget)
        XCTAssertGreaterThanOrEqual(report.freedBytes, 3 * 4096)
        XCTAssertTrue(FileManager.default.fileExists(atPath: caches + "/open.db"))
        XCTAssertTrue(FileManager.default.fileExists(atPath: caches + "/fresh.json"))
        XCTAssertTrue(FileManager.default.fileExists(atPath: caches + "/thumbs"), "directories stay")
    }

    func testPurgeWithoutTargetRemovesAllButOpenAndReportsUnreachableTarget() throws {
        let box = try Sandbox(self)
        try box.install()
        try makeCaches(box, ["x": 3, "y": 2, "z": 1])
        let everything = try CachePurger(store: box.store, isOpen: { $0.hasSuffix("/y") }).purge()
        XCTAssertEqual(everything.removed.count, 2)
        XCTAssertEqual(everything.skippedOpen.count, 1)

        let impossible = try CachePurger(store: box.store, isOpen: { _ in false }, freeSpace: { _ in 0 })
            .purge(targetFreeBytes: 1 << 40)
        XCTAssertFalse(impossible.reachedTarget)
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: box.store.cachesPath(box.id)), [])
    }

    func testFreeSpaceAndOpenFileTable() throws {
        let box = try Sandbox(self)
        XCTAssertGreaterThan(try FreeSpace.available(at: box.store.root), 0)
        XCTAssertFalse(try FreeSpace.isLow(at: box.store.root, threshold: 0))
        XCTAssertTrue(try FreeSpace.isLow(at: box.store.root, threshold: .max))

        try box.write("held", "x", under: box.root)
        try box.write("idle", "x", under: box.root)
        let fd = open(box.root + "/held", O_RDONLY)
        defer { close(fd) }
        let table = OpenFileTable.snapshot()
        XCTAssertTrue(table.contains(path: box.root + "/held"))
        XCTAssertFalse(table.contains(path: box.root + "/idle"))
    }
}
