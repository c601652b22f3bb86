import Containers
@testable import ContainerFS
import Foundation
import Glibc
import XCTest

/// A write-only change of a large file, on a store that cannot reflink, goes through a redo log
/// applied in place (docs/atomic-replace.md, "Large files"). The mount calls 1 MiB large here.
final class LargeFileTests: MountedTestCase {
    override func setUpWithError() throws {
        mounted = try MountedStore(extraArguments: ["-o", "large_file=1M"])
        // Where the store's filesystem reflinks, a copy costs nothing and no log is kept.
        let probe = mounted.root.appendingPathComponent("reflink-probe").path
        let reflinks = Shell.run("head -c 4096 /dev/urandom > \(probe) && cp --reflink=always \(probe) \(probe).2", in: mounted.root.path)
        if reflinks.status == 0 {
            throw XCTSkip("the store's filesystem reflinks files: a rewrite reflinks its shadow and keeps no log")
        }
    }

    private func backingInode(_ path: String) -> String {
        (Shell.run("stat -c %i \(Shell.quote(mounted.backing() + "/" + path))").output)
    }

    /// Makes Documents/large and waits until its writer's session has ended: the kernel releases a
    /// closed file after close(2) returns, and a writer coming first would join that session.
    private func makeLargeFile() {
        sh("cd Documents && " + makeLarge)
        settle()
    }

    /// Unmounts and waits for the daemon to finish (a clean unmount applies what it must).
    private func unmountCleanly() {
        XCTAssertEqual(Shell.run("fusermount3 -u \(Shell.quote(mounted.mountPoint))").status, 0)
        let stopped = Date().addingTimeInterval(10)
        while mounted.daemonIsRunning, Date() < stopped { usleep(20_000) }
        XCTAssertFalse(mounted.daemonIsRunning, "the daemon did not exit after the unmount")
    }

    private func settle() {
        let deadline = Date().addingTimeInterval(5)
        while Shell.run("\(Shell.quote(MountedStore.executable)) status \(Shell.quote(mounted.mountPoint))").output
            .contains("Documents/large"), Date() < deadline { usleep(10_000) }
    }

    /// A file of 3 MiB with a hole in its middle.
    private let makeLarge = """
    python3 - <<'EOF'
    import os
    f = os.open("large", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.pwrite(f, bytes(range(256)) * 4096, 0)
    os.pwrite(f, b"end of the first version" * 100, 2 * 1024 * 1024)
    os.ftruncate(f, 3 * 1024 * 1024)
    os.close(f)
    EOF
    """

    func testAChangeToPartOfALargeFileEndsAsOnAPlainDirectory() {
        everywhere(makeLarge + """

        python3 - <<'EOF'
        import os
        f = os.open("large", os.O_WRONLY)
        os.pwrite(f, b"first", 5)
        os.pwrite(f, b"in the hole", 1536 * 1024)
        os.pwrite(f, b"past the end", 4 * 1024 * 1024)
        os.pwrite(f, b"FIRST", 5)
        os.close(f)
        f = os.open("large", os.O_WRONLY)
        os.ftruncate(f, 3 * 1024 * 1024 + 7)
        os.pwrite(f, b"after the truncation", 3 * 1024 * 1024 + 100)
        os.close(f)
        f = os.open("large", os.O_RDONLY)
        size = os.fstat(f).st_size
        print(size, os.lseek(f, 1024 * 1024 + 4096, os.SEEK_HOLE) < 1536 * 1024)
        os.close(f)
        EOF
        sha256sum large | cut -c1-16
        """)
    }

    func testAChangeToPartOfALargeFileKeepsTheFileAndCopiesNothing() {
        makeLargeFile()
        let before = backingInode("Documents/large")
        // Write-only, so that it is logged (dd opens for reading and writing: a live writer).
        syscall("f = os.open('Documents/large', os.O_WRONLY); os.pwrite(f, b'changed', 1000); os.close(f)", errno: 0)
        settle()
        XCTAssertEqual(backingInode("Documents/large"), before, "applied to the file itself, not published as a copy")
        XCTAssertEqual(sh("dd if=Documents/large bs=1 skip=1000 count=7 status=none"), "changed")
        XCTAssertEqual(sh("stat -c %s Documents/large"), "3145728\n")
        // truncate(1) by name is a rewrite of its own.
        sh("truncate -s 2M Documents/large")
        XCTAssertEqual(backingInode("Documents/large"), before)
        XCTAssertEqual(sh("stat -c %s Documents/large"), "2097152\n")
        XCTAssertEqual(sh("ls \(Shell.quote(mounted.store.workPath + "/shadows"))/* | grep -c delta || true"), "0\n", "no log is left")
    }

