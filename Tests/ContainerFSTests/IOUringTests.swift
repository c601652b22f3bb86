import Foundation
import Glibc
import XCTest

/// FUSE over io_uring (Linux 6.14 and later): where the fuse module's `enable_uring` is on, the
/// daemon takes its requests through a ring per CPU (docs/io-uring.md). The module's setting is
/// the machine's, off by default: each test turns it on for its own mount and puts it back.
final class IOUringTests: MountedTestCase {
    private static let parameter = "/sys/module/fuse/parameters/enable_uring"
    private var previous: String?

    override func setUpWithError() throws {
        guard geteuid() == 0 else { throw XCTSkip("turning on the fuse module's io_uring needs root; these tests run as uid \(geteuid())") }
        guard let was = try? String(contentsOfFile: Self.parameter, encoding: .utf8) else {
            throw XCTSkip("this kernel's fuse module has no io_uring (\(Self.parameter): Linux 6.14 and later, CONFIG_FUSE_IO_URING)")
        }
        previous = was.trimmingCharacters(in: .whitespacesAndNewlines)
        try Self.set("1")
        try super.setUpWithError()
    }

    override func tearDown() {
        super.tearDown()
        if let previous { try? Self.set(previous == "Y" ? "1" : "0") }
    }

    private static func set(_ value: String) throws {
        try value.write(toFile: parameter, atomically: false, encoding: .utf8)
    }

    /// The daemon's io_uring instances, as its descriptors name them.
    private func rings(of pid: pid_t) -> Int {
        let descriptors = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd")) ?? []
        return descriptors.filter { descriptor in
            (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/fd/\(descriptor)")) == "anon_inode:[io_uring]"
        }.count
    }

    /// What the daemon logged within `seconds`, until `wanted` shows.
    private func daemonLog(until wanted: String, seconds: Double = 10) -> String {
        var log = ""
        let deadline = Date().addingTimeInterval(seconds)
        while !log.contains(wanted), Date() < deadline {
            log += mounted.daemonOutput
            if !log.contains(wanted) { usleep(50_000) }
        }
        return log
    }

    func testRequestsComeThroughARingPerCPUAndProgramsSeeALocalDisk() throws {
        let pid = try XCTUnwrap(mounted.daemonPID)
        let log = daemonLog(until: "requests come through io_uring")
        XCTAssertTrue(log.contains("requests come through io_uring"), "the daemon says so: \(log)")
        XCTAssertEqual(rings(of: pid), sysconf(Int32(_SC_NPROCESSORS_CONF)), "one ring per possible CPU")
        // Every kind of request, through real programs, as on a plain directory.
        everywhere("""
        printf 'one\\ntwo\\n' > a.txt && cat a.txt && mv a.txt b.txt && ln -s b.txt link && readlink link && cat link
        mkdir -p d/e && touch d/e/f && ls -R d && rm -r d
        head -c 3000000 /dev/urandom > big && cp big big2 && cmp big big2 && echo same
        truncate -s 100 big && stat -c %s big && rm big big2
        sed -i 's/one/uno/' b.txt && cat b.txt
        sqlite3 w.db 'PRAGMA journal_mode=WAL;' 'CREATE TABLE t(x);' && for i in 1 2 3; do sqlite3 w.db "INSERT INTO t VALUES($i);"; done
        sqlite3 w.db 'SELECT sum(x) FROM t;'
        git init -q r && cd r && echo hi > f && git add f && git -c user.name=t -c user.email=t@t commit -qm one && git log --format=%s && cd ..
        tar -cf ../t.tar r && mkdir x && tar -xf ../t.tar -C x && diff -r r x && echo extracted && rm -rf x r ../t.tar
        python3 -c "import os; f = os.open('s', os.O_WRONLY | os.O_CREAT, 0o600); os.write(f, b'synced'); os.fsync(f); os.close(f)" && cat s
        setfattr -n user.k -v v b.txt && getfattr --only-values -n user.k b.txt && echo
        ls
        """)
    }

    /// A request that waits for the disk (here a sync, made slow) hands its queue to another
    /// thread: a request behind it, from the same CPU, is answered before the sync ends.
    func testASyncDoesNotHoldUpTheRequestsBehindIt() throws {
        XCTAssertTrue(daemonLog(until: "requests come through io_uring").contains("requests come through io_uring"))
        sh("echo other > Documents/other && echo data > Documents/synced")
        let events = mounted.root.appendingPathComponent("events").path
        try mounted.delaying("fsync,fdatasync", by: 3) {
            // Both on CPU 0, so both go to that CPU's queue.
            let sync = Process()
            sync.executableURL = URL(fileURLWithPath: "/usr/bin/taskset")
            sync.arguments = ["-c", "0", "python3", "-c", """
            import os
            f = os.open('Documents/synced', os.O_WRONLY | os.O_APPEND)
            os.write(f, b'more')
            open('\(events)', 'a').write('sync started\\n')
            os.fsync(f)
            open('\(events)', 'a').write('sync done\\n')
            """]
            sync.currentDirectoryURL = URL(fileURLWithPath: home)
            try sync.run()
            defer { sync.waitUntilExit() }
            let deadline = Date().addingTimeInterval(10)
            while !((try? String(contentsOfFile: events, encoding: .utf8)) ?? "").contains("sync started"), Date() < deadline {
                usleep(10_000)
            }
            usleep(300_000)
            let other = Shell.run("taskset -c 0 cat Documents/other && echo 'read done' >> \(Shell.quote(events))", in: home)
            XCTAssertEqual(other.status, 0, other.error)
            XCTAssertEqual(other.output, "other\n")
        }
        let order = try String(contentsOfFile: events, encoding: .utf8)
        XCTAssertEqual(order, "sync started\nread done\nsync done\n", "the read waited for the sync")
        XCTAssertEqual(sh("cat Documents/synced"), "data\nmore")
    }

    /// A question to a stopped daemon is taken by its ring at once, and a process waiting for the
    /// answer to a request taken cannot be killed: `containerfs unmount` detaches the mount, says
    /// so, and the daemon, let go on, answers and exits.
    func testUnmountDetachesAMountWhoseStoppedDaemonTookTheQuestion() throws {
        let pid = try XCTUnwrap(mounted.daemonPID)
        XCTAssertTrue(daemonLog(until: "requests come through io_uring").contains("requests come through io_uring"))
        kill(pid, SIGSTOP)
        let unmount = Shell.run("timeout -s KILL 20 \(Shell.quote(MountedStore.executable)) unmount \(Shell.quote(mounted.mountPoint))")
        let listed = mounted.isListedInMountTable
        kill(pid, SIGCONT)
        XCTAssertEqual(unmount.status, 0, unmount.error)
        XCTAssertTrue(unmount.error.contains("did not answer within 2 s"), unmount.error)
        XCTAssertTrue(unmount.error.contains("detached"), unmount.error)
        XCTAssertFalse(listed, "still mounted")
        let deadline = Date().addingTimeInterval(30)
        while mounted.daemonIsRunning, Date() < deadline { usleep(20_000) }
        XCTAssertFalse(mounted.daemonIsRunning, "the daemon, let go on, did not exit")
    }

    func testNoIOUringKeepsDevFuse() throws {
        try remount(with: "no_io_uring")
        let pid = try XCTUnwrap(mounted.daemonPID)
        sh("echo x > Documents/x && cat Documents/x")
        XCTAssertEqual(rings(of: pid), 0)
        XCTAssertFalse(mounted.daemonOutput.contains("io_uring"))
    }
}
