import Containers
import Coordination
import FileCoordination
import Foundation
import Glibc
import XCTest

/// The `containerfs` command as a new user meets it: mounting, unmounting, and what it says when
/// something is wrong.
final class MountCommandTests: XCTestCase {
    private var scratch: URL!
    // Joined as strings: a URL looks at the path it names, which under a mount asks the daemon
    // (and hangs while the daemon is stopped).
    private var mountPoint: String { scratch.path + "/mnt" }
    private var storePath: String { scratch.path + "/store" }

    override func setUpWithError() throws {
        scratch = FileManager.default.temporaryDirectory.appendingPathComponent("containerfs-cli-\(UUID().uuidString)")
        try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: true)
        let store = try Store.openOrCreate(storePath)
        try SampleApps.install(into: store, scratch: scratch.appendingPathComponent("bundles"))
    }

    override func tearDown() {
        // Whatever a test did, nothing stays mounted and no daemon keeps running.
        for _ in 0..<3 where isMounted {
            _ = Shell.run("fusermount3 -u -z \(Shell.quote(mountPoint))")
        }
        if let store = try? Store.open(storePath) {
            for mount in (try? MountRegistry.active(in: store)) ?? [] { kill(mount.pid, SIGKILL) }
        }
        try? FileManager.default.removeItem(at: scratch)
    }

    /// A store with the sample apps on a tmpfs of its own, unmounted at teardown.
    private func smallStore(megabytes: Int) throws -> Store {
        try XCTSkipIf(geteuid() != 0, "mounting a small tmpfs for the store needs root")
        let small = scratch.appendingPathComponent("tmpfs-\(megabytes)m").path
        try FileManager.default.createDirectory(atPath: small, withIntermediateDirectories: true)
        XCTAssertEqual(Shell.run("mount -t tmpfs -o size=\(megabytes)m tmpfs \(Shell.quote(small))").status, 0)
        addTeardownBlock { _ = Shell.run("umount -l \(Shell.quote(small))") }
        let store = try Store.openOrCreate(small + "/store")
        try SampleApps.install(into: store, scratch: scratch.appendingPathComponent("bundles-\(megabytes)m"))
        return store
    }

    /// Mounts `store` at the mount point until the test ends: its app's Documents.
    private func mountedDocuments(of store: Store) -> String {
        XCTAssertEqual(containerfs("mount \(Shell.quote(store.root)) \(Shell.quote(mountPoint))").status, 0)
        addTeardownBlock { _ = self.containerfs("unmount \(Shell.quote(self.mountPoint))") }
        return mountPoint + "/" + SampleApps.notes + "/Documents"
    }

    private var isMounted: Bool { isMounted(mountPoint) }

    private func isMounted(_ point: String) -> Bool {
        ((try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8)) ?? "").contains(" \(point) ")
    }

    private func containerfs(_ arguments: String, environment: String = "") -> Shell.Result {
        Shell.run("\(environment) \(Shell.quote(MountedStore.executable)) \(arguments) < /dev/null")
    }

    private func waitUntil(_ condition: () -> Bool, seconds: Double = 10) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while !condition() {
            if Date() > deadline { return false }
            usleep(20_000)
        }
        return true
    }

    func testAMountWhoseRecordCannotBeWrittenFailsAndSaysWhere() throws {
        try XCTSkipIf(geteuid() != 0, "making the records' directory immutable needs root")
        let records = try Store.open(storePath).workPath + "/mounts"
        try FileManager.default.createDirectory(atPath: records, withIntermediateDirectories: true)
        try XCTSkipIf(Shell.run("chattr +i \(Shell.quote(records))").status != 0,
                      "the filesystem has no immutable files (chattr +i failed)")
        defer { _ = Shell.run("chattr -i \(Shell.quote(records))") }
        let result = containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(mountPoint))")
        XCTAssertNotEqual(result.status, 0, "a mount nobody can find must not start")
        XCTAssertTrue((result.output + result.error).contains(records), result.output + result.error)
        XCTAssertFalse(isMounted)
    }

    func testAMountWhoseRecordCannotBeEmptiedOrWrittenFailsAndLeavesNone() throws {
        // strace fails the first of each call: the record's, the first file the mount writes.
        for (call, step) in [("ftruncate", "truncate"), ("pwrite64", "write")] {
            let result = Shell.run("strace -f -o /dev/null -e trace=\(call) -e inject=\(call):error=EIO:when=1 timeout 30 "
                                   + "\(Shell.quote(MountedStore.executable)) mount -f \(Shell.quote(storePath)) "
                                   + "\(Shell.quote(mountPoint)) < /dev/null")
            XCTAssertNotEqual(result.status, 0, "a mount nobody can find must not start (\(call))")
            XCTAssertTrue(result.error.contains(".json: \(step) failed: Input/output error"), result.error)
            XCTAssertFalse(isMounted)
            let records = try FileManager.default.contentsOfDirectory(atPath: try Store.open(storePath).workPath + "/mounts")
            XCTAssertEqual(records.filter { $0 != "registering.lock" }, [], "the failed mount's record is removed (\(call))")
        }
    }

    func testBackgroundMountAndUnmount() {
        let mount = containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(mountPoint))")
        XCTAssertEqual(mount.status, 0, mount.error)
        XCTAssertTrue(isMounted)
        XCTAssertEqual(Shell.run("ls", in: mountPoint).output, "com.example.notes\ncom.example.photos\n")
        let store = try! Store.open(storePath)
        XCTAssertEqual(try MountRegistry.active(in: store).map(\.mountPoint), [mountPoint])
        let unmount = containerfs("unmount \(Shell.quote(mountPoint))")
        XCTAssertEqual(unmount.status, 0, unmount.error)
        XCTAssertFalse(isMounted)
        XCTAssertTrue(waitUntil { (try? MountRegistry.active(in: store))?.isEmpty == true }, "the daemon kept running after unmount")
    }

    /// The whole store mounted at the mount point, with a file in notes' tmp, and a second mount
    /// point, unmounted at teardown if the test mounted it.
    private func storeMountedWithAFileInTmp() throws -> (kept: String, second: String, secondMounted: () -> Bool) {
        let second = scratch.path + "/second"
        try FileManager.default.createDirectory(atPath: second, withIntermediateDirectories: true)
        let secondMounted = { self.isMounted(second) }
        addTeardownBlock { if secondMounted() { _ = self.containerfs("unmount \(Shell.quote(second))") } }
        _ = mountedDocuments(of: try Store.open(storePath))
        let kept = mountPoint + "/" + SampleApps.notes + "/tmp/work.txt"
        try "in use\n".write(toFile: kept, atomically: false, encoding: .utf8)
        return (kept, second, secondMounted)
    }

    /// A second daemon for containers a running one serves is refused, and touches nothing: it
    /// would share none of the first mount's locks (each FUSE mount is a filesystem of its own to
    /// the kernel), and it emptied tmp under the first mount's programs. Apps mounted alone,
    /// each by its own daemon, share nothing and mount side by side. (A mount as root that asks
    /// nothing of a daemon's own shares the running one instead: the test after this.)
    func testASecondDaemonForTheSameContainersIsRefusedAndTouchesNothing() throws {
        let (kept, second, secondMounted) = try storeMountedWithAFileInTmp()
        let notes = mountPoint + "/" + SampleApps.notes
        for (arguments, shown) in [("-o versions=3", mountPoint), ("--app \(SampleApps.notes) -o versions=3", notes),
                                   ("--app \(SampleApps.notes) -o root=Documents,versions=3", notes + "/Documents")] {
            let refused = containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(second)) \(arguments)")
            XCTAssertNotEqual(refused.status, 0, arguments)
            XCTAssertTrue(refused.error.contains("the whole store is mounted at \(mountPoint)") && refused.error.contains("-o allow_overlap")
                          && refused.error.contains("`mount --bind \(shown) \(second)`"), refused.error)
            if geteuid() == 0 { XCTAssertTrue(refused.error.contains("since it asks for options of a daemon's own"), refused.error) }
            XCTAssertFalse(secondMounted(), arguments)
            XCTAssertEqual(try? String(contentsOfFile: kept, encoding: .utf8), "in use\n", "\(arguments): tmp kept")
        }
        XCTAssertEqual(try MountRegistry.active(in: Store.open(storePath)).map(\.mountPoint), [mountPoint], "no record left")

        // Apps alone: another app mounts beside one, a second daemon of the same app does not, nor the whole store.
        XCTAssertEqual(containerfs("unmount \(Shell.quote(mountPoint))").status, 0)
        XCTAssertEqual(containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(mountPoint)) --app \(SampleApps.notes)").status, 0)
        let photos = containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(second)) --app \(SampleApps.photos)")
        XCTAssertEqual(photos.status, 0, photos.error)
        XCTAssertEqual(containerfs("unmount \(Shell.quote(second))").status, 0)
        for (arguments, bind) in [("", nil), ("--app \(SampleApps.notes) -f", "`mount --bind \(mountPoint) \(second)`")] {
            let refused = containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(second)) \(arguments)")
            XCTAssertTrue(refused.status != 0 && refused.error.contains("\(SampleApps.notes) is mounted alone at \(mountPoint)")
                          && refused.error.contains("mount --bind") == (bind != nil) && bind.map(refused.error.contains) ?? true,
                          "\(arguments): \(refused.error)")
        }
    }

    /// A second mount as root of what a running daemon shows is a bind mount of that daemon's, as a
    /// block device's filesystem is shared by all its mounts: one daemon, so one set of locks, one
    /// tmp, one registration. Its own flags (read-only) apply to it alone; options of a daemon's
    /// own, or a mount in the foreground, are refused (the test before this). The daemon serves
    /// until its last mount goes, whichever is unmounted first, and an unmount that leaves
    /// another does not wait for it.
    func testASecondMountOfWhatARunningDaemonShowsSharesIt() throws {
        try XCTSkipIf(geteuid() != 0, "a bind mount needs root")
        let (kept, second, secondMounted) = try storeMountedWithAFileInTmp()
        let third = scratch.path + "/third"
        try FileManager.default.createDirectory(atPath: third, withIntermediateDirectories: true)
        addTeardownBlock { if self.isMounted(third) { _ = Shell.run("umount -l \(Shell.quote(third))") } }
        let shared = containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(second))")
        XCTAssertEqual(shared.status, 0, shared.error)
        XCTAssertEqual(shared.output + shared.error, "", "silent, as mount(8) is")
        XCTAssertTrue(secondMounted())
        let documents = containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(third)) --app \(SampleApps.notes) -o root=Documents,ro")
        XCTAssertEqual(documents.status, 0, documents.error)
        let entries = (try String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8)).split(separator: "\n")
            .map { $0.split(separator: " ") }.filter { [mountPoint, second, third].contains(String($0[4])) }
        XCTAssertEqual(Set(entries.map { $0[2] }).count, 1, "one filesystem: \(entries)")
        XCTAssertEqual(entries.first { $0[4] == third }.map { $0[5].split(separator: ",").filter { ["ro", "nosuid", "nodev"].contains($0) } },
                       ["ro", "nosuid", "nodev"])
        XCTAssertEqual(try MountRegistry.active(in: Store.open(storePath)).map(\.mountPoint), [mountPoint], "one daemon")
        XCTAssertEqual(try? String(contentsOfFile: kept, encoding: .utf8), "in use\n", "tmp kept")

        let file = "/" + SampleApps.notes + "/Documents/locked"
        let locks = Shell.run("""
        echo one > \(Shell.quote(mountPoint + file))
        cat \(Shell.quote(second + file)) \(Shell.quote(third + "/locked"))
        echo no > \(Shell.quote(third + "/locked")) 2>/dev/null || echo read-only
        flock \(Shell.quote(mountPoint + file)) -c 'touch \(Shell.quote(scratch.path))/held; sleep 3' &
        while [ ! -e \(Shell.quote(scratch.path))/held ]; do sleep 0.05; done
        flock -n \(Shell.quote(second + file)) -c 'echo second: taken' || echo second: kept out
        flock -n \(Shell.quote(third + "/locked")) -c 'echo third: taken' || echo third: kept out
        wait
        """, limit: 30)
        XCTAssertEqual(locks.output, "one\none\nread-only\nsecond: kept out\nthird: kept out\n", locks.error)

        // Root binds only what a record of root's alone names: another user's could name any mount.
        let records = try Store.open(storePath).workPath + "/mounts"
        let record = try XCTUnwrap(FileManager.default.contentsOfDirectory(atPath: records).first { $0.hasSuffix(".json") })
        XCTAssertEqual(chown(records + "/" + record, 4242, 4242), 0)
        let fourth = scratch.path + "/fourth"
        try FileManager.default.createDirectory(atPath: fourth, withIntermediateDirectories: true)
        let foreign = containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(fourth))")
        XCTAssertTrue(foreign.status != 0 && foreign.error.contains("since its record is not root's alone"), foreign.error)
        XCTAssertFalse(isMounted(fourth))
        XCTAssertEqual(chown(records + "/" + record, 0, 0), 0)

        let unmounted = containerfs("unmount \(Shell.quote(second))")
        XCTAssertEqual(unmounted.status, 0, unmounted.error)
        XCTAssertFalse(unmounted.error.contains("still finishing"), "waited for a daemon that serves on: \(unmounted.error)")
        XCTAssertEqual(containerfs("unmount \(Shell.quote(mountPoint))").status, 0)
        XCTAssertEqual(try? String(contentsOfFile: third + "/locked", encoding: .utf8), "one\n", "served while a mount of it is left")
        // Shared again from the mount that is left, the daemon's own mount point gone.
        let again = containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(second)) --app \(SampleApps.notes) -o root=Documents")
        XCTAssertEqual(again.status, 0, again.error)
        XCTAssertEqual(try? String(contentsOfFile: second + "/locked", encoding: .utf8), "one\n")
        XCTAssertEqual(containerfs("unmount \(Shell.quote(second))").status, 0)
        XCTAssertEqual(containerfs("unmount \(Shell.quote(third))").status, 0)
        XCTAssertTrue(waitUntil { (try? MountRegistry.active(in: Store.open(storePath)))?.isEmpty == true }, "the daemon outlived its last mount")
    }

    /// A sharing mount whose flags cannot be set leaves no bind mount behind (one without `ro`
    /// would write what was asked to be read-only), and says why.
    func testASharingMountWhoseFlagsFailLeavesNothingMounted() throws {
        try XCTSkipIf(geteuid() != 0, "a bind mount needs root")
        try XCTSkipIf(access("/usr/bin/strace", X_OK) != 0, "strace is not installed (scripts/setup.sh installs it)")
        let (_, second, secondMounted) = try storeMountedWithAFileInTmp()
        // The daemon's first mount(2) is the bind, its second the remount that sets the flags.
        let failed = Shell.run("""
            strace -f -o /dev/null -e trace=mount -e inject=mount:error=EPERM:when=2 \
              \(Shell.quote(MountedStore.executable)) mount \(Shell.quote(storePath)) \(Shell.quote(second)) -o ro < /dev/null
            """)
        XCTAssertNotEqual(failed.status, 0)
        XCTAssertTrue(failed.error.contains("cannot set the bind mount's flags: Operation not permitted"), failed.error)
        XCTAssertFalse(secondMounted(), "the bind mount was undone")
        XCTAssertEqual(try MountRegistry.active(in: Store.open(storePath)).map(\.mountPoint), [mountPoint], "the running daemon serves on")
        XCTAssertEqual(try? String(contentsOfFile: mountPoint + "/" + SampleApps.notes + "/tmp/work.txt", encoding: .utf8), "in use\n")
    }

    /// A presenter of a folder reached through a bind mount of an app's container (a second mount
    /// of it makes one) hears of its items by their paths in that mount, and `status` there shows
    /// them so. It heard them as `/APP/Documents/...`, paths of the daemon's tree from `/`.
    func testAPresenterThroughABindMountHearsItsOwnPaths() throws {
        try XCTSkipIf(geteuid() != 0, "a bind mount needs root")
        let (_, second, _) = try storeMountedWithAFileInTmp()
        let app = containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(second)) --app \(SampleApps.notes)")
        XCTAssertEqual(app.status, 0, app.error)
        let heard = scratch.path + "/heard"
        let documents = mountPoint + "/" + SampleApps.notes + "/Documents"
        let watched = Shell.run("""
        \(Shell.quote(MountedStore.executable)) watch --json \(Shell.quote(second + "/Documents")) > \(Shell.quote(heard)) &
        for i in $(seq 50); do grep -q Documents \(Shell.quote(heard)) 2>/dev/null && break; \
          \(Shell.quote(MountedStore.executable)) status \(Shell.quote(second)) | grep -q 'Presenters: 1' && break; sleep 0.1; done
        \(Shell.quote(MountedStore.executable)) status \(Shell.quote(second)) | grep -A1 '^Presenters'
        echo made > \(Shell.quote(documents + "/made.txt")) && mv \(Shell.quote(documents + "/made.txt")) \(Shell.quote(documents + "/moved.txt"))
        sleep 1; kill %1; wait
        """)
        let presenter = watched.output.split(separator: "\n").dropFirst().first.map(String.init) ?? ""
        XCTAssertTrue(presenter.hasPrefix("  \(second)/Documents  client"), "status: \(watched.output) \(watched.error)")
        let lines = ((try? String(contentsOfFile: heard, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
        XCTAssertTrue(lines.contains { $0.contains("presentedSubitemDidAppear") && $0.contains("\"\(second)/Documents/made.txt\"") }, "\(lines)")
        XCTAssertTrue(lines.contains { $0.contains("\"\(second)/Documents/moved.txt\"") }, "\(lines)")
        XCTAssertFalse(lines.contains { $0.contains("\"/\(SampleApps.notes)/") }, "paths of the daemon's tree from /: \(lines)")
    }

    /// The store mounted, and its notes app mounted again (a bind mount of it) at a directory named
    /// as the app: the names a path ends with alike do not tell its mount. Its path.
    private func appMountedAtADirectoryNamedAsTheApp() throws -> String {
        _ = try storeMountedWithAFileInTmp()
        let second = scratch.path + "/" + SampleApps.notes
        try FileManager.default.createDirectory(atPath: second, withIntermediateDirectories: true)
        addTeardownBlock { if self.isMounted(second) { _ = self.containerfs("unmount \(Shell.quote(second))") } }
        let app = containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(second)) --app \(SampleApps.notes)")
        XCTAssertEqual(app.status, 0, app.error)
        return second
    }

    /// The client library tells what a bind mount of an app shows from the kernel's mount table:
    /// at a directory named as the app, the names alone paired the directory above it with the
    /// daemon's root, and named another app's items there, where they are not.
    func testTheLibrarysViewOfABindMountIsWhatItShows() throws {
        try XCTSkipIf(geteuid() != 0, "a bind mount needs root")
        let second = try appMountedAtADirectoryNamedAsTheApp()
        let location = try XCTUnwrap(MountLocator().locate(path: second + "/Documents/new.txt"))
        XCTAssertEqual(location.itemPath, ItemPath(SampleApps.notes + "/Documents/new.txt"))
        let view = try XCTUnwrap(location.view)
        XCTAssertEqual(view, MountView(localRoot: second, daemonRoot: try XCTUnwrap(ItemPath(SampleApps.notes))))
        XCTAssertNil(view.url(for: try XCTUnwrap(ItemPath(SampleApps.photos + "/Documents"))), "another app is not in this mount")
    }

    /// `containerfs run` finds an app's container through the bind mounts a second mount made, once
    /// the daemon's own mount is gone: given the store, or the bind mount's path. It named the
    /// daemon's first mount point only, and found nothing there.
    func testRunFindsABindMountOnceTheDaemonsOwnMountIsGone() throws {
        try XCTSkipIf(geteuid() != 0, "a bind mount needs root")
        try XCTSkipIf(access("/usr/bin/bwrap", X_OK) != 0, "bubblewrap is not installed (scripts/setup.sh installs it)")
        let second = try appMountedAtADirectoryNamedAsTheApp()
        try "kept\n".write(toFile: second + "/Documents/note.txt", atomically: false, encoding: .utf8)
        let reads = "cat \"$HOME/Documents/note.txt\""
        for place in [storePath, mountPoint, second] {
            let ran = containerfs("run \(Shell.quote(place)) \(SampleApps.notes) -- sh -c \(Shell.quote(reads))")
            XCTAssertEqual(ran.output, "kept\n", "\(place), both mounts there: \(ran.error)")
        }
        XCTAssertEqual(containerfs("unmount \(Shell.quote(mountPoint))").status, 0)
        for place in [storePath, second] {
            let ran = containerfs("run \(Shell.quote(place)) \(SampleApps.notes) -- sh -c \(Shell.quote(reads))")
            XCTAssertEqual(ran.output, "kept\n", "\(place), the daemon's own mount gone: \(ran.error)")
        }
        // `status` through what is left, from any item in it, shows the app running.
        let running = Shell.run("""
        \(Shell.quote(MountedStore.executable)) run \(Shell.quote(second)) \(SampleApps.notes) -- sh -c 'touch "$HOME/tmp/started"; sleep 3' &
        for i in $(seq 100); do [ -e \(Shell.quote(second + "/tmp/started")) ] && break; sleep 0.05; done
        \(Shell.quote(MountedStore.executable)) status \(Shell.quote(second + "/Documents")) | grep -c '^  \(SampleApps.notes): launched by pid .*sleep'
        wait
        """)
        XCTAssertEqual(running.output, "1\n", running.error)
        // Another app is not in what is left.
        let other = containerfs("run \(Shell.quote(storePath)) \(SampleApps.photos) -- true")
        XCTAssertTrue(other.status != 0 && other.error.contains("has no mount that shows \(SampleApps.photos)'s container whole"), other.error)
        let elsewhere = containerfs("run \(Shell.quote(second)) \(SampleApps.photos) -- true")
        XCTAssertTrue(elsewhere.status != 0 && elsewhere.error.contains("does not show \(SampleApps.photos)'s container"), elsewhere.error)
        XCTAssertEqual(containerfs("unmount \(Shell.quote(second))").status, 0)
        XCTAssertTrue(waitUntil { (try? MountRegistry.active(in: Store.open(storePath)))?.isEmpty == true }, "the daemon outlived its last mount")
    }

    /// `umount` returns before the daemon has finished (its shadows, tmp emptied), and a mount right
    /// after waits for it rather than refusing it as a running daemon of the same containers.
    func testAMountRightAfterUmountWaitsForTheDaemonToFinish() throws {
        for round in 0..<6 {
            let mount = containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(mountPoint))")
            XCTAssertEqual(mount.status, 0, "round \(round): \(mount.error)")
            let container = Shell.quote(mountPoint + "/" + SampleApps.notes)
            let used = Shell.run("""
            for i in $(seq 200); do echo $i > \(container)/Documents/f$i && echo $i > \(container)/tmp/t$i || exit 1; done
            umount \(Shell.quote(mountPoint))
            """)
            XCTAssertEqual(used.status, 0, used.error)
        }
        XCTAssertFalse(isMounted)
    }

    /// A mount unmounted lazily while a program holds a file in it keeps its daemon serving that
    /// file: a mount of the same containers is refused at once, saying so and what to do, and
    /// mounts once the file is closed. It waited 10 s, then named the gone mount as mounted and
    /// told to bind it from where it no longer was.
    func testAMountWhileALazilyUnmountedOneServesOpenFilesSaysSo() throws {
        XCTAssertEqual(containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(mountPoint))").status, 0)
        let file = mountPoint + "/" + SampleApps.notes + "/Documents/open.txt"
        try "open\n".write(toFile: file, atomically: false, encoding: .utf8)
        let held = scratch.path + "/held"
        let holder = Process()
        holder.executableURL = URL(fileURLWithPath: "/bin/sh")
        holder.arguments = ["-c", "exec 3< \"$1\"; touch \"$2\"; exec sleep 60", "sh", file, held]
        try holder.run()
        addTeardownBlock { if holder.isRunning { holder.terminate() } }
        XCTAssertTrue(waitUntil { FileManager.default.fileExists(atPath: held) })
        XCTAssertEqual(Shell.run("umount -l \(Shell.quote(mountPoint))").status, 0)
        XCTAssertFalse(isMounted)
        let refused = containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(mountPoint))")
        XCTAssertNotEqual(refused.status, 0)
        XCTAssertTrue(refused.error.contains("has not ended: it serves files still open in that mount if it was unmounted lazily")
                      && refused.error.contains("`kill "), refused.error)
        XCTAssertFalse(isMounted)
        holder.terminate()
        holder.waitUntilExit()
        let mounted = containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(mountPoint))")
        XCTAssertEqual(mounted.status, 0, "once the file is closed, the daemon ends: \(mounted.error)")
        XCTAssertEqual(containerfs("unmount \(Shell.quote(mountPoint))").status, 0)
    }

    /// Another user who can read the store cannot hold its mounts back: the daemons' registration
    /// lock is a file only the store's owner opens. A lock on the records' directory, which any
    /// reader may take, held every mount of the store until it went.
    func testAnotherUserCannotHoldTheStoresMountsBack() throws {
        try XCTSkipIf(geteuid() != 0, "acting as a second user needs root")
        let records = try Store.open(storePath).workPath + "/mounts"
        try FileManager.default.createDirectory(atPath: records, withIntermediateDirectories: true)
        XCTAssertEqual(Shell.run("chmod 755 \(Shell.quote(scratch.path)) \(Shell.quote(storePath)) \(Shell.quote(storePath))/work").status, 0)
        let held = scratch.path + "/held"
        let other = "setpriv --reuid=4242 --regid=4242 --clear-groups"
        let result = Shell.run("""
        touch \(Shell.quote(held)) && chmod 666 \(Shell.quote(held))
        setsid \(other) flock \(Shell.quote(records)) -c 'echo > \(Shell.quote(held)); sleep 120' > /dev/null 2>&1 & holder=$!
        while [ ! -s \(Shell.quote(held)) ]; do sleep 0.05; done
        # Not a measure of speed: a mount held back waits for as long as the other user likes.
        timeout 30 \(Shell.quote(MountedStore.executable)) mount \(Shell.quote(storePath)) \(Shell.quote(mountPoint)) < /dev/null && echo mounted
        \(other) flock -n \(Shell.quote(records))/registering.lock true 2>/dev/null || echo "the lock file is the owner's"
        kill -- -$holder; wait $holder 2>/dev/null
        \(Shell.quote(MountedStore.executable)) unmount \(Shell.quote(mountPoint))
        """, limit: 60)
        XCTAssertEqual(result.output, "mounted\nthe lock file is the owner's\n", result.error)
    }

    /// With -o allow_overlap two daemons serve the same containers, and neither empties tmp while
    /// the other serves it: each did at its mount and unmount, under the other's programs. What
    /// the option gives up is shown too: a lock taken through one mount does not keep out a
    /// program on the other, where a bind mount of the first (what the refusal suggests) shares it.
    func testOverlappingDaemonsLeaveEachOthersTmpAlone() throws {
        let (kept, second, secondMounted) = try storeMountedWithAFileInTmp()
        let overlapping = containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(second)) -o allow_overlap")
        XCTAssertEqual(overlapping.status, 0, overlapping.error)
        XCTAssertEqual(try? String(contentsOfFile: kept, encoding: .utf8), "in use\n", "kept at the second mount")
        XCTAssertEqual(try? String(contentsOfFile: second + "/" + SampleApps.notes + "/tmp/work.txt", encoding: .utf8), "in use\n")

        let documents = "/" + SampleApps.notes + "/Documents/locked"
        let locks = Shell.run("""
        touch \(Shell.quote(mountPoint + documents))
        flock \(Shell.quote(mountPoint + documents)) -c 'touch \(Shell.quote(scratch.path))/held; sleep 3' &
        while [ ! -e \(Shell.quote(scratch.path))/held ]; do sleep 0.05; done
        flock -n \(Shell.quote(second + documents)) -c 'echo other mount: taken' || echo other mount: kept out
        flock -n \(Shell.quote(mountPoint + documents)) -c 'echo same mount: taken' || echo same mount: kept out
        wait
        """, limit: 30)
        XCTAssertEqual(locks.output, "other mount: taken\nsame mount: kept out\n", locks.error)
        if geteuid() == 0 {
            let bound = scratch.path + "/bound"
            try FileManager.default.createDirectory(atPath: bound, withIntermediateDirectories: true)
            let bind = Shell.run("""
            mount --bind \(Shell.quote(mountPoint)) \(Shell.quote(bound)) || exit 1
            flock \(Shell.quote(mountPoint + documents)) -c 'touch \(Shell.quote(scratch.path))/held2; sleep 3' &
            while [ ! -e \(Shell.quote(scratch.path))/held2 ]; do sleep 0.05; done
            flock -n \(Shell.quote(bound + documents)) -c 'echo bind mount: taken' || echo bind mount: kept out
            wait
            umount \(Shell.quote(bound))
            """, limit: 30)
            XCTAssertEqual(bind.output, "bind mount: kept out\n", bind.error)
        } else {
            print("skipped the bind mount's lock: mount --bind needs root")
        }

        XCTAssertEqual(containerfs("unmount \(Shell.quote(second))").status, 0)
        XCTAssertEqual(try? String(contentsOfFile: kept, encoding: .utf8), "in use\n", "kept at the second unmount")
        XCTAssertEqual(containerfs("unmount \(Shell.quote(mountPoint))").status, 0)
        XCTAssertFalse(FileManager.default.fileExists(atPath: try Store.open(storePath).tmpPath(AppID(SampleApps.notes)!) + "/work.txt"),
                       "the last daemon empties it")
    }

    /// `containerfs unmount` returns once the daemon has let go of the store: the store's own
    /// disk can be unmounted next. The daemon's last steps (its shadows removed, tmp emptied) are
    /// held back (strace delays each of its unlinks), as a busy machine would; the unmount
    /// returned before them, and the disk was busy.
    func testTheStoresDiskCanBeUnmountedRightAfterTheMount() throws {
        let store = try smallStore(megabytes: 64)
        _ = mountedDocuments(of: store)
        let pid = try XCTUnwrap(MountRegistry.active(in: store).first).pid
        let disk = (store.root as NSString).deletingLastPathComponent
        let result = Shell.run("""
        strace -f -qq -o /dev/null -p \(pid) -e trace=unlinkat -e inject=unlinkat:delay_enter=100000 & tracer=$!
        sleep 0.5
        \(Shell.quote(MountedStore.executable)) unmount \(Shell.quote(mountPoint)) && umount \(Shell.quote(disk)) && echo unmounted
        wait $tracer
        """, limit: 30)
        XCTAssertEqual(result.output, "unmounted\n", result.error)
    }

    func testAnUnmountOfABusyMountSaysHowToFindWhatUsesIt() {
        XCTAssertEqual(containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(mountPoint))").status, 0)
        // A shell whose working directory is in the mount, for longer than the unmount's second.
        let busy = Process()
        busy.executableURL = URL(fileURLWithPath: "/bin/sh")
        busy.arguments = ["-c", "cd \(Shell.quote(mountPoint)) && exec sleep 5"]
        XCTAssertNoThrow(try busy.run())
        usleep(300_000)
        let refused = containerfs("unmount \(Shell.quote(mountPoint))")
        XCTAssertNotEqual(refused.status, 0)
        XCTAssertTrue(refused.error.contains("fuser -vm \(mountPoint)"), refused.error)
        XCTAssertTrue(isMounted)
        busy.terminate()
        busy.waitUntilExit()
        XCTAssertTrue(waitUntil { containerfs("unmount \(Shell.quote(mountPoint))").status == 0 })
        XCTAssertFalse(isMounted)
    }

    func testAnUnmountLeavesNoSpareOrPreviousVersionBehind() throws {
        XCTAssertEqual(containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(mountPoint))").status, 0)
        let documents = mountPoint + "/" + SampleApps.notes + "/Documents"
        XCTAssertEqual(Shell.run("for n in 1 2 3 4 5 6; do echo $n > saved; done", in: documents).status, 0)
        let store = try Store.open(storePath)
        XCTAssertEqual(containerfs("unmount \(Shell.quote(mountPoint))").status, 0)
        XCTAssertTrue(waitUntil { (try? MountRegistry.active(in: store))?.isEmpty == true }, "the daemon kept running after unmount")
        let shadows = store.workPath + "/shadows"
        let left = try FileManager.default.contentsOfDirectory(atPath: shadows)
            .flatMap { try FileManager.default.contentsOfDirectory(atPath: shadows + "/" + $0) }
        XCTAssertEqual(left, [], "spares and previous versions are removed at unmount")
        let check = containerfs("check \(Shell.quote(storePath))")
        XCTAssertEqual(check.status, 0, "check after a clean unmount: \(check.output) \(check.error)")
    }

    /// `containerfs mount -f` on the test's store: the caller stops it, and kills it with
    /// `killIfRunning` in every outcome.
    private func foregroundDaemon() throws -> Process {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: MountedStore.executable)
        process.arguments = ["mount", "-f", storePath, mountPoint]
        process.standardError = FileHandle.nullDevice
        try process.run()
        return process
    }

    private func killIfRunning(_ process: Process) {
        guard process.isRunning else { return }
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }

    func testSignalsStopTheDaemonCleanly() throws {
        for signal in [SIGTERM, SIGINT] {
            let process = try foregroundDaemon()
            defer { killIfRunning(process) }
            XCTAssertTrue(waitUntil { isMounted })
            XCTAssertTrue(FileManager.default.createFile(atPath: mountPoint + "/com.example.notes/tmp/scratch", contents: Data("x".utf8)))
            kill(process.processIdentifier, signal)
            guard waitUntil({ !process.isRunning }, seconds: 30) else { return XCTFail("signal \(signal) did not stop the daemon") }
            XCTAssertEqual(process.terminationStatus, 0, "signal \(signal)")
            XCTAssertFalse(isMounted, "signal \(signal) left the mount")
            XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: storePath + "/containers/com.example.notes/tmp"), [],
                           "tmp is emptied at unmount")
        }
    }

    /// A signal after a burst of requests ends every thread of the loop: the burst left several
    /// waiting for a request, which are woken, and the daemon unmounts and exits (the loop is the
    /// project's own: libfuse's cancels its threads, CFuse.c). Signals during requests are
    /// `testSignalsStopTheDaemonCleanly`'s.
    func testASignalStopsEveryThreadABurstOfRequestsLeft() throws {
        let process = try foregroundDaemon()
        defer { killIfRunning(process) }
        XCTAssertTrue(waitUntil { isMounted })
        let documents = mountPoint + "/" + SampleApps.notes + "/Documents"
        let tasks = "/proc/\(process.processIdentifier)/task"
        let threadsBefore = try FileManager.default.contentsOfDirectory(atPath: tasks).count
        // Sixteen writers and readers, for a second or two.
        let load = Shell.run("""
            end=$(($(date +%s) + 2))
            for n in $(seq 16); do (while [ $(date +%s) -lt $end ]; do echo $n > f$n; cat f$n hello.txt >/dev/null; done) & done
            wait
            """, in: documents)
        XCTAssertEqual(load.status, 0, load.error)
        let threadsAfter = try FileManager.default.contentsOfDirectory(atPath: tasks).count
        XCTAssertGreaterThan(threadsAfter, threadsBefore, "the burst left more threads waiting than one")
        kill(process.processIdentifier, SIGTERM)
        guard waitUntil({ !process.isRunning }, seconds: 30) else {
            return XCTFail("the daemon did not stop (\(threadsAfter) threads)")
        }
        XCTAssertEqual(process.terminationStatus, 0)
        XCTAssertFalse(isMounted)
    }

    func testStaleMountOfAKilledDaemonIsClearedAtTheNextMount() throws {
        XCTAssertEqual(containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(mountPoint))").status, 0)
        let store = try Store.open(storePath)
        let pid = try XCTUnwrap(MountRegistry.active(in: store).first).pid
        kill(pid, SIGKILL)
        XCTAssertTrue(waitUntil { Shell.run("ls \(Shell.quote(mountPoint))").error.contains("Transport endpoint is not connected") })
        let again = containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(mountPoint))")
        XCTAssertEqual(again.status, 0, again.error)
        XCTAssertTrue(again.error.contains("stale mount"), again.error)
        XCTAssertEqual(Shell.run("cat com.example.notes/Documents/hello.txt", in: mountPoint).output, "hello\n")
        XCTAssertEqual(containerfs("unmount \(Shell.quote(mountPoint))").status, 0)
    }

    func testClearErrorsForCommonMistakes() throws {
        let notStore = scratch.appendingPathComponent("plain").path
        try FileManager.default.createDirectory(atPath: notStore, withIntermediateDirectories: true)
        var result = containerfs("mount -f \(Shell.quote(notStore)) \(Shell.quote(mountPoint))")
        XCTAssertNotEqual(result.status, 0)
        XCTAssertTrue(result.error.contains("is not a ContainerFS store"), result.error)

        result = containerfs("mount -f \(Shell.quote(storePath)) \(Shell.quote(mountPoint + "/missing"))")
        XCTAssertNotEqual(result.status, 0)
        XCTAssertTrue(result.error.contains("no such directory"), result.error)

        XCTAssertTrue(FileManager.default.createFile(atPath: mountPoint + "/file", contents: nil))
        result = containerfs("mount -f \(Shell.quote(storePath)) \(Shell.quote(mountPoint))")
        XCTAssertNotEqual(result.status, 0)
        XCTAssertTrue(result.error.contains("is not empty"), result.error)
        try FileManager.default.removeItem(atPath: mountPoint + "/file")

        // A mount point that cannot be listed is not taken for an empty one (strace fails its listing).
        result = Shell.run("strace -f -o /dev/null -P \(Shell.quote(mountPoint)) -e trace=getdents64 "
                           + "-e inject=getdents64:error=EIO timeout 30 \(Shell.quote(MountedStore.executable)) mount -f "
                           + "\(Shell.quote(storePath)) \(Shell.quote(mountPoint)) < /dev/null")
        XCTAssertNotEqual(result.status, 0)
        XCTAssertTrue(result.error.contains("\(mountPoint): listing failed: Input/output error. A mount point must be an empty directory"),
                      result.error)
        XCTAssertFalse(isMounted)

        result = containerfs("mount -f --app com.example.none \(Shell.quote(storePath)) \(Shell.quote(mountPoint))")
        XCTAssertNotEqual(result.status, 0)
        XCTAssertTrue(result.error.contains("No app com.example.none"), result.error)

        result = containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(mountPoint)) -o no_such_option")
        XCTAssertNotEqual(result.status, 0)
        XCTAssertTrue(result.error.contains("no_such_option"), result.error)
        XCTAssertFalse(isMounted)

        result = containerfs("unmount \(Shell.quote(mountPoint))")
        XCTAssertNotEqual(result.status, 0)
        XCTAssertTrue(result.error.contains("could not unmount"), result.error)
    }

    /// A store whose work directory is a link (its owner may plant one: docs/store-format.md, "Links
    /// in the store") is not mounted, the refusal names the link, and nothing is made or removed
    /// where it points.
    func testAStoreWhoseWorkDirectoryIsALinkIsNotMounted() throws {
        let store = try Store.open(storePath)
        let elsewhere = scratch.appendingPathComponent("elsewhere/shadows/999999").path
        try FileManager.default.createDirectory(atPath: elsewhere, withIntermediateDirectories: true)
        try FileManager.default.removeItem(atPath: store.workPath)
        XCTAssertEqual(symlink(scratch.appendingPathComponent("elsewhere").path, store.workPath), 0)
        let mount = containerfs("mount -f \(Shell.quote(storePath)) \(Shell.quote(mountPoint))")
        XCTAssertNotEqual(mount.status, 0, mount.output)
        XCTAssertTrue(mount.error.contains(store.workPath), mount.error)
        XCTAssertFalse(isMounted)
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: scratch.appendingPathComponent("elsewhere").path), ["shadows"])
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: elsewhere), [])
    }

    /// A listing of the store's apps that fails (strace fails every `getdents64` of STORE/apps) is
    /// not taken for an empty one: that would mount no app, list none, and have `check` call a
    /// group container that apps belong to unused, to be removed.
    func testAStoreWhoseAppsCannotBeListedIsNotTakenForEmpty() throws {
        let store = try Store.open(storePath)
        let bundle = scratch.appendingPathComponent("bundles/Grouped.app").path
        try FileManager.default.createDirectory(atPath: bundle, withIntermediateDirectories: true)
        try Installer.install(bundle: bundle, into: store, id: AppID("com.example.grouped")!, groups: [AppID("group.example")!])
        let failing = "strace -f -o /dev/null -P \(Shell.quote(store.appsPath)) -e trace=getdents64 -e inject=getdents64:error=EIO:when=1+ "
        let expected = "\(store.appsPath): listing failed: Input/output error"
        let list = Shell.run(failing + "\(Shell.quote(MountedStore.executable)) list \(Shell.quote(storePath))")
        XCTAssertNotEqual(list.status, 0, list.output)
        XCTAssertTrue(list.error.contains(expected), list.error)
        let mount = Shell.run(failing + "timeout 30 \(Shell.quote(MountedStore.executable)) mount -f "
                              + "\(Shell.quote(storePath)) \(Shell.quote(mountPoint))")
        XCTAssertNotEqual(mount.status, 0, mount.output)
        XCTAssertTrue(mount.error.contains(expected), mount.error)
        XCTAssertFalse(isMounted)
        let check = Shell.run(failing + "\(Shell.quote(MountedStore.executable)) check \(Shell.quote(storePath))")
        XCTAssertNotEqual(check.status, 0, check.output)
        XCTAssertTrue(check.output.contains("apps: cannot be read (\(expected))"), check.output)
        XCTAssertFalse(check.output.contains("no installed app belongs to"), check.output)
        // The containers' listing, likewise.
        let containers = Shell.run("strace -f -o /dev/null -P \(Shell.quote(store.containersPath)) -e trace=getdents64 "
                                   + "-e inject=getdents64:error=EIO:when=1+ \(Shell.quote(MountedStore.executable)) check "
                                   + Shell.quote(storePath))
        XCTAssertNotEqual(containers.status, 0, containers.output)
        XCTAssertTrue(containers.output.contains("containers: cannot be listed (\(store.containersPath): listing failed: Input/output error)"),
                      containers.output)
        // Without the failure, all is well.
        XCTAssertEqual(containerfs("check \(Shell.quote(storePath))").status, 0)
        XCTAssertEqual(containerfs("list \(Shell.quote(storePath))").output.split(separator: "\n").count, 3)
    }

    func testAMissingOrForbiddenFuseDeviceIsExplained() throws {
        try XCTSkipIf(geteuid() != 0, "hiding /dev/fuse in a private mount namespace needs root")
        let binary = Shell.quote(MountedStore.executable)
        let arguments = "mount -f \(Shell.quote(storePath)) \(Shell.quote(mountPoint))"
        let missing = Shell.run("unshare --mount sh -c 'mount -t tmpfs none /dev && \(binary) \(arguments)'")
        XCTAssertNotEqual(missing.status, 0)
        XCTAssertTrue(missing.error.contains("/dev/fuse is missing") && missing.error.contains("modprobe fuse"), missing.error)
        let forbidden = Shell.run("setpriv --reuid=4242 --regid=4242 --clear-groups \(binary) \(arguments)")
        XCTAssertNotEqual(forbidden.status, 0)
        XCTAssertTrue(forbidden.error.contains("/dev/fuse is not readable and writable by you"), forbidden.error)
        XCTAssertFalse(isMounted)
    }

    func testOptionsOfMountAndFstabAreAccepted() {
        let mount = containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(mountPoint)) -o rw,noauto,nofail,_netdev,x-systemd.automount,app=com.example.notes,allow_other,noatime,nodiratime,suid")
        XCTAssertEqual(mount.status, 0, mount.error)
        XCTAssertEqual(Shell.run("ls", in: mountPoint).output, "Documents\nLibrary\nNotes.app\ntmp\n")
        let options = Shell.run("grep \(Shell.quote(mountPoint)) /proc/mounts").output
        XCTAssertTrue(options.contains("allow_other"), options)
        XCTAssertTrue(options.contains("default_permissions"), "others may enter: the kernel checks mode bits. \(options)")
        XCTAssertTrue(options.contains("noatime") && options.contains("nosuid"), "noatime is passed on, suid never: \(options)")
        XCTAssertEqual(containerfs("unmount \(Shell.quote(mountPoint))").status, 0)
    }

    func testOneDirectoryOfAContainerCanBeTheRoot() throws {
        // root=Documents: what a test suite that works at a mount's root (xfstests) needs.
        let refused = containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(mountPoint)) -o root=Documents")
        XCTAssertNotEqual(refused.status, 0)
        XCTAssertTrue(refused.error.contains("needs app=ID"), refused.error)
        let mount = containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(mountPoint)) -o app=com.example.notes,root=Documents")
        XCTAssertEqual(mount.status, 0, mount.error)
        defer { _ = containerfs("unmount \(Shell.quote(mountPoint))") }
        let source = Shell.run("awk -v m=\(Shell.quote(mountPoint)) '$2 == m { print $1 }' /proc/mounts").output
        XCTAssertEqual(source, storePath + ":com.example.notes/Documents\n")
        XCTAssertEqual(Shell.run("echo new > made && cat made", in: mountPoint).output, "new\n")
        XCTAssertEqual(try String(contentsOfFile: storePath + "/containers/com.example.notes/Documents/made", encoding: .utf8), "new\n")
        // The Inbox keeps its rules, and a delivery is heard where the Inbox now is.
        XCTAssertNotEqual(Shell.run("touch Inbox/x", in: mountPoint).status, 0)
        let file = scratch.appendingPathComponent("report.pdf").path
        XCTAssertTrue(FileManager.default.createFile(atPath: file, contents: Data("%PDF\n".utf8)))
        let watched = Shell.run("""
        timeout 5 \(Shell.quote(MountedStore.executable)) watch --json Inbox > \(Shell.quote(scratch.path))/heard & sleep 1
        \(Shell.quote(MountedStore.executable)) deliver \(Shell.quote(storePath)) com.example.notes \(Shell.quote(file)) > /dev/null
        sleep 1; cat Inbox/report.pdf; kill %1; wait
        """, in: mountPoint)
        XCTAssertEqual(watched.output, "%PDF\n", watched.error)
        let heard = (try? String(contentsOfFile: scratch.appendingPathComponent("heard").path, encoding: .utf8)) ?? ""
        XCTAssertTrue(heard.contains("presentedSubitemDidAppear") && heard.contains("/Inbox/report.pdf"), heard)
    }

    func testTheSourceCanBeANameAndTheTypePlainFuse() {
        // store=PATH leaves the first argument only a name, which umount finds the mount by (the
        // store is a directory umount would take for a mount point); subtype= mounts as "fuse".
        let mount = containerfs("mount xfstests-test \(Shell.quote(mountPoint)) -o store=\(Shell.quote(storePath)),app=com.example.notes,subtype=")
        XCTAssertEqual(mount.status, 0, mount.error)
        let line = Shell.run("awk -v m=\(Shell.quote(mountPoint)) '$2 == m { print $1, $3 }' /proc/mounts").output
        XCTAssertEqual(line, "xfstests-test fuse\n")
        let unmounted = Shell.run("umount xfstests-test")
        XCTAssertEqual(unmounted.status, 0, unmounted.error)
        if unmounted.status != 0 { _ = containerfs("unmount \(Shell.quote(mountPoint))") }
        XCTAssertTrue(waitUntil { !isMounted })
    }

    func testAMountOnlyRootMayEnterLeavesModeBitsToRoot() throws {
        try XCTSkipIf(geteuid() != 0, "the daemon runs as root only when the tests do")
        XCTAssertEqual(containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(mountPoint))").status, 0)
        let options = Shell.run("grep \(Shell.quote(mountPoint)) /proc/mounts").output
        XCTAssertFalse(options.contains("default_permissions"), options)
        XCTAssertEqual(containerfs("unmount \(Shell.quote(mountPoint))").status, 0)
    }

    func testDemoStoreIsCreatedAndMounted() {
        let data = scratch.appendingPathComponent("xdg").path
        let mount = containerfs("mount --demo \(Shell.quote(mountPoint))", environment: "XDG_DATA_HOME=\(Shell.quote(data))")
        XCTAssertEqual(mount.status, 0, mount.error)
        XCTAssertEqual(Shell.run("ls", in: mountPoint).output, "com.example.notes\ncom.example.photos\n")
        XCTAssertFalse(Shell.run("ls com.example.notes/Documents/Inbox", in: mountPoint).output.isEmpty)
        XCTAssertEqual(Shell.run("head -c 8 com.example.photos/Documents/Inbox/sunset.png | od -An -c | tr -d ' '", in: mountPoint).output,
                       "211PNG\\r\\n032\\n\n")
        XCTAssertEqual(Shell.run("test -x com.example.notes/Notes.app/Notes", in: mountPoint).status, 0)
        XCTAssertEqual(containerfs("verify \(Shell.quote(data + "/containerfs/demo"))").status, 0)
        XCTAssertEqual(containerfs("unmount \(Shell.quote(mountPoint))").status, 0)
    }

    func testTamperedBundleFilesAnswerEIO() throws {
        let bundle = storePath + "/containers/com.example.notes/Notes.app"
        try "tampered\n".write(toFile: bundle + "/Info.plist", atomically: false, encoding: .utf8)
        XCTAssertEqual(containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(mountPoint))").status, 0)
        let container = mountPoint + "/com.example.notes"
        XCTAssertTrue(Shell.run("cat Notes.app/Info.plist", in: container).error.contains("Input/output error"))
        XCTAssertEqual(Shell.run("cat Notes.app/Resources/Deep/readme.txt", in: container).output, "deep\n")
        XCTAssertEqual(Shell.run("cat Photos.app/Info.plist", in: mountPoint + "/com.example.photos").output, "<plist/>\n")
        XCTAssertEqual(containerfs("unmount \(Shell.quote(mountPoint))").status, 0)
    }

    func testABundleWhoseSealCannotBeCheckedAnswersEIO() throws {
        try XCTSkipIf(geteuid() != 0, "strace attaches to the daemon, which needs root here")
        // strace fails the listings of a folder of the bundle: its check at the mount cannot end.
        let folder = storePath + "/containers/com.example.notes/Notes.app/Resources"
        let tracer = Process()
        tracer.executableURL = URL(fileURLWithPath: "/usr/bin/strace")
        tracer.arguments = ["-f", "-o", "/dev/null", "-P", folder, "-e", "trace=getdents64", "-e", "inject=getdents64:error=EIO",
                            MountedStore.executable, "mount", "-f", storePath, mountPoint]
        tracer.standardInput = FileHandle.nullDevice
        let log = Pipe()
        tracer.standardError = log
        try tracer.run()
        defer {
            _ = containerfs("unmount \(Shell.quote(mountPoint))")
            tracer.terminate()
            tracer.waitUntilExit()
        }
        XCTAssertTrue(waitUntil { isMounted }, "the mount did not come up")
        let container = mountPoint + "/com.example.notes"
        XCTAssertTrue(Shell.run("cat Notes.app/Info.plist", in: container).error.contains("Input/output error"),
                      "a file of a bundle that could not be checked is served")
        XCTAssertEqual(Shell.run("cat Photos.app/Info.plist", in: mountPoint + "/com.example.photos").output, "<plist/>\n")
        XCTAssertEqual(containerfs("unmount \(Shell.quote(mountPoint))").status, 0)
        tracer.waitUntilExit()
        let said = String(decoding: log.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        XCTAssertTrue(said.contains("cannot check the seal"), said)
    }

    func testUninstallAndRestoreAreRefusedWhileMounted() {
        XCTAssertEqual(containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(mountPoint))").status, 0)
        let uninstall = containerfs("uninstall --force \(Shell.quote(storePath)) com.example.notes")
        XCTAssertNotEqual(uninstall.status, 0)
        XCTAssertTrue(uninstall.error.contains("is mounted at \(mountPoint)"), uninstall.error)
        XCTAssertEqual(containerfs("unmount \(Shell.quote(mountPoint))").status, 0)
        XCTAssertTrue(waitUntil { (try? MountRegistry.active(in: Store.open(storePath)))?.isEmpty == true })
        let again = containerfs("uninstall --force \(Shell.quote(storePath)) com.example.notes")
        XCTAssertEqual(again.status, 0, again.error)
    }

    func testMountDashTThroughTheHelper() throws {
        try XCTSkipIf(geteuid() != 0, "installing a mount(8) helper in /sbin needs root")
        let helper = "/sbin/mount.fuse.containerfs"
        let source = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("mount-helpers/mount.fuse.containerfs").path
        let backup = helper + ".containerfs-test-backup"
        if FileManager.default.fileExists(atPath: helper) { try FileManager.default.moveItem(atPath: helper, toPath: backup) }
        defer {
            try? FileManager.default.removeItem(atPath: helper)
            if FileManager.default.fileExists(atPath: backup) { try? FileManager.default.moveItem(atPath: backup, toPath: helper) }
        }
        try FileManager.default.copyItem(atPath: source, toPath: helper)
        let mount = Shell.run("CONTAINERFS=\(Shell.quote(MountedStore.executable)) mount -t fuse.containerfs \(Shell.quote(storePath)) \(Shell.quote(mountPoint)) -o app=com.example.photos,nofail")
        XCTAssertEqual(mount.status, 0, mount.error)
        XCTAssertEqual(Shell.run("ls", in: mountPoint).output, "Documents\nLibrary\nPhotos.app\ntmp\n")
        XCTAssertTrue(Shell.run("findmnt -n -o FSTYPE \(Shell.quote(mountPoint))").output.hasPrefix("fuse.containerfs"))
        // A remount changes the mount's flags; the same daemon serves on.
        let remount = Shell.run("mount -o remount,ro \(Shell.quote(mountPoint)) && touch \(Shell.quote(mountPoint))/Documents/x")
        XCTAssertTrue(remount.error.contains("Read-only file system"), remount.error)
        XCTAssertEqual(Shell.run("mount -o remount,rw \(Shell.quote(mountPoint)) && touch \(Shell.quote(mountPoint))/Documents/x").status, 0)
        XCTAssertEqual(Shell.run("umount \(Shell.quote(mountPoint))").status, 0)
        XCTAssertFalse(isMounted)
    }

    func testCachesArePurgedOldestFirstWhenSpaceRunsLowButNeverWhileOpen() throws {
        let store = try smallStore(megabytes: 16)
        let caches = store.containerPath(AppID(SampleApps.notes)!) + "/Library/Caches"
        XCTAssertEqual(Shell.run("""
            head -c 3M /dev/urandom > \(Shell.quote(caches))/a.bin && touch -d '3 days ago' \(Shell.quote(caches))/a.bin \
            && head -c 3M /dev/urandom > \(Shell.quote(caches))/b.bin && touch -d '2 days ago' \(Shell.quote(caches))/b.bin
            """).status, 0)
        let mount = containerfs("mount \(Shell.quote(store.root)) \(Shell.quote(mountPoint)) -o purge_below=8M,purge_interval=0.3")
        XCTAssertEqual(mount.status, 0, mount.error)
        defer { _ = containerfs("unmount \(Shell.quote(mountPoint))") }
        let mountedCaches = mountPoint + "/" + SampleApps.notes + "/Library/Caches"
        // Hold the oldest file open through the mount, then use up the space.
        let holder = Process()
        holder.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        holder.arguments = ["-c", "import time; f = open('\(mountedCaches)/a.bin', 'rb'); time.sleep(30)"]
        try holder.run()
        defer { holder.terminate(); holder.waitUntilExit() }
        usleep(300_000)
        XCTAssertEqual(Shell.run("head -c 3M /dev/urandom > \(Shell.quote(mountedCaches))/c.bin").status, 0)
        // Looked at through the mount meanwhile, so that the kernel holds its attributes: a
        // purge makes it forget them.
        XCTAssertTrue(waitUntil({
            _ = FileManager.default.fileExists(atPath: mountedCaches + "/b.bin")
            return !FileManager.default.fileExists(atPath: caches + "/b.bin")
        }, seconds: 10), "the oldest closed file is purged")
        XCTAssertEqual(Shell.run("stat \(Shell.quote(mountedCaches))/b.bin").status, 1, "the mount shows it gone at once")
        XCTAssertTrue(FileManager.default.fileExists(atPath: caches + "/a.bin"), "an open file is never purged")
        XCTAssertTrue(FileManager.default.fileExists(atPath: caches + "/c.bin"), "purging stops once there is room")
        XCTAssertEqual(Shell.run("ls", in: mountedCaches).output, "a.bin\nc.bin\n")
    }

    func testAFullDiskFailsTheWriteAndLosesNothing() throws {
        let store = try smallStore(megabytes: 6)
        let documents = mountedDocuments(of: store)
        XCTAssertEqual(Shell.run("head -c 1M /dev/urandom > keep && md5sum keep > keep.md5", in: documents).status, 0)
        // Rewriting it with more than the disk holds fails, and the previous version stays whole.
        let overwrite = Shell.run("head -c 16M /dev/zero > keep", in: documents)
        XCTAssertNotEqual(overwrite.status, 0)
        XCTAssertTrue(overwrite.error.contains("No space left on device"), overwrite.error)
        XCTAssertEqual(Shell.run("md5sum -c keep.md5", in: documents).status, 0, "the previous version is intact")
        let new = Shell.run("head -c 16M /dev/zero > new", in: documents)
        XCTAssertTrue(new.error.contains("No space left on device"), new.error)
        XCTAssertEqual(Shell.run("stat -c %s new", in: documents).output, "0\n", "a new file that could not be written stays empty")
        // Spare shadows, made ahead, are empty.
        let holding = try FileManager.default.contentsOfDirectory(atPath: store.workPath + "/shadows").flatMap { daemon in
            try FileManager.default.contentsOfDirectory(atPath: store.workPath + "/shadows/" + daemon).filter { name in
                var attributes = stat()
                return lstat(store.workPath + "/shadows/" + daemon + "/" + name, &attributes) != 0 || attributes.st_size > 0
            }
        }
        XCTAssertEqual(holding, [], "no shadow is left holding the space")
    }

    /// A write that finds the disk full makes the oldest versions go at once, not at the next look
    /// at the free-space floor (every 5 s): the room goes back to the writers (docs/versions.md).
    func testAWriteThatFindsTheDiskFullMakesVersionsGoAtOnce() throws {
        let store = try smallStore(megabytes: 32)
        let documents = mountedDocuments(of: store)
        XCTAssertEqual(Shell.run("head -c 8M /dev/urandom > kept && head -c 8M /dev/urandom > kept", in: documents).status, 0)
        let versions = { self.containerfs("versions \(Shell.quote(documents + "/kept"))").output.split(separator: "\n").count }
        XCTAssertTrue(waitUntil({ versions() == 1 }), "the replaced version is kept")
        // A writer fills the disk and holds what it wrote, open.
        let full = scratch.appendingPathComponent("full-\(UUID().uuidString)").path
        let writer = Process()
        writer.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        writer.arguments = ["-c", """
            import errno, os, sys, time
            f = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                while True: os.write(f, b'x' * 1048576)
            except OSError as error:
                assert error.errno == errno.ENOSPC, error
            open(sys.argv[2], 'w').close()
            time.sleep(30)
            """, documents + "/filler", full]
        try writer.run()
        defer { writer.terminate(); writer.waitUntilExit() }
        XCTAssertTrue(waitUntil({ FileManager.default.fileExists(atPath: full) }, seconds: 20), "the disk filled")
        XCTAssertTrue(waitUntil({ versions() == 0 }, seconds: 1), "the version went at once")
    }

    /// A daemon in a process namespace of its own hears of callers outside it as pid 0, which it
    /// cannot tell from a rewrite's writer: they see the writer's view of its size, and the writer
    /// sees its writes (docs/atomic-replace.md, "Sizes during a rewrite").
    func testCallersTheDaemonCannotNameSeeARewritesWritersView() throws {
        try XCTSkipIf(Shell.run("command -v unshare").status != 0, "unshare is not installed (scripts/setup.sh installs util-linux)")
        let daemon = Process()
        daemon.executableURL = URL(fileURLWithPath: "/usr/bin/unshare")
        daemon.arguments = ["--pid", "--fork", MountedStore.executable, "mount", "--foreground", storePath, mountPoint]
        daemon.standardOutput = FileHandle.nullDevice
        daemon.standardError = FileHandle.nullDevice
        try daemon.run()
        defer {
            _ = Shell.run("fusermount3 -u \(Shell.quote(mountPoint))")
            daemon.waitUntilExit()
        }
        XCTAssertTrue(waitUntil({ self.isMounted }), "mounted")
        let result = Shell.run("""
            python3 -c '
            import os, subprocess
            open("v", "wb").write(b"A" * 100000)
            writer = os.open("v", os.O_WRONLY | os.O_TRUNC)
            os.write(writer, b"B" * 5000)
            print(os.fstat(writer).st_size, subprocess.run(["stat", "-c", "%s", "v"], capture_output=True, text=True).stdout.strip())
            os.close(writer)
            print(os.stat("v").st_size)
            '
            """, in: mountPoint + "/" + SampleApps.notes + "/Documents")
        XCTAssertEqual(result.output, "5000 5000\n5000\n", result.error)
    }

    /// `containerfs unmount` waits for the daemon it unmounted, found through its control socket
    /// (SO_PEERCRED), not by the socket's name: a daemon in a process namespace of its own names
    /// the socket by its pid there (1), and unmount waited 10 s for the machine's pid 1 and said
    /// the daemon was still finishing.
    func testUnmountWaitsForADaemonInAProcessNamespaceOfItsOwn() throws {
        try XCTSkipIf(Shell.run("command -v unshare").status != 0, "unshare is not installed (scripts/setup.sh installs util-linux)")
        let daemon = Process()
        daemon.executableURL = URL(fileURLWithPath: "/usr/bin/unshare")
        daemon.arguments = ["--pid", "--fork", "--kill-child", MountedStore.executable, "mount", "--foreground", storePath, mountPoint]
        daemon.standardOutput = FileHandle.nullDevice
        daemon.standardError = FileHandle.nullDevice
        try daemon.run()
        defer {
            if isMounted { _ = Shell.run("fusermount3 -u \(Shell.quote(mountPoint))") }
            daemon.waitUntilExit()
        }
        XCTAssertTrue(waitUntil({ self.isMounted }), "mounted")
        let unmount = Shell.run("\(Shell.quote(MountedStore.executable)) unmount \(Shell.quote(mountPoint))")
        XCTAssertEqual(unmount.status, 0, unmount.error)
        XCTAssertEqual(unmount.error, "", "nothing to say about a daemon that finished")
        XCTAssertFalse(isMounted)
        // The daemon had exited when unmount returned; unshare follows it at once.
        XCTAssertTrue(waitUntil({ !daemon.isRunning }, seconds: 2), "the daemon exited")
    }

    /// Two daemons in process namespaces of their own (each pid 1 there) mount beside one of the
    /// machine's, and no daemon takes another's control socket: a starting daemon took every
    /// socket whose pid it could not see for a dead daemon's (so one in a namespace removed every
    /// other daemon's, and their clients could not coordinate), and the second namespace's daemon
    /// found its socket's name (1.sock) taken and did not mount.
    func testDaemonsInProcessNamespacesKeepEveryDaemonsControlSocket() throws {
        try XCTSkipIf(geteuid() != 0, "a process namespace needs root")
        try XCTSkipIf(Shell.run("command -v unshare").status != 0, "unshare is not installed (scripts/setup.sh installs util-linux)")
        let answers = { (path: String) in connectionError(at: path) == 0 }
        _ = mountedDocuments(of: try Store.open(storePath))
        let machines = try XCTUnwrap(MountedStore.controlSocket(of: mountPoint))
        XCTAssertTrue(answers(machines))
        var sockets: [String] = []
        for index in 1...2 {
            let store = try Store.openOrCreate(scratch.path + "/store-\(index)")
            try SampleApps.install(into: store, scratch: scratch.appendingPathComponent("bundles-\(index)"))
            let point = scratch.path + "/mnt-\(index)"
            try FileManager.default.createDirectory(atPath: point, withIntermediateDirectories: true)
            let daemon = Process()
            daemon.executableURL = URL(fileURLWithPath: "/usr/bin/unshare")
            daemon.arguments = ["--pid", "--fork", "--kill-child", MountedStore.executable, "mount", "--foreground", store.root, point]
            daemon.standardOutput = FileHandle.nullDevice
            daemon.standardError = FileHandle.nullDevice
            try daemon.run()
            let mounted = { self.isMounted(point) }
            addTeardownBlock {
                if mounted() { _ = Shell.run("fusermount3 -u -z \(Shell.quote(point))") }
                daemon.terminate()
                daemon.waitUntilExit()
            }
            XCTAssertTrue(waitUntil(mounted), "the daemon in namespace \(index) mounted")
            guard mounted(), let socket = MountedStore.controlSocket(of: point) else { continue }
            XCTAssertTrue(answers(socket), "namespace \(index)'s daemon answers at \(socket)")
            sockets.append(socket)
        }
        XCTAssertEqual(Set(sockets).count, 2, "two sockets: \(sockets)")
        XCTAssertTrue(FileManager.default.fileExists(atPath: machines), "the machine's daemon keeps its socket")
        XCTAssertTrue(answers(machines), "and answers there")
    }

    /// A second daemon for the store from another process namespace, with the same pid there,
    /// fails with a message that says why, and leaves the first daemon's record whole: it emptied
    /// the record before it found it locked, and every later mount of the store failed on it.
    func testASecondDaemonWithTheSamePidElsewhereLeavesTheFirstsRecord() throws {
        try XCTSkipIf(geteuid() != 0, "a process namespace needs root")
        try XCTSkipIf(Shell.run("command -v unshare").status != 0, "unshare is not installed (scripts/setup.sh installs util-linux)")
        var daemons: [Process] = []
        var points: [String] = []
        let mounted = { (point: String) in self.isMounted(point) }
        addTeardownBlock {
            for point in points where mounted(point) { _ = Shell.run("fusermount3 -u -z \(Shell.quote(point))") }
            for daemon in daemons {
                if daemon.isRunning { daemon.terminate() }
                daemon.waitUntilExit()
            }
        }
        var errors: [String] = []
        for index in 1...2 {
            let point = scratch.path + "/ns-\(index)"
            try FileManager.default.createDirectory(atPath: point, withIntermediateDirectories: true)
            points.append(point)
            let daemon = Process()
            let error = Pipe()
            daemon.executableURL = URL(fileURLWithPath: "/usr/bin/unshare")
            daemon.arguments = ["--pid", "--fork", "--kill-child", MountedStore.executable, "mount", "--foreground", storePath, point]
            daemon.standardOutput = FileHandle.nullDevice
            daemon.standardError = error
            try daemon.run()
            daemons.append(daemon)
            if index == 1 {
                XCTAssertTrue(waitUntil({ mounted(point) }), "the first daemon mounted")
            } else {
                XCTAssertTrue(waitUntil({ !daemon.isRunning }), "the second daemon gave up")
                errors.append(String(decoding: error.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self))
            }
        }
        XCTAssertFalse(mounted(points[1]))
        XCTAssertTrue(errors.first?.contains("another process namespace") ?? false, "says why: \(errors)")
        // The first daemon's record reads: a third mount is told where the store is mounted, and
        // mounts beside it when asked to.
        let refused = containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(mountPoint))")
        XCTAssertTrue(refused.status != 0 && refused.error.contains("mounted at \(points[0])"), refused.error)
        let third = containerfs("mount \(Shell.quote(storePath)) \(Shell.quote(mountPoint)) -o allow_overlap")
        XCTAssertEqual(third.status, 0, third.error)
        XCTAssertTrue(isMounted)
        _ = containerfs("unmount \(Shell.quote(mountPoint))")
    }

    /// A daemon that does not answer (stopped here; hung alike) is unmounted all the same: unmount
    /// asks who serves the mount in a child it kills after 2 s, which held the mount busy while it
    /// waited, and it hung for as long as the daemon did.
    func testUnmountDoesNotWaitForADaemonThatDoesNotAnswer() throws {
        let daemon = try foregroundDaemon()
        defer {
            kill(daemon.processIdentifier, SIGCONT)
            if isMounted { _ = Shell.run("fusermount3 -u \(Shell.quote(mountPoint))") }
            if !waitUntil({ !daemon.isRunning }, seconds: 30) { killIfRunning(daemon) }
        }
        XCTAssertTrue(waitUntil { isMounted }, "mounted")
        kill(daemon.processIdentifier, SIGSTOP)
        let unmount = Shell.run("timeout -s KILL 20 \(Shell.quote(MountedStore.executable)) unmount \(Shell.quote(mountPoint))")
        let unmounted = !isMounted
        kill(daemon.processIdentifier, SIGCONT)
        XCTAssertEqual(unmount.status, 0, unmount.error)
        XCTAssertTrue(unmount.error.contains("did not answer within 2 s"), unmount.error)
        XCTAssertTrue(unmounted)
        guard waitUntil({ !daemon.isRunning }, seconds: 30) else { return XCTFail("the daemon, let go on, did not exit") }
        XCTAssertEqual(daemon.terminationStatus, 0)
    }

    /// A writer's failed write spoils its version, not the next one: a truncating open starts a
    /// new version, which its own close publishes (it was discarded, and its close failed, with
    /// the first writer's error).
    func testATruncationAfterAFailedWriteStartsAVersionOfItsOwn() throws {
        let store = try smallStore(megabytes: 6)
        let documents = mountedDocuments(of: store)
        XCTAssertEqual(Shell.run("echo old > f", in: documents).status, 0)
        let script = """
            import errno, os
            first = os.open("f", os.O_WRONLY)
            try:
                for _ in range(64): os.write(first, b"x" * (1 << 20))
                raise SystemExit("the disk never filled")
            except OSError as error:
                assert error.errno == errno.ENOSPC, error
            second = os.open("f", os.O_WRONLY | os.O_TRUNC)
            os.write(second, b"new\\n")
            os.close(second)
            print(open("f").read(), end="")
            try:
                os.close(first)
            except OSError as error:
                print("first:", error.strerror)
            """
        let result = Shell.run("python3 -c \(Shell.quote(script))", in: documents)
        XCTAssertEqual(result.status, 0, result.error)
        XCTAssertEqual(result.output, "new\n", "the truncating writer's version is published at its close")
        XCTAssertEqual(Shell.run("cat f", in: documents).output, "new\n")
    }
}