    /// The kernel releases a closed file after close(2) returns, so in a loop of changes (`dd
    /// conv=notrunc` in a script) the next open often comes before the last one's release. A child
    /// holding the first descriptor makes that certain: the second writer joins a session whose
    /// change is published, and logs its own, where it used to copy the whole file.
    func testAChangeRightAfterAnotherClosedOneCopiesNothing() {
        makeLargeFile()
        let before = backingInode("Documents/large")
        syscall("""
        first = os.open('Documents/large', os.O_WRONLY)
        os.pwrite(first, b'first', 100)
        child = os.fork()
        if child == 0:
            os.close(0); os.close(1); os.close(2)
            import time; time.sleep(2); os._exit(0)
        os.close(first)
        second = os.open('Documents/large', os.O_WRONLY)
        os.pwrite(second, b'second', 200)
        os.close(second)
        os.waitpid(child, 0)
        data = open('Documents/large', 'rb').read(206)
        assert data[100:105] == b'first' and data[200:206] == b'second', data
        """, errno: 0)
        settle()
        XCTAssertEqual(backingInode("Documents/large"), before, "applied to the file itself, not published as a copy")
        XCTAssertEqual(sh("dd if=Documents/large bs=1 skip=200 count=6 status=none"), "second")
    }

    /// `rsync --inplace` reads the file through one descriptor while it writes through another, and
    /// closes the reader just before the writer. The reader's release comes after its close has
    /// returned: a writer's close that counted it as open still (its node, its descriptor, or the
    /// node a writer left to it) copied the whole file, at a third of such changes in the lab.
    func testAChangeRightAfterItsReaderClosedCopiesNothing() {
        makeLargeFile()
        let before = backingInode("Documents/large")
        syscall("""
        for i in range(30):
            reader = os.open('Documents/large', os.O_RDONLY)
            os.pread(reader, 4096, i * 4096)
            writer = os.open('Documents/large', os.O_WRONLY)
            os.pwrite(writer, b'%02d' % i, i * 4096 + 7)
            os.close(reader)
            os.close(writer)
        data = open('Documents/large', 'rb').read(30 * 4096)
        assert all(data[i * 4096 + 7:i * 4096 + 9] == b'%02d' % i for i in range(30)), data
        """, errno: 0)
        settle()
        XCTAssertEqual(backingInode("Documents/large"), before, "applied to the file itself, not published as a copy")
    }

    /// `truncate -s` opens, truncates and closes without writing: its close publishes, so that the
    /// `stat` or `du` right after it counts the blocks the truncation freed (xfstests generic/701).
    func testTheCloseAfterATruncationPublishesIt() {
        everywhere("""
        for round in 1 2 3 4 5 6 7 8; do
            python3 -c "import os; f = os.open('t', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644); os.posix_fallocate(f, 0, 256 << 20); os.close(f)"
            truncate -s 64M t
            blocks=$(stat -c %b t)
            [ "$blocks" -le $((64 * 2048 + 64)) ] && echo "round $round: 64 MiB" || echo "round $round: $blocks blocks"
        done
        """)
    }

