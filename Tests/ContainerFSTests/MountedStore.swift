import CLinux
import Containers
import Foundation
import XCTest

/// A store built for one test, mounted by the real `containerfs` binary in a child process.
/// `unmount()` (called from tearDown) takes the mount down whatever happened, and never leaves
/// the daemon running.
final class MountedStore {
    let root: URL
    let store: Store
    let mountPoint: String
    private var daemon: Process?
    private var stderrPipe = Pipe()

    /// The control socket of the mount at `mountPoint`, as the mount names it; nil if it does not.
    static func controlSocket(of mountPoint: String) -> String? {
        var buffer = [UInt8](repeating: 0, count: 4096)
        let length = clinux_getxattr(mountPoint, "user.containerfs.control-socket", &buffer, buffer.count)
        return length > 0 ? String(decoding: buffer.prefix(length).prefix { $0 != 0 }, as: UTF8.self) : nil
    }

    /// The binary built next to the test bundle.
    static var executable: String {
        let testBinary = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
        var directory = testBinary.deletingLastPathComponent()
        // swift test runs .build/debug/NamePackageTests.xctest; the binary is beside it.
        while !FileManager.default.fileExists(atPath: directory.appendingPathComponent("containerfs").path),
              directory.path != "/" {
            directory = directory.deletingLastPathComponent()
        }
        return directory.appendingPathComponent("containerfs").path
    }

    /// Installs the sample apps, then mounts the whole store, or one app with `app`.
    /// `descriptorLimit` caps the daemon's open descriptors (soft and hard, so it cannot raise it).
    /// The store and the mount point are made in `base` (the temporary directory by default).
    init(app: String? = nil, extraArguments: [String] = [], descriptorLimit: Int? = nil, base: URL? = nil,
         prepare: (Store) throws -> Void = { _ in }) throws {
        root = (base ?? FileManager.default.temporaryDirectory).appendingPathComponent("containerfs-test-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: root, withIntermediateDirectories: true)
        store = try Store.openOrCreate(root.appendingPathComponent("store").path)
        try SampleApps.install(into: store, scratch: root.appendingPathComponent("bundles"))
        try prepare(store)
        mountPoint = root.appendingPathComponent("mnt").path
        try FileManager.default.createDirectory(atPath: mountPoint, withIntermediateDirectories: true)
        // Every version kept, as the tests of versions count them; `VersionTests` spaces them apart.
        arguments = ["mount", "-f", store.root, mountPoint, "-o", "version_spacing=0"] + extraArguments
        if let app { arguments += ["--app", app] }
        if let descriptorLimit {
            // prlimit execs the daemon: the pid stays the daemon's.
            arguments = ["--nofile=\(descriptorLimit):\(descriptorLimit)", "--", MountedStore.executable] + arguments
            executable = "/usr/bin/prlimit"
        }
        try start(arguments)
    }

    private var arguments: [String] = []
    private var executable = MountedStore.executable

    /// The running daemon's process id.
    var daemonPID: pid_t? { daemon?.processIdentifier }
    /// The daemon's own directory of shadows, marks and records (STORE/work/shadows/PID).
    var shadowDirectory: String? { daemonPID.map { store.workPath + "/shadows/\($0)" } }
    var daemonIsRunning: Bool { daemon?.isRunning == true }

    /// Waits (up to `timeout`) until the daemon's background has written the data of the closes
    /// that published without waiting for it: no record is left in its shadow directory. A batch
    /// gathers for a second before it is written (docs/atomic-replace.md, "Closes without a sync").
    func waitForUnsyncedPublishes(timeout: Double = 10) {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline, !records.isEmpty { usleep(20_000) }
    }

    /// The records in the running daemon's shadow directory: publishes waiting for their data.
    var records: [String] {
        guard let directory = shadowDirectory else { return [] }
        return ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).filter { PublishRecord.parse($0) != nil }
    }

    /// Runs `body` while every call of `syscall` by the daemon fails with `error` (an errno name):
    /// strace's fault injection, attached to all of the daemon's threads, detached after.
    func failing(_ syscall: String, with error: String, _ body: () throws -> Void) throws {
        try injecting(syscall, "error=" + error, body)
    }

    /// Runs `body` while every call of `syscall` by the daemon on `path` fails with `error`.
    func failing(_ syscall: String, with error: String, on path: String, _ body: () throws -> Void) throws {
        try tracing(syscall, ["-P", path, "-e", "inject=\(syscall):error=\(error)", "-o", "/dev/null"], body)
    }

    /// Runs `body` while every call of `syscall` by the daemon waits `seconds` before it starts.
    func delaying(_ syscall: String, by seconds: Double, _ body: () throws -> Void) throws {
        try injecting(syscall, "delay_enter=\(Int(seconds * 1_000_000))", body)
    }

