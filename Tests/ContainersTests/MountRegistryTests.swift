import Foundation
import XCTest
@testable import Containers

/// Which daemons serve a store, told by the records they hold locked (STORE/work/mounts).
final class MountRegistryTests: XCTestCase {
    /// A daemon locks its record before it writes it: a record found locked and still empty is read
    /// again until it holds the mount; one that never does is an error, never "no daemon".
    func testALockedRecordIsReadOnceWrittenAndNeverTakenForNone() throws {
        let box = try Sandbox(self)
        let directory = box.store.workPath + "/mounts"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let path = directory + "/4242.json"
        let record = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        XCTAssertGreaterThanOrEqual(record, 0)
        defer { close(record) }
        XCTAssertEqual(flock(record, LOCK_EX | LOCK_NB), 0)

        XCTAssertThrowsError(try MountRegistry.active(in: box.store)) { error in
            XCTAssertTrue("\(error)".contains("a running daemon's record cannot be read"), "\(error)")
        }

        let mount = ActiveMount(mountPoint: "/mnt/x", app: nil, pid: 4242)
        let data = try JSONEncoder().encode(mount)
        DispatchQueue.global().asyncAfter(deadline: .now() + 0.2) {
            _ = data.withUnsafeBytes { pwrite(record, $0.baseAddress, $0.count, 0) }
        }
        XCTAssertEqual(try MountRegistry.active(in: box.store), [mount])
    }

    /// A record nobody holds locked is a dead daemon's: removed, and not counted.
    func testAnUnlockedRecordIsADeadDaemonsAndGoes() throws {
        let box = try Sandbox(self)
        let directory = box.store.workPath + "/mounts"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try JSONEncoder().encode(ActiveMount(mountPoint: "/mnt/x", app: nil, pid: 4242)).write(to: URL(fileURLWithPath: directory + "/4242.json"))
        XCTAssertEqual(try MountRegistry.active(in: box.store), [])
        XCTAssertFalse(FileManager.default.fileExists(atPath: directory + "/4242.json"))
    }

    /// A daemon is refused while another serves a container it would show: the whole store
    /// overlaps every mount, an app alone only the same app. Refused, it leaves no record; asked
    /// to (`allow_overlap`), it registers beside the other.
    func testAMountOfContainersAnotherDaemonServesIsRefused() throws {
        let box = try Sandbox(self)
        let notes = try MountRegistry.register(ActiveMount(mountPoint: "/mnt/notes", app: "com.example.notes", pid: 4001), in: box.store)
        defer { close(notes) }
        let photos = try MountRegistry.register(ActiveMount(mountPoint: "/mnt/photos", app: "com.example.photos", pid: 4002), in: box.store)
        defer { close(photos) }
        for (mount, running) in [(ActiveMount(mountPoint: "/mnt/all", app: nil, pid: 4003), "com.example.notes is mounted alone at /mnt/notes"),
                                 (ActiveMount(mountPoint: "/mnt/again", app: "com.example.photos", pid: 4003, root: "Documents"),
                                  "com.example.photos is mounted alone at /mnt/photos")] {
            XCTAssertThrowsError(try MountRegistry.register(mount, in: box.store)) { error in
                XCTAssertTrue("\(error)".contains(running) && "\(error)".contains("allow_overlap"), "\(error)")
            }
        }
        XCTAssertEqual(Set(try MountRegistry.active(in: box.store).map(\.pid)), [4001, 4002], "no record of the refused")
        let overlapping = try MountRegistry.register(ActiveMount(mountPoint: "/mnt/all", app: nil, pid: 4003), in: box.store,
                                                     allowingOverlap: true)
        close(overlapping)

        XCTAssertTrue(ActiveMount(mountPoint: "/a", app: nil, pid: 1).overlaps(ActiveMount(mountPoint: "/b", app: "x.y", pid: 2)))
        XCTAssertTrue(ActiveMount(mountPoint: "/a", app: "x.y", pid: 1).overlaps(ActiveMount(mountPoint: "/b", app: nil, pid: 2)))
        XCTAssertFalse(ActiveMount(mountPoint: "/a", app: "x.y", pid: 1).overlaps(ActiveMount(mountPoint: "/b", app: "x.z", pid: 2)))
    }

    /// A daemon whose mount is gone is waited for while it says it is finishing, and registers
    /// once it ends; one that does not say so serves files of a lazily unmounted mount, and the
    /// mount is refused after a second, saying so.
    func testADaemonWithoutAMountIsWaitedForOnlyWhileItIsFinishing() throws {
        let box = try Sandbox(self)
        var running = ActiveMount(mountPoint: "/mnt/gone", app: nil, pid: 4001)
        let lease = try MountRegistry.register(running, in: box.store)
        let wanted = ActiveMount(mountPoint: "/mnt/new", app: "com.example.notes", pid: 4002)
        XCTAssertThrowsError(try MountRegistry.register(wanted, in: box.store, isMounted: { _ in false })) { error in
            XCTAssertTrue("\(error)".contains("the daemon (pid 4001) of the mount that was at /mnt/gone has not ended")
                          && "\(error)".contains("unmounted lazily"), "\(error)")
        }
        running.finishing = true
        try MountRegistry.update(lease, to: running, in: box.store)
        DispatchQueue.global().asyncAfter(deadline: .now() + 1.5) { close(lease) }
        let registered = try MountRegistry.register(wanted, in: box.store, isMounted: { _ in false })
        close(registered)
        XCTAssertEqual(try MountRegistry.active(in: box.store), [], "registered once the finishing daemon ended")
    }

    /// Where a running mount shows what another mount asks for: the refusal's bind mount.
    func testARunningMountSaysWhereItShowsAnotherMountsView() {
        let whole = ActiveMount(mountPoint: "/srv/apps", app: nil, pid: 1)
        let notes = ActiveMount(mountPoint: "/srv/notes", app: "x.notes", pid: 1)
        let notesDocuments = ActiveMount(mountPoint: "/srv/docs", app: "x.notes", pid: 1, root: "Documents")
        let want = { (app: String?, root: String?) in ActiveMount(mountPoint: "/mnt/b", app: app, pid: 2, root: root) }
        XCTAssertEqual(whole.place(of: want(nil, nil)), "/srv/apps")
        XCTAssertEqual(whole.place(of: want("x.notes", nil)), "/srv/apps/x.notes")
        XCTAssertEqual(whole.place(of: want("x.notes", "Documents/Old")), "/srv/apps/x.notes/Documents/Old")
        XCTAssertEqual(notes.place(of: want("x.notes", "Documents")), "/srv/notes/Documents")
        XCTAssertEqual(notesDocuments.place(of: want("x.notes", "Documents")), "/srv/docs")
        XCTAssertNil(notes.place(of: want(nil, nil)), "an app alone shows part of the store")
        XCTAssertNil(notesDocuments.place(of: want("x.notes", nil)), "a directory shows part of the container")
        XCTAssertNil(notesDocuments.place(of: want("x.notes", "Library")))
        XCTAssertNil(notes.place(of: want("x.photos", nil)))
        XCTAssertEqual(MountRegistry.shellWord("/srv/apps/x.notes"), "/srv/apps/x.notes")
        XCTAssertEqual(MountRegistry.shellWord("/mnt/my notes/it's"), "'/mnt/my notes/it'\\''s'")
    }
}
