import Containers
@testable import ContainerFS
import Foundation
import Glibc
import XCTest

/// A daemon killed in the middle of heavy writes loses nothing that was published and tears
/// nothing (docs/atomic-replace.md, "A daemon that crashes").
final class CrashTests: MountedTestCase {
    func testKillingTheDaemonDuringWritesLeavesEveryFileOldOrNew() throws {
        let files = 40
        sh("for i in $(seq 1 \(files)); do echo old-$i > Documents/f$i; done")
        // Writers rewrite their files with a large new version, over and over, until the daemon dies.
        // Rewrites in place and by editor-style rename, with creations and deletions around them.
        // Each writer has files of its own: a second writer's O_TRUNC open empties a file the first
        // is writing, on a local disk as here, and a crash then would rightly leave it empty.
        let writer = """
        import os, sys
        n = \(files)
        pid = os.getpid()
        mine = int(sys.argv[1])
        while True:
            for i in range(1, n + 1):
                if (i - 1) // 2 % 2 != mine:
                    continue
                try:
                    content = ''.join(f'new-{i}-' + 'x' * 1000 + '\\n' for _ in range(64))
                    if i % 2:
                        with open(f'Documents/f{i}', 'w') as f:
                            f.write(content)
                    else:
                        with open(f'Documents/.f{i}.{pid}', 'w') as f:
                            f.write(content)
                        os.rename(f'Documents/.f{i}.{pid}', f'Documents/f{i}')
                    with open(f'Documents/scratch-{pid}-{i}', 'w') as f:
                        f.write('scratch')
                    os.unlink(f'Documents/scratch-{pid}-{i}')
                except OSError:
                    sys.exit(0)
        """
        let writers = (0..<2).map { index -> Process in
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
            process.arguments = ["-c", writer, String(index)]
            process.currentDirectoryURL = URL(fileURLWithPath: home)
            process.standardError = FileHandle.nullDevice
            try? process.run()
            return process
        }
        usleep(800_000)
        let deadDaemon = mounted.daemonPID!
        let deadSocket = "/run/containerfs/\(deadDaemon)-\(try XCTUnwrap(ControlSocket.processNamespace())).sock"
        XCTAssertTrue(FileManager.default.fileExists(atPath: deadSocket), "the daemon's control socket")
        mounted.crashDaemon()
        for process in writers {
            let deadline = Date().addingTimeInterval(10)
            while process.isRunning && Date() < deadline { usleep(20_000) }
            if process.isRunning { process.terminate() }
        }
        // What the next mount recovers, with each link's inode: said when a file comes back torn.
        let shadows = mounted.store.workPath + "/shadows/\(deadDaemon)"
        let left = ((try? FileManager.default.contentsOfDirectory(atPath: shadows)) ?? []).sorted().map { name -> String in
            var attributes = stat()
            return lstat(shadows + "/" + name, &attributes) == 0 ? "\(name) (inode \(attributes.st_ino), \(attributes.st_size) B)" : name
        }
        let inodes = (1...files).map { index -> String in
            var attributes = stat()
            return lstat(mounted.backing() + "/Documents/f\(index)", &attributes) == 0 ? "f\(index): \(attributes.st_ino)" : "f\(index): -"
        }
        try mounted.remount()

        let complete = (1...files).map { "new-\($0)-" + String(repeating: "x", count: 1000) + "\n" }
        var rewritten = 0
        for index in 1...files {
            let content = try String(contentsOfFile: home + "/Documents/f\(index)", encoding: .utf8)
            if content == "old-\(index)\n" { continue }
            XCTAssertEqual(content.count, complete[index - 1].count * 64,
                           "Documents/f\(index) is torn; the dead daemon left \(left); the files were \(inodes)")
            XCTAssertEqual(content, String(repeating: complete[index - 1], count: 64), "Documents/f\(index) is torn")
            rewritten += 1
        }
        XCTAssertGreaterThan(rewritten, 0, "the writers had published something before the crash")
        XCTAssertFalse(FileManager.default.fileExists(atPath: mounted.store.workPath + "/shadows/\(deadDaemon)"),
                       "the dead daemon's shadows are removed at the next mount")
        XCTAssertFalse(FileManager.default.fileExists(atPath: deadSocket),
                       "and so is its control socket")
        let check = Shell.run("\(Shell.quote(MountedStore.executable)) check \(Shell.quote(mounted.store.root))")
        XCTAssertEqual(check.status, 0, "the store passes its own check: \(check.output)")
        print("crash test: \(files) files checked, \(rewritten) new, \(files - rewritten) old, 0 torn; store consistent")
    }

