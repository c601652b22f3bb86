import Glibc
import XCTest

/// No operation turns a denied write into an allowed one (docs/policy.md).
/// Each attempt is a system call with its exact errno.
final class EscapeTests: MountedTestCase {
    func testHardLinksOutOfReadOnlyPlaces() {
        syscall("os.link('Notes.app/Info.plist', 'Documents/plist')", errno: EROFS)
        syscall("os.link('Documents/Inbox/letter.txt', 'Documents/letter')", errno: EACCES)
        syscall("os.link('Documents/hello.txt', 'Notes.app/hello')", errno: EROFS)
    }

    func testRenameTricks() {
        syscall("os.rename('Notes.app/Info.plist', 'Documents/plist')", errno: EROFS)
        // The bundle is a read-only volume, its own directory included.
        syscall("os.rename('Notes.app', 'Documents/Notes.app')", errno: EROFS)
        syscall("os.rename('Documents/Inbox', 'Documents/Mine')", errno: EACCES)
        // Replacing a fixed directory by renaming an empty one over it.
        syscall("os.mkdir('Documents/empty'); os.rename('Documents/empty', 'Documents/Inbox')", errno: EACCES)
        let renameat2 = """
        libc = ctypes.CDLL(None, use_errno=True)
        def renameat2(a, b, flags):
            if libc.renameat2(-100, a.encode(), -100, b.encode(), flags) != 0:
                raise OSError(ctypes.get_errno(), 'renameat2')
        """
        syscall(renameat2 + "\nrenameat2('Documents/hello.txt', 'Notes.app/Info.plist', 2)", errno: EROFS)
        syscall(renameat2 + "\nrenameat2('Documents/hello.txt', 'Documents/Inbox/letter.txt', 2)", errno: EACCES)
        syscall(renameat2 + "\nopen('Documents/b', 'w').close()\nrenameat2('Documents/hello.txt', 'Documents/b', 1)", errno: EEXIST)
        syscall(renameat2 + "\nrenameat2('Documents/hello.txt', 'Documents/b', 2)", errno: 0)
        XCTAssertEqual(sh("cat Documents/b"), "hello\n")
    }

    func testTruncatingOpensOfReadOnlyFiles() {
        syscall("os.open('Notes.app/Info.plist', os.O_RDONLY | os.O_TRUNC)", errno: EROFS)
        syscall("os.open('Documents/Inbox/letter.txt', os.O_RDONLY | os.O_TRUNC)", errno: EACCES)
        syscall("os.open('Notes.app/Info.plist', os.O_WRONLY)", errno: EROFS)
        syscall("os.open('Documents/Inbox/letter.txt', os.O_RDWR)", errno: EACCES)
        XCTAssertEqual(sh("cat Documents/Inbox/letter.txt"), "delivered\n")
    }

    func testWritesThroughReadOnlyDescriptors() {
        // fallocate, copy_file_range and a writable shared mapping all need a descriptor open for writing.
        syscall("fd = os.open('Notes.app/Info.plist', os.O_RDONLY)\nos.posix_fallocate(fd, 0, 4096)", errno: EBADF)
        syscall("""
        src = os.open('Documents/hello.txt', os.O_RDONLY)
        dst = os.open('Notes.app/Info.plist', os.O_RDONLY)
        os.copy_file_range(src, dst, 5)
        """, errno: EBADF)
        syscall("fd = os.open('Documents/Inbox/letter.txt', os.O_RDONLY)\nmmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)",
                errno: EACCES)
        XCTAssertEqual(sh("cat Notes.app/Info.plist"), "<plist/>\n")
    }

    func testSymlinksAreResolvedForTheCallerNeverByTheDaemon() throws {
        // A link into the bundle gives no write access to it.
        sh("ln -s ../Notes.app/Info.plist Documents/to-bundle")
        syscall("os.open('Documents/to-bundle', os.O_WRONLY)", errno: EROFS)
        // A link planted in the store that points outside: the daemon shows the link itself.
        XCTAssertEqual(symlink("/etc/hostname", mounted.backing() + "/Documents/outside"), 0)
        XCTAssertEqual(sh("stat -c %F Documents/outside"), "symbolic link\n")
        XCTAssertEqual(sh("readlink Documents/outside"), "/etc/hostname\n")
        // Removing or renaming the link acts on the link, never on what it points to.
        sh("mv Documents/outside Documents/moved && rm Documents/moved")
        XCTAssertTrue(FileManager.default.fileExists(atPath: "/etc/hostname"))
    }

    func testHostileNames() {
        syscall("open('Documents/' + 'n' * 256, 'w')", errno: ENAMETOOLONG)
        syscall("open('Documents/' + 'n' * 255, 'w').close()", errno: 0)
        syscall("open('Documents/a\\nb\\tc\\x01\\xff'.encode('latin-1'), 'w').close()", errno: 0)
        XCTAssertEqual(sh("python3 -c 'import os; print(len(os.listdir(\"Documents\")))'"), "4\n")
        syscall("os.mkdir('Documents/../../com.example.photos/Documents/sneaky')", errno: 0)
        XCTAssertTrue(FileManager.default.fileExists(atPath: mounted.backing("com.example.photos") + "/Documents/sneaky"))
        syscall("os.mkdir('Documents/../../new-app')", errno: EACCES)
    }
}
