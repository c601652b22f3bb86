import Foundation
import XCTest

/// A second, unprivileged user on a store mounted by root with allow_other (default_permissions is
/// always on): nothing the daemon does as root on the user's behalf gives them more than a local
/// disk would.
final class MultiUserTests: MountedTestCase {
    private let asUser = "setpriv --reuid=4242 --regid=4242 --clear-groups"

    override func setUpWithError() throws {
        try XCTSkipIf(geteuid() != 0, "needs root to act as another user")
        mounted = try MountedStore(extraArguments: ["-o", "allow_other"]) { store in
            chmod(store.containerPath(.init("com.example.notes")!) + "/Documents", 0o1777)
        }
    }

    /// A shadow holds what its file holds, out of the folder whose permissions keep others out of
    /// the file: the daemon's shadow directory lets nobody else in (it was open to all, and a
    /// user read another's unpublished writes in a folder of mode 0700 there).
    func testNoOneReadsAnotherUsersWriteThroughTheShadows() {
        let other = "setpriv --reuid=4243 --regid=4243 --clear-groups"
        XCTAssertEqual(chmod(mounted.root.path, 0o755), 0, "the store is within everyone's reach")
        let result = Shell.run("""
        \(asUser) sh -c 'mkdir -m 700 Documents/private && echo draft > Documents/private/secret.txt'
        \(asUser) /usr/bin/python3 -c 'import os, time; f = os.open("Documents/private/secret.txt", os.O_WRONLY | os.O_TRUNC); os.write(f, b"unpublished"); time.sleep(2)' &
        sleep 1
        \(other) sh -c 'cat \(Shell.quote(mounted.store.workPath))/shadows/*/* 2>/dev/null; cat Documents/private/secret.txt 2>/dev/null'
        echo "read: $?"
        wait
        """, in: home, limit: 30)
        XCTAssertEqual(result.output, "read: 1\n", result.error)
    }

    func testAHardLinkLeavesTheLinkedFileItsOwner() {
        // As on a disk (with protected_hardlinks off, as here for root's files the user can write).
        sh("echo secret > Documents/victim && chmod 666 Documents/victim")
        let linked = Shell.run("\(asUser) ln Documents/victim Documents/mine", in: home)
        let plain = mounted.root.appendingPathComponent("plain").path
        XCTAssertNoThrow(try FileManager.default.createDirectory(atPath: plain, withIntermediateDirectories: true))
        chmod(plain, 0o1777)
        let native = Shell.run("echo secret > victim && chmod 666 victim && \(asUser) ln victim mine", in: plain)
        XCTAssertEqual(linked.status, native.status, "linking as on a disk: \(linked.error) / \(native.error)")
        XCTAssertEqual(sh("stat -c %u:%g Documents/victim"), "0:0\n", "the existing file keeps its owner")
        if linked.status == 0 {
            XCTAssertEqual(Shell.run("\(asUser) chmod 600 Documents/mine", in: home).status, 1, "not the user's to chmod")
        }
    }

    func testWritingAnotherUsersSetIDFileClearsItsSetIDBits() {
        // Each way of writing: a shadow (rewrite), an appender, a truncation, an open that
        // truncates, a live writer (through passthrough where it may), and a shared mapping (whose
        // writes clear nothing on Linux).
        let script = """
        for how in rewrite append truncate otrunc live mapped; do echo a > $how && chmod 6777 $how; done
        \(asUser) /usr/bin/python3 -c 'import os; f = os.open("rewrite", os.O_WRONLY); os.write(f, b"b"); os.close(f)'
        \(asUser) sh -c 'echo b >> append && truncate -s 0 truncate && : > otrunc'
        \(asUser) /usr/bin/python3 -c 'import os; f = os.open("live", os.O_RDWR); os.pwrite(f, b"b", 0); os.pwrite(f, b"c", 1); os.close(f)'
        \(asUser) /usr/bin/python3 -c '
        import mmap, os
        f = os.open("mapped", os.O_RDWR); m = mmap.mmap(f, 2); m[0:1] = b"b"; m.flush(); m.close(); os.close(f)'
        stat -c '%a %n' rewrite append truncate otrunc live mapped
        """
        inSharedDirectories(script, expected: "777 rewrite\n777 append\n777 truncate\n777 otrunc\n777 live\n6777 mapped\n")
    }

