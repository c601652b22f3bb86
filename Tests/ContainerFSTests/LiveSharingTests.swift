import Foundation
import XCTest

/// Programs that share a file while it is open (docs/atomic-replace.md, "Sharing a file live"):
/// databases, shared mappings, counters under locks, logs followed while appended. Each scenario
/// runs in a plain directory on the same disk first, so that the scenario itself is known to pass
/// there, then in Documents and in Library/Application Support of the mount.
final class LiveSharingTests: MountedTestCase {
    /// SQLite with two writer processes and a reader, then a writer killed mid-transaction.
    private func checkSQLite(journalMode: String) {
        everywhere("""
        sqlite3 db 'PRAGMA journal_mode=\(journalMode); CREATE TABLE t(x);' >/dev/null
        write() { for i in $(seq 1 100); do echo "INSERT INTO t VALUES($1);"; done | sqlite3 -cmd '.timeout 20000' db; }
        read() { for i in $(seq 1 20); do sqlite3 -cmd '.timeout 20000' db 'SELECT count(*) FROM t' >/dev/null; done; }
        write 1 & write 2 & read & wait
        sqlite3 db 'SELECT count(*) FROM t'
        # A connection that stays open sees what others commit.
        python3 - <<'EOF'
        import os, sqlite3, subprocess
        reader = sqlite3.connect('db', timeout=20)
        before = reader.execute('SELECT count(*) FROM t').fetchone()[0]
        subprocess.run(['sqlite3', 'db', 'PRAGMA synchronous=OFF; INSERT INTO t VALUES(3);'], check=True)
        print(reader.execute('SELECT count(*) FROM t').fetchone()[0] - before)
        EOF
        # Killed in the middle of a transaction: nothing of it stays, everything committed does.
        python3 -c "
        import os, sqlite3
        c = sqlite3.connect('db', timeout=20)
        c.execute('BEGIN')
        c.executemany('INSERT INTO t VALUES(?)', [(9,)] * 5000)
        os.kill(os.getpid(), 9)
        " || true
        sqlite3 -cmd '.timeout 20000' db 'PRAGMA integrity_check; SELECT count(*) FROM t'
        """, expected: "200\n1\nok\n201\n")
    }

    func testSQLiteInWALMode() { checkSQLite(journalMode: "WAL") }

    func testSQLiteWithARollbackJournal() { checkSQLite(journalMode: "DELETE") }

    /// LMDB (Debian's python3-lmdb, and its own mdb_stat, mdb_dump and mdb_load): two writer
    /// processes and a reader at once (its lock file is a shared mapping with the writers' mutexes
    /// in it), a reader that stays open seeing a later commit, a writer killed mid-transaction.
    func testLMDBWritersAndReadersInSeveralProcesses() throws {
        try XCTSkipIf(Shell.run("/usr/bin/python3 -c 'import lmdb' && command -v mdb_stat mdb_dump mdb_load").status != 0,
                      "python3-lmdb or lmdb-utils is missing (scripts/setup.sh installs them)")
        everywhere("""
        cat > writer.py <<'EOF'
        import lmdb, sys
        env = lmdb.open('db', map_size=64 << 20)
        for i in range(200):
            with env.begin(write=True) as txn:
                txn.put(b'%s-%03d' % (sys.argv[1].encode(), i), b'x' * 100)
        EOF
        cat > reader.py <<'EOF'
        import lmdb
        env = lmdb.open('db', map_size=64 << 20, readonly=True)
        last = 0
        for i in range(300):
            with env.begin() as txn:
                entries = txn.stat()['entries']
            assert entries >= last, (entries, last)
            last = entries
        EOF
        cat > late.py <<'EOF'
        import lmdb
        with lmdb.open('db', map_size=64 << 20).begin(write=True) as txn:
            txn.put(b'late', b'1')
        EOF
        cat > killed.py <<'EOF'
        import lmdb, os
        txn = lmdb.open('db', map_size=64 << 20).begin(write=True)
        for i in range(5000):
            txn.put(b'killed-%d' % i, b'y' * 100)
        os.kill(os.getpid(), 9)
        EOF
        /usr/bin/python3 - <<'EOF'
        import lmdb, subprocess
        env = lmdb.open('db', map_size=64 << 20)
        with env.begin(write=True) as txn:
            txn.put(b'start', b'1')
        children = [subprocess.Popen(['/usr/bin/python3', 'writer.py', w]) for w in 'ab']
        children.append(subprocess.Popen(['/usr/bin/python3', 'reader.py']))
        assert all(child.wait() == 0 for child in children)
        with env.begin() as txn:
            print(txn.stat()['entries'])
        subprocess.run(['/usr/bin/python3', 'late.py'], check=True)
        with env.begin() as txn:
            print(txn.get(b'late'))
        subprocess.run(['/usr/bin/python3', 'killed.py'])
        with env.begin() as txn:
            print(txn.stat()['entries'], txn.get(b'killed-1'))
        EOF
        mdb_stat db | grep Entries
        mkdir copy
        mdb_dump db | mdb_load -f /dev/stdin copy 2>/dev/null
        mdb_stat copy | grep Entries
        """, expected: "401\nb'1'\n402 None\n  Entries: 402\n  Entries: 402\n")
    }

