@testable import ContainerFS
import Containers
import Foundation
import XCTest

/// What a mount that shares a running daemon's may ask, and how the mount table is read, without a
/// mount (the bind mount itself: `MountCommandTests.testASecondMountOfWhatARunningDaemonShowsSharesIt`).
final class MountSharingTests: XCTestCase {
    private var directory = ""

    override func setUpWithError() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("containerfs-test-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    }

    override func tearDown() {
        try? FileManager.default.removeItem(atPath: directory)
    }

    func testALineOfTheMountTableWithOptionalFieldsAndEscapedPaths() throws {
        let line = #"48 27 0:40 /com.example.notes/My\040Documents /srv/two\040words rw,nosuid,nodev shared:5 master:1 - fuse.containerfs /srv/my\040st\303\266re rw,user_id=0,group_id=0,default_permissions,allow_other"#
        let entry = try XCTUnwrap(MountTable.entry(line))
        XCTAssertEqual(entry.device, "0:40")
        XCTAssertEqual(entry.root, "/com.example.notes/My Documents")
        XCTAssertEqual(entry.mountPoint, "/srv/two words")
        XCTAssertEqual(entry.type, "fuse.containerfs")
        XCTAssertEqual(entry.source, "/srv/my st\u{f6}re", "the name's UTF-8 bytes, escaped or not")
        XCTAssertEqual(entry.superOptions, ["rw", "user_id=0", "group_id=0", "default_permissions", "allow_other"])
        XCTAssertNil(MountTable.entry("48 27 0:40 / /srv rw"), "no separator: not a line of the table")
    }

    /// A mount shows a path of its filesystem when its root is the path or above it.
    func testWhereAMountShowsAPathOfItsFilesystem() throws {
        let whole = try XCTUnwrap(MountTable.entry("45 27 0:40 / /mnt/a rw - fuse.containerfs s rw"))
        let documents = try XCTUnwrap(MountTable.entry("46 27 0:40 /app/Documents /mnt/d rw - fuse.containerfs s rw"))
        XCTAssertEqual(whole.showing(""), "/mnt/a")
        XCTAssertEqual(whole.showing("/app/Documents"), "/mnt/a/app/Documents")
        XCTAssertEqual(documents.showing("/app/Documents"), "/mnt/d")
        XCTAssertEqual(documents.showing("/app/Documents/Projects"), "/mnt/d/Projects")
        XCTAssertNil(documents.showing("/app"), "above its root")
        XCTAssertNil(documents.showing("/app/Documents2"), "a sibling whose name starts alike")
    }

    /// What `containerfs run` finds through a daemon's mount or a bind mount of it: the app's
    /// container where it shows whole, and the store's top where it shows that too.
    func testWhereAMountOfADaemonShowsAnAppsContainer() throws {
        let app = try XCTUnwrap(AppID("com.example.notes")), other = try XCTUnwrap(AppID("com.example.photos"))
        let store = ActiveMount(mountPoint: "/mnt/a", app: nil, pid: 1)
        let alone = ActiveMount(mountPoint: "/mnt/n", app: app.rawValue, pid: 1)
        let documents = ActiveMount(mountPoint: "/mnt/d", app: app.rawValue, pid: 1, root: "Documents")
        func entry(_ root: String, _ point: String) throws -> MountTable.Entry {
            try XCTUnwrap(MountTable.entry("45 27 0:40 \(root) \(point) rw - fuse.containerfs s rw"))
        }
        let top = try entry("/", "/mnt/b"), container = try entry("/com.example.notes", "/mnt/c")
        let deeper = try entry("/com.example.notes/Documents", "/mnt/e")
        XCTAssertTrue(top.places(of: app, in: store)! == ("/mnt/b/com.example.notes", "/mnt/b"))
        XCTAssertTrue(container.places(of: app, in: store)! == ("/mnt/c", nil), "the app alone: no store")
        XCTAssertNil(container.places(of: other, in: store), "another app's")
        XCTAssertNil(deeper.places(of: app, in: store), "part of the container")
        XCTAssertTrue(top.places(of: app, in: alone)! == ("/mnt/b", nil))
        XCTAssertNil(top.places(of: other, in: alone))
        XCTAssertNil(top.places(of: app, in: documents), "a daemon of a directory of it")
    }

    /// Flags of its own go to the bind mount; options of the filesystem must be the running
    /// mount's; options of a daemon's own are refused, as is another type.
    func testWhatASharingMountMayAsk() throws {
        let store = try Store.openOrCreate(directory + "/store")
        let running = try XCTUnwrap(MountTable.entry("45 27 0:40 / /mnt/a rw - fuse.containerfs s rw,default_permissions,allow_other"))
        func flags(_ options: [String], configure: (inout MountConfiguration) -> Void = { _ in }) -> Result<UInt, MountSharing.Refusal> {
            var configuration = MountConfiguration(store: store, app: nil, mountPoint: directory + "/b")
            configuration.fuseOptions = options
            configure(&configuration)
            return MountSharing.flags(for: configuration, sharing: running)
        }
        XCTAssertEqual(flags([]), .success(0))
        XCTAssertEqual(flags(["ro,noatime", "allow_other", "fsname=notes"]), .success(UInt(MS_RDONLY) | UInt(MS_NOATIME)))
        XCTAssertEqual(flags(["allow_root"]), .failure(MountSharing.Refusal("the running mount has no allow_root")))
        XCTAssertEqual(flags(["max_read=4096"]), .failure(MountSharing.Refusal("-o max_read=4096 is an option of a daemon's own mount")))
        XCTAssertEqual(flags(["subtype="]), .failure(MountSharing.Refusal("the running mount's type is fuse.containerfs, not fuse")))
        XCTAssertEqual(flags([]) { $0.versionLimits.count = 3 }, .failure(MountSharing.Refusal("it asks for options of a daemon's own")))
        XCTAssertEqual(flags([]) { $0.passthrough = false }, .failure(MountSharing.Refusal("it asks for options of a daemon's own")))
    }

    /// A record written before records held the mount's device still reads.
    func testARecordWithoutADeviceReads() throws {
        let record = try JSONDecoder().decode(ActiveMount.self, from: Data(#"{"pid":12,"mountPoint":"/mnt/a","app":"com.example.notes"}"#.utf8))
        XCTAssertEqual(record, ActiveMount(mountPoint: "/mnt/a", app: "com.example.notes", pid: 12))
        XCTAssertNil(record.device)
    }
}
