import XCTest
import Glibc
@testable import Containers

final class PolicyTests: XCTestCase {
    func testZonesFollowFromNames() {
        XCTAssertEqual(Zone.mountRoot.child(named: "com.example.notes"), .containerRoot)
        XCTAssertEqual(Zone.containerRoot.child(named: "Notes.app"), .bundle)
        XCTAssertEqual(Zone.containerRoot.child(named: ".app"), .stray)
        XCTAssertEqual(Zone.containerRoot.child(named: "Documents"), .documents)
        XCTAssertEqual(Zone.containerRoot.child(named: "Library"), .library)
        XCTAssertEqual(Zone.containerRoot.child(named: "tmp"), .tmp)
        XCTAssertEqual(Zone.containerRoot.child(named: "junk"), .stray)
        XCTAssertEqual(Zone.documents.child(named: "Inbox"), .inbox)
        XCTAssertEqual(Zone.documents.child(named: "notes.txt"), .data)
        XCTAssertEqual(Zone.inbox.child(named: "a.pdf"), .inboxItem)
        XCTAssertEqual(Zone.inboxItem.child(named: "x"), .inboxItem)
        XCTAssertEqual(Zone.data.child(named: "Inbox"), .data)
        XCTAssertEqual(Zone.library.child(named: "Caches"), .caches)
        XCTAssertEqual(Zone.caches.child(named: "thumbs"), .cachesItem)
        XCTAssertEqual(Zone.library.child(named: "Preferences"), .libraryDirectory)
        XCTAssertEqual(Zone.library.child(named: "Application Support"), .libraryDirectory)
        XCTAssertEqual(Zone.library.child(named: "Saved"), .data)
        XCTAssertEqual(Zone.libraryDirectory.child(named: "db.sqlite"), .data)
        XCTAssertEqual(Policy.remove(.libraryDirectory), EACCES)
        XCTAssertEqual(Policy.remove(.caches), EACCES)
        XCTAssertTrue(Zone.cachesItem.writesInPlaceByDefault)
        XCTAssertFalse(Zone.data.writesInPlaceByDefault)
        XCTAssertEqual(Zone.tmp.child(named: "x"), .tmpItem)
        XCTAssertEqual(Zone.bundle.child(named: "Info.plist"), .bundle)
    }

    /// The kernel may remember a missing name only where names come through the mount alone.
    func testMissingNamesAreKeptWhereOnlyTheMountMakesNames() {
        func keeps(_ zone: Zone, _ name: String) -> Bool {
            Array(name.utf8).withUnsafeBytes { zone.keepsMissingName($0) }
        }
        for (zone, name) in [(Zone.documents, "notes.txt"), (.data, "Inbox"), (.library, "Saved"), (.libraryDirectory, "db"),
                             (.caches, "thumbs"), (.cachesItem, "x"), (.tmp, "x"), (.tmpItem, "x")] {
            XCTAssertTrue(keeps(zone, name), "\(zone) \(name)")
        }
        for (zone, name) in [(Zone.mountRoot, "com.example.new"), (.containerRoot, "Documents"), (.containerRoot, "junk"),
                             (.groupRoot, "shared.sqlite"), (.bundle, "Info.plist"), (.documents, "Inbox"),
                             (.inbox, "report.pdf"), (.inboxItem, "x"), (.library, "Caches"),
                             (.library, "Application Support"), (.stray, "x")] {
            XCTAssertFalse(keeps(zone, name), "\(zone) \(name)")
        }
    }

    func testAGroupContainerKeepsItsLibraryAndTakesFilesAtItsTop() {
        XCTAssertEqual(Zone.mountRoot.child(named: "group.com.example.shared"), .groupRoot)
        XCTAssertEqual(Zone.mountRoot.child(named: "group."), .containerRoot)
        XCTAssertEqual(Zone.groupRoot.child(named: "Library"), .library)
        XCTAssertEqual(Zone.groupRoot.child(named: "shared.sqlite"), .data)
        XCTAssertEqual(Zone.groupRoot.child(named: "tmp"), .data)
        XCTAssertEqual(Policy.create(in: .groupRoot), 0)
        XCTAssertEqual(Policy.remove(.groupRoot), EACCES)
        XCTAssertEqual(Policy.remove(.library), EACCES)
        XCTAssertEqual(Policy.changeMetadata(.groupRoot), EACCES)
        XCTAssertEqual(Policy.rename(.data, to: .data, in: .groupRoot, replacing: false), 0)
        XCTAssertEqual(Policy.rename(.library, to: .data, in: .groupRoot, replacing: false), EACCES)
        XCTAssertEqual(Policy.rename(.data, to: .library, in: .groupRoot, replacing: true), EACCES)
        XCTAssertEqual(Policy.visibleMode(0o040755, of: .groupRoot, isDirectory: true), 0o040755)
        XCTAssertTrue(AppID("group.com.example.shared")!.isGroup)
        XCTAssertFalse(AppID("group.")!.isGroup)
        XCTAssertFalse(AppID("com.example.group")!.isGroup)
    }