    /// Runs `body` with strace's `injection` (its inject= option) on every call of `syscall` by the daemon.
    func injecting(_ syscall: String, _ injection: String, _ body: () throws -> Void) throws {
        try injecting([(syscall, injection)], body)
    }

    /// Runs `body` with each of strace's `injections` (syscall, its inject= option) at once.
    func injecting(_ injections: [(syscall: String, injection: String)], _ body: () throws -> Void) throws {
        let arguments = injections.flatMap { ["-e", "inject=\($0.syscall):\($0.injection)"] }
        try tracing(injections.map(\.syscall).joined(separator: ","), arguments + ["-o", "/dev/null"], body)
    }

    /// How many calls of `syscalls` (strace's list) the daemon makes while `body` runs.
    func counting(_ syscalls: String, _ body: () throws -> Void) throws -> Int {
        try calls(syscalls, body).count
    }

    /// The calls of `syscalls` (strace's list) the daemon makes while `body` runs, in the order
    /// they began, as strace shows them.
    func calls(_ syscalls: String, _ body: () throws -> Void) throws -> [String] {
        try logged(syscalls, [], body).filter { line in
            !line.contains("resumed>") && syscalls.split(separator: ",").contains { line.contains($0 + "(") }
        }
    }

    /// The calls of `syscalls` (strace's list) the daemon makes while `body` runs that fail, as
    /// strace shows them.
    func failures(_ syscalls: String, _ body: () throws -> Void) throws -> [String] {
        try logged(syscalls, ["-Z"], body)
    }

    /// Runs `body` as `failing(_:with:on:_:)` does, and returns the calls that failed so, as strace
    /// shows them: a test can tell that the failure it meant happened.
    func failed(_ syscall: String, with error: String, on path: String, _ body: () throws -> Void) throws -> [String] {
        try logged(syscall, ["-P", path, "-e", "inject=\(syscall):error=\(error)"], body).filter { $0.contains("(INJECTED)") }
    }