    func testSharedMappingsReadAndWriteFromTwoProcesses() {
        everywhere("""
        python3 - <<'EOF'
        import mmap, os, subprocess
        with open('mapped', 'wb') as f:
            f.write(b'.' * 8192)
        fd = os.open('mapped', os.O_RDWR)
        m = mmap.mmap(fd, 8192, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        m[0:5] = b'first'
        other = '''
        import mmap, os
        fd = os.open('mapped', os.O_RDWR)
        m = mmap.mmap(fd, 8192, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        print(m[0:5].decode())
        m[4096:4102] = b'second'
        m.flush()
        '''
        print(subprocess.run(['python3', '-c', other], capture_output=True, text=True, check=True).stdout, end='')
        print(m[4096:4102].decode())
        ro = mmap.mmap(os.open('mapped', os.O_RDONLY), 8192, mmap.MAP_SHARED, mmap.PROT_READ)
        print(ro[0:5].decode())
        m.close()
        EOF
        """, expected: "first\nsecond\nfirst\n")
    }

    func testAGdbmDatabaseFillsAndReopens() throws {
        guard Shell.run("/usr/bin/python3 -c 'import dbm.gnu'").status == 0 else {
            throw XCTSkip("Debian's python3-gdbm is missing (scripts/setup.sh installs it)")
        }
        everywhere("""
        /usr/bin/python3 - <<'EOF'
        import dbm.gnu
        with dbm.gnu.open('gdbm', 'c') as db:
            for i in range(2000):
                db[b'key%d' % i] = b'value%d' % i
        with dbm.gnu.open('gdbm', 'r') as db:
            print(len(db.keys()), db[b'key1999'].decode())
        EOF
        """, expected: "2000 value1999\n")
    }

    /// A lock held on a file outlives another process's rewrite of it, as on a disk: a shell's
    /// `flock FILE -c 'echo new > FILE'` keeps others out. The rewrite goes to the file itself
    /// (docs/atomic-replace.md, "Files under locks"); its writer used to leave the node, and the
    /// lock on it, to the lock's holder, and the next process to ask got the lock.
    func testALockHeldOnAFileOutlivesARewriteOfIt() {
        everywhere("""
        echo v1 > data
        flock data -c 'echo v2 > data; sleep 1.5' & sleep 0.7
        flock -n data true && echo "flock: taken" || echo "flock: refused"
        wait; cat data
        cat > try.py <<'PY'
        import fcntl, os, subprocess, sys
        if sys.argv[1:] == ["hold"]:
            fcntl.lockf(os.open("data", os.O_RDWR), fcntl.LOCK_EX)
            subprocess.run("echo v3 > data", shell=True, check=True)
            print("lockf:", "taken" if subprocess.run([sys.executable, "try.py", "take"]).returncode == 0 else "refused")
        else:
            try: fcntl.lockf(os.open("data", os.O_RDWR), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError: sys.exit(1)
        PY
        python3 try.py hold; cat data
        """, expected: "flock: refused\nv2\nlockf: refused\nv3\n")
    }

    /// As above with /proc/locks longer than one read (64 KiB): 3,000 locks taken on another file
    /// after the mount's, on the same processor, come before it in the listing.
    func testALockHeldOnAFileOutlivesARewriteOfItAmongManyLocks() {
        everywhere("""
        echo v1 > data
        filler=$(mktemp)
        trap 'rm -f "$filler"' EXIT
        taskset -c 0 flock data -c 'while [ ! -e ready ]; do sleep 0.05; done; echo v2 > data; sleep 1.5' &
        sleep 0.3
        taskset -c 0 python3 -c '
        import fcntl, os, sys, time
        f = os.open(sys.argv[1], os.O_RDWR)
        for i in range(3000): fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 2 * i)
        open("ready", "w").close()
        time.sleep(2.5)
        ' "$filler" &
        while [ ! -e ready ]; do sleep 0.05; done
        [ "$(wc -c < /proc/locks)" -gt 65536 ] && echo "many locks"
        sleep 0.7
        flock -n data true && echo "flock: taken" || echo "flock: refused"
        wait; cat data
        """, expected: "many locks\nflock: refused\nv2\n")
    }