    func testSetIDBitsSetWhileAnotherUserHasTheFileOpenGoAtTheirNextWrite() {
        // The user opens and writes each file; root then makes it set-ID, and the user's next write
        // through the same descriptor clears the bits: through a shadow, in place through
        // passthrough, and appending. The daemon, not the kernel, clears them (it took that over).
        let child = """
        import os, sys
        files = [os.open("rewrite", os.O_WRONLY), os.open("live", os.O_RDWR), os.open("append", os.O_WRONLY | os.O_APPEND)]
        for f in files: os.write(f, b"b")
        print("ready", flush=True); sys.stdin.readline()
        for f in files: os.write(f, b"c")
        for f in files: os.close(f)
        """
        let script = """
        for how in rewrite live append; do echo a > $how && chmod 666 $how; done
        /usr/bin/python3 -c '
        import os, subprocess, sys
        user = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert user.stdout.readline() == "ready\\n"
        for how in ("rewrite", "live", "append"): os.chmod(how, 0o6777)
        user.stdin.write("go\\n"); user.stdin.close(); user.wait()
        ' \(asUser) /usr/bin/python3 -c '\(child)'
        stat -c '%a %n' rewrite live append
        """
        inSharedDirectories(script, expected: "777 rewrite\n777 live\n777 append\n")
    }

    func testAWriterOutsideTheFilesGroupClearsSetGroupIDEvenWithoutGroupExecute() {
        // The kernel's VFS rule (setattr_should_drop_sgid); its FUSE applies only the older one.
        // (Not through passthrough: there the kernel writes with one set of credentials for every
        // writer, which keeps a set-group-ID without group execute, as the kernel's FUSE did.)
        let script = """
        for how in rewrite truncate allocate; do echo a > $how && chmod 6666 $how; done
        \(asUser) /usr/bin/python3 -c 'import os; f = os.open("rewrite", os.O_WRONLY); os.write(f, b"b"); os.close(f)'
        \(asUser) sh -c 'truncate -s 1 truncate && fallocate -l 8192 allocate'
        stat -c '%a %n' rewrite truncate allocate
        """
        inSharedDirectories(script, expected: "666 rewrite\n666 truncate\n666 allocate\n")
    }

    func testAWriterInTheFilesGroupKeepsSetGroupIDWithoutGroupExecute() {
        // Through a shadow and through passthrough (whose backing file is registered with the
        // file's group: docs/atomic-replace.md, "Set-ID bits"); set-user-ID goes.
        let script = """
        for how in rewrite live; do echo a > $how && chown 4242:4242 $how && chmod 6664 $how; done
        \(asUser) /usr/bin/python3 -c 'import os; f = os.open("rewrite", os.O_WRONLY); os.write(f, b"b"); os.close(f)'
        \(asUser) /usr/bin/python3 -c 'import os; f = os.open("live", os.O_RDWR); os.pwrite(f, b"b", 0); os.close(f)'
        stat -c '%a %n' rewrite live
        """
        inSharedDirectories(script, expected: "2664 rewrite\n2664 live\n")
    }

    func testAWriterInTheFilesGroupThroughASupplementaryGroupKeepsSetGroupIDWithoutGroupExecute() {
        // The daemon reads the writer's groups from /proc/PID/status (`ProcessState.isMember`):
        // here the file's group is neither the writer's own nor its owner's.
        let member = "setpriv --reuid=4242 --regid=4242 --groups=4321"
        let script = """
        for how in rewrite live; do echo a > $how && chown 4243:4321 $how && chmod 2664 $how; done
        \(member) /usr/bin/python3 -c 'import os; f = os.open("rewrite", os.O_WRONLY); os.write(f, b"b"); os.close(f)'
        \(member) /usr/bin/python3 -c 'import os; f = os.open("live", os.O_RDWR); os.pwrite(f, b"b", 0); os.close(f)'
        \(member) /usr/bin/python3 -c 'import os; f = os.open("rewrite", os.O_WRONLY | os.O_TRUNC); os.write(f, b"c"); os.close(f)'
        stat -c '%a %u:%g %n' rewrite live; cat rewrite
        """
        inSharedDirectories(script, expected: "2664 4243:4321 rewrite\n2664 4243:4321 live\nc")
    }