    func testWithoutLeasesTheDaemonsOwnCountDecidesWhereALogIsApplied() throws {
        // fs.leases-enable=0 makes F_SETLEASE fail with EINVAL, as it does for files of another
        // owner: a log is then applied in place only when the daemon knows of no other open.
        let setting = "/proc/sys/fs/leases-enable"
        guard let before = try? String(contentsOfFile: setting, encoding: .utf8),
              Shell.run("echo 0 > \(setting)").status == 0 else {
            throw XCTSkip("cannot turn leases off here (\(setting) is not writable)")
        }
        defer { _ = Shell.run("echo \(before.trimmingCharacters(in: .whitespacesAndNewlines)) > \(setting)") }
        makeLargeFile()
        let inode = backingInode("Documents/large")
        // Write-only, so that it is logged (dd opens for reading and writing: a live writer).
        syscall("f = os.open('Documents/large', os.O_WRONLY); os.pwrite(f, b'alone', 1000); os.close(f)", errno: 0)
        settle()
        XCTAssertEqual(backingInode("Documents/large"), inode, "applied to the file itself")
        XCTAssertEqual(sh("dd if=Documents/large bs=1 skip=1000 count=5 status=none"), "alone")
        writeWhileAReaderHasTheFile("SHARE", at: 1000)
    }

    /// Writes `text` at `offset` of Documents/large while a reader has it open: the reader keeps
    /// reading its version, and the next open reads the change.
    private func writeWhileAReaderHasTheFile(_ text: String, at offset: Int, thenAlso check: String = "") {
        syscall("""
        reader = os.open('Documents/large', os.O_RDONLY)
        first = os.pread(reader, \(text.utf8.count), \(offset))
        writer = os.open('Documents/large', os.O_WRONLY)
        os.pwrite(writer, b'\(text)', \(offset))
        os.close(writer)
        assert os.pread(reader, \(text.utf8.count), \(offset)) == first, os.pread(reader, \(text.utf8.count), \(offset))
        again = os.open('Documents/large', os.O_RDONLY)
        assert os.pread(again, \(text.utf8.count), \(offset)) == b'\(text)'
        \(check)
        """, errno: 0)
    }

    func testAReaderOfALargeFileKeepsItsVersionWhileAWriterChangesIt() {
        makeLargeFile()
        let before = backingInode("Documents/large")
        writeWhileAReaderHasTheFile("NEW!", at: 0,
                                    thenAlso: "assert os.pread(again, 24, 2 * 1024 * 1024) == b'end of the first version'")
        XCTAssertNotEqual(backingInode("Documents/large"), before, "published as a copy, for the reader's sake")
    }

    func testTwoWritersOfALargeFileShareOneRewrite() {
        makeLargeFile()
        syscall("""
        one = os.open('Documents/large', os.O_WRONLY)
        os.pwrite(one, b'one', 0)
        two = os.open('Documents/large', os.O_WRONLY)
        os.pwrite(two, b'two', 10)
        os.pwrite(one, b'ONE', 20)
        os.close(two)
        os.close(one)
        data = open('Documents/large', 'rb').read(23)
        assert data[:3] == b'one' and data[10:13] == b'two' and data[20:23] == b'ONE', data
        """, errno: 0)
    }

    func testAWriterKilledBeforeItClosesLeavesTheLargeFileAsItWas() {
        makeLargeFile()
        let before = sh("sha256sum Documents/large")
        let result = Shell.run("""
        python3 -c "import os; f = os.open('Documents/large', os.O_WRONLY); os.pwrite(f, b'torn' * 1000, 0); os.kill(os.getpid(), 9)"
        """, in: home)
        XCTAssertTrue([9, 137].contains(result.status), "the writer was killed: \(result.status)")
        XCTAssertEqual(sh("sha256sum Documents/large"), before)
    }

    func testALoggedChangeTheFileCannotTakeIsRefusedWholeAtClose() throws {
        makeLargeFile()
        let file = mounted.backing() + "/Documents/large"
        let before = sh("sha256sum Documents/large")
        // The file turns immutable after its writer opened it: the log's blocks cannot be reserved
        // in it, so nothing is committed, and the close says so.
        let result = Shell.run("""
        python3 -c "
        import os, subprocess
        f = os.open('Documents/large', os.O_WRONLY)
        os.pwrite(f, b'never' * 100, 1000)
        subprocess.run(['chattr', '+i', '\(file)'], check=True)
        try:
            os.close(f)
            print('closed')
        except OSError as e:
            print(e.errno)"
        """, in: home)
        _ = Shell.run("chattr -i \(Shell.quote(file))")
        try XCTSkipIf(result.status != 0, "the filesystem has no immutable files: \(result.error)")
        XCTAssertEqual(result.output, "\(EPERM)\n", "the close reports why: \(result.error)")
        settle()
        XCTAssertEqual(sh("sha256sum Documents/large"), before, "the file is as it was")
        XCTAssertEqual(sh("ls \(Shell.quote(mounted.store.workPath + "/shadows"))/* | grep -c delta || true"), "0\n", "no log is left")
    }

