import Foundation
import XCTest

/// What ordinary tools expect of a local disk, each checked in a plain directory first.
final class DiskLikeTests: MountedTestCase {
    /// A name found missing stays missing for the kernel only until the mount makes it, whatever
    /// makes it; a program that asks for it again and again (SQLite's journal checks) is answered
    /// by the kernel (docs/conformance.md, "Missing names").
    func testAMissingNameIsRememberedUntilTheMountMakesIt() throws {
        everywhere("""
        python3 - <<'EOF'
        import os
        def seen(name): return os.path.lexists(name)
        made = []
        for make in ("open('n', 'w').close()", "os.mkdir('n')", "os.symlink('t', 'n')", "os.link('other', 'n')",
                     "os.rename('other', 'n')", "os.mknod('n', 0o600 | 0o010000)"):
            open('other', 'a').close()
            before = seen('n')
            exec(make)
            made.append((before, seen('n')))
            os.rmdir('n') if os.path.isdir('n') and not os.path.islink('n') else os.unlink('n')
            made.append(seen('n'))
        print(made)
        EOF
        """, expected: "[(False, True), False, (False, True), False, (False, True), False, (False, True), False, "
                       + "(False, True), False, (False, True), False]\n")
        let asked = try mounted.calls("newfstatat") {
            syscall("""
            for round in range(20):
                assert not os.path.exists('Documents/absent')
            """, errno: 0)
        }.filter { $0.contains("\"absent\"") }
        XCTAssertLessThanOrEqual(asked.count, 2, "looked up for each of 20 checks: \(asked)")
    }

    /// Where names come from outside the mount, a name found missing is asked for again: a
    /// delivery to the Inbox shows at once to a program that looked for it before.
    func testADeliveryShowsAtOnceAfterALookUpFoundItMissing() throws {
        let file = mounted.root.appendingPathComponent("late.txt").path
        XCTAssertTrue(FileManager.default.createFile(atPath: file, contents: Data("late\n".utf8)))
        let result = Shell.run("""
        test ! -e Documents/Inbox/late.txt
        \(Shell.quote(MountedStore.executable)) deliver \(Shell.quote(mounted.store.root)) com.example.notes \(Shell.quote(file)) > /dev/null
        cat Documents/Inbox/late.txt
        """, in: home)
        XCTAssertEqual(result.output, "late\n", result.error)
    }

    func testTimesSetOnNewFilesAreKept() {
        // touch -d sets the times through the descriptor it created the file with; tar -x and
        // cp -p set them on files just written, empty ones too.
        everywhere("""
        touch -d 2001-01-01 new && stat -c '%y %s %n' new
        mkdir -p src && : > src/empty && echo data > src/full && touch -d 2003-03-03 src/empty src/full
        tar cf - -C src empty full | (mkdir -p untarred && tar xf - -C untarred)
        stat -c '%y %s %n' untarred/empty untarred/full
        cp -p src/empty copied && stat -c '%y %s %n' copied
        """, expected: """
        2001-01-01 00:00:00.000000000 +0000 0 new
        2003-03-03 00:00:00.000000000 +0000 0 untarred/empty
        2003-03-03 00:00:00.000000000 +0000 5 untarred/full
        2003-03-03 00:00:00.000000000 +0000 0 copied

        """)
    }

    /// What `tar -x` does to each file it makes: times, owner and mode set through the descriptor
    /// it writes with, before its close; here also after a rename, after an unlink, and after
    /// someone else opened the file (which gives the writes a shadow of their own).
    func testAttributesSetThroughANewFilesDescriptorAreKept() {
        everywhere("""
        python3 - <<'EOF'
        import os
        made = os.open("made", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(made, b"data")
        os.utime(made, (1000000000, 1000000000))
        os.fchown(made, 65534, 65534)
        os.fchmod(made, 0o4751)
        print(oct(os.stat("made").st_mode), os.stat("made").st_uid)
        os.rename("made", "moved")
        os.fchmod(made, 0o640)
        os.utime(made, (1100000000, 1100000000))
        os.close(made)
        gone = os.open("gone", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(gone, b"x")
        os.unlink("gone")
        os.fchmod(gone, 0o604)
        os.utime(gone, (1200000000, 1200000000))
        found = os.fstat(gone)
        print(oct(found.st_mode), int(found.st_mtime))
        os.close(gone)
        shared = os.open("shared", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(shared, b"abc")
        reader = os.open("shared", os.O_RDONLY)
        os.fchmod(shared, 0o644)
        os.utime(shared, (1300000000, 1300000000))
        print(oct(os.fstat(reader).st_mode))
        os.close(reader)
        os.close(shared)
        EOF
        stat -c '%a %u %g %Y %s %n' moved shared
        """, expected: """
        0o104751 65534
        0o100604 1200000000
        0o100644
        640 65534 65534 1100000000 4 moved
        644 0 0 1300000000 3 shared

        """)
    }