    /// Runs `written`, then `published` while the background's writes of data wait `seconds`
    /// (`sync_file_range` held back), and kills the daemon before they are done, after `meanwhile`:
    /// the publishes' records stay. Returns the dead daemon's shadow directory.
    private func crashWithUnwrittenPublishes(after written: String, of published: String, waiting seconds: Double,
                                             meanwhile: (String) -> Void = { _ in }) throws -> String {
        sh(written)
        let deadDaemon = try XCTUnwrap(mounted.daemonPID)
        let shadows = mounted.store.workPath + "/shadows/\(deadDaemon)"
        mounted.waitForUnsyncedPublishes()
        // Its batch written file by file, or by a sync of the filesystem.
        let delay = "delay_enter=\(Int(seconds * 1_000_000))"
        try mounted.injecting([("sync_file_range", delay), ("syncfs", delay)]) {
            sh(published)
            meanwhile(shadows)
            mounted.crashDaemon()
        }
        return shadows
    }

    /// The records in a (dead) daemon's shadow directory `shadows` of versions that replaced another.
    private static func replacedRecords(in shadows: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: shadows)) ?? [])
            .filter { $0.hasPrefix(PublishRecord.replacedPrefix) && PublishRecord.parse($0) != nil }
    }

    /// A daemon killed before the data of its unsynced publishes was written leaves their records
    /// (docs/atomic-replace.md, "Closes without a sync"). The next mount keeps each version that
    /// reads as its record says, and puts back the previous version of each that does not (what a
    /// power cut leaves of data never written: here the backing files are cut short by hand).
    func testRecordsOfUnwrittenPublishesKeepWholeVersionsAndRestoreTheRest() throws {
        let shadows = try crashWithUnwrittenPublishes(after: "echo a-v1 > Documents/a; echo c-v1 > Documents/c",
                                                      of: "echo a-v2 > Documents/a; echo b-new > Documents/b; echo c-v2 > Documents/c; echo d-new > Documents/d",
                                                      waiting: 30) { shadows in
            let records = ((try? FileManager.default.contentsOfDirectory(atPath: shadows)) ?? [])
                .filter { PublishRecord.parse($0) != nil }
            XCTAssertEqual(records.count, 4, "every publish waits for its data with a record: \(records)")
        }
        let documents = mounted.backing() + "/Documents"
        XCTAssertEqual(truncate(documents + "/a", 0), 0)
        XCTAssertEqual(truncate(documents + "/b", 2), 0)
        try mounted.remount()
        XCTAssertEqual(sh("cat Documents/a"), "a-v1\n", "a torn rewrite goes back to its previous version")
        XCTAssertEqual(sh("stat -c %s Documents/b"), "0\n", "a torn new file goes back to empty")
        XCTAssertEqual(sh("cat Documents/c Documents/d"), "c-v2\nd-new\n", "whole versions stay")
        XCTAssertFalse(FileManager.default.fileExists(atPath: shadows), "the dead daemon's shadows are removed")
        let check = Shell.run("\(Shell.quote(MountedStore.executable)) check \(Shell.quote(mounted.store.root))")
        XCTAssertEqual(check.status, 0, "the store passes its own check: \(check.output)")
    }

    /// A save without a sync (a temporary file written, closed and renamed over the document, as
    /// `sed -i`, `mv` and atomic writes do) does not wait at the rename for the temporary file's
    /// data: the document it replaces becomes its record's previous version. A cut that keeps the
    /// rename but not the data puts the document's content back; a whole one stays.
    func testASaveWithoutASyncKeepsTheDocumentItReplacesUntilItsDataIsWritten() throws {
        let shadows = try crashWithUnwrittenPublishes(
            after: "echo doc-v1 > Documents/doc; echo kept-v1 > Documents/kept",
            // The first file's data holds the background up: the temporary files' records wait behind it.
            of: "echo first > Documents/first; echo doc-v2 > Documents/.doc.tmp; mv Documents/.doc.tmp Documents/doc; "
                + "echo kept-v2 > Documents/.kept.tmp; mv Documents/.kept.tmp Documents/kept",
            waiting: 30) { shadows in
            let records = Self.replacedRecords(in: shadows)
            XCTAssertEqual(records.count, 2, "each renamed file's record has the document it replaced: \(records)")
        }
        XCTAssertEqual(truncate(mounted.backing() + "/Documents/doc", 3), 0)
        try mounted.remount()
        XCTAssertEqual(sh("cat Documents/doc"), "doc-v1\n", "a torn save goes back to the document it replaced")
        XCTAssertEqual(sh("cat Documents/kept; ls -A Documents | grep -c '[.]tmp$' || true"), "kept-v2\n0\n", "a whole one stays")
        XCTAssertFalse(FileManager.default.fileExists(atPath: shadows), "the dead daemon's shadows are removed")
    }

    /// Two saves by rename in a row without a sync: the second replaces the first while the first's
    /// record still waits, and takes it as its previous version instead of waiting for its own data.
    /// A cut that tears both puts back the document from before them; one that tears only the
    /// second puts back the first.
    func testSavesByRenameInARowGoBackOneAtATime() throws {
        let save = { (name: String, content: String) in
            "echo \(content) > Documents/.\(name).tmp; mv Documents/.\(name).tmp Documents/\(name); "
        }
        let shadows = try crashWithUnwrittenPublishes(
            after: "echo doc-v1 > Documents/doc; echo two-v1 > Documents/two",
            // The first file's data holds the background up: the saves' records wait behind it.
            of: "echo first > Documents/first; " + save("doc", "doc-v2") + save("doc", "doc-v3")
                + save("two", "two-v2") + save("two", "two-v3"),
            waiting: 30) { shadows in
            let records = Self.replacedRecords(in: shadows)
            XCTAssertEqual(records.count, 4, "each save's record has the document it replaced: \(records)")
        }
        // What a power cut leaves of data never written: both of doc's saves, and two's last.
        let firstSave = try XCTUnwrap(try FileManager.default.contentsOfDirectory(atPath: shadows).first {
            PublishRecord.parse($0) != nil && FileManager.default.contents(atPath: shadows + "/" + $0) == Data("doc-v2\n".utf8)
        }, "the first save's record links its file")
        XCTAssertEqual(truncate(shadows + "/" + firstSave, 3), 0)
        XCTAssertEqual(truncate(mounted.backing() + "/Documents/doc", 3), 0)
        XCTAssertEqual(truncate(mounted.backing() + "/Documents/two", 3), 0)
        try mounted.remount()
        XCTAssertEqual(sh("cat Documents/doc"), "doc-v1\n", "two torn saves go back to the document before them")
        XCTAssertEqual(sh("cat Documents/two; ls -A Documents | grep -c '[.]tmp$' || true"), "two-v2\n0\n",
                       "a torn save over a whole one goes back to that one")
        XCTAssertFalse(FileManager.default.fileExists(atPath: shadows), "the dead daemon's shadows are removed")
    }

    /// The recovery of a dead daemon's records (the next mount's, `containerfs check --repair`'s)
    /// stops at an error it cannot get past, here a record it cannot open (the first open in the
    /// dead daemon's directory fails, as a disk's read error would; the later ones would succeed):
    /// nothing is put back halfway, the directory and its records stay for the next attempt, and
    /// the error says why. The next attempt, without the fault, puts the previous version back.
    func testARecordThatCannotBeLookedAtStopsTheRecoveryAndStays() throws {
        let shadows = try crashWithUnwrittenPublishes(after: "echo a-v1 > Documents/a", of: "echo a-v2 > Documents/a", waiting: 3)
        let record = try XCTUnwrap(try FileManager.default.contentsOfDirectory(atPath: shadows).first { PublishRecord.parse($0) != nil })
        let file = mounted.backing() + "/Documents/a"
        // What a power cut leaves of data never written.
        XCTAssertEqual(truncate(file, 0), 0)
        let check = "\(Shell.quote(MountedStore.executable)) check --repair \(Shell.quote(mounted.store.root))"
        // The recovery reaches the files by their directory's descriptor (strace matches it by that).
        let failed = Shell.run("strace -f -o /dev/null -P \(Shell.quote(shadows)) -e trace=openat "
                               + "-e inject=openat:error=EIO:when=1 " + check)
        XCTAssertNotEqual(failed.status, 0, failed.output)
        XCTAssertTrue(failed.error.contains("not repaired: work/shadows/\((shadows as NSString).lastPathComponent)"), failed.error)
        XCTAssertTrue(failed.error.contains("(Input/output error)"), failed.error)
        XCTAssertTrue(FileManager.default.fileExists(atPath: shadows + "/" + record), "the record stays")
        XCTAssertEqual(FileManager.default.contents(atPath: file), Data(), "nothing was put back halfway")
        let repaired = Shell.run(check)
        XCTAssertEqual(repaired.status, 0, repaired.output + repaired.error)
        XCTAssertEqual(FileManager.default.contents(atPath: file), Data("a-v1\n".utf8), "the previous version is back")
        XCTAssertFalse(FileManager.default.fileExists(atPath: shadows))
    }

    /// A dead daemon's directory that cannot be listed is not taken for empty: removing it would
    /// drop the record that puts the previous version back. strace fails one listing of it: the
    /// logs' recovery's (the first), then the records' (the logs' recovery reads the entries,
    /// then the end).
    func testADirectoryThatCannotBeListedStopsTheRecoveryAndStays() throws {
        let shadows = try crashWithUnwrittenPublishes(after: "echo b-v1 > Documents/b", of: "echo b-v2 > Documents/b", waiting: 3)
        let file = mounted.backing() + "/Documents/b"
        XCTAssertEqual(truncate(file, 0), 0)
        let check = "\(Shell.quote(MountedStore.executable)) check --repair \(Shell.quote(mounted.store.root))"
        let refused = Shell.run("strace -f -o /dev/null -P \(Shell.quote(shadows)) -e trace=getdents64 "
                                + "-e inject=getdents64:error=ENOMEM:when=1 " + check)
        XCTAssertNotEqual(refused.status, 0, refused.output)
        XCTAssertTrue(refused.error.contains("(Cannot allocate memory)"), "the error as it was: \(refused.error)")
        XCTAssertEqual(FileManager.default.contents(atPath: file), Data(), "nothing was put back halfway")
        let failed = Shell.run("strace -f -o /dev/null -P \(Shell.quote(shadows)) -e trace=getdents64 "
                               + "-e inject=getdents64:error=EIO:when=3 " + check)
        XCTAssertNotEqual(failed.status, 0, failed.output)
        XCTAssertTrue(failed.error.contains("not repaired: work/shadows/\((shadows as NSString).lastPathComponent)"), failed.error)
        XCTAssertTrue(failed.error.contains("Input/output error"), failed.error)
        XCTAssertTrue(FileManager.default.fileExists(atPath: shadows), "the directory and its record stay")
        let repaired = Shell.run(check)
        XCTAssertEqual(repaired.status, 0, repaired.output + repaired.error)
        XCTAssertEqual(FileManager.default.contents(atPath: file), Data("b-v1\n".utf8), "the previous version is back")
    }

    /// The folder of the daemons' shadow directories that cannot be listed keeps the next mount
    /// from starting, and `check` says so: read as empty, it let the mount serve what a dead
    /// daemon's records were to put right.
    func testAShadowsFolderThatCannotBeListedKeepsTheMountFromStarting() throws {
        _ = try crashWithUnwrittenPublishes(after: "echo c-v1 > Documents/c", of: "echo c-v2 > Documents/c", waiting: 3)
        let file = mounted.backing() + "/Documents/c"
        XCTAssertEqual(truncate(file, 0), 0)
        let shadows = Shell.quote(mounted.store.workPath + "/shadows")
        let failing = "strace -f -o /dev/null -P \(shadows) -e trace=getdents64 -e inject=getdents64:error=EIO:when=1 "
        let mountPoint = mounted.root.appendingPathComponent("second").path
        try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: true)
        defer { _ = Shell.run("fusermount3 -u -z \(Shell.quote(mountPoint)) 2>/dev/null") }
        let mount = Shell.run(failing + "timeout 30 \(Shell.quote(MountedStore.executable)) mount -f "
                              + "\(Shell.quote(mounted.store.root)) \(Shell.quote(mountPoint))")
        XCTAssertNotEqual(mount.status, 0, mount.output)
        XCTAssertTrue(mount.error.contains("shadows: cannot tell what daemons that stopped left there (") && mount.error.contains("Input/output error"), mount.error)
        let check = Shell.run(failing + "\(Shell.quote(MountedStore.executable)) check \(Shell.quote(mounted.store.root))")
        XCTAssertNotEqual(check.status, 0, check.output)
        XCTAssertTrue((check.output + check.error).contains("work/shadows: not checked ("), check.output + check.error)
        try mounted.remount()
        XCTAssertEqual(sh("cat Documents/c"), "c-v1\n", "the next mount that can list it puts the previous version back")
    }

    /// A check that cannot tell which daemons run (strace fails every listing of STORE/work/mounts)
    /// does not take a running daemon's shadow directory for a dead one's: removing it would lose
    /// the write in progress there, and the daemon's spares.
    func testACheckThatCannotListTheMountsLeavesARunningDaemonsWorkAlone() throws {
        let mounts = Shell.quote(mounted.store.workPath + "/mounts")
        let result = Shell.run("""
            echo old > Documents/w
            ( exec 3>Documents/w; echo new >&3; sleep 2; exec 3>&- ) &
            sleep 0.5
            strace -f -o /dev/null -P \(mounts) -e trace=getdents64 -e inject=getdents64:error=EIO:when=1+ \
              \(Shell.quote(MountedStore.executable)) check --repair \(Shell.quote(mounted.store.root)) 2>&1
            echo "check: $?"
            wait
            cat Documents/w
            echo again > Documents/v && cat Documents/v
            """, in: home)
        XCTAssertEqual(result.status, 0, result.error)
        XCTAssertTrue(result.output.contains("work/shadows: not checked (\(mounted.store.workPath)/mounts: listing failed: Input/output error)"),
                      result.output)
        XCTAssertTrue(result.output.hasSuffix("check: 1\nnew\nagain\n"), result.output)
        XCTAssertEqual(sh("\(Shell.quote(MountedStore.executable)) check \(Shell.quote(mounted.store.root))"),
                       "\(mounted.store.root): consistent.\n")
    }

    /// Two unwritten publishes of one file in a row leave two records, the second one's previous
    /// version being the first one's file: with both cut short, the next mount puts the first back
    /// before the second copies it, whatever order the directory lists them in (the power-loss
    /// harness found files read empty when it did not: docs/atomic-replace.md). Four files, so that
    /// a listing's order puts all of them right by chance once in 16 runs.
    func testChainedRecordsOfUnwrittenPublishesPutTheOldestVersionBack() throws {
        let names = ["e", "f", "g", "h"]
        let shadows = try crashWithUnwrittenPublishes(
            after: names.map { "echo \($0)-v1 > Documents/\($0)" }.joined(separator: "; "),
            of: names.map { "echo \($0)-v2 > Documents/\($0); echo \($0)-v3 > Documents/\($0)" }.joined(separator: "; "),
            waiting: 10)
        let documents = mounted.backing() + "/Documents"
        let records = try FileManager.default.contentsOfDirectory(atPath: shadows).filter { $0.hasPrefix(PublishRecord.replacedPrefix) }
        XCTAssertEqual(records.count, 2 * names.count, "each rewrite left its record: \(records)")
        for name in names {
            // The third version's record names the second version's file as its previous version.
            var file = stat(), linked = stat()
            XCTAssertEqual(stat(documents + "/" + name, &file), 0)
            let third = try XCTUnwrap(records.first { stat(shadows + "/" + $0, &linked) == 0 && linked.st_ino == file.st_ino })
            let previous = try XCTUnwrap(PublishRecord.parse(String(third.dropFirst(PublishRecord.replacedPrefix.count)))?.base)
            XCTAssertEqual(truncate(shadows + "/" + previous, 0), 0)
            XCTAssertEqual(truncate(documents + "/" + name, 0), 0)
        }
        try mounted.remount()
        for name in names {
            XCTAssertEqual(sh("cat Documents/\(name)"), "\(name)-v1\n", "\(name): both torn versions go back to the first")
        }
    }

    /// A record's checksum comes from the writes themselves while they fill the shadow in order
    /// (docs/atomic-replace.md, "Closes without a sync"); anything else that changes the shadow (a
    /// write inside it, a truncation, a punched hole, a second descriptor's write, a copy of the
    /// previous version under part of it) makes the publish read the file for it. Each way of
    /// writing is published with a record and the daemon killed before the data is written: the
    /// next mount keeps every file that reads as its record says, and each must read as the same
    /// writes leave it on a plain directory. A wrong checksum would put a previous version back.
    /// Files over 1 MiB get a record too where their writes checksummed them; one changed
    /// otherwise waits for its data at its close instead (`large-patched`: no record).
    func testRecordsOfEveryWayOfWritingMatchWhatWasWritten() throws {
        let script = mounted.root.appendingPathComponent("ways-\(UUID().uuidString).py").path
        try Self.waysOfWriting.write(toFile: script, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: script) }
        let plain = mounted.root.appendingPathComponent("plain-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: plain, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: plain) }
        let run = "python3 \(Shell.quote(script)) "
        sh(run + "\(Shell.quote(plain)) before && " + run + "\(Shell.quote(plain)) write")
        let expected = sh(run + "\(Shell.quote(plain)) digest")
        XCTAssertEqual(expected.split(separator: "\n").count, 14, expected)
        sh("mkdir Documents/ways")
        var records: [String] = []
        _ = try crashWithUnwrittenPublishes(after: run + "Documents/ways before", of: run + "Documents/ways write", waiting: 3) {
            records = ((try? FileManager.default.contentsOfDirectory(atPath: $0)) ?? []).filter { PublishRecord.parse($0) != nil }
        }
        XCTAssertEqual(records.count, 13, "every publish but the patched large file's had a record: \(records)")
        try mounted.remount()
        XCTAssertEqual(sh(run + "Documents/ways digest"), expected, "every file reads as written")
    }

    /// `python3 ways.py DIR before|write|digest`: the previous versions, the ways of writing, the
    /// files' digests.
    private static let waysOfWriting = #"""
        import ctypes, hashlib, os, random, sys
        folder, step = sys.argv[1], sys.argv[2]
        os.chdir(folder)
        data = random.Random(7).randbytes(4_000_000)
        names = ['sequential', 'new', 'overwritten', 'regrown', 'punched', 'appended', 'whole',
                 'partial', 'new-regrown', 'new-punched', 'two-descriptors', 'large', 'new-large', 'large-patched']
        libc = ctypes.CDLL(None, use_errno=True)
        def punch(f, offset, length):
            # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
            if libc.fallocate(f, 3, ctypes.c_long(offset), ctypes.c_long(length)) != 0:
                raise OSError(ctypes.get_errno(), 'fallocate')
        def chunks(f, content, size=131072):
            for start in range(0, len(content), size):
                os.write(f, content[start:start + size])
        TRUNC = os.O_WRONLY | os.O_TRUNC
        NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        if step == 'before':
            for name in names:
                if not name.startswith('new'):
                    with open(name, 'wb') as f:
                        f.write(b'previous ' * 3000)
        elif step == 'write':
            f = os.open('sequential', TRUNC); chunks(f, data[:300_001]); os.close(f)
            f = os.open('new', NEW, 0o644); chunks(f, data[:70_000], 30_000); os.close(f)
            f = os.open('overwritten', TRUNC); os.write(f, data[:20_000]); os.pwrite(f, b'x' * 100, 5_000); os.close(f)
            f = os.open('regrown', TRUNC); os.write(f, data[:10_000]); os.ftruncate(f, 5_000); os.ftruncate(f, 10_000); os.close(f)
            f = os.open('punched', TRUNC); os.write(f, data[:40_000]); punch(f, 8192, 8192); os.close(f)
            f = os.open('appended', TRUNC | os.O_APPEND); chunks(f, data[:50_000], 7_000); os.close(f)
            f = os.open('whole', os.O_WRONLY); os.write(f, data[:27_000]); os.close(f)
            f = os.open('partial', os.O_WRONLY); os.write(f, data[:10]); os.close(f)
            f = os.open('new-regrown', NEW, 0o644); os.write(f, data[:10_000]); os.ftruncate(f, 100); os.ftruncate(f, 10_000); os.close(f)
            f = os.open('new-punched', NEW, 0o644); os.write(f, data[:40_000]); punch(f, 4096, 12288); os.close(f)
            f = os.open('two-descriptors', TRUNC); g = os.open('two-descriptors', os.O_WRONLY)
            os.write(f, data[:1_000]); os.pwrite(g, b'y' * 100, 0); os.write(f, data[1_000:2_000]); os.close(g); os.close(f)
            f = os.open('large', TRUNC); chunks(f, data[:3_000_000]); os.close(f)
            f = os.open('new-large', NEW, 0o644); chunks(f, data[:2_500_000], 1 << 20); os.close(f)
            f = os.open('large-patched', TRUNC); chunks(f, data[:2_000_000]); os.pwrite(f, b'z' * 10, 1_000); os.close(f)
        else:
            for name in names:
                with open(name, 'rb') as f:
                    content = f.read()
                print(name, len(content), hashlib.sha256(content).hexdigest())
        """#

    /// A new file's fsync promises its content. Where the file's sync does not carry its names
    /// (ext4 without a journal), its mark becomes a record of its size and checksum, which the
    /// background removes later (docs/atomic-replace.md, "Durability"): a daemon killed before that
    /// leaves the record (here the background's write fails, which leaves it), and the next mount
    /// keeps the file, which reads as it says.
    func testANewFileSyncedJustBeforeACrashKeepsItsContent() throws {
        let deadDaemon = try XCTUnwrap(mounted.daemonPID)
        try mounted.failing("sync_file_range", with: "EIO") {
            syscall("""
            f = os.open('Documents/saved.txt', os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(f, b'saved and synced\\n')
            os.fsync(f)
            os.close(f)
            """, errno: 0)
            usleep(100_000)
            mounted.crashDaemon()
        }
        let left = (try? FileManager.default.contentsOfDirectory(atPath: mounted.store.workPath + "/shadows/\(deadDaemon)")) ?? []
        print("crash test: the dead daemon left \(left.filter { PublishRecord.parse($0) != nil }.count) record(s)")
        try mounted.remount()
        XCTAssertEqual(sh("cat Documents/saved.txt"), "saved and synced\n")
    }

    /// What a stopped daemon left that cannot be put right (here a new file it was writing, which
    /// must go back to empty, made immutable) keeps the next mount from starting, and says why:
    /// otherwise the file would be served as a crash left it.
    func testAMountRefusesWhatItCannotRecoverAndSaysWhy() throws {
        try XCTSkipIf(geteuid() != 0, "making a file immutable needs root")
        sh("printf 'half written' > Documents/left.txt")
        mounted.crashDaemon()
        let file = mounted.backing() + "/Documents/left.txt"
        let shadows = mounted.store.workPath + "/shadows/2147483640"
        try FileManager.default.createDirectory(atPath: shadows, withIntermediateDirectories: true)
        XCTAssertEqual(link(file, shadows + "/fresh-1"), 0)
        defer { _ = Shell.run("chattr -i \(Shell.quote(file))") }
        let made = Shell.run("chattr +i \(Shell.quote(file))")
        try XCTSkipIf(made.status != 0, "the filesystem has no immutable files: \(made.error)")
        XCTAssertThrowsError(try mounted.remount()) { error in
            XCTAssertTrue("\(error)".contains("cannot be put right"), "\(error)")
        }
        XCTAssertEqual(Shell.run("chattr -i \(Shell.quote(file))").status, 0)
        try mounted.remount()
        XCTAssertEqual(sh("stat -c %s Documents/left.txt"), "0\n", "a new file a daemon was writing goes back to empty")
        XCTAssertFalse(FileManager.default.fileExists(atPath: shadows))
    }
}
