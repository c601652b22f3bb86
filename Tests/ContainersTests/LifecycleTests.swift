import Foundation
import XCTest
@testable import Containers

final class LifecycleTests: XCTestCase {
    func testClashFreeNamesFollowIOS() {
        XCTAssertEqual(Inbox.clashFreeName("report.pdf", attempt: 0), "report.pdf")
        XCTAssertEqual(Inbox.clashFreeName("report.pdf", attempt: 1), "report-1.pdf")
        XCTAssertEqual(Inbox.clashFreeName("report.pdf", attempt: 2), "report-2.pdf")
        XCTAssertEqual(Inbox.clashFreeName("README", attempt: 1), "README-1")
        XCTAssertEqual(Inbox.clashFreeName(".profile", attempt: 1), ".profile-1")
        XCTAssertEqual(Inbox.clashFreeName("data.tar.gz", attempt: 3), "data.tar-3.gz")
        XCTAssertEqual(Inbox.clashFreeName("odd.", attempt: 1), "odd.-1")
    }

    func testAGroupsContainerIsMadeWithItsFirstAppAndGoesWithItsLast() throws {
        let box = try Sandbox(self)
        let group = AppID("group.com.example.shared")!
        let bundle = try box.makeBundle()
        try Installer.install(bundle: bundle, into: box.store, id: box.id, groups: [group])
        let shared = box.store.containerPath(group)
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: shared), ["Library"])
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: shared + "/Library").sorted(),
                       ["Application Support", "Caches", "Preferences"])
        try box.write("shared.txt", "kept", under: shared)
        let other = AppID("com.example.photos")!
        try Installer.install(bundle: bundle, into: box.store, id: other, groups: [group])
        // A reinstall without groups keeps them; a group's apps are its members.
        try Installer.install(bundle: bundle, into: box.store, id: box.id)
        XCTAssertEqual(try box.store.record(box.id).groupIDs, [group])
        XCTAssertEqual(try box.store.members(of: group).map(\.id), [box.id.rawValue, other.rawValue])
        XCTAssertEqual(try box.store.groups(), [group])
        XCTAssertTrue(StoreCheck.problems(in: box.store).isEmpty, "\(StoreCheck.problems(in: box.store))")

        try Lifecycle.uninstall(store: box.store, id: other)
        XCTAssertEqual(box.read(shared + "/shared.txt"), "kept")
        try Lifecycle.uninstall(store: box.store, id: box.id)
        XCTAssertFalse(FileManager.default.fileExists(atPath: shared))
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: box.store.workPath), [])
    }

    func testGroupIdentifiersAreNotAppsAndAGroupIsNotUninstalledAlone() throws {
        let box = try Sandbox(self)
        let bundle = try box.makeBundle()
        XCTAssertThrowsError(try Installer.install(bundle: bundle, into: box.store, id: AppID("group.notes")!)) {
            XCTAssertTrue("\($0)".contains("name app groups"), "\($0)")
        }
        XCTAssertThrowsError(try Installer.install(bundle: bundle, into: box.store, id: box.id, groups: [AppID("com.example.shared")!])) {
            XCTAssertTrue("\($0)".contains("start with group."), "\($0)")
        }
        XCTAssertFalse(box.store.isInstalled(box.id))
        let group = AppID("group.com.example.shared")!
        try Installer.install(bundle: bundle, into: box.store, id: box.id, groups: [group])
        XCTAssertThrowsError(try Lifecycle.uninstall(store: box.store, id: group)) {
            XCTAssertTrue("\($0)".contains("removed with the last of its apps (\(box.id))"), "\($0)")
        }
        // A group container no app belongs to is reported, never removed by a repair.
        try FileManager.default.createDirectory(atPath: box.store.containerPath(AppID("group.orphan")!), withIntermediateDirectories: true)
        let problems = StoreCheck.problems(in: box.store).map(\.description)
        XCTAssertTrue(problems.contains { $0.hasPrefix("containers/group.orphan: a group container that no installed app belongs to") }, "\(problems)")
    }

    func testDeliveringTheSameNameThreeTimes() throws {
        let box = try Sandbox(self)
        try box.install()
        for version in 1...3 {
            try box.write("outside/report.pdf", "version \(version)", under: box.root)
            let delivered = try Inbox.deliver([box.root + "/outside/report.pdf"], to: box.id, in: box.store)
            XCTAssertEqual(delivered.map(\.name), [["report.pdf", "report-1.pdf", "report-2.pdf"][version - 1]])
        }
        let inbox = box.store.inboxPath(box.id)
        XCTAssertEqual(box.read(inbox + "/report.pdf"), "version 1")
        XCTAssertEqual(box.read(inbox + "/report-1.pdf"), "version 2")
        XCTAssertEqual(box.read(inbox + "/report-2.pdf"), "version 3")
        // The source stays where it was, and no scratch is left behind.
        XCTAssertEqual(box.read(box.root + "/outside/report.pdf"), "version 3")
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: box.store.workPath), [])
    }

    func testDeliveringANameWithoutExtensionAndAPackage() throws {
        let box = try Sandbox(self)
        try box.install()
        try box.write("a/NOTES", "one", under: box.root)
        try box.write("b/NOTES", "two", under: box.root)
        try box.write("Trip.pages/Index.xml", "<doc/>", under: box.root)
        let delivered = try Inbox.deliver([box.root + "/a/NOTES", box.root + "/b/NOTES", box.root + "/Trip.pages"],
                                          to: box.id, in: box.store)
        XCTAssertEqual(delivered.map(\.containerPath), ["Documents/Inbox/NOTES", "Documents/Inbox/NOTES-1", "Documents/Inbox/Trip.pages"])
        XCTAssertEqual(box.read(box.store.inboxPath(box.id) + "/NOTES-1"), "two")
        XCTAssertEqual(box.read(box.store.inboxPath(box.id) + "/Trip.pages/Index.xml"), "<doc/>")
    }

    func testConcurrentDeliveriesNeverOverwrite() throws {
        let box = try Sandbox(self)
        try box.install()
        for index in 0..<8 { try box.write("src\(index)/scan.jpg", "scan \(index)", under: box.root) }
        let store = box.store, id = box.id, root = box.root
        DispatchQueue.concurrentPerform(iterations: 8) { index in
            do { try Inbox.deliver([root + "/src\(index)/scan.jpg"], to: id, in: store) } catch { XCTFail("\(error)") }
        }
        let inbox = box.store.inboxPath(box.id)
        let names = try FileManager.default.contentsOfDirectory(atPath: inbox).sorted()
        XCTAssertEqual(names, ["scan-1.jpg", "scan-2.jpg", "scan-3.jpg", "scan-4.jpg", "scan-5.jpg", "scan-6.jpg", "scan-7.jpg", "scan.jpg"])
        XCTAssertEqual(Set(names.compactMap { box.read(inbox + "/" + $0) }), Set((0..<8).map { "scan \($0)" }))
    }

    func testDeliveringAMissingFileOrToAMissingAppExplains() throws {
        let box = try Sandbox(self)
        try box.install()
        XCTAssertThrowsError(try Inbox.deliver([box.root + "/nope.txt"], to: box.id, in: box.store)) { error in
            XCTAssertTrue("\(error)".contains("nope.txt: No such file or directory"), "\(error)")
        }
        XCTAssertThrowsError(try Inbox.deliver([box.root], to: AppID("com.example.none")!, in: box.store)) { error in
            XCTAssertTrue("\(error)".contains("No app com.example.none"), "\(error)")
        }
    }

    func testEmptyTmpRemovesEverythingButTmpItself() throws {
        let box = try Sandbox(self)
        try box.install()
        let tmp = box.store.tmpPath(box.id)
        try box.write("deep/er/file", "x", under: tmp)
        try box.write("top", "y", under: tmp)
        XCTAssertEqual(chmod(tmp + "/deep/er", 0o500), 0)
        XCTAssertEqual(symlink(box.root + "/outside-target", tmp + "/link"), 0)
        try box.write("outside-target", "keep me", under: box.root)

        try Lifecycle.emptyTmp(store: box.store, id: box.id)
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: tmp), [])
        XCTAssertEqual(box.read(box.root + "/outside-target"), "keep me")

        try FileTree.remove(tmp)
        try Lifecycle.emptyTmp(store: box.store, id: box.id)
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: tmp), [])
    }

    func testUninstallRemovesContainerAndRecord() throws {
        let box = try Sandbox(self)
        try box.install()
        XCTAssertEqual(chmod(box.bundle + "/Resources", 0o555), 0)
        XCTAssertThrowsError(try Lifecycle.uninstall(store: box.store, id: box.id, mountCheck: { _, id in
            throw ContainerError("\(id) is mounted")
        }))
        XCTAssertTrue(box.store.isInstalled(box.id))

        try Lifecycle.uninstall(store: box.store, id: box.id)
        XCTAssertFalse(box.store.isInstalled(box.id))
        XCTAssertFalse(FileManager.default.fileExists(atPath: box.container))
        XCTAssertEqual(try box.store.apps(), [])
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: box.store.workPath), [])
        XCTAssertThrowsError(try Lifecycle.uninstall(store: box.store, id: box.id))
    }

    func testClearWorkRemovesLeftoverScratch() throws {
        let box = try Sandbox(self)
        try box.write("install-x-1-2/Notes.app/Info.plist", "left by a crash", under: box.store.workPath)
        try box.write("deliver-1-2", "half a copy", under: box.store.workPath)
        try Lifecycle.clearWork(store: box.store)
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: box.store.workPath), [])
    }
}