    /// Runs `script` in a plain directory that everyone may write (sticky, as /tmp), where it must
    /// print `expected`, then in Documents, where it must print the same.
    private func inSharedDirectories(_ script: String, expected: String, line: UInt = #line) {
        let plain = mounted.root.appendingPathComponent("plain-\(UUID().uuidString.prefix(8))").path
        XCTAssertNoThrow(try FileManager.default.createDirectory(atPath: plain, withIntermediateDirectories: true))
        chmod(plain, 0o1777)
        let native = Shell.run(script, in: plain)
        XCTAssertEqual(native.output, expected, native.error, line: line)
        let mounted = Shell.run(script, in: home + "/Documents")
        XCTAssertEqual(mounted.output, native.output, mounted.error, line: line)
    }

    func testWritingAnotherUsersFileWithACapabilityClearsIt() {
        // The kernel asks whether a file has a capability only until it finds one without (SB_NOSEC:
        // the daemon clears set-ID bits itself); a capability set since is still cleared by the
        // store's filesystem, as each way of writing shows (in place, through passthrough, a
        // shadow, a large file's log).
        let script = """
        for how in rewrite live append large; do echo a > $how && chmod 666 $how; done
        truncate -s 65M large
        for how in rewrite live append large; do \(asUser) sh -c "echo b >> $how"; done
        for how in rewrite live append large; do setcap cap_net_raw+ep $how; done
        \(asUser) /usr/bin/python3 -c 'import os; f = os.open("rewrite", os.O_WRONLY); os.write(f, b"b"); os.close(f)'
        \(asUser) /usr/bin/python3 -c 'import os; f = os.open("live", os.O_RDWR); os.pwrite(f, b"b", 0); os.close(f)'
        \(asUser) sh -c 'echo b >> append'
        \(asUser) /usr/bin/python3 -c 'import os; f = os.open("large", os.O_WRONLY); os.pwrite(f, b"b", 10); os.close(f)'
        for how in rewrite live append large; do echo "$how $(getcap $how | wc -l)"; done
        """
        inSharedDirectories(script, expected: "rewrite 0\nlive 0\nappend 0\nlarge 0\n")
    }

    func testItemsAUserMakesAreTheirsAndOnlyThose() {
        let made = Shell.run("""
        \(asUser) bash -c 'mkdir Documents/d && ln -s target Documents/l && mkfifo Documents/p && touch Documents/f &&
        stat -c %u:%g Documents/d Documents/p Documents/f && stat -c %u:%g -L Documents/d && stat -c %u Documents/l'
        """, in: home)
        XCTAssertEqual(made.output, "4242:4242\n4242:4242\n4242:4242\n4242:4242\n4242\n", made.error)
    }

    func testCreatingANameThatAppearsMeanwhileChecksThePermissionsOfWhatIsThere() throws {
        // Another writer of the store (here, root in the store itself) makes and removes a root-owned
        // 0644 file, again and again, while the user opens the name with O_CREAT and without O_EXCL.
        let target = mounted.backing() + "/Documents/racing"
        let churn = Process()
        churn.executableURL = URL(fileURLWithPath: "/bin/bash")
        churn.arguments = ["-c", "end=$((SECONDS + 4)); while [ $SECONDS -lt $end ]; do echo root > \(Shell.quote(target)); rm -f \(Shell.quote(target)); done"]
        try churn.run()
        defer { churn.terminate(); churn.waitUntilExit() }
        let result = Shell.run("""
        \(asUser) /usr/bin/python3 -c '
        import os, time, errno
        end = time.time() + 3
        writable_foreign = 0
        while time.time() < end:
            try:
                fd = os.open("Documents/racing", os.O_WRONLY | os.O_CREAT, 0o644)
            except OSError as e:
                assert e.errno in (errno.EACCES, errno.ENOENT, errno.ESTALE, errno.EEXIST), e
                continue
            if os.fstat(fd).st_uid != 4242:
                writable_foreign += 1
            os.close(fd)
            try:
                os.unlink("Documents/racing")
            except OSError:
                pass
        print(writable_foreign)
        '
        """, in: home)
        XCTAssertEqual(result.output, "0\n", "writable descriptors on root's file: \(result.error)")
    }
}

