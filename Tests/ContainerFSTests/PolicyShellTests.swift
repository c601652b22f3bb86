import Glibc
import XCTest

/// Every row of the policy table (docs/policy.md), from the shell.
final class PolicyShellTests: MountedTestCase {
    func testMountRootListsAppsAndTakesNothingNew() {
        let root = mounted.mountPoint
        XCTAssertEqual(Shell.run("ls", in: root).output, "com.example.notes\ncom.example.photos\n")
        shFails("touch ../new", with: EACCES)
        shFails("mkdir ../new", with: EACCES)
        shFails("rmdir ../com.example.photos", with: EACCES)
        shFails("mv ../com.example.photos ../renamed", with: EACCES)
        shFails("chmod 700 ../com.example.photos", with: EACCES)
        XCTAssertEqual(sh("stat -c %A ..").trimmingCharacters(in: .whitespacesAndNewlines), "dr-xr-xr-x")
    }

    func testContainerRootHasOnlyItsFixedEntries() {
        XCTAssertEqual(sh("ls"), "Documents\nLibrary\nNotes.app\ntmp\n")
        XCTAssertEqual(sh("ls Library"), "Application Support\nCaches\nPreferences\n")
        shFails("touch new", with: EACCES)
        shFails("mkdir new", with: EACCES)
        shFails("ln -s Documents link", with: EACCES)
        shFails("rmdir tmp", with: EACCES)
        shFails("mv Documents Docs", with: EACCES)
        shFails("mv tmp Documents/tmp", with: EACCES)
        shFails("chmod 700 Documents", with: EACCES)
        shFails("touch -d 2001-01-01 Library", with: EACCES)
        XCTAssertEqual(sh("stat -c %A .").trimmingCharacters(in: .whitespacesAndNewlines), "dr-xr-xr-x")
    }

    func testBundleIsReadOnly() {
        XCTAssertEqual(sh("cat Notes.app/Resources/Deep/readme.txt"), "deep\n")
        XCTAssertEqual(sh("readlink Notes.app/Link"), "Info.plist\n")
        shFails("echo x > Notes.app/new", with: EROFS)
        shFails("echo x >> Notes.app/Info.plist", with: EROFS)
        shFails("truncate -s 0 Notes.app/Info.plist", with: EROFS)
        shFails("rm Notes.app/Info.plist", with: EROFS)
        shFails("rm -r Notes.app/Resources", with: EROFS)
        shFails("mv Notes.app/Info.plist Notes.app/Other.plist", with: EROFS)
        shFails("mkdir Notes.app/New", with: EROFS)
        shFails("ln -s Info.plist Notes.app/Another", with: EROFS)
        shFails("chmod 777 Notes.app/Info.plist", with: EROFS)
        shFails("touch Notes.app/Info.plist", with: EROFS)
        shFails("cp Documents/hello.txt Notes.app/", with: EROFS)
        shFails("mv Documents/hello.txt Notes.app/", with: EROFS)
        XCTAssertEqual(sh("stat -c %A Notes.app/Info.plist Notes.app/Resources"), "-r--r--r--\ndr-xr-xr-x\n")
    }

