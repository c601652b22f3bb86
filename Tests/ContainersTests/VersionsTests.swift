import Foundation
import XCTest
@testable import Containers

/// The versions store's layout, and which versions the limits let go, without a mount.
final class VersionsTests: XCTestCase {
    private func version(_ directory: String, _ seconds: Double, bytes: UInt64 = 4096) -> FileVersionRecord {
        FileVersionRecord(name: "v-\(UInt64(seconds * 1e9))", directory: directory, replacedAt: Date(timeIntervalSince1970: seconds),
                          modifiedAt: Date(timeIntervalSince1970: seconds), size: bytes, allocatedBytes: bytes)
    }

    func testAFilesVersionsAreKeptAtLeastTheSpacingApart() {
        XCTAssertEqual(VersionLimits().spacing, 1)
        let second: UInt64 = 1_000_000_000
        var spacing = VersionSpacing<String>(seconds: 1)
        XCTAssertTrue(spacing.admits("a", at: 10 * second))
        XCTAssertFalse(spacing.admits("a", at: 10 * second + second / 2), "within the spacing")
        XCTAssertTrue(spacing.admits("b", at: 10 * second + second / 2), "another file's")
        XCTAssertFalse(spacing.admits("a", at: 10 * second - second / 2), "decided late, just before the last")
        XCTAssertTrue(spacing.admits("a", at: 11 * second))
        XCTAssertFalse(spacing.admits("a", at: 11 * second + 1))
        var every = VersionSpacing<String>(seconds: 0)
        XCTAssertTrue(every.admits("a", at: second))
        XCTAssertTrue(every.admits("a", at: second), "0 keeps every version")
        XCTAssertEqual(VersionSpacing<String>(seconds: 1e30).interval, 365 * 86_400 * second, "a year at most")
        XCTAssertEqual(VersionSpacing<String>(seconds: .infinity).interval, 365 * 86_400 * second)
        XCTAssertEqual(VersionSpacing<String>(seconds: .nan).interval, 0)
        XCTAssertEqual(VersionSpacing<String>(seconds: -1).interval, 0)
    }

    func testTheSpacingLetsGoOfFilesWhoseLastKeepIsPast() {
        // Looked through when the files tracked reach twice those the last look kept (4,096 at first).
        var spacing = VersionSpacing<Int>(seconds: 1)
        for file in 0..<5000 { XCTAssertTrue(spacing.admits(file, at: UInt64(file))) }
        XCTAssertEqual(spacing.tracked, 5000, "all within the spacing: none let go")
        for file in 5000..<8200 { XCTAssertTrue(spacing.admits(file, at: 3_000_000_000)) }
        XCTAssertEqual(spacing.tracked, 3200, "the first 5,000 let go")
        XCTAssertTrue(spacing.admits(5, at: 3_000_000_001), "let go: kept again")
    }

    func testEachFileKeepsItsCountAndOldVersionsAgeOut() {
        var limits = VersionLimits()
        limits.count = 2
        limits.age = 100
        var retention = VersionRetention(limits: limits, existing: [version("a", 10), version("b", 500)])
        XCTAssertEqual(retention.kept(version("a", 520), now: Date(timeIntervalSince1970: 530)).versions.map(\.name), [version("a", 10).name])
        XCTAssertEqual(retention.kept(version("a", 540), now: Date(timeIntervalSince1970: 550)).versions.map(\.name), [])
        // A third of a's goes; b's is 101 s old by now, and b has no version left.
        let removal = retention.kept(version("a", 600), now: Date(timeIntervalSince1970: 601))
        XCTAssertEqual(Set(removal.versions.map(\.name)), [version("a", 520).name, version("b", 500).name])
        XCTAssertEqual(removal.emptiedDirectories, ["b"])
        XCTAssertEqual(retention.count, 2)
        var none = VersionLimits()
        none.count = 1
        var single = VersionRetention(limits: none, existing: [version("d", 1)])
        XCTAssertEqual(single.kept(version("d", 2), now: Date(timeIntervalSince1970: 3)).emptiedDirectories, [])
        XCTAssertEqual(single.freeSpace(needed: 1).emptiedDirectories, ["d"])
    }

    func testAFileRewrittenAllDayKeepsItsCountWhileOthersKeepTheirOrder() {
        var limits = VersionLimits()
        limits.count = 3
        limits.age = 1_000_000
        var retention = VersionRetention(limits: limits, existing: [version("b", 1), version("c", 2)])
        var removed: [String] = []
        for second in 0..<1_000 {
            let removal = retention.kept(version("a", 10 + Double(second)), now: Date(timeIntervalSince1970: 2_000))
            XCTAssertEqual(removal.emptiedDirectories, [])
            removed += removal.versions.map(\.name)
        }
        XCTAssertEqual(removed, (0..<997).map { version("a", 10 + Double($0)).name }, "a's oldest, one at a time")
        XCTAssertEqual(retention.count, 5)
        // Out of order (another queue's keep), and counted once when the store's listing has it already.
        XCTAssertEqual(retention.kept(version("b", 5), now: Date(timeIntervalSince1970: 2_000)).versions, [])
        XCTAssertEqual(retention.kept(version("b", 5), now: Date(timeIntervalSince1970: 2_000)).versions, [])
        XCTAssertEqual(retention.count, 6)
        // The store-wide order is by time, whatever a file's count took out of it before.
        let all = retention.freeSpace(needed: UInt64.max)
        XCTAssertEqual(all.versions.map(\.directory), ["b", "c", "b", "a", "a", "a"])
        XCTAssertEqual(Set(all.emptiedDirectories), ["a", "b", "c"])
        XCTAssertEqual(retention.count, 0)
        XCTAssertEqual(retention.totalBytes, 0)
    }

