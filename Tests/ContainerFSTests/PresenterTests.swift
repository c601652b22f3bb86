import Containers
import Foundation
import Glibc
import XCTest

/// A presenter in another process (`containerfs watch --json`) hears, in order, what ordinary
/// programs do through the mount (docs/coordination.md, "Presenters and messages").
final class PresenterTests: MountedTestCase {
    /// A running `containerfs watch --json` and the events it printed so far.
    final class Watcher {
        let process = Process()
        private let output = Pipe()
        private var buffer = Data()

        init(_ paths: [String], extra: [String] = []) throws {
            process.executableURL = URL(fileURLWithPath: MountedStore.executable)
            process.arguments = ["watch", "--json"] + extra + paths
            process.standardOutput = output
            process.standardError = FileHandle.nullDevice
            try process.run()
        }

        /// Events as (event, path, newPath) with paths as printed, read until `count` arrived or time ran out.
        /// Versions kept are left out: they come from the daemon's background queue, in no fixed
        /// order with the operation's (VersionTests hears them).
        func events(atLeast count: Int, within seconds: Double = 10) -> [[String: String]] {
            let deadline = Date().addingTimeInterval(seconds)
            var parsed: [[String: String]] = []
            let handle = output.fileHandleForReading
            let flags = fcntl(handle.fileDescriptor, F_GETFL)
            _ = fcntl(handle.fileDescriptor, F_SETFL, flags | O_NONBLOCK)
            while Date() < deadline {
                var chunk = [UInt8](repeating: 0, count: 65536)
                let got = read(handle.fileDescriptor, &chunk, chunk.count)
                if got > 0 { buffer.append(contentsOf: chunk[0..<got]) }
                parsed = String(decoding: buffer, as: UTF8.self).split(separator: "\n").compactMap { line in
                    (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: String]
                }.filter { !($0["event"] ?? "").hasSuffix("DidGainVersion") }
                if parsed.count >= count { break }
                usleep(20_000)
            }
            return parsed
        }

        func stop() {
            if process.isRunning { process.terminate() }
            process.waitUntilExit()
        }

        deinit { stop() }
    }

    /// Starts a watcher and waits until the daemon lists its presenters.
    func watch(_ paths: [String], extra: [String] = []) throws -> Watcher {
        let watcher = try Watcher(paths.map { home + "/" + $0 }, extra: extra)
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline {
            let status = Shell.run("\(Shell.quote(MountedStore.executable)) status --json \(Shell.quote(mounted.mountPoint))").output
            if status.components(separatedBy: "\"presenters\"").count > 1,
               paths.allSatisfy({ status.contains($0.split(separator: "/").last.map(String.init) ?? $0) }) { break }
            usleep(50_000)
        }
        return watcher
    }

    private func names(_ events: [[String: String]], under prefix: String = "") -> [String] {
        events.map { event in
            let path = (event["path"] ?? "").replacingOccurrences(of: home + "/", with: "")
            return "\(event["event"]!) \(path)"
        }
    }

    override func tearDown() {
        super.tearDown()
    }

    /// A watcher that cannot reach the mount's daemon says so and exits: it sat silent, hearing
    /// nothing, when another daemon had taken the control socket away.
    func testAWatcherThatCannotReachTheDaemonSaysSo() throws {
        let socketPath = try XCTUnwrap(MountedStore.controlSocket(of: mounted.mountPoint))
        XCTAssertEqual(rename(socketPath, socketPath + ".away"), 0)
        defer { rename(socketPath + ".away", socketPath) }
        let result = Shell.run("timeout 10 \(Shell.quote(MountedStore.executable)) watch \(Shell.quote(home + "/Documents"))")
        XCTAssertEqual(result.status, 1, "exits at once: \(result.error)")
        XCTAssertTrue(result.error.contains(socketPath), result.error)
    }

    func testEditorSaveIsADidChangeNotADeletion() throws {
        let watcher = try watch(["Documents/hello.txt"])
        // vim-style: write a new file, rename it over the original.
        sh("printf 'saved by editor\\n' > Documents/.hello.swp && mv Documents/.hello.swp Documents/hello.txt")
        let heard = names(watcher.events(atLeast: 3))
        XCTAssertEqual(Array(heard.prefix(3)), [
            "relinquishPresentedItemToWriter Documents/hello.txt",
            "presentedItemDidChange Documents/hello.txt",
            "reacquirePresentedItem Documents/hello.txt",
        ])
        XCTAssertFalse(heard.contains { $0.hasPrefix("accommodatePresentedItemDeletion") })
    }