    func testPolicyTable() {
        XCTAssertEqual(Policy.create(in: .mountRoot), EACCES)
        XCTAssertEqual(Policy.create(in: .containerRoot), EACCES)
        XCTAssertEqual(Policy.create(in: .bundle), EROFS)
        XCTAssertEqual(Policy.create(in: .inbox), EACCES)
        XCTAssertEqual(Policy.create(in: .inboxItem), EACCES)
        XCTAssertEqual(Policy.create(in: .tmp), 0)
        XCTAssertEqual(Policy.create(in: .data), 0)
        XCTAssertEqual(Policy.remove(.inboxItem), 0)
        XCTAssertEqual(Policy.remove(.inbox), EACCES)
        XCTAssertEqual(Policy.remove(.documents), EACCES)
        XCTAssertEqual(Policy.remove(.bundle), EROFS)
        XCTAssertEqual(Policy.write(.inboxItem), EACCES)
        XCTAssertEqual(Policy.write(.bundle), EROFS)
        XCTAssertEqual(Policy.changeMetadata(.inboxItem), EACCES)
        XCTAssertEqual(Policy.changeMetadata(.data), 0)
    }

    func testRenames() {
        // Out of the Inbox: allowed; into or within it: EACCES.
        XCTAssertEqual(Policy.rename(.inboxItem, to: .data, in: .documents, replacing: false), 0)
        XCTAssertEqual(Policy.rename(.data, to: .inboxItem, in: .inbox, replacing: false), EACCES)
        XCTAssertEqual(Policy.rename(.inboxItem, to: .inboxItem, in: .inbox, replacing: false), EACCES)
        // tmp is a volume of its own.
        XCTAssertEqual(Policy.rename(.tmpItem, to: .tmpItem, in: .tmp, replacing: true), 0)
        XCTAssertEqual(Policy.rename(.tmpItem, to: .data, in: .documents, replacing: false), EXDEV)
        XCTAssertEqual(Policy.rename(.data, to: .tmpItem, in: .tmp, replacing: false), EXDEV)
        // The bundle is read-only in both directions.
        XCTAssertEqual(Policy.rename(.bundle, to: .data, in: .documents, replacing: false), EROFS)
        XCTAssertEqual(Policy.rename(.data, to: .bundle, in: .bundle, replacing: false), EROFS)
        XCTAssertEqual(Policy.rename(.data, to: .data, in: .data, replacing: true), 0)
    }

    func testLinksNeverMakeReadOnlyItemsWritable() {
        XCTAssertEqual(Policy.link(.bundle, into: .documents), EROFS)
        XCTAssertEqual(Policy.link(.inboxItem, into: .documents), EACCES)
        XCTAssertEqual(Policy.link(.data, into: .tmp), EXDEV)
        XCTAssertEqual(Policy.link(.data, into: .data), 0)
        XCTAssertEqual(Policy.link(.data, into: .inbox), EACCES)
    }

    func testVisibleModeMatchesPolicy() {
        XCTAssertEqual(Policy.visibleMode(0o100644, of: .bundle, isDirectory: false), 0o100444)
        XCTAssertEqual(Policy.visibleMode(0o100644, of: .inboxItem, isDirectory: false), 0o100444)
        XCTAssertEqual(Policy.visibleMode(0o040755, of: .inboxItem, isDirectory: true), 0o040755)
        XCTAssertEqual(Policy.visibleMode(0o100644, of: .data, isDirectory: false), 0o100644)
        XCTAssertEqual(Policy.visibleMode(0o040755, of: .containerRoot, isDirectory: true), 0o040555)
    }

    func testAppIDs() {
        XCTAssertNotNil(AppID("com.example.notes"))
        XCTAssertNil(AppID(""))
        XCTAssertNil(AppID(".hidden"))
        XCTAssertNil(AppID("a/b"))
        XCTAssertNil(AppID(".."))
        XCTAssertNil(AppID(String(repeating: "a", count: 256)))
    }
}
