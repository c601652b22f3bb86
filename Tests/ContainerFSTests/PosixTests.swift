import Glibc
import XCTest

/// Full POSIX behaviour where policy allows, as on a local disk.
final class PosixTests: MountedTestCase {
    func testFilesReadWriteSeekAndSync() {
        syscall("""
        fd = os.open('Documents/f', os.O_RDWR | os.O_CREAT, 0o640)
        assert os.write(fd, b'hello world') == 11
        os.fsync(fd); os.fdatasync(fd)
        assert os.pread(fd, 5, 6) == b'world'
        os.ftruncate(fd, 5)
        assert os.fstat(fd).st_size == 5
        os.posix_fallocate(fd, 0, 1 << 20)
        assert os.fstat(fd).st_size == 1 << 20
        os.pwrite(fd, b'end', 4 << 20)
        assert os.lseek(fd, 0, os.SEEK_HOLE) < 4 << 20
        assert os.lseek(fd, 2 << 20, os.SEEK_DATA) >= 2 << 20
        os.close(fd)
        assert oct(os.stat('Documents/f').st_mode & 0o777) == '0o640'
        """, errno: 0)
    }

    func testDirectoriesAndListings() {
        sh("mkdir -p Documents/a/b/c && touch Documents/a/b/c/{1..300}")
        XCTAssertEqual(sh("ls Documents/a/b/c | wc -l").trimmingCharacters(in: .whitespacesAndNewlines), "300")
        XCTAssertEqual(sh("find Documents/a | wc -l").trimmingCharacters(in: .whitespacesAndNewlines), "303")
        shFails("rmdir Documents/a", with: ENOTEMPTY)
        syscall("d = os.open('Documents/a', os.O_RDONLY | os.O_DIRECTORY); os.fsync(d)", errno: 0)
        sh("rm -r Documents/a")
    }

    /// A program that stats and writes in turn through passthrough (as in tmp) makes the kernel
    /// ask for the file's security.capability before each write; the daemon reads it once, and a
    /// capability set later, or a write's removal of it, shows as on a local disk.
    func testAFilesCapabilityReadsAsOnADisk() throws {
        let script = """
        python3 - <<'EOF'
        import os, struct
        cap = struct.pack('<IIIII', 0x02000001, 1 << 10, 0, 0, 0)
        def capability(path):
            try: return os.getxattr(path, 'security.capability').hex()
            except OSError as e: return e.strerror
        fd = os.open('f', os.O_RDWR | os.O_CREAT, 0o644)
        seen = [capability('f')]
        for round in range(3):
            os.fstat(fd); os.write(fd, b'x')
        seen.append(capability('f'))
        os.setxattr('f', 'security.capability', cap)
        seen.append(capability('f'))
        os.fstat(fd); os.write(fd, b'y')
        seen.append(capability('f'))
        os.setxattr('f', 'security.capability', cap)
        os.close(fd)
        with open('f', 'a') as f: f.write('z')
        seen.append(capability('f'))
        print(seen, open('f').read())
        EOF
        """
        everywhere(script, expected: "['No data available', 'No data available', '0100000200040000000000000000000000000000', "
                                     + "'No data available', 'No data available'] xxxyz\n")
        sh("touch tmp/asked")
        let asked = try mounted.calls("getxattr,fgetxattr") {
            syscall("""
            fd = os.open('tmp/asked', os.O_WRONLY)
            for round in range(20):
                os.fstat(fd); os.write(fd, b'x')
            os.close(fd)
            """, errno: 0)
        }.filter { $0.contains("security.capability") }
        XCTAssertLessThanOrEqual(asked.count, 2, "read for each of 20 writes: \(asked)")
    }

    func testSpecialFilesAndOwnership() {
        sh("mkfifo Documents/fifo && test -p Documents/fifo")
        sh("chown 1234:5678 Documents/hello.txt")
        XCTAssertEqual(sh("stat -c %u:%g Documents/hello.txt"), "1234:5678\n")
        XCTAssertEqual(sh("stat -c %u:%g \(Shell.quote(mounted.backing() + "/Documents/hello.txt"))"), "1234:5678\n")
        syscall("os.mknod('Documents/null', 0o600 | 0o020000, os.makedev(1, 3))", errno: EPERM)
    }