    func testACounterUnderLockfCountsEveryIncrement() {
        // Each process keeps its descriptor open; a reader opens the file again for every look.
        everywhere("""
        echo 0 > counter
        cat > count.py <<'EOF'
        import fcntl, os
        f = open('counter', 'r+')
        for _ in range(100):
            fcntl.lockf(f, fcntl.LOCK_EX)
            f.seek(0)
            value = int(f.read() or 0)
            f.seek(0)
            f.write(str(value + 1))
            f.flush()
            fcntl.lockf(f, fcntl.LOCK_UN)
            with open('counter') as look:
                look.read()
        EOF
        for n in 1 2 3 4; do python3 count.py & done; wait
        cat counter; echo
        """, expected: "400\n")
    }

    /// Live writers share one backing file in the kernel (FUSE passthrough): an appender's flags
    /// must not become another writer's, whichever of them opened first.
    func testAnAppendersFlagsStayItsOwnAmongLiveWriters() {
        everywhere("""
        python3 - <<'EOF'
        import os
        for first_appends in (True, False):
            with open('f', 'wb') as f: f.write(b'xxxx')
            appender_flags, other_flags = os.O_RDWR | os.O_APPEND, os.O_RDWR
            first = os.open('f', appender_flags if first_appends else other_flags)
            second = os.open('f', other_flags if first_appends else appender_flags)
            appender, other = (first, second) if first_appends else (second, first)
            os.write(appender, b'aa')
            os.pwrite(other, b'BB', 0)
            os.write(appender, b'cc')
            os.close(first); os.close(second)
            print(open('f', 'rb').read().decode())
        EOF
        """, expected: "BBxxaacc\nBBxxaacc\n")
    }

    func testTailFollowsAppends() {
        everywhere("""
        echo first > log
        (sleep 1; echo second >> log) &
        timeout 4 tail -f log || true
        echo first > log2
        (sleep 1; echo second >> log2) &
        timeout 4 tail -F log2 2>/dev/null || true
        """, expected: "first\nsecond\nfirst\nsecond\n")
    }

    /// A follower of a file rewritten whole (`>`) keeps the version it opened, `tail -F` too: the
    /// file keeps its inode number, and the follower's size stays its version's. Opted into in-place
    /// writes, the file is truncated in place and followed as on a disk. (The new version is the
    /// shorter, so that a follower on a disk tells the truncation from an append whatever the timing.)
    func testAFollowerOfARewrittenFileFollowsItOnceTheFileIsOptedIntoInPlaceWrites() {
        XCTAssertEqual(sh("""
        cd Documents && echo a-longer-first-line > status
        (sleep 1; echo second > status) &
        timeout 3 tail -F status 2>/dev/null || true
        echo --; cat status
        """), "a-longer-first-line\n--\nsecond\n")
        everywhere("""
        echo a-longer-first-line > status
        setfattr -n user.containerfs.write-in-place -v 1 status 2>/dev/null || true
        (sleep 1; echo second > status) &
        timeout 3 tail -F status 2>/dev/null || true
        echo a-longer-first-line > log
        setfattr -n user.containerfs.write-in-place -v 1 log 2>/dev/null || true
        (sleep 1; echo second > log) &
        timeout 3 tail -f log 2>/dev/null || true
        """, expected: "a-longer-first-line\nsecond\na-longer-first-line\nsecond\n")
    }

    func testAnAppenderKilledBySignalKeepsWhatItWrote() {
        everywhere("""
        timeout 1 sh -c 'while :; do echo tick; sleep .01; done >> log' || true
        [ "$(wc -l < log)" -gt 10 ] && echo kept
        """, expected: "kept\n")
    }

    func testAReadWriteWriterKilledKeepsWhatItWroteAsOnADisk() {
        everywhere("""
        echo intact > k
        python3 -c "import os; f = os.open('k', os.O_RDWR); os.write(f, b'TORN'); os.kill(os.getpid(), 9)" || true
        cat k
        """, expected: "TORNct\n")
    }

    func testARewriteWhileTheFileIsLiveReachesItsWriters() {
        // While a program shares the file, a rewrite is written in place too: the program sees it.
        everywhere("""
        echo old > shared
        python3 - <<'EOF'
        import os, subprocess
        fd = os.open('shared', os.O_RDWR)
        subprocess.run('echo new > shared', shell=True, check=True)
        print(os.pread(fd, 100, 0).decode(), end='')
        EOF
        """, expected: "new\n")
    }

    func testTheFileComesBackToAtomicReplaceWhenItsLiveWritersClose() {
        sh("echo one > Documents/f && python3 -c \"import os; os.close(os.open('Documents/f', os.O_RDWR))\"")
        syscall("""
        reader = open('Documents/f')
        with open('Documents/f', 'w') as writer:
            writer.write('two')
            writer.flush()
            import subprocess
            assert subprocess.run(['cat', 'Documents/f'], capture_output=True, text=True).stdout == 'one\\n'
        assert reader.read() == 'one\\n'
        assert open('Documents/f').read() == 'two'
        """, errno: 0)
    }
}