    func testSedInPlaceAndReadingMakeThePresenterSaveFirst() throws {
        let watcher = try watch(["Documents/hello.txt"])
        sh("cat Documents/hello.txt > /dev/null")
        XCTAssertEqual(names(watcher.events(atLeast: 3)), [
            "relinquishPresentedItemToReader Documents/hello.txt",
            "savePresentedItemChanges Documents/hello.txt",
            "reacquirePresentedItem Documents/hello.txt",
        ])
        sh("sed -i 's/hello/goodbye/' Documents/hello.txt")
        let heard = names(watcher.events(atLeast: 9))
        XCTAssertEqual(Array(heard.dropFirst(3).prefix(6)), [
            "relinquishPresentedItemToReader Documents/hello.txt",
            "savePresentedItemChanges Documents/hello.txt",
            "reacquirePresentedItem Documents/hello.txt",
            "relinquishPresentedItemToWriter Documents/hello.txt",
            "presentedItemDidChange Documents/hello.txt",
            "reacquirePresentedItem Documents/hello.txt",
        ])
    }

    func testMovingAParentDirectoryMovesThePresentedItem() throws {
        sh("mkdir -p Documents/Project/Notes && echo x > Documents/Project/Notes/todo.txt")
        let watcher = try watch(["Documents/Project/Notes/todo.txt"])
        sh("mv Documents/Project Documents/Renamed")
        // Moving is a write: the presenter lets go first, then hears where its item went.
        let heard = watcher.events(atLeast: 3)
        XCTAssertEqual(heard.first?["event"], "relinquishPresentedItemToWriter")
        let moved = heard.first { $0["event"] == "presentedItemDidMove" }
        XCTAssertEqual(moved?["event"], "presentedItemDidMove")
        XCTAssertEqual(moved?["newPath"], home + "/Documents/Renamed/Notes/todo.txt")
        // The presenter follows the item: a change at its new place reaches it.
        sh("echo y >> Documents/Renamed/Notes/todo.txt")
        XCTAssertTrue(names(watcher.events(atLeast: 5)).contains("presentedItemDidChange Documents/Renamed/Notes/todo.txt"))
    }

    func testRemovingATreeAsksItsPresentersToAccommodate() throws {
        sh("mkdir -p Documents/Old/Sub && echo x > Documents/Old/Sub/file.txt")
        let watcher = try watch(["Documents/Old/Sub/file.txt", "Documents"])
        sh("rm -r Documents/Old")
        // The file's presenter hears its deletion; the directory's, those of the file, Sub and Old.
        let heard = names(watcher.events(atLeast: 4))
        XCTAssertTrue(heard.contains("accommodatePresentedItemDeletion Documents/Old/Sub/file.txt"), "\(heard)")
        XCTAssertTrue(heard.contains("accommodatePresentedSubitemDeletion Documents/Old"), "\(heard)")
    }

    func testFoundationsAtomicWriteIsHeardAsAChangeOfTheFile() throws {
        let watcher = try watch(["Documents/hello.txt", "Documents"])
        // What Foundation's Data.write(to:options: .atomic) does on Linux (strace shows it): a
        // temporary file beside the item, renamed over it.
        sh("printf changed > Documents/.dat.nosync1F2E.aB3dEf && mv Documents/.dat.nosync1F2E.aB3dEf Documents/hello.txt")
        let heard = names(watcher.events(atLeast: 4))
        XCTAssertEqual(Set(heard), [
            "relinquishPresentedItemToWriter Documents/hello.txt", "presentedItemDidChange Documents/hello.txt",
            "presentedSubitemDidChange Documents/hello.txt", "reacquirePresentedItem Documents/hello.txt",
        ], "\(heard)")
        XCTAssertEqual(heard.count, 4, "\(heard)")
    }

    func testCopyOverAFileIsAWrite() throws {
        sh("echo other > Documents/other.txt")
        let watcher = try watch(["Documents/hello.txt"])
        sh("cp Documents/other.txt Documents/hello.txt")
        XCTAssertEqual(names(watcher.events(atLeast: 3)), [
            "relinquishPresentedItemToWriter Documents/hello.txt",
            "presentedItemDidChange Documents/hello.txt",
            "reacquirePresentedItem Documents/hello.txt",
        ])
    }

    func testAPresenterThatNeverAnswersDelaysNoLongerThanTheTimeout() throws {
        try remount(with: "presenter_timeout=1")
        let watcher = try watch(["Documents/hello.txt"], extra: ["--on-save", "sleep 60"])
        let started = Date()
        XCTAssertEqual(sh("cat Documents/hello.txt"), "hello\n")
        let waited = Date().timeIntervalSince(started)
        XCTAssertLessThan(waited, 20, "a presenter that never answers must not hang a reader")
        let status = Shell.run("\(Shell.quote(MountedStore.executable)) status \(Shell.quote(mounted.mountPoint))").output
        XCTAssertTrue(status.contains("Unresponsive presenters: 1"), status)
        watcher.stop()
    }

