import Containers
import Foundation
import XCTest

/// `containerfs run`: programs launched as an app reach its containers and nothing else, whatever
/// way they try (docs/island.md). Real programs (sh, ls, cat, python3) inside bubblewrap.
final class IslandTests: XCTestCase {
    private var mounted: MountedStore!
    private let binary = Shell.quote(MountedStore.executable)

    override func setUpWithError() throws {
        try XCTSkipIf(access("/usr/bin/bwrap", X_OK) != 0, "bubblewrap is not installed (scripts/setup.sh installs it)")
        mounted = try MountedStore(extraArguments: ["-o", "allow_other"])
        try "photos' secret\n".write(toFile: mounted.backing(SampleApps.photos) + "/Documents/secret.txt",
                                     atomically: false, encoding: .utf8)
    }

    override func tearDown() {
        mounted?.unmount()
        mounted = nil
    }

    /// Runs `script` with sh as `app` in this test's mount.
    private func run(_ app: String, _ script: String, as user: String = "", in place: String? = nil) -> Shell.Result {
        Shell.run("\(user) \(binary) run \(Shell.quote(place ?? mounted.mountPoint)) \(app) -- sh -c \(Shell.quote(script))", limit: 60)
    }

    func testAnAppSeesItsOwnContainersAndNothingElse() {
        let result = run(SampleApps.notes, """
        echo "$CONTAINERFS_APP_ID $HOME $TMPDIR"
        ls -A "$HOME"; ls /var/containers/Bundle/Application/*
        cat "$CONTAINERFS_BUNDLE/Info.plist"
        ls /home /root \(Shell.quote(mounted.root.path)) 2>&1 | sed 's/^ls: //'
        echo written > "$HOME/Documents/from-app.txt"
        touch "$CONTAINERFS_BUNDLE/new" 2>&1 | sed 's/^touch: //'
        """)
        XCTAssertEqual(result.status, 0, result.error)
        let home = "/var/mobile/Containers/Data/Application/\(SampleApps.notes)"
        XCTAssertEqual(result.output, """
        \(SampleApps.notes) \(home) \(home)/tmp
        Documents
        Library
        tmp
        Notes.app
        <plist/>
        cannot access '/home': No such file or directory
        cannot access '/root': No such file or directory
        cannot access '\(mounted.root.path)': No such file or directory
        cannot touch '/var/containers/Bundle/Application/\(SampleApps.notes)/Notes.app/new': Read-only file system

        """)
        XCTAssertEqual(try String(contentsOfFile: mounted.container() + "/Documents/from-app.txt", encoding: .utf8), "written\n")
    }

    func testAnotherAppsContainerIsRefusedThroughDescriptorsAndOtherMounts() throws {
        // The store mounted a second time: its daemon knows the app's processes too.
        let second = mounted.root.appendingPathComponent("second").path
        try FileManager.default.createDirectory(atPath: second, withIntermediateDirectories: true)
        XCTAssertEqual(Shell.run("\(binary) mount \(Shell.quote(mounted.store.root)) \(Shell.quote(second)) -o allow_other").status, 0)
        defer { _ = Shell.run("\(binary) unmount \(Shell.quote(second))") }
        // A process outside hands the app directory descriptors over an abstract socket.
        let socket = "cfs-island-\(UUID().uuidString.prefix(8))"
        let server = """
        import array, os, socket, sys
        s = socket.socket(socket.AF_UNIX); s.bind("\\0\(socket)"); s.listen(1)
        print("ready", flush=True)
        c, _ = s.accept()
        fds = [os.open(p, os.O_RDONLY | os.O_DIRECTORY) for p in sys.argv[1:]]
        c.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]); c.close()
        """
        let client = """
        import array, os, socket, time
        s = socket.socket(socket.AF_UNIX); s.connect("\\0\(socket)")
        _, ancillary, _, _ = s.recvmsg(1, socket.CMSG_LEN(64))
        fds = array.array("i"); fds.frombytes(ancillary[0][2])
        def attempt(what, call):
            try: call(); return what + " ok"
            except OSError as error: return what + " " + error.strerror
        for fd, label in zip(fds, ["photos", "photos (second mount)", "own"]):
            print(label + ":", ", ".join([
                attempt("list", lambda: os.listdir(fd)),
                attempt("open", lambda: os.close(os.open("secret.txt", os.O_RDONLY, dir_fd=fd))),
                attempt("create", lambda: os.close(os.open("planted.txt", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))),
                attempt("rename", lambda: os.rename("secret.txt", "moved.txt", src_dir_fd=fd, dst_dir_fd=fd)),
            ]))
        """
        let paths = [mounted.container(SampleApps.photos) + "/Documents", second + "/" + SampleApps.photos + "/Documents",
                     mounted.container() + "/Documents"].map(Shell.quote).joined(separator: " ")
        try "secret\n".write(toFile: mounted.backing() + "/Documents/secret.txt", atomically: false, encoding: .utf8)
        let result = Shell.run("""
        python3 -c \(Shell.quote(server)) \(paths) > \(Shell.quote(mounted.root.path))/server.out &
        while ! grep -q ready \(Shell.quote(mounted.root.path))/server.out 2>/dev/null; do sleep 0.05; done
        \(binary) run \(Shell.quote(mounted.mountPoint)) \(SampleApps.notes) -- python3 -c \(Shell.quote(client))
        wait
        """, limit: 60)
        XCTAssertEqual(result.status, 0, result.error)
        XCTAssertEqual(result.output, """
        photos: list Permission denied, open Permission denied, create Permission denied, rename Permission denied
        photos (second mount): list Permission denied, open Permission denied, create Permission denied, rename Permission denied
        own: list ok, open ok, create ok, rename ok

        """)
        // The store's owner keeps every container; nothing was planted or moved.
        XCTAssertEqual(try String(contentsOfFile: mounted.container(SampleApps.photos) + "/Documents/secret.txt", encoding: .utf8),
                       "photos' secret\n")
        XCTAssertFalse(FileManager.default.fileExists(atPath: mounted.backing(SampleApps.photos) + "/Documents/planted.txt"))
    }