    func testALogCommittedWhenTheDaemonStoppedIsAppliedAtTheNextMount() throws {
        makeLargeFile()
        let file = mounted.backing() + "/Documents/large"
        mounted.crashDaemon()
        // What a daemon that died between committing a log and retiring it leaves: one committed
        // log with its target's link, and one it never committed.
        let shadows = mounted.store.workPath + "/shadows/2147483646"
        try FileManager.default.createDirectory(atPath: shadows, withIntermediateDirectories: true)
        func log(_ name: String, committed: Bool, data: String, at offset: off_t) {
            let log = open(shadows + "/" + name, O_RDWR | O_CREAT | O_EXCL, 0o600)
            XCTAssertGreaterThanOrEqual(log, 0)
            var end: off_t = 0
            XCTAssertEqual(pwrite(log, data, data.utf8.count, off_t(DeltaLog.headerSize)), data.utf8.count)
            XCTAssertEqual(DeltaLog.writeHeader(log, at: 0, kind: .write, offset: offset, length: off_t(data.utf8.count)), 0)
            end = off_t(DeltaLog.headerSize + data.utf8.count)
            XCTAssertEqual(DeltaLog.appendTruncate(log, end: &end, size: 3 * 1024 * 1024 + 1), 0)
            if committed { XCTAssertEqual(DeltaLog.commit(log, named: name.utf8, end: &end), 0) }
            close(log)
            XCTAssertEqual(link(file, shadows + "/" + name + DeltaLog.targetSuffix), 0)
        }
        log("delta-1", committed: true, data: "recovered", at: 100)
        log("delta-2", committed: false, data: "never committed", at: 200)
        try mounted.remount()
        XCTAssertEqual(sh("dd if=Documents/large bs=1 skip=100 count=9 status=none"), "recovered")
        XCTAssertNotEqual(sh("dd if=Documents/large bs=1 skip=200 count=15 status=none"), "never committed")
        XCTAssertEqual(sh("stat -c '%s %h' Documents/large"), "3145729 1\n")
        XCTAssertFalse(FileManager.default.fileExists(atPath: shadows))
    }
}

extension LargeFileTests {
    func testAWriterThatSyncsAsItGoesLogsEachChange() {
        makeLargeFile()
        let before = backingInode("Documents/large")
        // Each fsync applies the change to the file in the store. (A reader through the mount
        // would still count as open for a moment after its close: the kernel's release comes later.)
        syscall("""
        writer = os.open('Documents/large', os.O_WRONLY)
        for round in range(5):
            os.pwrite(writer, b'round %d' % round, round * 300000)
            os.fsync(writer)
            with open(\(Shell.quote(mounted.backing() + "/Documents/large")), 'rb') as stored:
                stored.seek(round * 300000)
                assert stored.read(7) == b'round %d' % round
        os.close(writer)
        """, errno: 0)
        XCTAssertEqual(backingInode("Documents/large"), before, "every change applied to the file itself")
    }
}

extension LargeFileTests {
    func testAMountThatCannotApplyACommittedLogRefusesToStartAndSaysWhy() throws {
        mounted.crashDaemon()
        let shadows = mounted.store.workPath + "/shadows/2147483645"
        try FileManager.default.createDirectory(atPath: shadows + "/delta-1" + DeltaLog.targetSuffix, withIntermediateDirectories: true)
        let log = open(shadows + "/delta-1", O_RDWR | O_CREAT | O_EXCL, 0o600)
        var end: off_t = 0
        XCTAssertEqual(DeltaLog.appendTruncate(log, end: &end, size: 1), 0)
        XCTAssertEqual(DeltaLog.commit(log, named: "delta-1".utf8, end: &end), 0)
        close(log)
        // Its target is a directory, which no log applies to.
        XCTAssertThrowsError(try mounted.remount()) { error in
            XCTAssertTrue("\(error)".contains("was committed but cannot be applied"), "\(error)")
        }
        XCTAssertTrue(FileManager.default.fileExists(atPath: shadows + "/delta-1"), "the log stays for the next attempt")
        // Once the store's owner has dealt with it, the store mounts.
        try FileManager.default.removeItem(atPath: shadows)
        try mounted.remount()
        XCTAssertTrue(mounted.isMounted)
    }
}