    func testANewFileAppearsOnceItsFirstContentIsThereToRead() throws {
        let watcher = try watch(["Documents"])
        let writer = Process()
        writer.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        writer.arguments = ["-c", "import time; f = open('Documents/new.txt', 'w'); f.write('content'); f.flush(); time.sleep(1.5); f.close()"]
        writer.currentDirectoryURL = URL(fileURLWithPath: home)
        try writer.run()
        XCTAssertEqual(names(watcher.events(atLeast: 1, within: 1)), [], "heard of the file while it was being written")
        writer.waitUntilExit()
        XCTAssertEqual(writer.terminationStatus, 0)
        XCTAssertEqual(names(watcher.events(atLeast: 1)), ["presentedSubitemDidAppear Documents/new.txt"])
        sh("touch Documents/empty.txt")
        XCTAssertEqual(names(watcher.events(atLeast: 2)).last, "presentedSubitemDidAppear Documents/empty.txt",
                       "a file created with nothing written appears too")
    }

    func testAPresenterOnABusyDirectoryKeepsUp() throws {
        // The presenter's callbacks name items by URL; making one must not touch the mount, where
        // the operation being announced waits for the callback's answer.
        let watcher = try watch(["Documents"])
        sh("""
        mkdir -p Documents/busy
        for worker in 1 2 3; do
          ( for i in $(seq 1 30); do echo x > Documents/busy/$worker-$i; rm Documents/busy/$worker-$i; done ) &
        done
        wait
        """)
        let heard = names(watcher.events(atLeast: 181, within: 30))
        XCTAssertEqual(heard.filter { $0.hasPrefix("accommodatePresentedSubitemDeletion Documents/busy/") }.count, 90)
        XCTAssertFalse(mounted.daemonOutput.contains("did not answer in time"), "the presenter was marked unresponsive")
    }

    func testDocumentsOfTwoProcessesReloadAndKeepConflicts() {
        // Two processes with a Document each on one file. Opening makes the other save first; a
        // save that meets the other's later, unsaved edit is kept beside the file, and the edit too.
        let binary = Shell.quote(MountedStore.executable)
        let out = Shell.quote(mounted.root.path)
        sh("printf first > Documents/note.txt")
        let result = Shell.run("""
        \(binary) example-document Documents/note.txt --edit 'their edit' --delay 1 --wait 3 --save-at-end > \(out)/theirs.out &
        for i in $(seq 200); do grep -q opened \(out)/theirs.out 2>/dev/null && break; sleep 0.05; done
        \(binary) example-document Documents/note.txt --edit 'my save' --delay 2 --save > \(out)/mine.out
        wait
        cat \(out)/theirs.out \(out)/mine.out; cat Documents/note.txt; echo; cat 'Documents/note (conflict).txt'; echo
        """, in: home, limit: 60)
        XCTAssertEqual(result.status, 0, result.error)
        XCTAssertEqual(result.output, """
        opened: first
        conflict kept: note (conflict).txt
        holds: their edit
        opened: first
        holds: my save
        their edit
        my save

        """)
    }

    func testOpeningADocumentMakesAnotherProcessSaveItsEditsFirst() {
        // The other process saves in savePresentedItemChanges, without a coordinator of its own:
        // its write goes ahead while the read that asked waits for its answer.
        let binary = Shell.quote(MountedStore.executable)
        let out = Shell.quote(mounted.root.path)
        sh("printf first > Documents/note.txt")
        let result = Shell.run("""
        \(binary) example-document Documents/note.txt --edit 'unsaved edit' --wait 2 > \(out)/theirs.out &
        for i in $(seq 200); do grep -q opened \(out)/theirs.out 2>/dev/null && break; sleep 0.05; done
        sleep 0.3
        \(binary) example-document Documents/note.txt
        wait
        """, in: home, limit: 60)
        XCTAssertEqual(result.status, 0, result.error)
        XCTAssertEqual(result.output, "opened: unsaved edit\nholds: unsaved edit\n")
        XCTAssertFalse(mounted.daemonOutput.contains("did not answer in time"), "the presenter answered in time")
    }