    /// A file made and closed unwritten keeps its change time (pjdfstest's unlink/00.t reads it
    /// right after `create`, and again a second later). Its mark, a link, goes at its release:
    /// the kernel kept the create's answer, from before, for its attribute timeout.
    func testAFileClosedUnwrittenKeepsItsChangeTime() {
        everywhere("""
        python3 -c "import os; os.close(os.open('made', os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))"
        sleep 0.2
        first=$(stat -c %z made)
        sleep 1.1
        test "$first" = "$(stat -c %z made)" && echo kept
        """, expected: "kept\n")
    }

    /// An open for writing reads nothing: the access time stays (the daemon's copy of the file for
    /// the shadow moved it, which mail readers comparing it with the modification time notice).
    func testAnOpenForWritingLeavesTheAccessTime() {
        everywhere("""
        echo x > at && touch -d 2001-01-01 at && touch -m -d 2002-02-02 at
        python3 -c "import os; os.close(os.open('at', os.O_WRONLY))"
        stat -c '%x' at
        """, expected: "2001-01-01 00:00:00.000000000 +0000\n")
    }

    /// Python for file handles: `handle(name)` is `name_to_handle_at`'s answer, a `Handle`.
    private static let fileHandles = """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        class Handle(ctypes.Structure):
            _fields_ = [("size", ctypes.c_uint), ("type", ctypes.c_int), ("bytes", ctypes.c_ubyte * 128)]
        def handle(name):
            found, mount = Handle(size=128), ctypes.c_int()
            assert libc.name_to_handle_at(-100, name.encode(), ctypes.byref(found), ctypes.byref(mount), 0) == 0
            return found
        """

    func testAFileHandleNeverOpensAnotherFile() {
        // A file handle (`name_to_handle_at`, as an NFS server keeps them) names the kernel's inode
        // number and a generation. The daemon's inode numbers are its nodes' addresses, which a
        // node made after another was freed may get: a handle of the removed file then names the
        // new one, and only the generation tells them apart. The stale handle is made here by
        // giving one file's handle the other's generation.
        everywhere("""
        python3 - <<'EOF'
        \(Self.fileHandles)
        def read(found):
            descriptor = libc.open_by_handle_at(here, ctypes.byref(found), os.O_RDONLY)
            if descriptor < 0: return os.strerror(ctypes.get_errno())
            with os.fdopen(descriptor) as opened: return opened.read()
        here = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
        open("old", "w").write("old"); open("new", "w").write("new")
        old, new = handle("old"), handle("new")
        print(read(old), read(new))
        # Where the generation is: ext4's handles are (inode, generation), FUSE's (node id, generation).
        at = {1: 4, 0x81: 8}[new.type]
        stale = Handle.from_buffer_copy(new)
        stale.bytes[at:at + 4] = old.bytes[at:at + 4]
        print(read(stale))
        EOF
        """, expected: "old new\nStale file handle\n")
    }

    func testADirectorysHandleReopensItWhereverItIsNow() {
        // An NFS server reopens a directory from its handle, and the kernel then reconnects it to
        // the tree: it asks for the directory's parent (`..`), and finds its name there. An inotify
        // watch keeps the directory's inode while its dentries are dropped, as a server's own
        // references would; the directories are renamed meanwhile.
        everywhere("""
        mkdir -p a/b/c
        python3 - <<'EOF'
        \(Self.fileHandles)
        here = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
        watches = libc.inotify_init1(0)
        handles = {name: handle(name) for name in ["a", "a/b", "a/b/c"]}
        for name in handles: assert libc.inotify_add_watch(watches, name.encode(), 0x4) >= 0
        os.rename("a/b", "a/d")
        os.rename("a", "e")
        os.system("sync; echo 2 > /proc/sys/vm/drop_caches")
        for name, found in handles.items():
            descriptor = libc.open_by_handle_at(here, ctypes.byref(found), os.O_RDONLY)
            if descriptor < 0:
                print(name, os.strerror(ctypes.get_errno()))
                continue
            print(name, os.path.relpath(os.readlink("/proc/self/fd/%d" % descriptor)), sorted(os.listdir(descriptor)))
        EOF
        """, expected: "a e ['d']\na/b e/d ['c']\na/b/c e/d/c []\n")
    }

