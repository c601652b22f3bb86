import Containers
import FileCoordination
import Foundation
import XCTest

/// Previous versions (docs/versions.md): what rewrites and editors' saves leave, listed and put back
/// with `containerfs versions` and `containerfs restore-version`, within the mount's limits.
final class VersionTests: MountedTestCase {
    private let binary = Shell.quote(MountedStore.executable)

    /// The contents of the file's versions, oldest first, as `containerfs versions` lists them.
    private func versions(_ file: String, line: UInt = #line) -> [String] {
        versionPaths(file, line: line).map { path in (try? String(contentsOfFile: path, encoding: .utf8)) ?? "unreadable \(path)" }
    }

    /// The store paths of the file's versions, oldest first.
    private func versionPaths(_ file: String, line: UInt = #line) -> [String] {
        let listed = Shell.run("\(binary) versions \(Shell.quote(file))")
        XCTAssertEqual(listed.status, 0, listed.error, line: line)
        return listed.output.split(separator: "\n").map { String($0.split(separator: "\t").last ?? "") }
    }

    private func identifiers(_ file: String) -> [String] {
        Shell.run("\(binary) versions \(Shell.quote(file))").output.split(separator: "\n").map { String($0.prefix { $0 != "\t" }) }
    }

    /// Versions are moved aside after the writer's close, off its path: wait for them.
    private func waitForVersions(_ file: String, count: Int) {
        let deadline = Date().addingTimeInterval(10)
        while identifiers(file).count < count, Date() < deadline { usleep(20_000) }
    }

    func testRewritesAndEditorsSavesLeaveVersionsThatArePutBack() {
        // The edits do on the mount what they do on a plain directory.
        everywhere("""
        echo one > note.txt; echo two > note.txt; sed -i s/two/three/ note.txt
        vi -es -c 's/three/four/' -c wq note.txt; cat note.txt
        """, expected: "four\n")
        let file = home + "/Documents/note.txt"
        sh("echo one > Documents/note.txt; echo two > Documents/note.txt; sed -i s/two/three/ Documents/note.txt; vi -es -c 's/three/four/' -c wq Documents/note.txt")
        waitForVersions(file, count: 3)
        XCTAssertEqual(versions(file), ["one\n", "two\n", "three\n"])

        let first = identifiers(file)[0]
        let restored = Shell.run("\(binary) restore-version \(Shell.quote(file)) \(first)")
        XCTAssertEqual(restored.status, 0, restored.error)
        XCTAssertEqual(sh("cat Documents/note.txt"), "one\n")
        // What it replaced is a version in turn.
        waitForVersions(file, count: 4)
        XCTAssertEqual(versions(file), ["one\n", "two\n", "three\n", "four\n"])

        let removed = Shell.run("\(binary) versions \(Shell.quote(file)) --remove all")
        XCTAssertEqual(removed.output, "Removed 4 versions of \(file).\n", removed.error)
        XCTAssertEqual(versions(file), [])
        let unknown = Shell.run("\(binary) restore-version \(Shell.quote(file)) \(first)")
        XCTAssertNotEqual(unknown.status, 0)
        XCTAssertTrue(unknown.error.contains("has no version \(first)"), unknown.error)
    }

    /// A save that renames over one name of a hard-linked file replaces that name only: the file
    /// lives on under its other name, as on a disk, and is no version (it was: the other name
    /// showed a link too many, and its later writes changed the version).
    func testASaveOverAHardLinkedFileKeepsNoVersionOfIt() {
        everywhere("echo one > a; ln a b; echo two > n; mv n a; stat -c %h b; echo three > b; cat a b",
                   expected: "1\ntwo\nthree\n")
        sh("echo one > Documents/a; ln Documents/a Documents/b; sed -i s/one/two/ Documents/a")
        mounted.waitForUnsyncedPublishes()
        usleep(300_000)
        XCTAssertEqual(versions(home + "/Documents/a"), [])
        var attributes = stat()
        XCTAssertEqual(stat(mounted.backing() + "/Documents/b", &attributes), 0)
        XCTAssertEqual(attributes.st_nlink, 1, "no link into the versions")
        XCTAssertEqual(sh("cat Documents/a Documents/b"), "two\none\n")
    }