    func testFilesCreatedByAUserBelongToThatUser() throws {
        try XCTSkipIf(geteuid() != 0, "needs root to act as another user")
        mounted.unmount()
        mounted = try MountedStore(extraArguments: ["-o", "allow_other"]) { store in
            chmod(store.containerPath(.init("com.example.notes")!) + "/Documents", 0o777)
        }
        let result = Shell.run("setpriv --reuid=4242 --regid=4242 --clear-groups bash -c 'echo mine > Documents/mine && stat -c %u:%g Documents/mine'",
                               in: home)
        XCTAssertEqual(result.output, "4242:4242\n", result.error)
        shFails("setpriv --reuid=4242 --regid=4242 --clear-groups touch Documents/hello.txt", with: EACCES)
    }

    func testExtendedAttributes() {
        syscall("""
        os.setxattr('Documents/hello.txt', 'user.color', b'blue')
        assert os.getxattr('Documents/hello.txt', 'user.color') == b'blue'
        assert 'user.color' in os.listxattr('Documents/hello.txt')
        os.removexattr('Documents/hello.txt', 'user.color')
        assert 'user.color' not in os.listxattr('Documents/hello.txt')
        """, errno: 0)
        syscall("os.getxattr('Documents/hello.txt', 'user.none')", errno: ENODATA)
        // No ACLs or SELinux labels: said once, so that tools stop asking for every file.
        syscall("os.getxattr('Documents/hello.txt', 'system.posix_acl_access')", errno: EOPNOTSUPP)
        syscall("os.getxattr('Documents/hello.txt', 'security.selinux')", errno: EOPNOTSUPP)
        syscall("os.setxattr('Notes.app/Info.plist', 'user.color', b'red')", errno: EROFS)
        syscall("os.setxattr('Documents/Inbox/letter.txt', 'user.color', b'red')", errno: EACCES)
        syscall("os.removexattr('Documents/Inbox/letter.txt', 'user.color')", errno: EACCES)
    }

    func testLocksWorkAcrossProcesses() {
        // A lock held by one process is seen by another, through the mount, in both flavours.
        syscall("""
        import subprocess
        fd = os.open('Documents/hello.txt', os.O_RDWR)
        fcntl.lockf(fd, fcntl.LOCK_EX)
        probe = "import fcntl,os\\nfd=os.open('Documents/hello.txt', os.O_RDWR)\\ntry:\\n fcntl.lockf(fd, fcntl.LOCK_EX|fcntl.LOCK_NB)\\n print('free')\\nexcept OSError:\\n print('held')"
        assert subprocess.run(['python3', '-c', probe], capture_output=True, text=True).stdout.strip() == 'held'
        fcntl.lockf(fd, fcntl.LOCK_UN)
        assert subprocess.run(['python3', '-c', probe], capture_output=True, text=True).stdout.strip() == 'free'
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert subprocess.run(['flock', '-n', 'Documents/hello.txt', 'true']).returncode == 1
        fcntl.flock(fd, fcntl.LOCK_UN)
        assert subprocess.run(['flock', '-n', 'Documents/hello.txt', 'true']).returncode == 0
        """, errno: 0)
    }

    func testInodeNumbersAreStableForTheLifeOfTheMount() {
        let before = sh("stat -c %i Documents/hello.txt Notes.app/Info.plist Documents")
        // Make the kernel forget what it can, so the daemon looks the files up again.
        _ = Shell.run("sync; echo 2 > /proc/sys/vm/drop_caches")
        XCTAssertEqual(sh("stat -c %i Documents/hello.txt Notes.app/Info.plist Documents"), before)
        XCTAssertEqual(sh("ls -i Documents/hello.txt | cut -d' ' -f1"), sh("stat -c %i Documents/hello.txt"))
    }

    func testStatfsReportsTheBackingFilesystem() {
        let output = sh("stat -f -c '%b %S' .").split(separator: " ")
        XCTAssertEqual(output.count, 2)
        XCTAssertGreaterThan(Int(output[0]) ?? 0, 0)
        sh("df . > /dev/null")
    }
}