    func testNewItemsHaveTheModeAskedForWhateverTheDaemonsUmask() {
        // The kernel applies the caller's umask; the daemon's own (022 here) must not be applied again.
        XCTAssertNotEqual(Self.daemonUmask, 0, "the daemon's umask would hide the difference")
        everywhere("""
        umask 0
        python3 -c 'import os; os.close(os.open("f", os.O_CREAT | os.O_WRONLY, 0o777)); os.mkfifo("p", 0o666)'
        mkdir d0 && : > f0
        umask 002 && mkdir d2 && : > f2
        umask 077 && mkdir d7 && : > f7
        stat -c '%a %n' f p d0 f0 d2 f2 d7 f7
        """, expected: "777 f\n666 p\n777 d0\n666 f0\n775 d2\n664 f2\n700 d7\n600 f7\n")
    }

    private static let daemonUmask: mode_t = {
        let mask = umask(0o022)
        umask(mask)
        return mask
    }()

    func testRewritingPartOfASparseFileKeepsItsHoles() {
        // A write-only open without truncation (dd opens read-write) is a rewrite, published
        // whole; its copy of the file must not fill the holes.
        everywhere("""
        truncate -s 1G sparse
        write() { python3 -c 'import os, sys; f = os.open("sparse", os.O_WRONLY); os.pwrite(f, sys.argv[2].encode(), int(sys.argv[1])); os.close(f)' "$@"; }
        write 500000000 middle
        write 1073741821 end
        stat -c '%s' sparse
        [ "$(du -k sparse | cut -f1)" -lt 1024 ] && echo "holes kept"
        dd if=sparse bs=1 skip=500000000 count=6 status=none; echo
        tail -c 3 sparse; echo
        """, expected: "1073741824\nholes kept\nmiddle\nend\n")
    }

    func testRewritingPartOfAFileKeepsTheSpaceReservedBeyondItsEnd() throws {
        // Logs and databases reserve space past their end (fallocate --keep-size) and write into it;
        // a rewrite published whole must keep the reservation, as the file itself would.
        guard Shell.run("stat -f -c %t \(Shell.quote(mounted.store.workPath))").output == "ef53\n" else {
            throw XCTSkip("the store is not on ext4, the only filesystem where the daemon keeps reservations")
        }
        everywhere("""
        echo hello > reserved && fallocate -n -l 1M reserved
        python3 -c 'import os; f = os.open("reserved", os.O_WRONLY); os.pwrite(f, b"J", 0); os.close(f)'
        echo "$(stat -c '%s' reserved) $(( $(stat -c '%b * %B' reserved) >= 1048576 ))"
        cat reserved
        """, expected: "6 1\nJello\n")
    }

    func testUnnamedFilesAreWrittenAndThenNamedByLink() {
        // open(O_TMPFILE) then linkat(AT_SYMLINK_FOLLOW): how glibc's and systemd's writers publish
        // a finished file. O_EXCL makes one that can never be named.
        everywhere("""
        python3 - <<'PY'
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        def link(fd, name):
            if libc.linkat(-100, f"/proc/self/fd/{fd}".encode(), -100, name.encode(), 0x400) != 0:
                return os.strerror(ctypes.get_errno())
            return "linked"
        fd = os.open(".", os.O_TMPFILE | os.O_RDWR, 0o640)
        os.write(fd, b"first\\n")
        st = os.fstat(fd)
        print(oct(st.st_mode), st.st_nlink, st.st_size, sorted(n for n in os.listdir(".") if n != "Inbox"))
        print(link(fd, "named"), os.fstat(fd).st_nlink, open("named").read().strip())
        os.write(fd, b"second\\n")
        os.close(fd)
        print(repr(open("named").read()), oct(os.stat("named").st_mode))
        fd = os.open(".", os.O_TMPFILE | os.O_WRONLY | os.O_EXCL, 0o600)
        print(link(fd, "never"), os.path.exists("never"))
        os.close(fd)
        PY
        """, expected: """
        0o100640 0 6 []
        linked 1 first
        'first\\nsecond\\n' 0o100640
        No such file or directory False

        """)
    }