extension LargeFileTests {
    /// A committed log whose apply fails in a running mount (the disk failing just after the commit,
    /// made here by strace's fault injection: every `copy_file_range` of the daemon fails with EIO):
    /// the writer's fsync reports it, and the clean unmount applies the log.
    func testAnApplyThatFailsIsReportedAndTheUnmountAppliesTheLog() throws {
        try changeWhileCopiesFail(withAReader: false, syncing: true)
        unmountCleanlyAndFindTheChangeApplied()
    }

    /// The same at a close without a sync, whose commit and apply follow in the background: the
    /// close hears nothing (as a local disk's close does not hear of its cache's writes), and the
    /// clean unmount applies the log.
    func testAClosesApplyThatFailsInTheBackgroundLeavesTheLogToTheUnmount() throws {
        makeLargeFile()
        try mounted.failing("copy_file_range", with: "EIO") {
            syscall("f = os.open('Documents/large', os.O_WRONLY); os.pwrite(f, b'CHANGED', 4096); os.close(f)", errno: 0)
            settle()
            usleep(200_000)
        }
        unmountCleanlyAndFindTheChangeApplied()
    }

    private func unmountCleanlyAndFindTheChangeApplied() {
        let file = mounted.backing() + "/Documents/large"
        unmountCleanly()
        XCTAssertEqual(Shell.run("dd if=\(Shell.quote(file)) bs=1 skip=4096 count=7 status=none").output, "CHANGED",
                       "the unmount applies the committed log")
        let check = Shell.run("\(Shell.quote(MountedStore.executable)) check \(Shell.quote(mounted.store.root))")
        XCTAssertEqual(check.status, 0, check.output + check.error)
    }
}

extension LargeFileTests {
    /// A logged change that must become a copy (a reader has the file open) and cannot (every
    /// `copy_file_range` of the daemon fails): the writer's close reports it, nothing of the change
    /// is published, then or at the unmount.
    func testALogThatCannotBecomeACopyIsReportedAndChangesNothing() throws {
        try changeWhileCopiesFail(withAReader: true)
        XCTAssertEqual(sh("python3 -c \"import os; print(os.pread(os.open('Documents/large', os.O_RDONLY), 7, 4096))\""),
                       "b'\\x00\\x01\\x02\\x03\\x04\\x05\\x06'\n")
        let file = mounted.backing() + "/Documents/large"
        unmountCleanly()
        XCTAssertEqual(Shell.run("od -An -tx1 -j4096 -N7 \(Shell.quote(file))").output.trimmingCharacters(in: .whitespacesAndNewlines),
                       "00 01 02 03 04 05 06", "nothing of the change is applied at the unmount either")
    }
}

extension LargeFileTests {
    /// Writes "CHANGED" at 4096 in Documents/large (a reader holding the file open meanwhile, if
    /// `withAReader`) while every `copy_file_range` of the daemon fails: the writer's close says EIO.
    private func changeWhileCopiesFail(withAReader: Bool, syncing: Bool = false) throws {
        makeLargeFile()
        try mounted.failing("copy_file_range", with: "EIO") {
            syscall("""
            reader = os.open('Documents/large', os.O_RDONLY) if \(withAReader ? "True" : "False") else None
            writer = os.open('Documents/large', os.O_WRONLY)
            os.pwrite(writer, b'CHANGED', 4096)
            try:
                if \(syncing ? "True" : "False"):
                    os.fsync(writer)
                os.close(writer)
            finally:
                if reader is not None:
                    os.close(reader)
            """, errno: EIO)
        }
    }
}

