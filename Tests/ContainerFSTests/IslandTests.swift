import Containers
import Foundation
import XCTest

/// `containerfs run`: programs launched as an app reach its containers and nothing else, whatever
/// way they try (docs/island.md). Real programs (sh, ls, cat, python3) inside bubblewrap.
final class IslandTests: XCTestCase {
    private var mounted: MountedStore!
    static let group = "group.com.example.shared"
    static let mail = "com.example.mail"
    private let binary = Shell.quote(MountedStore.executable)

    override func setUpWithError() throws {
        try XCTSkipIf(access("/usr/bin/bwrap", X_OK) != 0, "bubblewrap is not installed (scripts/setup.sh installs it)")
        // Notes and Photos share a group; Mail is in none.
        mounted = try MountedStore(extraArguments: ["-o", "allow_other"]) { store in
            let bundles = (store.root as NSString).deletingLastPathComponent + "/bundles/"
            let group = [AppID(IslandTests.group)!]
            try Installer.install(bundle: bundles + "Notes.app", into: store, id: AppID(SampleApps.notes)!, groups: group)
            try Installer.install(bundle: bundles + "Photos.app", into: store, id: AppID(SampleApps.photos)!, groups: group)
            try Installer.install(bundle: bundles + "Photos.app", into: store, id: AppID(IslandTests.mail)!)
        }
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
        ls /proc/\(getpid())/root\(Shell.quote(mounted.container(SampleApps.photos))) >/dev/null 2>&1 && echo "out through /proc" || echo "no way out through /proc"
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
        no way out through /proc

        """)
        XCTAssertEqual(try String(contentsOfFile: mounted.container() + "/Documents/from-app.txt", encoding: .utf8), "written\n")
    }

    func testAnotherAppsContainerIsRefusedThroughDescriptorsAndOtherMounts() throws {
        // The store mounted a second time (by a second daemon, as -o allow_overlap allows): its
        // daemon knows the app's processes too.
        let second = mounted.root.appendingPathComponent("second").path
        try FileManager.default.createDirectory(atPath: second, withIntermediateDirectories: true)
        XCTAssertEqual(Shell.run("\(binary) mount \(Shell.quote(mounted.store.root)) \(Shell.quote(second)) -o allow_other,allow_overlap").status, 0)
        defer { _ = Shell.run("\(binary) unmount \(Shell.quote(second))") }
        let result = attemptsThroughPassedDescriptors(as: SampleApps.notes, [
            ("photos", mounted.container(SampleApps.photos) + "/Documents"),
            ("photos (second mount)", second + "/" + SampleApps.photos + "/Documents"),
            ("own", mounted.container() + "/Documents"),
        ])
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

    /// A process outside hands `app`'s process directory descriptors over an abstract socket;
    /// it lists each, and opens, creates and renames in it. One line per directory.
    private func attemptsThroughPassedDescriptors(as app: String, _ directories: [(label: String, path: String)],
                                                  place: String? = nil) -> Shell.Result {
        Shell.run(passedDescriptorsScript(as: app, directories, place: place), limit: 60)
    }

    /// The script of `attemptsThroughPassedDescriptors`. With `go`, the app's process makes
    /// its attempts once its Documents hold a file of that name.
    private func passedDescriptorsScript(as app: String, _ directories: [(label: String, path: String)],
                                         place: String? = nil, waitingFor go: String? = nil) -> String {
        let socket = "cfs-island-\(UUID().uuidString.prefix(8))"
        let server = """
        import array, os, socket, sys
        s = socket.socket(socket.AF_UNIX); s.bind("\\0\(socket)"); s.listen(1)
        print("ready", flush=True)
        c, _ = s.accept()
        fds = [os.open(p, os.O_RDONLY | os.O_DIRECTORY) for p in sys.argv[1:]]
        c.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]); c.close()
        """
        let wait = go.map { "while not os.path.exists(os.environ['HOME'] + '/Documents/\($0)'): time.sleep(0.05)" } ?? ""
        let client = """
        import array, os, socket, sys, time
        \(wait)
        s = socket.socket(socket.AF_UNIX); s.connect("\\0\(socket)")
        _, ancillary, _, _ = s.recvmsg(1, socket.CMSG_LEN(64))
        fds = array.array("i"); fds.frombytes(ancillary[0][2])
        def attempt(what, call):
            try: call(); return what + " ok"
            except OSError as error: return what + " " + error.strerror
        for fd, label in zip(fds, sys.argv[1:]):
            print(label + ":", ", ".join([
                attempt("list", lambda: os.listdir(fd)),
                attempt("open", lambda: os.close(os.open("secret.txt", os.O_RDONLY, dir_fd=fd))),
                attempt("create", lambda: os.close(os.open("planted.txt", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))),
                attempt("rename", lambda: os.rename("secret.txt", "moved.txt", src_dir_fd=fd, dst_dir_fd=fd)),
            ]))
        """
        for directory in directories where !FileManager.default.fileExists(atPath: directory.path + "/secret.txt") {
            try? "secret\n".write(toFile: directory.path + "/secret.txt", atomically: false, encoding: .utf8)
        }
        let paths = directories.map { Shell.quote($0.path) }.joined(separator: " ")
        let labels = directories.map { Shell.quote($0.label) }.joined(separator: " ")
        return """
        timeout 60 python3 -c \(Shell.quote(server)) \(paths) > \(Shell.quote(mounted.root.path))/server.out &
        while ! grep -q ready \(Shell.quote(mounted.root.path))/server.out 2>/dev/null; do sleep 0.05; done
        timeout 60 \(binary) run \(Shell.quote(place ?? mounted.mountPoint)) \(app) -- python3 -c \(Shell.quote(client)) \(labels)
        wait
        """
    }

    /// A daemon that cannot list the records of running sandboxes (strace fails its `getdents64`
    /// of STORE/work/running) does not take that for none: the app would run unconfined. `run`
    /// asks the mount to read them before the program starts, and refuses when it cannot; the
    /// program must then not run at all (bwrap, told to go by the end of its pipe as by a byte,
    /// ran it anyway, unconfined, while `run` said it was not started).
    func testAnAppDoesNotStartWhenTheMountCannotReadWhichAppsRun() throws {
        let marker = mounted.container() + "/Documents/ran"
        try mounted.failing("getdents64", with: "EIO", on: RunningApps.directory(of: mounted.store)) {
            let refused = run(SampleApps.notes, "echo started; touch \"$HOME/Documents/ran\"")
            XCTAssertNotEqual(refused.status, 0, refused.output)
            XCTAssertEqual(refused.output, "", "the program ran")
            XCTAssertTrue(refused.error.contains("does not confine apps (Input/output error)"), refused.error)
        }
        XCTAssertFalse(FileManager.default.fileExists(atPath: marker), "the program ran")
        let started = run(SampleApps.notes, "echo started; touch \"$HOME/Documents/ran\"")
        XCTAssertEqual(started.status, 0, started.error)
        XCTAssertEqual(started.output, "started\n")
        XCTAssertTrue(FileManager.default.fileExists(atPath: marker))
    }

    /// A reload on the watch's word that cannot list the records (strace fails the daemon's
    /// `getdents64` of STORE/work/running) keeps the records read before: a running app stays
    /// confined. Taken for none, its processes would pass for unconfined ones.
    func testARunningAppStaysConfinedWhenTheRecordsCannotBeReadAgain() throws {
        let records = RunningApps.directory(of: mounted.store)
        let output = mounted.root.path + "/attempts.out"
        let script = passedDescriptorsScript(as: SampleApps.notes, [("photos", mounted.container(SampleApps.photos) + "/Documents")],
                                             waitingFor: "go")
        XCTAssertTrue(FileManager.default.createFile(atPath: output, contents: nil))
        let attempts = Process()
        attempts.executableURL = URL(fileURLWithPath: "/bin/bash")
        attempts.arguments = ["-c", script]
        attempts.standardOutput = try FileHandle(forWritingTo: URL(fileURLWithPath: output))
        attempts.standardError = attempts.standardOutput
        try attempts.run()
        defer { attempts.waitUntilExit() }
        let deadline = Date().addingTimeInterval(30)
        while try RunningApps.recorded(in: mounted.store).isEmpty, Date() < deadline { usleep(50_000) }
        XCTAssertEqual(try RunningApps.recorded(in: mounted.store).map(\.app), [SampleApps.notes], "the app did not start")
        try mounted.failing("getdents64", with: "EIO", on: records) {
            // A record's temporary file comes and goes: the watch tells the daemon, which reads
            // the records again, and cannot.
            let trigger = records + "/.trigger"
            XCTAssertTrue(FileManager.default.createFile(atPath: trigger, contents: nil))
            try FileManager.default.removeItem(atPath: trigger)
            usleep(500_000)
            XCTAssertTrue(FileManager.default.createFile(atPath: mounted.container() + "/Documents/go", contents: nil))
            let deadline = Date().addingTimeInterval(30)
            while attempts.isRunning, Date() < deadline { usleep(50_000) }
        }
        XCTAssertEqual(try String(contentsOfFile: output, encoding: .utf8),
                       "photos: list Permission denied, open Permission denied, create Permission denied, rename Permission denied\n")
        XCTAssertEqual(try String(contentsOfFile: mounted.container(SampleApps.photos) + "/Documents/secret.txt", encoding: .utf8),
                       "photos' secret\n")
    }

    /// A bwrap that never says it made the sandbox (it tells `run` the sandbox's first process on
    /// descriptor 3) but waits on descriptor 4 to start the program, as bwrap does: it takes the
    /// pipe's end for a go too, so `run` stops it first. A stand-in bound over /usr/bin/bwrap in a
    /// mount namespace of the test's own.
    func testABwrapThatNeverReportsItsSandboxDoesNotStartTheProgram() throws {
        try XCTSkipIf(geteuid() != 0, "binding a stand-in over /usr/bin/bwrap needs root")
        let marker = mounted.root.path + "/ran"
        let fake = mounted.root.path + "/bwrap"
        try "#!/bin/sh\nexec 3>&-\ncat <&4 >/dev/null\ntouch \(Shell.quote(marker))\n".write(toFile: fake, atomically: false, encoding: .utf8)
        XCTAssertEqual(chmod(fake, 0o755), 0)
        let result = Shell.run("""
        unshare --mount --propagation private sh -c 'mount --bind \(fake) /usr/bin/bwrap && \
          \(binary) run \(Shell.quote(mounted.mountPoint)) \(SampleApps.notes) -- true'
        """, limit: 30)
        XCTAssertNotEqual(result.status, 0)
        XCTAssertTrue(result.error.contains("\(SampleApps.notes) was not started: bwrap could not make the sandbox"), result.error)
        usleep(200_000)
        XCTAssertFalse(FileManager.default.fileExists(atPath: marker), "the program ran")
    }

    func testSandboxesStartOnABusyMachine() {
        // bwrap binds the containers through the mount before the program may start; the mount
        // must not take it for the app meanwhile (it did, under load, for the last binds).
        let result = Shell.run("""
        burners=""; runs=""
        for i in 1 2; do timeout 20 sh -c 'while :; do :; done' & burners="$burners $!"; done
        for i in $(seq 24); do
          app=\(SampleApps.notes); [ $((i % 2)) = 0 ] && app=\(SampleApps.photos)
          ( \(binary) run \(Shell.quote(mounted.mountPoint)) $app -- sh -c 'ls "$CONTAINERFS_GROUP_CONTAINERS"' >/dev/null || echo "run $i failed" ) &
          runs="$runs $!"
        done
        wait $runs
        kill $burners; wait
        echo done
        """, limit: 60)
        XCTAssertEqual(result.output, "done\n", result.error)
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
        for i in $(seq 200); do [ -s \(Shell.quote(tmp))/long ] && break; sleep 0.05; done
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

    func testAGroupContainerIsSharedByItsAppsAndClosedToOthers() {
        let shared = "\"$CONTAINERFS_GROUP_CONTAINERS/\(IslandTests.group)\""
        let written = run(SampleApps.notes, "echo from notes > \(shared)/note.txt; ls -A \(shared)")
        XCTAssertEqual(written.status, 0, written.error)
        XCTAssertEqual(written.output, "Library\nnote.txt\n")
        let read = run(SampleApps.photos, "echo $CONTAINERFS_GROUP_CONTAINERS; cat \(shared)/note.txt; echo and photos >> \(shared)/note.txt")
        XCTAssertEqual(read.status, 0, read.error)
        XCTAssertEqual(read.output, "/var/mobile/Containers/Shared/AppGroup\nfrom notes\n")
        XCTAssertEqual(try String(contentsOfFile: mounted.container(IslandTests.group) + "/note.txt", encoding: .utf8),
                       "from notes\nand photos\n")
        // Mail is told of no group, and the mount refuses it the group's container however it is named.
        let outside = run(IslandTests.mail, "echo \"[$CONTAINERFS_GROUP_CONTAINERS]\"; ls /var/mobile/Containers 2>&1")
        XCTAssertEqual(outside.output, "[]\nData\n")
        let result = attemptsThroughPassedDescriptors(as: IslandTests.mail, [
            ("group", mounted.container(IslandTests.group)),
            ("own", mounted.container(IslandTests.mail) + "/Documents"),
        ])
        XCTAssertEqual(result.status, 0, result.error)
        XCTAssertEqual(result.output, """
        group: list Permission denied, open Permission denied, create Permission denied, rename Permission denied
        own: list ok, open ok, create ok, rename ok

        """)
        // A member reaches it through a passed descriptor too.
        let member = attemptsThroughPassedDescriptors(as: SampleApps.photos, [("group", mounted.container(IslandTests.group))])
        XCTAssertEqual(member.output, "group: list ok, open ok, create ok, rename ok\n", member.error)
    }

    func testAnAppInAGroupRunsOnlyOnAMountThatShowsItsGroup() throws {
        // A mount of Notes alone shows no group container: run says what to mount instead.
        let alone = mounted.root.appendingPathComponent("notes-alone").path
        try FileManager.default.createDirectory(atPath: alone, withIntermediateDirectories: true)
        XCTAssertEqual(Shell.run("\(binary) mount \(Shell.quote(mounted.store.root)) \(Shell.quote(alone)) --app \(SampleApps.notes) -o allow_overlap").status, 0)
        defer { _ = Shell.run("\(binary) unmount \(Shell.quote(alone))") }
        let refused = run(SampleApps.notes, "touch \"$HOME/Documents/started\"", in: alone)
        XCTAssertNotEqual(refused.status, 0)
        XCTAssertTrue(refused.error.contains("belongs to \(IslandTests.group)") && refused.error.contains("without -o app="), refused.error)
        XCTAssertFalse(FileManager.default.fileExists(atPath: mounted.backing() + "/Documents/started"))
        // Mail, in no group, runs there as before.
        XCTAssertEqual(run(IslandTests.mail, "true", in: mounted.mountPoint).status, 0)
    }

    func testACoordinatedWriteInOneAppIsHeardByAPresenterInAnotherOfItsGroup() throws {
        // The client programs reach the group through the mount, as the apps' own code would.
        let group = mounted.container(IslandTests.group)
        XCTAssertEqual(Shell.run("cp \(binary) \(Shell.quote(group))/containerfs && echo one > \(Shell.quote(group))/shared.txt").status, 0)
        let shared = "$CONTAINERFS_GROUP_CONTAINERS/\(IslandTests.group)"
        let events = mounted.root.path + "/events"
        let result = Shell.run("""
        \(binary) run \(Shell.quote(mounted.mountPoint)) \(SampleApps.photos) -- sh -c 'exec "\(shared)/containerfs" watch "\(shared)/shared.txt"' >> \(Shell.quote(events)) &
        watcher=$!
        # Ready once it hears the owner's writes.
        for i in $(seq 200); do grep -q . \(Shell.quote(events)) && break; echo one > \(Shell.quote(group))/shared.txt; sleep 0.05; done
        sleep 0.2; heard=$(wc -l < \(Shell.quote(events)))
        \(binary) run \(Shell.quote(mounted.mountPoint)) \(SampleApps.notes) -- sh -c '"\(shared)/containerfs" coordinate --write "\(shared)/shared.txt" -- sh -c "echo two > \\"\(shared)/shared.txt\\""'
        echo "notes: $?"
        for i in $(seq 100); do tail -n +$((heard + 1)) \(Shell.quote(events)) | grep -q reacquire && break; sleep 0.05; done
        kill $watcher; wait
        tail -n +$((heard + 1)) \(Shell.quote(events))
        """, limit: 60)
        XCTAssertEqual(result.status, 0, result.error)
        let path = "/var/mobile/Containers/Shared/AppGroup/\(IslandTests.group)/shared.txt"
        let lines = result.output.split(separator: "\n").map(String.init)
        XCTAssertEqual(lines.first, "notes: 0", result.output)
        XCTAssertEqual(lines.first { $0.hasPrefix("relinquish") }, "relinquishPresentedItemToWriter \(path)", result.output)
        XCTAssertTrue(lines.contains("presentedItemDidChange \(path)"), result.output)
        XCTAssertEqual(lines.last, "reacquirePresentedItem \(path)", result.output)
        XCTAssertEqual(try String(contentsOfFile: group + "/shared.txt", encoding: .utf8), "two\n")
    }

    func testTheControlSocketAnswersAnAppOnlyForItsOwnContainers() {
        // A client inside the sandbox speaks the control protocol itself (docs/control-protocol.md),
        // naming items of other containers that it cannot reach through its files.
        let client = """
        import json, os, socket, struct
        path = os.getxattr(os.environ["HOME"] + "/Documents", "user.containerfs.control-socket").decode()
        s = socket.socket(socket.AF_UNIX); s.connect(path)
        def send(kind, body):
            data = json.dumps({"version": 1, "type": kind, "body": body}).encode()
            s.sendall(struct.pack(">I", len(data)) + data)
        def receive():
            header = b""
            while len(header) < 4: header += s.recv(4 - len(header))
            length = struct.unpack(">I", header)[0]; data = b""
            while len(data) < length: data += s.recv(length - len(data))
            return json.loads(data)
        send("hello", {"clientName": "island-test"}); receive()
        for request, container in enumerate(["com.example.photos", "\(IslandTests.group)", "com.example.notes"], 1):
            item = [container, "Documents", "secret.txt"] if not container.startswith("group.") else [container, "note.txt"]
            send("addPresenter", {"presenter": "p%d" % request, "path": item})
            send("coordinate", {"requestID": request, "purpose": "c%d" % request, "timeoutMilliseconds": 5000,
                                "accesses": [{"isDirectory": False, "kind": {"mode": "read", "options": []}, "path": item}]})
            answers = []
            while not answers or answers[-1] not in ("granted", "denied accessDenied", "denied timedOut"):
                answer = receive()
                if answer["type"] == "presenterMessage":
                    # Its own presenter is asked to make way for its read: it does at once.
                    if answer["body"]["expectsReply"]: send("presenterReply", {"messageID": answer["body"]["messageID"]})
                    continue
                answers.append(" ".join([answer["type"]] + [answer["body"][k] for k in ("code", "reason") if k in answer["body"]]))
            print(container + ":", ", ".join(answers))
            if answers[-1] == "granted": send("release", {"requestID": request})
        """
        let result = run(SampleApps.notes, "python3 -c \(Shell.quote(client))")
        XCTAssertEqual(result.status, 0, result.error)
        XCTAssertEqual(result.output, """
        com.example.photos: error accessDenied, denied accessDenied
        \(IslandTests.group): granted
        com.example.notes: granted

        """)
        // Mail, outside the group, is refused the group's items too.
        let mail = run(IslandTests.mail, "python3 -c \(Shell.quote(client.replacingOccurrences(of: "com.example.notes\"]", with: "com.example.mail\"]")))")
        XCTAssertEqual(mail.output, """
        com.example.photos: error accessDenied, denied accessDenied
        \(IslandTests.group): error accessDenied, denied accessDenied
        com.example.mail: granted

        """, mail.error)
    }
}