    func testOnlyDocumentsAndLibraryKeepVersionsAndBackupsLeaveThemOut() throws {
        sh("""
        mkdir -p Library/Caches/c; for n in 1 2; do echo $n > Library/Caches/c/x; echo $n > tmp/t; echo marker-$n > 'Library/Application Support/db'; done
        """)
        for file in ["Library/Caches/c/x", "tmp/t"] {
            let listed = Shell.run("\(binary) versions \(Shell.quote(home + "/" + file))")
            XCTAssertNotEqual(listed.status, 0, file)
            XCTAssertTrue(listed.error.contains("no versions are kept for it"), listed.error)
        }
        waitForVersions(home + "/Library/Application Support/db", count: 1)
        XCTAssertEqual(versions(home + "/Library/Application Support/db"), ["marker-1\n"])
        let archive = mounted.root.appendingPathComponent("backup.tar").path
        XCTAssertEqual(Shell.run("\(binary) backup \(Shell.quote(mounted.store.root)) \(SampleApps.notes) \(Shell.quote(archive))").status, 0)
        // The archive has the file as it is now, and not its previous version.
        XCTAssertEqual(Shell.run("grep -a -c marker-2 \(Shell.quote(archive)); grep -a -c marker-1 \(Shell.quote(archive))").output, "1\n0\n")
    }

    func testTheLimitsTheMountIsGiven() throws {
        try remount(with: "versions=2")
        let file = home + "/Documents/counted.txt"
        sh("for n in 1 2 3 4 5; do echo $n > Documents/counted.txt; done")
        waitForVersions(file, count: 2)
        mounted.waitForUnsyncedPublishes()
        usleep(300_000)
        XCTAssertEqual(versions(file), ["3\n", "4\n"])

        // Below the free-space floor, none is kept.
        try remount(with: "version_floor=1000000T")
        sh("echo a > Documents/floor.txt; echo b > Documents/floor.txt; sed -i s/b/c/ Documents/floor.txt")
        mounted.waitForUnsyncedPublishes()
        usleep(500_000)
        XCTAssertEqual(versions(home + "/Documents/floor.txt"), [])

        // versions=0 keeps none, and says so.
        try remount(with: "versions=0")
        sh("echo a > Documents/none.txt; echo b > Documents/none.txt")
        let listed = Shell.run("\(binary) versions \(Shell.quote(home + "/Documents/none.txt"))")
        XCTAssertTrue(listed.error.contains("no versions are kept for it"), listed.error)
        let bad = Shell.run("\(binary) mount \(Shell.quote(mounted.store.root)) /nonexistent -o versions=-1")
        XCTAssertTrue(bad.error.contains("versions takes how many previous versions"), bad.error)
    }

    /// A program's burst of rewrites or saves keeps the version from before it, not one per rewrite,
    /// so that it pushes none of the file's older versions out; another program's replacement (the
    /// next command of a script, a restore) is kept whenever it comes.
    func testABurstOfRewritesByOneProgramKeepsTheVersionFromBeforeIt() throws {
        try remount(with: "version_spacing=1")
        let file = home + "/Documents/burst.txt"
        // One shell: its redirections are one process's rewrites.
        sh("echo one > Documents/burst.txt; echo two > Documents/burst.txt; echo three > Documents/burst.txt")
        // Another program's, in a loop.
        sh("python3 -c \"for text in 'abcde': open('Documents/burst.txt', 'w').write(text)\"")
        // A third one's synced saves by rename: the file the first renames over is linked at once.
        sh("""
        python3 -c "
        import os
        for text in ('s1', 's2', 's3'):
            f = os.open('Documents/tmp.txt', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(f, text.encode()); os.fsync(f); os.close(f)
            os.rename('Documents/tmp.txt', 'Documents/burst.txt')
        "
        """)
        waitForVersions(file, count: 3)
        mounted.waitForUnsyncedPublishes()
        usleep(300_000)
        XCTAssertEqual(versions(file), ["one\n", "three\n", "e"])
        XCTAssertEqual(sh("cat Documents/burst.txt"), "s3")
        let bad = Shell.run("\(binary) mount \(Shell.quote(mounted.store.root)) /nonexistent -o version_spacing=soon")
        XCTAssertTrue(bad.error.contains("version_spacing takes a number of seconds"), bad.error)
    }