extension MultiUserTests {
    func testOneUsersCoordinatedWriteDoesNotHoldUpTheRestOfTheContainer() throws {
        // The app ID has an extension, yet the container is no file package: a write the user holds
        // on their own file does not make root's writes of other files in that container wait.
        let binary = Shell.quote(MountedStore.executable)
        sh("echo mine > Documents/held && chown 4242:4242 Documents/held && echo root > Documents/other")
        let holder = Process()
        holder.executableURL = URL(fileURLWithPath: "/bin/bash")
        // Held until its standard input closes.
        holder.arguments = ["-c", "exec \(asUser) \(binary) coordinate --write Documents/held -- head -c 1"]
        holder.currentDirectoryURL = URL(fileURLWithPath: home)
        let release = Pipe()
        holder.standardInput = release
        try holder.run()
        defer {
            try? release.fileHandleForWriting.close()
            holder.waitUntilExit()
        }
        // Wait until the user's write is granted: root's coordinated read of the same file waits then.
        let held = (0..<20).contains { _ in
            Shell.run("timeout 1 \(binary) coordinate --read Documents/held -- true", in: home).status == 124
        }
        XCTAssertTrue(held, "the user's coordinated write was never granted; the test could not show anything")
        let other = Shell.run("timeout 10 \(binary) coordinate --write Documents/other -- sh -c 'echo two > Documents/other'",
                              in: home)
        XCTAssertEqual(other.status, 0, "root's write of another file waited for the user's: \(other.error)")
        XCTAssertTrue(holder.isRunning, "the user's write was still held meanwhile")
        XCTAssertEqual(sh("cat Documents/other"), "two\n")
    }
}

extension MultiUserTests {
    /// A client of the control socket as the second user, speaking the wire protocol
    /// (docs/control-protocol.md) itself: what it sends, then every frame it got, a JSON line each.
    private func controlClient(_ requests: [String], listenFor seconds: Double, meanwhile script: String = "") -> [String] {
        let client = """
        import json, os, socket, struct, subprocess, sys, time
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(os.getxattr(".", "user.containerfs.control-socket").rstrip(b"\\0"))
        def send(t, body):
            data = json.dumps({"version": 1, "type": t, "body": body}).encode()
            s.sendall(struct.pack(">I", len(data)) + data)
        send("hello", {"clientName": "stranger"})
        for line in sys.stdin:
            message = json.loads(line)
            send(message["type"], message["body"])
        s.settimeout(0.2)
        end, data = time.time() + float(sys.argv[1]), b""
        while time.time() < end:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                continue
            if not chunk:
                break
            data += chunk
        while len(data) >= 4:
            (n,) = struct.unpack(">I", data[:4])
            print(data[4:4 + n].decode())
            data = data[4 + n:]
        """
        let script = script.isEmpty ? "" : "(sleep 1; \(script)) & "
        let result = Shell.run("""
        \(script)printf '%s\\n' \(requests.map(Shell.quote).joined(separator: " ")) |
        \(asUser) /usr/bin/python3 -c \(Shell.quote(client)) \(seconds); wait
        """, in: home)
        XCTAssertEqual(result.status, 0, result.error)
        return result.output.split(separator: "\n").map(String.init)
    }

