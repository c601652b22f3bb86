import Containers
import Foundation
import Glibc
import XCTest

/// Names with every byte, paths deeper than PATH_MAX, symlink loops, and stores that would contain
/// their own mount.
final class HostileTreeTests: MountedTestCase {
    func testNamesWithEveryByteTheKernelAllows() {
        syscall("""
        names = [bytes([b]) for b in range(1, 256) if b not in (ord('/'), ord('.'))]
        names += [b'..' + bytes([b]) for b in range(1, 256) if b != ord('/')]
        d = os.open(b'Documents', os.O_RDONLY | os.O_DIRECTORY)
        for name in names:
            fd = os.open(name, os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=d)
            os.write(fd, name)
            os.close(fd)
        listed = set(os.listdir(b'Documents'))
        assert set(names) <= listed, len(set(names) - listed)
        for name in names:
            fd = os.open(name, os.O_RDONLY, dir_fd=d)
            assert os.read(fd, 10) == name
            os.close(fd)
            os.unlink(name, dir_fd=d)
        """, errno: 0)
        XCTAssertEqual(sh("ls -A Documents"), "Inbox\nhello.txt\n")
    }

    func testPathsDeeperThanPathMax() {
        syscall("""
        d = os.open('Documents', os.O_RDONLY | os.O_DIRECTORY)
        for level in range(60):
            name = ('%03d' % level) + 'd' * 200
            os.mkdir(name, dir_fd=d)
            parent = d
            d = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=parent)
            os.close(parent)
        fd = os.open('deep.txt', os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=d)
        os.write(fd, b'bottom')
        os.close(fd)
        fd = os.open('deep.txt', os.O_RDONLY, dir_fd=d)
        assert os.read(fd, 10) == b'bottom'
        """, errno: 0)
        sh("rm -rf Documents/000*")
    }

    func testSymlinkLoopsAndLinksOutOfTheStore() {
        sh("ln -s loop-b Documents/loop-a && ln -s loop-a Documents/loop-b")
        shFails("cat Documents/loop-a", with: ELOOP)
        sh("ln -s /etc/hostname Documents/outside && cat Documents/outside > /dev/null")
        // Writing through a link that leaves the mount is the caller's own access, not the daemon's.
        XCTAssertEqual(sh("stat -c %F Documents/outside"), "symbolic link\n")
    }

    func testMountPointsInsideTheStoreAreRefused() throws {
        let inside = mounted.store.root + "/work/mnt-inside"
        try FileManager.default.createDirectory(atPath: inside, withIntermediateDirectories: true)
        let result = Shell.run("\(Shell.quote(MountedStore.executable)) mount -f \(Shell.quote(mounted.store.root)) \(Shell.quote(inside))")
        XCTAssertNotEqual(result.status, 0)
        XCTAssertTrue(result.error.contains("is inside the store"), result.error)
    }

    func testChangesBehindTheDaemonsBackAreServed() throws {
        XCTAssertEqual(sh("cat Documents/hello.txt"), "hello\n")
        try "changed in the store\n".write(toFile: mounted.backing() + "/Documents/hello.txt", atomically: true, encoding: .utf8)
        XCTAssertEqual(sh("cat Documents/hello.txt"), "changed in the store\n")
        try FileManager.default.removeItem(atPath: mounted.backing() + "/Documents/hello.txt")
        shFails("cat Documents/hello.txt", with: ENOENT)
    }

    func testAFileReplacedByAFIFOWhileAnOpenWaitsOpensTheFIFO() throws {
        // A client's coordinated write holds a reader's open after the daemon checked the name;
        // meanwhile a FIFO takes the file's place in the store. The daemon then opens by name what
        // it took for the file, which must neither block nor pass for it: the reader gets the FIFO,
        // as an open after the change gets it on a plain disk, and a writer's line through it.
        let backing = Shell.quote(mounted.backing() + "/Documents/hello.txt")
        let plain = mounted.root.appendingPathComponent("plain-fifo").path
        try FileManager.default.createDirectory(atPath: plain, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: plain) }
        let onDisk = Shell.run("""
            echo hello > file; rm file; mkfifo file
            timeout 10 cat file & sleep 0.5; timeout 10 sh -c 'echo fifo > file'; wait
            """, in: plain)
        XCTAssertEqual(onDisk.output, "fifo\n", onDisk.error)
        XCTAssertEqual(sh("cat Documents/hello.txt"), "hello\n")
        // The reader starts once the client holds the file (the marker), and the FIFO comes later.
        let marker = Shell.quote(plain + "/held")
        let replace = "touch \(marker); sleep 1; rm \(backing); mkfifo \(backing)"
        let result = Shell.run("""
            \(Shell.quote(MountedStore.executable)) coordinate --write Documents/hello.txt -- sh -c \(Shell.quote(replace)) & holder=$!
            for i in $(seq 200); do [ -e \(marker) ] && break; sleep 0.05; done
            sleep 0.2; timeout 10 cat Documents/hello.txt & reader=$!
            wait $holder; sleep 0.5; timeout 10 sh -c 'echo fifo > Documents/hello.txt'; wait $reader
            """, in: home)
        XCTAssertEqual(result.output, onDisk.output, result.error)
        XCTAssertEqual(sh("stat -c %F Documents/hello.txt"), "fifo\n")
    }
}