    /// While the store's filesystem is below the floor the oldest versions go, also when other
    /// writes filled it and no version was kept since (they stayed until the next keep, taking
    /// room a full disk's writers needed).
    func testVersionsGoWhenOtherWritesTakeTheDiskBelowTheFloor() throws {
        var disk = statvfs()
        XCTAssertEqual(statvfs(mounted.root.path, &disk), 0)
        let freeMiB = (UInt64(disk.f_bavail) * UInt64(disk.f_frsize)) >> 20
        try XCTSkipIf(freeMiB < 2048, "needs 2 GiB free beside the store, has \(freeMiB) MiB")
        try remount(with: "version_floor=\(freeMiB - 512)M")
        let file = home + "/Documents/kept.txt"
        sh("head -c 1048576 /dev/zero > Documents/kept.txt; echo b > Documents/kept.txt")
        waitForVersions(file, count: 1)
        XCTAssertEqual(identifiers(file).count, 1)
        // A gigabyte taken beside the store, by nothing the mount does.
        let filler = mounted.root.appendingPathComponent("filler").path
        XCTAssertEqual(Shell.run("fallocate -l 1G \(Shell.quote(filler))").status, 0)
        defer { unlink(filler) }
        let deadline = Date().addingTimeInterval(15)
        while !identifiers(file).isEmpty, Date() < deadline { usleep(200_000) }
        XCTAssertEqual(identifiers(file), [], "the version stayed below the floor")
    }

    func testASaveWhoseRenameFailsLeavesNoVersionOfItsOwn() throws {
        // An editor's save links the file it replaces into its versions before its rename. A rename
        // that fails removes the link again; one that cannot be removed is counted as kept, so that
        // the limits remove it in turn.
        try remount(with: "versions=1")
        let file = home + "/Documents/saved.txt"
        // A version kept first: the mount counts the versions it keeps from then on.
        sh("echo a > Documents/other.txt; echo b > Documents/other.txt; echo one > Documents/saved.txt; printf draft > Documents/.saved.swp")
        waitForVersions(home + "/Documents/other.txt", count: 1)
        mounted.waitForUnsyncedPublishes()
        usleep(300_000)
        let save = "python3 -c 'import os; os.rename(\"Documents/.saved.swp\", \"Documents/saved.txt\")'"
        try mounted.failing("renameat,renameat2", with: "EIO") {
            XCTAssertNotEqual(Shell.run(save, in: home).status, 0, "the save's rename fails")
        }
        XCTAssertEqual(versions(file), [], "nothing was replaced")
        try mounted.failing("renameat,renameat2,unlinkat", with: "EIO") {
            XCTAssertNotEqual(Shell.run(save, in: home).status, 0, "the save's rename fails")
        }
        XCTAssertEqual(versions(file), ["one\n"], "the link that could not go")
        sh(save)
        mounted.waitForUnsyncedPublishes()
        usleep(500_000)
        XCTAssertEqual(versions(file), ["one\n"], "versions=1: the save's version, the older link gone")
        XCTAssertEqual(sh("cat Documents/saved.txt"), "draft")
    }