    func testARewriteCanMapTheFileSharedAndWriteThroughTheMapping() {
        // Linkers and fsx open with O_TRUNC, size the file, and write it through a shared mapping.
        everywhere("""
        echo "old contents" > out
        python3 - <<'PY'
        import mmap, os
        fd = os.open("out", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.ftruncate(fd, 8192)
        mapping = mmap.mmap(fd, 8192, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        mapping[0:4] = b"head"
        mapping[8188:8192] = b"tail"
        mapping.flush()
        mapping.close()
        os.close(fd)
        data = open("out", "rb").read()
        print(len(data), data[:4], data[-4:], data.count(0))
        PY
        """, expected: "8192 b'head' b'tail' 8184\n")
    }

    func testDirectIOWorksWithAlignedBuffers() {
        // O_DIRECT with aligned buffers (fio, databases): a new file, then an existing one opened again.
        everywhere("""
        python3 - <<'PY'
        import mmap, os
        block = mmap.mmap(-1, 8192); block.write(b"d" * 8192)
        for flags in (os.O_RDWR | os.O_CREAT, os.O_RDWR):
            fd = os.open("direct.bin", flags | os.O_DIRECT, 0o644)
            written = os.pwrite(fd, block, 65536)
            back = mmap.mmap(-1, 8192)
            read = os.preadv(fd, [back], 65536)
            os.close(fd)
            print(written, read, back[:1], os.stat("direct.bin").st_size)
        PY
        """, expected: "8192 8192 b'd' 73728\n8192 8192 b'd' 73728\n")
    }

    func testAWriteThroughASharedMappingMovesTheTimesAtOnce() {
        // As xfstests generic/080: the times another process stats right after the writer exits.
        everywhere("""
        printf 'four' > mapped && stat -c %.9Y mapped > before && sleep 0.1
        python3 -c 'import mmap, os; fd = os.open("mapped", os.O_RDWR); m = mmap.mmap(fd, 4); m[0:1]; m[0:4] = b"FOUR"'
        [ "$(stat -c %.9Y mapped)" != "$(cat before)" ] && echo moved; cat mapped; echo
        """, expected: "moved\nFOUR\n")
    }

    /// A sync through the mount leaves the file's next write as a disk's sync does. Reading a
    /// file's times makes its next write take a fine-grained timestamp (Linux 6.13), which ext4
    /// journals, and the fdatasync after it waits for that commit; the daemon's sync read them
    /// (SQLite in WAL mode: 0.50–0.62 ms a transaction against 0.45–0.48 without). Counted over
    /// rounds in which the coarse clock did not tick, which moves the times anyway; a few may
    /// move still, when another file takes a fine-grained time meanwhile (the clock's floor).
    func testASyncLeavesTheNextWriteAsOnADisk() throws {
        func secondWrites(in directory: String, after look: String) -> String {
            let result = Shell.run("""
            python3 - <<'EOF'
            import os, time
            f = os.open("log", os.O_RDWR | os.O_CREAT, 0o644)
            quiet = moved = 0
            for _ in range(400):
                if quiet == 20: break
                os.stat("log")
                tick = time.clock_gettime_ns(5)  # CLOCK_REALTIME_COARSE
                os.pwrite(f, b"a", 0)
                before = time.clock_gettime_ns(time.CLOCK_REALTIME)
                \(look)
                os.pwrite(f, b"b", 0)
                if time.clock_gettime_ns(5) != tick: continue
                quiet += 1
                moved += os.stat("log").st_ctime_ns > before
            os.close(f)
            os.unlink("log")
            print(f"{quiet} quiet rounds,", "few moved" if moved < 10 else f"{moved} moved")
            EOF
            """, in: directory, limit: 60)
            XCTAssertEqual(result.status, 0, "in \(directory): \(result.error)")
            return result.output
        }
        let plain = mounted.root.appendingPathComponent("plain-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: plain, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: plain) }
        let control = secondWrites(in: plain, after: "os.stat('log')")
        guard control == "20 quiet rounds, 20 moved\n" else {
            throw XCTSkip("a stat between two writes in \(plain) did not give the second a new time (\(control)): no multigrain timestamps here (Linux before 6.13), or a disk too slow for rounds within a clock tick")
        }
        let reference = secondWrites(in: plain, after: "os.fdatasync(f)")
        XCTAssertEqual(reference, "20 quiet rounds, few moved\n", "a plain directory")
        for place in ["Documents", "Library/Application Support", "tmp"] {
            XCTAssertEqual(secondWrites(in: home + "/" + place, after: "os.fdatasync(f)"), reference, "in \(place)")
        }
    }
}
