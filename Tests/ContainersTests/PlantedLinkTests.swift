@testable import Containers
import Foundation
import Glibc
import XCTest

/// The store's owner owns everything in the store, and a daemon serving it may run as root: a
/// symbolic link the owner plants in the store's work directory or a container leads the daemon's
/// upkeep nowhere (docs/store-format.md, "Links in the store"). Each case points a link at a folder
/// outside the store and checks that nothing there was made, changed or removed.
final class PlantedLinkTests: XCTestCase {
    private var box: Sandbox!
    private var outside: String!

    override func setUpWithError() throws {
        box = try Sandbox(self)
        outside = box.root + "/outside"
        // What the daemon's upkeep removes or rewrites where it finds it: a dead daemon's shadow
        // directory (named by a pid) with a new file's mark, a dead daemon's record, an app's
        // record whose launcher is gone.
        try FileManager.default.createDirectory(atPath: outside + "/999999", withIntermediateDirectories: true)
        try box.write("999999/fresh-1", "not the store's", under: outside)
        try box.write("1.json", #"{"mountPoint":"/mnt","pid":1}"#, under: outside)
        try box.write("1.com.example.notes", "999999\n", under: outside)
    }

    private func assertOutsideUntouched(file: StaticString = #filePath, line: UInt = #line) {
        XCTAssertEqual(box.read(outside + "/999999/fresh-1"), "not the store's", file: file, line: line)
        XCTAssertEqual(box.read(outside + "/1.json"), #"{"mountPoint":"/mnt","pid":1}"#, file: file, line: line)
        XCTAssertEqual(box.read(outside + "/1.com.example.notes"), "999999\n", file: file, line: line)
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: outside).sorted(),
                       ["1.com.example.notes", "1.json", "999999"], file: file, line: line)
    }

    /// `name` in the store's work directory is a link to the folder outside.
    private func plant(_ name: String) throws {
        try? FileManager.default.removeItem(atPath: box.store.workPath + "/" + name)
        XCTAssertEqual(symlink(outside, box.store.workPath + "/" + name), 0)
    }

    /// The case that reached outside before: the last directory of each path was opened with
    /// O_NOFOLLOW already, but not `work` above it.
    func testALinkInPlaceOfTheWorkDirectory() throws {
        let work = box.root + "/elsewhere"
        for (name, text) in [("shadows/999999/x", "not the store's"), ("mounts/1.json", "{}")] {
            try FileManager.default.createDirectory(atPath: ((work + "/" + name) as NSString).deletingLastPathComponent,
                                                    withIntermediateDirectories: true)
            try box.write(name, text, under: work)
        }
        try FileManager.default.removeItem(atPath: box.store.workPath)
        XCTAssertEqual(symlink(work, box.store.workPath), 0)
        XCTAssertThrowsError(try ShadowDirectory.recoverLeft(in: box.store))
        XCTAssertThrowsError(try MountRegistry.active(in: box.store))
        XCTAssertThrowsError(try box.store.makeWorkDirectory("shadows"))
        XCTAssertEqual(box.read(work + "/shadows/999999/x"), "not the store's")
        XCTAssertEqual(box.read(work + "/mounts/1.json"), "{}")
    }

    func testALinkInPlaceOfTheShadowsDirectory() throws {
        try plant("shadows")
        XCTAssertThrowsError(try ShadowDirectory.left(in: box.store))
        XCTAssertThrowsError(try ShadowDirectory.recoverLeft(in: box.store))
        XCTAssertThrowsError(try box.store.makeWorkDirectory("shadows"))
        assertOutsideUntouched()
    }

    func testALinkInPlaceOfADeadDaemonsShadowDirectory() throws {
        let shadows = try box.store.makeWorkDirectory("shadows")
        XCTAssertEqual(symlink(outside + "/999999", shadows.path + "/999999"), 0)
        XCTAssertEqual(try ShadowDirectory.left(in: box.store), ["999999"])
        try ShadowDirectory.recoverLeft(in: box.store)
        XCTAssertEqual(try shadows.names(), [], "the link, no daemon's directory, goes")
        assertOutsideUntouched()
    }

    func testALinkInPlaceOfTheMountsRecords() throws {
        try plant("mounts")
        XCTAssertThrowsError(try MountRegistry.active(in: box.store))
        XCTAssertThrowsError(try MountRegistry.register(ActiveMount(mountPoint: "/mnt", app: nil, pid: 1), in: box.store))
        assertOutsideUntouched()
    }

    func testALinkInPlaceOfTheRunningAppsRecords() throws {
        try plant("running")
        XCTAssertThrowsError(try RunningApps.list(in: box.store))
        XCTAssertThrowsError(try RunningApps.recorded(in: box.store))
        XCTAssertThrowsError(try RunningApps.record(RunningApp(namespace: 2, app: "com.example.notes", launcher: 1), in: box.store))
        RunningApps.remove(RunningApp(namespace: 1, app: "com.example.notes", launcher: 999999), in: box.store)
        assertOutsideUntouched()
    }

    func testALinkInPlaceOfAContainersFixedDirectory() throws {
        try box.install()
        let library = box.container + "/Library"
        try FileManager.default.removeItem(atPath: library)
        XCTAssertEqual(symlink(outside, library), 0)
        XCTAssertThrowsError(try box.store.repairContainer(box.id))
        assertOutsideUntouched()
    }
}