    /// A save without a sync whose rename fails: the document, which the new file's record took as
    /// its previous version before the rename (`Shadows.renameUnwritten`), keeps its name, one
    /// link and no version, once the background has written the new file's data.
    func testASaveWithoutASyncWhoseRenameFailsLeavesTheDocumentAsItWas() throws {
        sh("echo doc-v1 > Documents/doc")
        let documents = mounted.backing() + "/Documents"
        // Renamed right after each close, most while the data is being written: some take that path.
        let saves = """
        import os
        errors = []
        for n in range(20):
            with open(f'Documents/.doc{n}.tmp', 'w') as f:
                f.write(f'doc-v2 {n}')
            try:
                os.rename(f'Documents/.doc{n}.tmp', 'Documents/doc')
                errors.append(0)
            except OSError as e:
                errors.append(e.errno)
        print(set(errors))
        """
        try mounted.failing("renameat,renameat2", with: "EIO", on: documents) {
            XCTAssertEqual(Shell.run("python3 -c \(Shell.quote(saves))", in: home).output, "{5}\n", "every save's rename fails")
        }
        var attributes = stat()
        let deadline = Date().addingTimeInterval(10)
        while stat(documents + "/doc", &attributes) == 0, attributes.st_nlink != 1, Date() < deadline { usleep(50_000) }
        XCTAssertEqual(attributes.st_nlink, 1, "no link to the document stays")
        mounted.waitForUnsyncedPublishes()
        usleep(300_000)
        XCTAssertEqual(sh("cat Documents/doc; cat Documents/.doc19.tmp"), "doc-v1\ndoc-v2 19")
        XCTAssertEqual(versions(home + "/Documents/doc"), [], "nothing replaced it")
    }

    private func inode(_ path: String) -> UInt64? {
        var attributes = stat()
        return lstat(path, &attributes) == 0 ? UInt64(attributes.st_ino) : nil
    }

    func testAVersionTheLimitsRemoveIsReusedOnlyWhereNothingOfItCanShow() throws {
        // The inode of a version the limits remove becomes the next spare shadow (`Shadows.recycle`).
        try remount(with: "versions=1")
        let documents = home + "/Documents"

        // A version someone has open keeps what they read: it is not reused.
        sh("echo kept-open > Documents/held.txt; echo second > Documents/held.txt")
        waitForVersions(documents + "/held.txt", count: 1)
        let heldPath = try XCTUnwrap(versionPaths(documents + "/held.txt").first)
        let held = try XCTUnwrap(FileHandle(forReadingAtPath: heldPath))
        defer { try? held.close() }
        let heldInode = inode(heldPath)
        sh("for n in 3 4 5 6 7 8; do echo $n > Documents/held.txt; touch Documents/new-held-$n; done")
        mounted.waitForUnsyncedPublishes()
        usleep(300_000)
        XCTAssertFalse(FileManager.default.fileExists(atPath: heldPath), "the limits removed it")
        XCTAssertEqual(String(decoding: try held.readToEnd() ?? Data(), as: UTF8.self), "kept-open\n")
        XCTAssertEqual(sh("cat Documents/held.txt"), "8\n")
        let written = (["held.txt"] + (3...8).map { "new-held-\($0)" }).compactMap { inode(mounted.backing() + "/Documents/" + $0) }
        XCTAssertFalse(written.contains(try XCTUnwrap(heldInode)), "no file made after took the held version's inode")

        // Root's rewrite of another user's set-user-ID file keeps owner and mode, as on a local disk
        // (the shadow took the owner after the mode, and the chown cleared the bit).
        everywhere("echo a > f; chown 4242:4242 f; chmod 4755 f; echo b > f; stat -c '%u:%g %a' f", expected: "4242:4242 4755\n")

        // Versions of another owner, with another mode, are reused, as the daemon's own spares: a
        // file made or rewritten after is the maker's, with the mode asked for.
        sh("echo a > Documents/theirs.txt; chown 4242:4242 Documents/theirs.txt; chmod 4755 Documents/theirs.txt")
        var removed = Set<UInt64>()
        for round in 0..<8 {
            removed.formUnion(versionPaths(documents + "/theirs.txt").compactMap(inode))
            sh("echo \(round) > Documents/theirs.txt")
            mounted.waitForUnsyncedPublishes()
            usleep(50_000)
        }
        removed.formUnion(versionPaths(documents + "/theirs.txt").compactMap(inode))
        var reused = 0
        for round in 0..<8 {
            sh("umask 022; echo \(round) > Documents/mine-\(round).txt; echo again > Documents/rewritten.txt; echo more > Documents/rewritten.txt")
            XCTAssertEqual(sh("stat -c '%u:%g %a' Documents/mine-\(round).txt Documents/rewritten.txt"), "0:0 644\n0:0 644\n")
            // The store's inodes: the mount shows another number for one it still shows for another file.
            let made = Shell.run("stat -c %i \(Shell.quote(mounted.store.root))/containers/*/Documents/{mine-\(round),rewritten}.txt")
            reused += made.output.split(separator: "\n").filter { UInt64($0).map(removed.contains) ?? false }.count
        }
        XCTAssertGreaterThan(reused, 0, "the removed versions' inodes came back as new files and versions")
        XCTAssertEqual(sh("stat -c '%u:%g %a' Documents/theirs.txt; cat Documents/theirs.txt"), "4242:4242 4755\n7\n")

        // A version with extended attributes is not reused: they would show on another file.
        sh("echo a > Documents/tagged.txt; setfattr -n user.tag -v secret Documents/tagged.txt")
        sh("for n in 1 2 3 4 5 6; do echo $n > Documents/tagged.txt; echo $n > Documents/plain.txt; echo $n > Documents/new-$n.txt; done")
        mounted.waitForUnsyncedPublishes()
        usleep(300_000)
        sh("for n in 1 2 3 4 5 6; do echo $n > Documents/plain.txt; echo $n > Documents/later-$n.txt; done")
        XCTAssertEqual(sh("getfattr --absolute-names -d -m - Documents/plain.txt Documents/new-*.txt Documents/later-*.txt"), "")
        XCTAssertEqual(sh("getfattr --absolute-names --only-values -n user.tag Documents/tagged.txt"), "secret")
    }