extension LargeFileTests {
    /// A logged change's close returns once the log is committed and applied; the file's sync and
    /// the log's retirement follow. Until the retirement is done, the log's link to the file stays
    /// (made to fail here: every `unlinkat` of the daemon returns EIO), `stat` does not count it,
    /// and no change in place may begin: a cut would apply the log again over it. The next open
    /// that may change the file retires the log first.
    func testAChangeInPlaceWaitsForTheRetirementOfTheLastLoggedChange() throws {
        makeLargeFile()
        try mounted.failing("unlinkat", with: "EIO") {
            syscall("f = os.open('Documents/large', os.O_WRONLY); os.pwrite(f, b'LOGGED', 100); os.close(f)", errno: 0)
            settle()
            XCTAssertEqual(sh("stat -c %h Documents/large"), "1\n", "the log's link is the daemon's")
            // Read and write, without truncation: a live writer, in place.
            syscall("os.open('Documents/large', os.O_RDWR)", errno: EIO)
        }
        syscall("""
        f = os.open('Documents/large', os.O_RDWR)
        os.pwrite(f, b'IN PLACE', 100)
        os.fsync(f)
        os.close(f)
        """, errno: 0)
        mounted.crashDaemon()
        try mounted.remount()
        XCTAssertEqual(sh("dd if=Documents/large bs=1 skip=100 count=8 status=none"), "IN PLACE",
                       "the log was retired before the change in place, and not applied again over it")
        XCTAssertEqual(sh("stat -c %h Documents/large"), "1\n")
    }

    /// A daemon that stops after a logged change's close, before the log's retirement (made to
    /// fail: every `unlinkat` of the daemon returns EIO), leaves the committed log and its link:
    /// the next mount applies it again, here over bytes the disk lost (overwritten behind the
    /// daemon's back).
    func testALoggedChangeWhoseRetirementDidNotEndIsAppliedAgainAtTheNextMount() throws {
        makeLargeFile()
        try mounted.failing("unlinkat", with: "EIO") { logAndStop("LOGGED", at: 100) }
        let file = mounted.backing() + "/Documents/large"
        XCTAssertEqual(Shell.run("printf LOST.. | dd of=\(Shell.quote(file)) bs=1 seek=100 conv=notrunc status=none").status, 0)
        try findAfterTheNextMount("LOGGED", at: 100)
    }

    /// Writes `text` at `offset` of Documents/large, closes, and stops the daemon.
    private func logAndStop(_ text: String, at offset: Int) {
        syscall("f = os.open('Documents/large', os.O_WRONLY); os.pwrite(f, b'\(text)', \(offset)); os.close(f)", errno: 0)
        settle()
        mounted.crashDaemon()
    }

    /// Mounts again: the file reads `text` at `offset`, and no log is left.
    private func findAfterTheNextMount(_ text: String, at offset: Int) throws {
        try mounted.remount()
        XCTAssertEqual(sh("dd if=Documents/large bs=1 skip=\(offset) count=\(text.utf8.count) status=none"), text)
        XCTAssertEqual(sh("ls \(Shell.quote(mounted.store.workPath + "/shadows"))/* | grep -c delta || true"), "0\n", "no log is left")
    }
}

extension LargeFileTests {
    /// A close's logged change that keeps the file's size returns before its commit is synced
    /// (each sync of the daemon is held back here for 0.3 s): the next open of the file waits
    /// for the change, which it then reads whole, and `stat` shows the change's time at once.
    func testAnOpenRightAfterALoggedCloseReadsTheChange() throws {
        makeLargeFile()
        let before = sh("stat -c %Y.%y Documents/large")
        usleep(20_000)
        try mounted.delaying("fsync", by: 0.3) {
            syscall("f = os.open('Documents/large', os.O_WRONLY); os.pwrite(f, b'CHANGED', 4096); os.close(f)", errno: 0)
            XCTAssertNotEqual(sh("stat -c %Y.%y Documents/large"), before, "the change's time")
            XCTAssertEqual(sh("dd if=Documents/large bs=1 skip=4096 count=7 status=none"), "CHANGED")
        }
    }

