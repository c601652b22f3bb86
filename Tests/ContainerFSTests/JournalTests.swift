import Containers
import Foundation
import XCTest
@testable import ContainerFS

/// A store on a loop image of its own (the suite's other stores live wherever the temporary
/// directory is): ext4 with a journal or without, or another filesystem.
class LoopImageTestCase: MountedTestCase {
    /// Whether the image's filesystem syncs a file's names with the file (ext4: has a journal).
    var journaled: Bool { true }
    /// The command that makes the image's filesystem, the image's path appended.
    var makeFileSystem: String { journaled ? "mkfs.ext4 -q -F" : "mkfs.ext4 -q -F -O ^has_journal" }
    /// The mount command's further arguments.
    var mountArguments: [String] { [] }
    private var imageMount: URL?

    override func setUpWithError() throws {
        guard geteuid() == 0 else { throw XCTSkip("mounting a loop image needs root") }
        let tool = String(makeFileSystem.prefix { $0 != " " })
        guard Shell.run("command -v \(tool) && losetup -f").status == 0 else {
            throw XCTSkip("no \(tool) or no free loop device on this machine")
        }
        let work = FileManager.default.temporaryDirectory.appendingPathComponent("containerfs-image-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: work.appendingPathComponent("disk"), withIntermediateDirectories: true)
        let image = work.appendingPathComponent("image").path
        let made = Shell.run("truncate -s 320M \(image) && \(makeFileSystem) \(image) && mount -o loop \(image) \(work.path)/disk")
        guard made.status == 0 else {
            try? FileManager.default.removeItem(at: work)
            throw ContainerError("the image: \(made.error)")
        }
        imageMount = work.appendingPathComponent("disk")
        mounted = try MountedStore(extraArguments: mountArguments, base: imageMount)
        let store = open(mounted.store.root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        defer { close(store) }
        XCTAssertEqual(Backing.fileSyncCarriesNames(onFileSystemOf: store), journaled, "the image's journal")
    }

    /// Rewrites `path` (`O_TRUNC`) with the Python bytes `content` and fsyncs it before the close;
    /// the fsync's errno must be `expected`.
    func rewriteSynced(_ path: String, _ content: String, errno expected: Int32 = 0) {
        syscall("""
        f = os.open('\(path)', os.O_WRONLY | os.O_TRUNC)
        os.write(f, \(content))
        try:
            os.fsync(f)
        finally:
            os.close(f)
        """, errno: expected)
    }

    override func tearDown() {
        super.tearDown()
        if let imageMount {
            _ = Shell.run("umount \(imageMount.path)")
            try? FileManager.default.removeItem(at: imageMount.deletingLastPathComponent())
        }
    }
}

/// A store on ext4 with a journal, as most stores are: there a file's sync commits every change of
/// its names with it, and a rewrite's fsync swaps first and syncs once (docs/atomic-replace.md,
/// "Durability").
final class JournalTests: LoopImageTestCase {
    /// The rewrite's data, its record and its swap reach the disk in one journal commit: one sync.
    func testARewritesFsyncIsOneSync() throws {
        // A version kept first: the first one makes the file's versions directory, which is synced.
        sh("echo v0 > Documents/synced.txt; echo v1 > Documents/synced.txt")
        mounted.waitForUnsyncedPublishes()
        usleep(300_000)
        let syncs = try mounted.counting("fsync,fdatasync") {
            rewriteSynced("Documents/synced.txt", "b'v2\\n'")
        }
        XCTAssertEqual(syncs, 1, "the file's sync alone, after the swap")
        XCTAssertEqual(sh("cat Documents/synced.txt"), "v2\n")
        try mounted.remount()
        XCTAssertEqual(sh("cat Documents/synced.txt"), "v2\n")
    }

    /// A sync that fails after the swap (a disk failing) puts the previous version back: the
    /// writer hears the error, and the file reads as it did, there and after the next mount.
    func testARewriteWhoseSyncFailsGoesBackToThePreviousVersion() throws {
        sh("echo v1 > Documents/failed.txt")
        try write(to: "Documents/failed.txt", "v2\\n", flags: "os.O_WRONLY | os.O_TRUNC", whileFailing: "fsync")
        XCTAssertEqual(sh("cat Documents/failed.txt"), "v1\n")
        sh("echo v3 > Documents/failed.txt")
        XCTAssertEqual(sh("cat Documents/failed.txt"), "v3\n", "the next rewrite publishes")
        try mounted.remount()
        XCTAssertEqual(sh("cat Documents/failed.txt"), "v3\n")
    }

    /// Where the disk takes neither the sync nor the swap back, the file reads as written (as a
    /// local disk's does after a failed fsync) and its record stays: a daemon that stops before the
    /// data is written, with the data lost (the file cut short behind it, as a power cut leaves
    /// unwritten data), gets the previous version back at the next mount.
    func testARewriteWhoseSyncAndSwapBackFailKeepsItsRecordForTheNextMount() throws {
        sh("echo v1 > Documents/stuck.txt")
        try mounted.injecting([("fsync", "error=EIO"), ("renameat2", "error=EIO:when=2"), ("sync_file_range", "error=EIO")]) {
            rewriteSynced("Documents/stuck.txt", "b'v2\\n'", errno: EIO)
            XCTAssertEqual(sh("cat Documents/stuck.txt"), "v2\n")
            mounted.crashDaemon()
        }
        XCTAssertEqual(truncate(mounted.backing() + "/Documents/stuck.txt", 1), 0)
        try mounted.remount()
        XCTAssertEqual(sh("cat Documents/stuck.txt"), "v1\n")
    }
}

/// A store on ext4 without a journal, where nothing orders a file's writes and its names' changes
/// but the daemon's own syncs (docs/atomic-replace.md, "Durability").
final class NoJournalTests: LoopImageTestCase {
    override var journaled: Bool { false }

    /// A new file that cannot have a record (over 1 MiB, and changed after its writes filled it, so
    /// that they did not checksum it): its fsync syncs the data before its mark
    /// goes, since a cut that kept the mark's removal without the data would leave the file torn
    /// with nothing to tell the next mount so. The mark's directory and the name's are synced after.
    func testALargeNewFilesFsyncSyncsItsDataBeforeItsMarkGoes() throws {
        let calls = try mounted.calls("fsync,unlinkat") {
            syscall("""
            f = os.open('Documents/large.bin', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(f, os.urandom(3 << 20))
            os.pwrite(f, b'patched', 1000)
            os.fsync(f)
            os.close(f)
            """, errno: 0)
        }
        let unmark = try XCTUnwrap(calls.firstIndex { $0.contains("unlinkat(") && $0.contains("\"fresh-") }, "\(calls)")
        let syncs = calls.indices.filter { calls[$0].contains("fsync(") }
        XCTAssertEqual(syncs.count, 3, "the file, then the mark's directory and the name's: \(calls)")
        XCTAssertLessThan(try XCTUnwrap(syncs.first), unmark, "the file's sync comes first: \(calls)")
        XCTAssertEqual(syncs.filter { $0 > unmark }.count, 2, "both directories after the mark went: \(calls)")
        try mounted.remount()
        XCTAssertEqual(sh("stat -c %s Documents/large.bin"), "\(3 << 20)\n")
    }

    /// A large new file's fsync failing (a disk failing; here its writes checksummed it, and it has
    /// a record): the writer hears it, and the file is left empty, its previous version, there and
    /// after the next mount.
    func testALargeNewFileWhoseSyncFailsIsLeftEmpty() throws {
        try write(to: "Documents/failed.bin", bytes: "os.urandom(3 << 20)", flags: "os.O_WRONLY | os.O_CREAT | os.O_TRUNC",
                  whileFailing: "fsync")
        XCTAssertEqual(sh("stat -c %s Documents/failed.bin"), "0\n")
        try mounted.remount()
        XCTAssertEqual(sh("stat -c %s Documents/failed.bin"), "0\n")
    }
}

/// A store on btrfs, where written data does not order names (docs/atomic-replace.md, "btrfs").
final class BtrfsTests: LoopImageTestCase {
    override var journaled: Bool { false }
    override var makeFileSystem: String { "mkfs.btrfs -q -f" }

    /// A rewrite's fsync swaps the new version in from the shadow directory, then commits the
    /// filesystem: a sync of the file's directory alone left the swap out after a power cut (the
    /// harness's random cuts, once in some hundreds: an fsync'd version lost).
    func testADurableRewriteCommitsTheFilesystemAfterItsSwap() throws {
        sh("echo v1 > Documents/f.txt")
        let calls = try mounted.calls("renameat2,syncfs,fsync") {
            rewriteSynced("Documents/f.txt", "b'v2, synced'")
        }
        let swap = try XCTUnwrap(calls.lastIndex { $0.contains("renameat2(") && $0.contains("RENAME_EXCHANGE") }, "\(calls)")
        XCTAssertTrue(calls[swap...].contains { $0.contains("syncfs(") }, "a commit after the swap: \(calls)")
        try mounted.remount()
        XCTAssertEqual(sh("cat Documents/f.txt"), "v2, synced")
    }

    /// That commit failing (a disk failing) is the fsync's answer. The first rewrite's commit
    /// carries the renames made before, so the second one's fsync has only the commit after its swap.
    func testACommitAfterTheSwapThatFailsIsTheFsyncsError() throws {
        sh("echo v1 > Documents/f.txt")
        rewriteSynced("Documents/f.txt", "b'v2'")
        try mounted.failing("syncfs", with: "EIO") {
            rewriteSynced("Documents/f.txt", "b'v3'", errno: EIO)
        }
    }
}