    func testAVersionThatCannotBeEmptiedIsRemovedNotReused() throws {
        // A reused version must be empty before it is a spare: a new file would show its data.
        try remount(with: "versions=1")
        try mounted.failing("ftruncate", with: "EIO") {
            sh("for n in 1 2 3 4 5 6; do echo secret-$n > Documents/kept.txt; done")
            mounted.waitForUnsyncedPublishes()
            usleep(300_000)
        }
        XCTAssertEqual(sh("cat Documents/kept.txt"), "secret-6\n")
        let shadows = mounted.store.workPath + "/shadows/\(try XCTUnwrap(mounted.daemonPID))"
        let sizes = Shell.run("stat -c %s \(Shell.quote(shadows))/shadow-*").output.split(separator: "\n")
        XCTAssertEqual(Set(sizes), ["0"], "only empty spares")
        sh("for n in 1 2 3 4 5 6 7 8 9; do touch Documents/new-$n; echo x > Documents/rewritten.txt; done")
        // Read in the store: the kernel would trust the sizes the daemon gave at creation.
        let documents = Shell.quote(mounted.store.root) + "/containers/*/Documents"
        XCTAssertEqual(Shell.run("cat \(documents)/new-* \(documents)/rewritten.txt").output, "x\n")
    }

    func testAVersionIsKeptAfterTheLastOneWasRemoved() {
        // Removing a file's last version removes its versions directory, which the mount made and
        // remembers: the next version makes it again.
        let file = home + "/Documents/again.txt"
        sh("echo one > Documents/again.txt; echo two > Documents/again.txt")
        waitForVersions(file, count: 1)
        XCTAssertEqual(Shell.run("\(binary) versions \(Shell.quote(file)) --remove all").status, 0)
        XCTAssertEqual(identifiers(file).filter { !$0.isEmpty }, [])
        sh("echo three > Documents/again.txt")
        waitForVersions(file, count: 1)
        XCTAssertEqual(versions(file), ["two\n"])
    }

    func testVersionsAreKeptAfterTheAppsVersionsWereRemovedByHand() throws {
        // The mount keeps the app's versions directory open; removed, it is made again.
        let first = home + "/Documents/first.txt", second = home + "/Documents/second.txt"
        sh("echo one > Documents/first.txt; echo two > Documents/first.txt")
        waitForVersions(first, count: 1)
        try FileManager.default.removeItem(atPath: VersionStore(store: mounted.store).root + "/" + SampleApps.notes)
        sh("echo one > Documents/second.txt; echo two > Documents/second.txt; echo three > Documents/first.txt")
        waitForVersions(second, count: 1)
        waitForVersions(first, count: 1)
        XCTAssertEqual(versions(second), ["one\n"])
        XCTAssertEqual(versions(first), ["two\n"])
    }