    /// A daemon that stops after such a close, before the commit's sync: the commit was written,
    /// so the next mount applies the log, as a local disk keeps a closed file's writes when the
    /// program that wrote them dies.
    func testALoggedCloseOutlivesADaemonThatStopsBeforeItsCommitIsSynced() throws {
        makeLargeFile()
        try mounted.delaying("fsync", by: 1) { logAndStop("CHANGED", at: 4096) }
        try findAfterTheNextMount("CHANGED", at: 4096)
    }
}

extension LargeFileTests {
    /// Such a close whose commit cannot be synced after its answer (every `fsync` of the daemon
    /// fails): the change is dropped and the file reads as its previous version; after that
    /// failure, the next logged close syncs before it answers, and reports.
    func testALoggedCloseWhoseCommitCannotBeSyncedIsDroppedAndTheNextOneReports() throws {
        makeLargeFile()
        let previous = "b'\\x00\\x01\\x02\\x03\\x04\\x05\\x06'\n"
        let read = "python3 -c \"import os; print(os.pread(os.open('Documents/large', os.O_RDONLY), 7, 4096))\""
        try mounted.failing("fsync", with: "EIO") {
            syscall("f = os.open('Documents/large', os.O_WRONLY); os.pwrite(f, b'DROPPED', 4096); os.close(f)", errno: 0)
            settle()
            XCTAssertEqual(sh(read), previous)
            syscall("f = os.open('Documents/large', os.O_WRONLY); os.pwrite(f, b'REFUSED', 4096); os.close(f)", errno: EIO)
        }
        XCTAssertEqual(sh(read), previous)
        try mounted.remount()
        XCTAssertEqual(sh(read), previous)
    }
}

extension LargeFileTests {
    /// A close whose logged change it must retire itself (as many retirements as wait at most
    /// are stuck already, each on a removal that failed) closes the file once. It closed it twice:
    /// the second close took whatever another thread had opened under that number meanwhile.
    func testACloseThatRetiresItsOwnChangeClosesTheFileOnce() throws {
        let stuck = UnsyncedPublishes.retiringLimit
        sh("mkdir Documents/many && for i in $(seq 0 \(stuck)); do truncate -s 2M Documents/many/f$i; done")
        func change(_ index: Int) {
            syscall("f = os.open('Documents/many/f\(index)', os.O_WRONLY); os.pwrite(f, b'CHANGED', 100); os.close(f)", errno: 0)
        }
        let failed = try mounted.failed("unlinkat", with: "EIO", on: try XCTUnwrap(mounted.shadowDirectory)) {
            for index in 0..<stuck { change(index) }
        }
        XCTAssertGreaterThanOrEqual(failed.count, stuck, "each retirement was to fail at its removal")
        let failures = try mounted.failures("close") { change(stuck) }
        XCTAssertEqual(failures.filter { $0.contains("EBADF") }, [], "a descriptor closed twice")
        XCTAssertEqual(sh("dd if=Documents/many/f\(stuck) bs=1 skip=100 count=7 status=none"), "CHANGED")
    }
}

extension LargeFileTests {
    /// A synced change whose log could not be applied (every copy of the daemon fails meanwhile)
    /// reports it; the log, committed, is applied again before the next change in place, not left
    /// for the next mount to apply over that change (a database's fsync'd write was lost so).
    func testAChangeInPlaceAfterAnApplyThatFailedIsNotOverwrittenByIt() throws {
        makeLargeFile()
        try mounted.failing("copy_file_range", with: "EIO") {
            syscall("f = os.open('Documents/large', os.O_WRONLY); os.pwrite(f, b'LOGGED', 4096); os.fsync(f)", errno: EIO)
        }
        syscall("f = os.open('Documents/large', os.O_RDWR); os.pwrite(f, b'IN PLACE', 4096); os.fsync(f); os.close(f)", errno: 0)
        mounted.crashDaemon()
        try mounted.remount()
        XCTAssertEqual(sh("dd if=Documents/large bs=1 skip=4096 count=8 status=none"), "IN PLACE", "the fsync'd change survives")
    }
}