    func testADocumentsSaveShowsFolderPresentersAChangeAndNoTemporaryFile() throws {
        sh("printf first > Documents/note.txt")
        let watcher = try watch(["Documents"])
        defer { watcher.stop() }
        sh("\(Shell.quote(MountedStore.executable)) example-document Documents/note.txt --edit saved --save > /dev/null")
        let heard = names(watcher.events(atLeast: 1))
        XCTAssertEqual(heard.first, "presentedSubitemDidChange Documents/note.txt")
        XCTAssertFalse(heard.contains { $0.contains(".saving") }, "\(heard)")
    }

    func testDeliveriesWhileMountedReachTheInboxPresenters() throws {
        let watcher = try watch(["Documents/Inbox"])
        let file = mounted.root.appendingPathComponent("report.pdf").path
        XCTAssertTrue(FileManager.default.createFile(atPath: file, contents: Data("%PDF-1.4\n".utf8)))
        let delivered = Shell.run("\(Shell.quote(MountedStore.executable)) deliver \(Shell.quote(mounted.store.root)) \(SampleApps.notes) \(Shell.quote(file))")
        XCTAssertEqual(delivered.status, 0, delivered.error)
        XCTAssertEqual(names(watcher.events(atLeast: 1)).first, "presentedSubitemDidAppear Documents/Inbox/report.pdf")
        XCTAssertEqual(sh("cat Documents/Inbox/report.pdf"), "%PDF-1.4\n")
    }

    func testCoordinatedWriteOfAClientHoldsOffOrdinaryReaders() throws {
        // `containerfs coordinate --write` holds the file; a reader waits until the command ends.
        let script = "\(Shell.quote(MountedStore.executable)) coordinate --write Documents/hello.txt -- sh -c 'sleep 1; echo coordinated > Documents/hello.txt' & sleep 0.3; cat Documents/hello.txt; wait"
        XCTAssertEqual(sh(script), "coordinated\n")
    }

    func testAPresenterMakesWayBeforeAClientsAccessorRunsAndReacquiresAfter() throws {
        // Apple's order across processes: the watcher's relinquish (its hook notes it) comes before
        // the coordinated command runs, however long the command waits before touching the file.
        let log = mounted.root.appendingPathComponent("order.log").path
        let watcher = try watch(["Documents/hello.txt"], extra: ["--on-relinquish", "echo relinquished >> '\(log)'"])
        defer { watcher.stop() }
        let run = Shell.run("""
        \(Shell.quote(MountedStore.executable)) coordinate --write Documents/hello.txt -- sh -c \
          "echo accessor >> '\(log)'; sleep 0.5; echo changed > Documents/hello.txt"
        """, in: home)
        XCTAssertEqual(run.status, 0, run.error)
        XCTAssertEqual(try String(contentsOfFile: log, encoding: .utf8), "relinquished\naccessor\n")
        let events = names(watcher.events(atLeast: 3))
        XCTAssertEqual(events.first, "relinquishPresentedItemToWriter Documents/hello.txt")
        XCTAssertEqual(events.last, "reacquirePresentedItem Documents/hello.txt", "\(events)")
        XCTAssertEqual(events.filter { $0.hasPrefix("relinquish") }.count, 1, "asked once: \(events)")
        XCTAssertTrue(events.contains("presentedItemDidChange Documents/hello.txt"), "\(events)")
    }

    func testTheExampleAppRunsOnTheMount() {
        let result = Shell.run("mkdir Documents/Notes && \(Shell.quote(MountedStore.executable)) example-notes --add 'first note' --once Documents/Notes", in: home)
        XCTAssertEqual(result.status, 0, result.error)
        XCTAssertFalse(sh("ls Documents/Notes").isEmpty)
    }

    func testClientsMayCoordinateOnlyWhatTheirUserMayAccess() throws {
        try XCTSkipIf(geteuid() != 0, "acting as another user needs root")
        try remount(with: "allow_other")
        let binary = Shell.quote(MountedStore.executable)
        let asUser = "setpriv --reuid=4242 --regid=4242 --clear-groups"
        // hello.txt is root's, readable by everyone, writable by root alone.
        let read = Shell.run("\(asUser) \(binary) coordinate --read Documents/hello.txt -- cat Documents/hello.txt", in: home)
        XCTAssertEqual(read.status, 0, read.error)
        XCTAssertEqual(read.output, "hello\n")
        let write = Shell.run("\(asUser) \(binary) coordinate --write --timeout 5 Documents/hello.txt -- true", in: home)
        XCTAssertNotEqual(write.status, 0, "a user without write permission must not take a coordinated write")
        XCTAssertTrue(write.error.lowercased().contains("denied") || write.error.lowercased().contains("permission"), write.error)
    }
}