    func testVersionsGoWithTheirApp() throws {
        sh("echo a > Documents/gone.txt; echo b > Documents/gone.txt")
        waitForVersions(home + "/Documents/gone.txt", count: 1)
        let versions = VersionStore(store: mounted.store).root + "/" + SampleApps.notes
        XCTAssertTrue(FileManager.default.fileExists(atPath: versions))
        // (`containerfs uninstall` refuses while the store is mounted; the library leaves that to it.)
        try Lifecycle.uninstall(store: mounted.store, id: AppID(SampleApps.notes)!)
        XCTAssertFalse(FileManager.default.fileExists(atPath: versions))
    }

    func testTheClientLibrarysVersionsAreApplesNSFileVersion() throws {
        let url = URL(fileURLWithPath: home + "/Documents/report.txt")
        XCTAssertNil(FileVersion.otherVersionsOfItem(at: url), "no item, no versions")
        sh("echo draft > Documents/report.txt; echo final > Documents/report.txt")
        waitForVersions(url.path, count: 1)
        let current = try XCTUnwrap(FileVersion.currentVersionOfItem(at: url))
        XCTAssertEqual(current.url, url)
        let others = try XCTUnwrap(FileVersion.otherVersionsOfItem(at: url))
        XCTAssertEqual(others.count, 1)
        let draft = others[0]
        XCTAssertEqual(try String(contentsOf: draft.url, encoding: .utf8), "draft\n")
        XCTAssertEqual(FileVersion.version(itemAt: url, forPersistentIdentifier: draft.persistentIdentifier), draft)
        XCTAssertFalse(draft.isConflict)
        XCTAssertEqual(FileVersion.unresolvedConflictVersionsOfItem(at: url), [])
        // Put back by moving: the version is gone, and what it replaced is one now.
        XCTAssertEqual(try draft.replaceItem(at: url, options: .byMoving), url)
        XCTAssertEqual(try String(contentsOf: url, encoding: .utf8), "draft\n")
        waitForVersions(url.path, count: 1)
        XCTAssertEqual(versions(url.path), ["final\n"])
        XCTAssertThrowsError(try current.remove(), "the current version is not removed this way")
        try FileVersion.removeOtherVersionsOfItem(at: url)
        XCTAssertEqual(FileVersion.otherVersionsOfItem(at: url), [])
    }

    func testVersionsAreTheStoreOwnersAndNoOneElses() throws {
        try remount(with: "allow_other")
        let owner = "setpriv --reuid=4242 --regid=4242 --clear-groups", other = "setpriv --reuid=4243 --regid=4243 --clear-groups"
        let prepared = Shell.run("chown -R 4242:4242 \(Shell.quote(mounted.store.root)) && chmod 755 \(Shell.quote(mounted.root.path))")
        XCTAssertEqual(prepared.status, 0, prepared.error)
        let documents = Shell.quote(home + "/Documents")
        XCTAssertEqual(Shell.run("\(owner) sh -c 'echo a > \(documents)/mine.txt; echo b > \(documents)/mine.txt; mkdir -m 777 \(documents)/shared'").status, 0)
        XCTAssertEqual(Shell.run("\(other) sh -c 'echo a > \(documents)/shared/theirs.txt; echo b > \(documents)/shared/theirs.txt'").status, 0)
        waitForVersions(home + "/Documents/mine.txt", count: 1)
        // The daemon runs as root; what it made in the store is the owner's, who lists and removes.
        let listed = Shell.run("\(owner) \(binary) versions \(documents)/mine.txt --remove all")
        XCTAssertEqual(listed.output, "Removed 1 version of \(home)/Documents/mine.txt.\n", listed.error)
        // Another user's versions are in the store too, out of that user's reach; the owner reads them.
        let refused = Shell.run("\(other) \(binary) versions \(documents)/shared/theirs.txt")
        XCTAssertNotEqual(refused.status, 0)
        XCTAssertTrue(refused.error.contains("which only the store's owner may read"), refused.error)
        waitForVersions(home + "/Documents/shared/theirs.txt", count: 1)
        XCTAssertEqual(versions(home + "/Documents/shared/theirs.txt"), ["a\n"])
    }