    /// The lines strace writes while it traces `syscalls` with `arguments` and `body` runs.
    private func logged(_ syscalls: String, _ arguments: [String], _ body: () throws -> Void) throws -> [String] {
        let log = root.appendingPathComponent("strace-\(UUID().uuidString)").path
        try tracing(syscalls, arguments + ["-o", log], body)
        defer { try? FileManager.default.removeItem(atPath: log) }
        return ((try? String(contentsOfFile: log, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
    }

    /// Runs `body` while strace, with `arguments`, traces `syscall` in every thread of the daemon.
    private func tracing(_ syscall: String, _ arguments: [String], _ body: () throws -> Void) throws {
        guard geteuid() == 0 else { throw XCTSkip("strace attaches to the daemon, which needs root here") }
        guard Shell.run("command -v strace").status == 0 else { throw XCTSkip("strace is missing (scripts/setup.sh installs it)") }
        let pid = try XCTUnwrap(daemonPID)
        let tracer = Process()
        tracer.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        tracer.arguments = ["strace", "-f", "-qq", "-p", String(pid), "-e", "trace=" + syscall] + arguments
        try tracer.run()
        defer {
            tracer.terminate()
            tracer.waitUntilExit()
        }
        func traced() -> Bool {
            let threads = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
            return !threads.isEmpty && threads.allSatisfy { thread in
                let status = (try? String(contentsOfFile: "/proc/\(pid)/task/\(thread)/status", encoding: .utf8)) ?? ""
                return status.contains("TracerPid:\t\(tracer.processIdentifier)")
            }
        }
        let deadline = Date().addingTimeInterval(10)
        while !traced(), Date() < deadline { usleep(20_000) }
        guard traced() else { return XCTFail("strace did not attach to every thread of the daemon") }
        try body()
    }

    /// Kills the daemon as a crash would, leaving its mount stale.
    func crashDaemon() {
        guard let daemon else { return }
        kill(daemon.processIdentifier, SIGKILL)
        daemon.waitUntilExit()
    }

    /// Mounts the same store again at the same place (clearing a stale mount first, as the command does).
    func remount() throws {
        if let daemon, daemon.isRunning { crashDaemon() }
        try start(arguments)
    }

    private func start(_ arguments: [String]) throws {
        stderrPipe = Pipe()
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        process.standardError = stderrPipe
        try process.run()
        daemon = process
        let deadline = Date().addingTimeInterval(15)
        while !isMounted {
            guard process.isRunning else {
                throw ContainerError("the daemon exited (\(process.terminationStatus)) before mounting: \(daemonOutput)")
            }
            guard Date() < deadline else {
                unmount()
                throw ContainerError("the mount did not appear within 15 s: \(daemonOutput)")
            }
            usleep(20_000)
        }
    }

    /// Mounted and answering (a crashed daemon's mount is listed but answers ENOTCONN).
    var isMounted: Bool {
        let table = (try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8)) ?? ""
        guard table.contains(" \(mountPoint) ") else { return false }
        // statfs always reaches the daemon; stat may be answered from the kernel's cache. A FUSE
        // filesystem's: a stale mount taken down between the two looks reaches the bare directory.
        let root = open(mountPoint, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard root >= 0 else { return errno != ENOTCONN }
        defer { close(root) }
        let type = clinux_fs_type(root)
        return type == 0x6573_5546 || (type < 0 && errno != ENOTCONN)
    }

    var isListedInMountTable: Bool {
        ((try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8)) ?? "").contains(" \(mountPoint) ")
    }

    var daemonOutput: String {
        String(decoding: stderrPipe.fileHandleForReading.availableData, as: UTF8.self)
    }

    /// The container root of `app` in the mount.
    func container(_ app: String = SampleApps.notes) -> String { mountPoint + "/" + app }

    /// Backing path in the store, to look behind the daemon's back.
    func backing(_ app: String = SampleApps.notes) -> String { store.containerPath(AppID(app)!) }

    /// Unmounts and stops the daemon: politely, then by force. Removes the test's directories.
    func unmount() {
        if isMounted { _ = Shell.run("fusermount3 -u \(Shell.quote(mountPoint))") }
        if let daemon {
            let deadline = Date().addingTimeInterval(10)
            while daemon.isRunning && Date() < deadline { usleep(20_000) }
            if daemon.isRunning {
                kill(daemon.processIdentifier, SIGKILL)
                daemon.waitUntilExit()
            }
        }
        if isListedInMountTable { _ = Shell.run("fusermount3 -u -z \(Shell.quote(mountPoint))") }
        daemon = nil
        try? FileManager.default.removeItem(at: root)
    }

    deinit { unmount() }
}

/// Two apps with the shapes tests need: nested bundle folders, a symlink, documents, and Inbox files.
enum SampleApps {
    static let notes = "com.example.notes"
    static let photos = "com.example.photos"

    static func install(into store: Store, scratch: URL) throws {
        let files: [(String, String, [String: String])] = [
            (notes, "Notes.app", ["Info.plist": "<plist/>\n", "en.lproj/Main.strings": "\"a\" = \"b\";\n",
                                  "Resources/Deep/readme.txt": "deep\n"]),
            (photos, "Photos.app", ["Info.plist": "<plist/>\n"]),
        ]
        for (id, bundleName, contents) in files {
            let bundle = scratch.appendingPathComponent(bundleName)
            for (path, text) in contents {
                let url = bundle.appendingPathComponent(path)
                try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
                try text.write(to: url, atomically: false, encoding: .utf8)
            }
            try FileManager.default.createSymbolicLink(atPath: bundle.appendingPathComponent("Link").path,
                                                       withDestinationPath: "Info.plist")
            try Installer.install(bundle: bundle.path, into: store, id: AppID(id)!)
            let container = store.containerPath(AppID(id)!)
            try "hello\n".write(toFile: container + "/Documents/hello.txt", atomically: false, encoding: .utf8)
            try "delivered\n".write(toFile: container + "/Documents/Inbox/letter.txt", atomically: false, encoding: .utf8)
            try FileManager.default.createDirectory(atPath: container + "/Documents/Inbox/folder", withIntermediateDirectories: true)
            try "inside\n".write(toFile: container + "/Documents/Inbox/folder/item.txt", atomically: false, encoding: .utf8)
        }
    }
}

/// Runs shell commands as a user would.
enum Shell {
    struct Result {
        let status: Int32
        let output: String
        let error: String
    }

    /// Runs `script` with bash; a command still running after `limit` seconds is killed, so a
    /// hang fails its test instead of stalling the run.
    @discardableResult
    static func run(_ script: String, in directory: String? = nil, limit: Int = 120) -> Result {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/timeout")
        process.arguments = ["-k", "5", String(limit), "/bin/bash", "-c", script]
        if let directory { process.currentDirectoryURL = URL(fileURLWithPath: directory) }
        let output = Pipe(), error = Pipe()
        process.standardOutput = output
        process.standardError = error
        do { try process.run() } catch { return Result(status: -1, output: "", error: "\(error)") }
        let outData = output.fileHandleForReading.readDataToEndOfFile()
        let errData = error.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return Result(status: process.terminationStatus, output: String(decoding: outData, as: UTF8.self),
                      error: String(decoding: errData, as: UTF8.self))
    }

    static func quote(_ text: String) -> String { "'" + text.replacingOccurrences(of: "'", with: "'\\''") + "'" }
}

/// A test case with a fresh mounted store per test.
class MountedTestCase: XCTestCase {
    var mounted: MountedStore!

    /// Override to mount one app alone.
    var mountedApp: String? { nil }

    override func setUpWithError() throws {
        mounted = try MountedStore(app: mountedApp)
    }

    override func tearDown() {
        mounted?.unmount()
        mounted = nil
    }

    /// Runs `check` on this test's mount, whose readers of Documents read through passthrough
    /// where the kernel and the daemon's privileges allow, then on one whose readers read through
    /// the page cache.
    func onBothReadPaths(_ check: () -> Void) throws {
        check()
        try remountWithoutPassthrough()
        check()
    }

    func remountWithoutPassthrough() throws {
        try remount(with: "no_passthrough")
    }

    /// Mounts a fresh store in place of this test's, with the mount options `options`.
    func remount(with options: String) throws {
        mounted.unmount()
        mounted = try MountedStore(extraArguments: ["-o", options])
    }

    /// Writes `content` (a Python bytes literal's text) to `path`, opened with `flags` (Python's
    /// `os` flags), fsyncs it if `syncing`, and closes it, while every `call` of the daemon fails
    /// with EIO: the writer must hear EIO.
    func write(to path: String, _ content: String, flags: String, syncing: Bool = true, whileFailing call: String) throws {
        try write(to: path, bytes: "b'\(content)'", flags: flags, syncing: syncing, whileFailing: call)
    }

    /// The same, writing what the Python expression `bytes` gives.
    func write(to path: String, bytes: String, flags: String, syncing: Bool = true, whileFailing call: String) throws {
        try mounted.failing(call, with: "EIO") {
            syscall("""
            f = os.open('\(path)', \(flags), 0o644)
            os.write(f, \(bytes))
            try:
                if \(syncing ? "True" : "False"):
                    os.fsync(f)
            finally:
                os.close(f)
            """, errno: EIO)
        }
    }

    /// The container root the commands run in.
    var home: String { mountedApp == nil ? mounted.container() : mounted.mountPoint }

    /// Runs a shell command in the container root; fails the test if it fails.
    @discardableResult
    func sh(_ script: String, file: StaticString = #filePath, line: UInt = #line) -> String {
        let result = Shell.run(script, in: home)
        XCTAssertEqual(result.status, 0, "`\(script)` failed: \(result.error)", file: file, line: line)
        return result.output
    }

    /// Runs a shell command that must fail with the message of `errno` (as strerror words it).
    func shFails(_ script: String, with errno: Int32, file: StaticString = #filePath, line: UInt = #line) {
        let result = Shell.run(script, in: home)
        let message = String(cString: strerror(errno))
        XCTAssertNotEqual(result.status, 0, "`\(script)` succeeded but should fail with \(message)", file: file, line: line)
        XCTAssertTrue(result.error.contains(message), "`\(script)` should fail with \"\(message)\", said: \(result.error)",
                      file: file, line: line)
    }

    /// Runs a system call through Python and checks the exact errno (0: success).
    func syscall(_ python: String, errno expected: Int32, file: StaticString = #filePath, line: UInt = #line) {
        let script = """
        import os, errno, sys, ctypes, mmap, fcntl
        try:
        \(python.split(separator: "\n").map { "    " + $0 }.joined(separator: "\n"))
            print(0)
        except OSError as e:
            print(e.errno)
        """
        let result = Shell.run("python3 -c \(Shell.quote(script))", in: home)
        let got = Int32(result.output.trimmingCharacters(in: .whitespacesAndNewlines)) ?? -1
        XCTAssertEqual(got, expected, "\(python): expected errno \(expected) (\(String(cString: strerror(expected)))), got \(got) \(result.error)",
                       file: file, line: line)
    }
}

extension MountedTestCase {
    /// Runs `script` (bash, in the directory) in each place; it prints what it checks, and every place
    /// must print what the plain directory printed (and `expected`, when given).
    func everywhere(_ script: String, expected: String? = nil, file: StaticString = #filePath, line: UInt = #line) {
        let plain = mounted.root.appendingPathComponent("plain-\(UUID().uuidString)").path
        XCTAssertNoThrow(try FileManager.default.createDirectory(atPath: plain, withIntermediateDirectories: true))
        defer { try? FileManager.default.removeItem(atPath: plain) }
        let places = [plain, home + "/Documents", home + "/Library/Application Support"]
        var reference: String?
        for place in places {
            let directory = place == plain ? place : place + "/live-\(UUID().uuidString.prefix(8))"
            XCTAssertNoThrow(try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true))
            let result = Shell.run("set -e\n" + script, in: directory, limit: 60)
            XCTAssertEqual(result.status, 0, "in \(place): \(result.error)", file: file, line: line)
            if let expected { XCTAssertEqual(result.output, expected, "in \(place)", file: file, line: line) }
            if let reference {
                XCTAssertEqual(result.output, reference, "in \(place), unlike the plain directory", file: file, line: line)
            } else {
                reference = result.output
            }
        }
    }
}