    func testTheVersionJustKeptIsCountedOnceWhenTheStoresVersionsAreLoadedWithIt() {
        // The first keep of a mount loads the store's versions after linking the new one in.
        var limits = VersionLimits()
        limits.count = 1
        var retention = VersionRetention(limits: limits, existing: [version("a", 10)])
        XCTAssertEqual(retention.kept(version("a", 10), now: Date(timeIntervalSince1970: 11)).versions.map(\.name), [],
                       "one version of a, within the limit of one")
        XCTAssertEqual(retention.count, 1)
        XCTAssertEqual(retention.kept(version("a", 12), now: Date(timeIntervalSince1970: 13)).versions.map(\.name),
                       [version("a", 10).name])
    }

    func testTheOldestGoWhenAllTogetherTakeTooMuchSpace() {
        var limits = VersionLimits()
        limits.space = 10_000
        var retention = VersionRetention(limits: limits, existing: [version("a", 1), version("b", 2)])
        XCTAssertEqual(retention.kept(version("c", 3), now: Date(timeIntervalSince1970: 4)).versions.map(\.name), [version("a", 1).name])
        // Room asked for, below the free-space floor: the oldest first, until it is gained.
        XCTAssertEqual(retention.freeSpace(needed: 5000).versions.map(\.name), [version("b", 2).name, version("c", 3).name])
        XCTAssertEqual(retention.count, 0)
        // Versions removed by someone else are forgotten, and free nothing twice.
        retention = VersionRetention(limits: limits, existing: [version("a", 1), version("b", 2)])
        retention.forget([version("a", 1)])
        XCTAssertEqual(retention.freeSpace(needed: 1).versions.map(\.name), [version("b", 2).name])
    }

    func testTheStoreListsAFilesVersionsOldestFirstAndTidiesUp() throws {
        let box = try Sandbox(self)
        let versions = VersionStore(store: box.store)
        let directory = try versions.prepare(container: "com.example.notes", path: "Documents/a b/note.txt").path
        XCTAssertEqual(directory, versions.directory(container: "com.example.notes", path: "Documents/a b/note.txt"))
        XCTAssertNotEqual(directory, versions.directory(container: "com.example.notes", path: "Documents/a b/other.txt"))
        XCTAssertEqual(box.read(directory + "/path"), "Documents/a b/note.txt\n")
        var attributes = stat()
        XCTAssertEqual(stat(versions.root, &attributes), 0)
        XCTAssertEqual(attributes.st_mode & 0o777, 0o700, "versions hold what their files held: the store's owner's only")
        // Nine and ten digits of seconds: by number, not by name.
        for (nanoseconds, text) in [(1_000_000_000_500_000_000 as UInt64, "second"), (999_999_999_000_000_000, "first")] {
            try box.write(VersionStore.withName(nanoseconds) { String(cString: $0) }, text, under: directory)
        }
        for nanoseconds in [0, 7, UInt64.max] {
            XCTAssertEqual(VersionStore.withName(nanoseconds) { String(cString: $0) }, "v-\(nanoseconds)")
        }
        let listed = VersionStore.versions(in: directory)
        XCTAssertEqual(listed.map { box.read($0.path) }, ["first", "second"])
        XCTAssertEqual(versions.allVersions().count, 2)
        for version in listed { try VersionStore.remove(version) }
        XCTAssertFalse(FileManager.default.fileExists(atPath: directory))
    }

    /// The store's owner owns the versions directories: a link planted among them is never
    /// followed, by the making, the listing, the opening or the removal of one.
    func testALinkPlantedAmongTheVersionsIsNeverFollowed() throws {
        let box = try Sandbox(self)
        let versions = VersionStore(store: box.store)
        let outside = box.root + "/outside"
        try FileManager.default.createDirectory(atPath: outside + "/key", withIntermediateDirectories: true)
        try box.write("key/v-1", "not the store's", under: outside)
        let kept = try versions.prepare(container: "com.example.notes", path: "Documents/kept.txt").path
        try box.write("v-2", "kept", under: kept)
        XCTAssertEqual(symlink(outside + "/key", versions.root + "/com.example.notes/planted"), 0)
        XCTAssertEqual(symlink(outside, versions.root + "/com.example.mail"), 0)
        XCTAssertThrowsError(try versions.prepare(container: "com.example.mail", path: "Documents/note.txt"))
        XCTAssertEqual(versions.allVersions().map(\.path), [kept + "/v-2"])
        XCTAssertThrowsError(try versions.open(versions.root + "/com.example.notes/planted"))
        XCTAssertThrowsError(try versions.open(versions.root + "/com.example.mail/key"))
        XCTAssertThrowsError(try versions.open(versions.root + "/com.example.notes/../com.example.mail"))
        XCTAssertEqual(try versions.open(kept).path, kept)
        try FileManager.default.removeItem(atPath: outside + "/key/v-1")
        versions.removeDirectory(versions.root + "/com.example.mail/key")
        versions.removeDirectory(versions.root + "/com.example.notes/planted")
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: outside), ["key"])
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: outside + "/key"), [])
    }
}
