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
        let line = #"48 27 0:40 /com.example.notes/My\040Documents /srv/two\040words rw,nosuid,nodev shared:5 master:1 - fuse.containerfs /srv/store rw,user_id=0,group_id=0,default_permissions,allow_other"#
        let entry = try XCTUnwrap(MountTable.entry(line))
        XCTAssertEqual(entry.device, "0:40")
        XCTAssertEqual(entry.root, "/com.example.notes/My Documents")
        XCTAssertEqual(entry.mountPoint, "/srv/two words")
        XCTAssertEqual(entry.type, "fuse.containerfs")
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