    func testInboxAllowsOnlyReadingDeletingAndMovingOut() {
        XCTAssertEqual(sh("cat Documents/Inbox/letter.txt"), "delivered\n")
        XCTAssertEqual(sh("stat -c %A Documents/Inbox/letter.txt").trimmingCharacters(in: .whitespacesAndNewlines), "-r--r--r--")
        // The Inbox itself.
        shFails("touch Documents/Inbox/new", with: EACCES)
        shFails("mkdir Documents/Inbox/new", with: EACCES)
        shFails("ln -s x Documents/Inbox/link", with: EACCES)
        shFails("rmdir Documents/Inbox", with: EACCES)
        shFails("mv Documents/Inbox Documents/Outbox", with: EACCES)
        shFails("chmod 700 Documents/Inbox", with: EACCES)
        // What is in it.
        shFails("echo x >> Documents/Inbox/letter.txt", with: EACCES)
        shFails("truncate -s 0 Documents/Inbox/letter.txt", with: EACCES)
        shFails("chmod 600 Documents/Inbox/letter.txt", with: EACCES)
        shFails("touch Documents/Inbox/letter.txt", with: EACCES)
        shFails("mv Documents/hello.txt Documents/Inbox/", with: EACCES)
        shFails("mv Documents/Inbox/letter.txt Documents/Inbox/folder/", with: EACCES)
        shFails("ln Documents/hello.txt Documents/Inbox/hard", with: EACCES)
        // Moving out is allowed, and the item becomes an ordinary, writable document.
        sh("mv Documents/Inbox/letter.txt Documents/")
        XCTAssertEqual(sh("stat -c %A Documents/letter.txt").trimmingCharacters(in: .whitespacesAndNewlines), "-rw-r--r--")
        sh("echo more >> Documents/letter.txt")
        sh("mv Documents/Inbox/folder Documents/folder && echo edited > Documents/folder/item.txt")
        XCTAssertEqual(sh("cat Documents/folder/item.txt"), "edited\n")
        XCTAssertEqual(sh("ls -A Documents/Inbox"), "")
    }

    func testInboxItemsCanBeDeleted() {
        sh("rm Documents/Inbox/letter.txt && rm -r Documents/Inbox/folder")
        XCTAssertEqual(sh("ls -A Documents/Inbox"), "")
    }

    func testTmpIsAVolumeOfItsOwn() {
        sh("echo t > tmp/a && mkdir tmp/d && mv tmp/a tmp/d/b && chmod 600 tmp/d/b && rm -r tmp/d")
        sh("echo t > tmp/x")
        syscall("os.rename('tmp/x', 'Documents/x')", errno: EXDEV)
        syscall("os.rename('Documents/hello.txt', 'tmp/hello.txt')", errno: EXDEV)
        syscall("os.link('tmp/x', 'Documents/x')", errno: EXDEV)
        // mv copies across, as between two filesystems.
        sh("mv tmp/x Documents/x")
        XCTAssertEqual(sh("cat Documents/x && ls -A tmp"), "t\n")
    }

    func testDocumentsAndLibraryAllowEverything() {
        sh("""
        echo a > Documents/a && mkdir -p Documents/d/e && mv Documents/a Documents/d/e/b && chmod 600 Documents/d/e/b \
        && touch -d 2001-01-01 Documents/d/e/b && ln -s e/b Documents/d/link && ln Documents/d/e/b Documents/hard \
        && mv Documents/d "Library/Application Support/d" && truncate -s 1 Documents/hard && rm -r "Library/Application Support/d" \
        && rm Documents/hard
        """)
        XCTAssertEqual(sh("ls -A Documents"), "Inbox\nhello.txt\n")
    }

    func testTmpIsEmptyAtEveryMount() throws {
        mounted.unmount()
        mounted = try MountedStore { store in
            try "left over\n".write(toFile: store.containerPath(.init("com.example.notes")!) + "/tmp/stale",
                                    atomically: false, encoding: .utf8)
        }
        XCTAssertEqual(sh("ls -A tmp"), "")
    }
}

/// One app mounted alone: its container is the mount point's root.
final class SingleAppMountTests: MountedTestCase {
    override var mountedApp: String? { "com.example.photos" }

    func testContainerIsTheRoot() {
        XCTAssertEqual(sh("ls"), "Documents\nLibrary\nPhotos.app\ntmp\n")
        shFails("touch new", with: EACCES)
        shFails("echo x > Photos.app/x", with: EROFS)
        sh("echo x > Documents/x && cat Documents/x")
        XCTAssertEqual(sh("stat -c %A .").trimmingCharacters(in: .whitespacesAndNewlines), "dr-xr-xr-x")
    }
}