    /// The versions directories are the store's owner's, and the daemon runs as root: a link the
    /// owner plants there must lead the daemon nowhere out of the store. One link takes the place
    /// of a file's versions directory and points at a folder of root's holding a file named as a
    /// version from 1970, which the limits would remove at the daemon's second keep; another takes the
    /// place of the container's versions directory and points at another folder of root's, where
    /// the next file's versions directory would be made and given to the owner.
    func testALinkPlantedInTheVersionsLeadsTheDaemonNowhere() throws {
        try remount(with: "allow_other")
        let owner = "setpriv --reuid=4242 --regid=4242 --clear-groups"
        let elsewhere = mounted.root.appendingPathComponent("elsewhere").path
        let outside = mounted.root.appendingPathComponent("outside").path
        for folder in [elsewhere, outside] { try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true) }
        try "root's\n".write(toFile: elsewhere + "/v-1", atomically: false, encoding: .utf8)
        let versions = Shell.quote(mounted.store.root + "/versions")
        let documents = Shell.quote(home + "/Documents")
        XCTAssertEqual(Shell.run("chown -R 4242:4242 \(Shell.quote(mounted.store.root)) && chmod 755 \(Shell.quote(mounted.root.path))").status, 0)
        let planted = Shell.run("""
        \(owner) sh -ec 'mkdir -p \(versions)/\(SampleApps.notes); ln -s \(Shell.quote(elsewhere)) \(versions)/\(SampleApps.notes)/planted
        echo a > \(documents)/first.txt; echo b > \(documents)/first.txt; echo c > \(documents)/first.txt'
        """)
        XCTAssertEqual(planted.status, 0, planted.error)
        // The first keep loads the store's versions; the second applies the limits to them.
        waitForVersions(home + "/Documents/first.txt", count: 2)
        mounted.waitForUnsyncedPublishes()
        usleep(300_000)
        XCTAssertEqual(try String(contentsOfFile: elsewhere + "/v-1", encoding: .utf8), "root's\n", "the daemon emptied or removed a file out of the store")
        let moved = Shell.run("""
        \(owner) sh -ec 'mv \(versions)/\(SampleApps.notes) \(versions)/moved; ln -s \(Shell.quote(outside)) \(versions)/\(SampleApps.notes)
        echo a > \(documents)/second.txt; echo b > \(documents)/second.txt'
        """)
        XCTAssertEqual(moved.status, 0, moved.error)
        mounted.waitForUnsyncedPublishes()
        usleep(500_000)
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: outside), [], "the daemon made something out of the store")
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: elsewhere), ["v-1"])
        // Without its versions the file is still written.
        XCTAssertEqual(sh("cat Documents/second.txt"), "b\n")
    }

    func testPresentersHearAVersionKept() throws {
        let documents = home + "/Documents"
        sh("echo one > Documents/heard.txt")
        let events = mounted.root.appendingPathComponent("events").path
        let result = Shell.run("""
        \(binary) watch \(Shell.quote(documents + "/heard.txt")) \(Shell.quote(documents)) >> \(Shell.quote(events)) &
        watcher=$!
        for i in $(seq 200); do grep -q . \(Shell.quote(events)) && break; touch \(Shell.quote(documents))/ready-$i; sleep 0.05; done
        echo two > \(Shell.quote(documents))/heard.txt
        # Both notices, which come from two presenters' queues in either order.
        for i in $(seq 100); do
          grep -q presentedSubitemDidGainVersion \(Shell.quote(events)) && grep -q presentedItemDidGainVersion \(Shell.quote(events)) && break
          sleep 0.05
        done
        kill $watcher; wait
        grep GainVersion \(Shell.quote(events))
        """, limit: 60)
        XCTAssertEqual(result.status, 0, result.error)
        XCTAssertEqual(Set(result.output.split(separator: "\n").map(String.init)), [
            "presentedItemDidGainVersion \(documents)/heard.txt",
            "presentedSubitemDidGainVersion \(documents)/heard.txt",
        ])
    }
}