    func testAChangedBundleDoesNotStart() throws {
        try "tampered\n".write(toFile: mounted.backing() + "/Notes.app/Info.plist", atomically: false, encoding: .utf8)
        let result = run(SampleApps.notes, "touch \"$HOME/Documents/started\"")
        XCTAssertNotEqual(result.status, 0)
        XCTAssertTrue(result.error.contains("Info.plist") && result.error.contains("changed since it was sealed"), result.error)
        XCTAssertFalse(FileManager.default.fileExists(atPath: mounted.backing() + "/Documents/started"))
    }

    func testTmpIsEmptiedWhenTheAppsLastSandboxExits() {
        let tmp = mounted.container() + "/tmp"
        // While one sandbox runs, another's exit leaves tmp alone.
        let result = Shell.run("""
        \(binary) run \(Shell.quote(mounted.mountPoint)) \(SampleApps.notes) -- sh -c 'echo long > /tmp/long; sleep 2' &
        sleep 0.5
        \(binary) run \(Shell.quote(mounted.mountPoint)) \(SampleApps.notes) -- sh -c 'echo short > "$TMPDIR/short"'
        ls \(Shell.quote(tmp)); echo --
        \(binary) status \(Shell.quote(mounted.mountPoint)) | grep -c '^  \(SampleApps.notes): launched by pid .*sleep'
        wait
        ls \(Shell.quote(tmp)); echo --
        """, limit: 60)
        XCTAssertEqual(result.status, 0, result.error)
        XCTAssertEqual(result.output, "long\nshort\n--\n1\n--\n")
        XCTAssertEqual(((try? FileManager.default.contentsOfDirectory(atPath: mounted.store.workPath + "/running")) ?? []), [])
    }

    func testAnUnprivilegedOwnerRunsTheirStoresApps() throws {
        // A store of user 4242, served by a root daemon to others (allow_other); 4242 runs its app
        // in a user namespace of its own making.
        let chown = Shell.run("chown -R 4242:4242 \(Shell.quote(mounted.store.root)) && chmod 755 \(Shell.quote(mounted.root.path))")
        XCTAssertEqual(chown.status, 0, chown.error)
        let user = "setpriv --reuid=4242 --regid=4242 --clear-groups"
        let result = run(SampleApps.notes, "id -u; echo hello > \"$HOME/Documents/mine.txt\"; cat \"$HOME/Documents/mine.txt\"", as: user)
        XCTAssertEqual(result.status, 0, result.error)
        XCTAssertEqual(result.output.split(separator: "\n").last, "hello")
        var attributes = stat()
        XCTAssertEqual(stat(mounted.backing() + "/Documents/mine.txt", &attributes), 0)
        XCTAssertEqual(attributes.st_uid, 4242)
    }
}