    func testTheControlSocketGrantsNothingTheMountWouldNot() {
        sh("mkdir -m 700 Documents/secret && echo plan > Documents/secret/plan.txt && echo open > Documents/open.txt")
        XCTAssertEqual(Shell.run("\(asUser) cat Documents/secret/plan.txt", in: home).status, 1, "the mount refuses")
        let app = "com.example.notes"
        let plan = #"["\#(app)","Documents","secret","plan.txt"]"#
        let replies = controlClient([
            #"{"type":"addPresenter","body":{"presenter":"spy","path":\#(plan)}}"#,
            #"{"type":"coordinate","body":{"requestID":1,"purpose":"spy","accesses":[{"path":\#(plan),"isDirectory":false,"kind":{"mode":"read","options":[]}}]}}"#,
            #"{"type":"addPresenter","body":{"presenter":"root","path":[]}}"#,
            #"{"type":"statusRequest","body":{}}"#,
        ], listenFor: 3, meanwhile: "echo new > Documents/secret/new.txt; echo seen > Documents/seen.txt")
        XCTAssertTrue(replies.contains { $0.contains(#""accessDenied""#) && $0.contains("presenter spy") },
                      "the presenter inside a directory the user cannot search is refused: \(replies)")
        XCTAssertTrue(replies.contains { $0.contains(#""denied""#) && $0.contains(#""accessDenied""#) },
                      "the coordinated read is refused: \(replies)")
        XCTAssertTrue(replies.contains { $0.contains("seen.txt") }, "the root presenter hears of what it may list: \(replies)")
        XCTAssertFalse(replies.contains { $0.contains("new.txt") || $0.contains("plan.txt\"]") && !$0.contains("error") },
                       "no name inside the secret directory is told: \(replies)")
    }

    func testAPresenterTheDaemonCouldNotCheckIsRefused() throws {
        // The directory on the way cannot be opened (no descriptor left): it is not skipped for
        // the one above it, which the user may read.
        sh("mkdir -m 700 Documents/secret && echo plan > Documents/secret/plan.txt")
        let app = "com.example.notes"
        let plan = #"["\#(app)","Documents","secret","plan.txt"]"#
        var replies: [String] = []
        let failed = try mounted.failed("openat", with: "EMFILE", on: mounted.backing(app) + "/Documents") {
            replies = controlClient([#"{"type":"addPresenter","body":{"presenter":"spy","path":\#(plan)}}"#], listenFor: 1)
        }
        XCTAssertFalse(failed.isEmpty, "no open in Documents failed: the test showed nothing")
        XCTAssertTrue(replies.contains { $0.contains(#""accessDenied""#) && $0.contains("presenter spy") }, "\(replies)")
    }

    func testStatusShowsAnotherUsersItemsOnlyToRoot() {
        let binary = Shell.quote(MountedStore.executable)
        sh("echo shared > Documents/shared.txt && chmod 644 Documents/shared.txt")
        let watcher = Process()
        watcher.executableURL = URL(fileURLWithPath: MountedStore.executable)
        watcher.arguments = ["watch", home + "/Documents/shared.txt"]
        watcher.standardOutput = FileHandle.nullDevice
        XCTAssertNoThrow(try watcher.run())
        defer { watcher.terminate(); watcher.waitUntilExit() }
        let seen = (0..<50).contains { _ in
            usleep(100_000)
            return sh("\(binary) status --json .").contains("shared.txt")
        }
        XCTAssertTrue(seen, "root sees its own presenter")
        let strangers = Shell.run("\(asUser) \(binary) status --json .", in: home)
        XCTAssertEqual(strangers.status, 0, strangers.error)
        XCTAssertFalse(strangers.output.contains("shared.txt"), "another user sees none of root's presenters: \(strangers.output)")
    }
}

extension MultiUserTests {
    func testOneUserCannotCrowdOthersOutOfTheControlSocket() throws {
        // Connections, presenters and half-sent frames, each past the user's share, held while
        // root's clients use the socket.
        let binary = Shell.quote(MountedStore.executable)
        let reports = try XCTUnwrap(Shell.run("mktemp -d /tmp/containerfs-hog.XXXXXX").output.split(separator: "\n").first.map(String.init))
        defer { Shell.run("rm -rf \(Shell.quote(reports))") }
        chmod(reports, 0o777)
        let report = reports + "/report"
        let hostile = """
        import json, os, socket, struct, sys, time
        path = os.getxattr(".", "user.containerfs.control-socket").rstrip(b"\\0")
        out = open(sys.argv[1], "w")
        def frame(t, body):
            data = json.dumps({"version": 1, "type": t, "body": body}).encode()
            return struct.pack(">I", len(data)) + data
        def drain(s, seconds):
            s.settimeout(seconds)
            data = b""
            try:
                while True:
                    chunk = s.recv(1 << 20)
                    if not chunk:
                        break
                    data += chunk
            except (socket.timeout, OSError):
                pass
            return data
        held, refused, why = [], 0, b""
        for _ in range(100):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            try:
                s.sendall(frame("hello", {"clientName": "hog"}))
            except BrokenPipeError:
                pass  # refused before the hello was written: the refusal is still there to read
            s.settimeout(5)
            header = s.recv(4, socket.MSG_WAITALL)
            answer = s.recv(struct.unpack(">I", header)[0], socket.MSG_WAITALL) if len(header) == 4 else b""
            if b"helloReply" in answer:
                held.append(s)
            else:
                refused += 1
                why = answer
        print("clients", len(held), "refused", refused, b"limitExceeded" in why, file=out)
        for s in held[:2]:
            s.sendall(b"".join(frame("addPresenter", {"presenter": "p%d" % i, "path": []}) for i in range(6000)))
        print("presenters refused", sum(drain(s, 1).count(b"limitExceeded") for s in held[:2]), file=out)
        closed = 0
        for s in held[2:20]:
            try:
                s.sendall(struct.pack(">I", 1 << 20) + b"x" * ((1 << 20) - 1))
            except OSError:
                closed += 1
        closed += sum(1 for s in held[2:20] if b"limitExceeded" in drain(s, 0.2))
        print("big frames cut off", closed >= 14, file=out)
        print("ready", file=out, flush=True)
        time.sleep(60)
        """
        let rssBefore = residentKiB(of: mounted.daemonPID)
        let hog = Process()
        hog.executableURL = URL(fileURLWithPath: "/bin/bash")
        hog.arguments = ["-c", "exec \(asUser) /usr/bin/python3 -c \(Shell.quote(hostile)) \(Shell.quote(report)) 2>\(Shell.quote(report)).err"]
        hog.currentDirectoryURL = URL(fileURLWithPath: home)
        try hog.run()
        defer { hog.terminate(); hog.waitUntilExit() }
        let deadline = Date().addingTimeInterval(60)
        var lines: [String] = []
        while Date() < deadline, !lines.contains("ready"), hog.isRunning {
            usleep(100_000)
            lines = ((try? String(contentsOfFile: report, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
        }
        XCTAssertEqual(lines, ["clients 64 refused 36 True", "presenters refused 2000", "big frames cut off True", "ready"],
                       (try? String(contentsOfFile: report + ".err", encoding: .utf8)) ?? "")
        let rootStatus = Shell.run("\(binary) status .", in: home)
        XCTAssertEqual(rootStatus.status, 0, "root's status meanwhile: \(rootStatus.error)")
        let rootClient = Shell.run("\(binary) coordinate --read Documents -- true", in: home)
        XCTAssertEqual(rootClient.status, 0, "root's clients still connect meanwhile: \(rootClient.error)")
        if ProcessInfo.processInfo.environment["CONTAINERFS_SANITIZER"] == "address" {
            // Its quarantine keeps what the daemon freed (256 MiB by default).
            print("the daemon's growth is not judged under AddressSanitizer")
        } else if let before = rssBefore, let after = residentKiB(of: mounted.daemonPID) {
            XCTAssertLessThan(after - before, 64 << 10, "the daemon grew by \(after - before) KiB")
        }
    }

    private func residentKiB(of pid: pid_t?) -> Int? {
        guard let pid, let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }) else { return nil }
        return Int(line.split(separator: " ").dropFirst().first ?? "")
    }
}

/// The fixed directories of the layout stay where the installer put them (docs/policy.md).
final class FixedLibraryTests: MountedTestCase {
    func testLibrarysFixedDirectoriesCanBeNeitherMovedNorRemovedNorReplaced() {
        for directory in ["Library/Caches", "Library/Preferences", "Library/Application Support"] {
            let quoted = Shell.quote(directory)
            shFails("mv \(quoted) Library/moved", with: EACCES)
            shFails("rmdir \(quoted)", with: EACCES)
            shFails("chmod 700 \(quoted)", with: EACCES)
            sh("mkdir -p Library/spare")
            shFails("mv -T Library/spare \(quoted)", with: EACCES)
            sh("touch \(Shell.quote(directory + "/inside")) && rm \(Shell.quote(directory + "/inside"))")
        }
    }
}
