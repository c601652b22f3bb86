import Coordination
@testable import FileCoordination
import Foundation
import XCTest

/// Outside a ContainerFS mount: coordination between the threads of this process.
final class InProcessCoordinatorTests: XCTestCase {
    private var directory: URL!
    private var presenters: [RecordingPresenter] = []

    override func setUp() {
        directory = makeTemporaryDirectory()
        Placement.locator = MountLocator()
    }

    override func tearDown() {
        for presenter in presenters { FileCoordinator.removeFilePresenter(presenter) }
        presenters = []
        try? FileManager.default.removeItem(at: directory)
    }

    private func file(_ name: String, contents: String? = "text") -> URL {
        let url = directory.appendingPathComponent(name)
        if let contents { try? Data(contents.utf8).write(to: url) }
        return url
    }

    private func present(_ url: URL) -> RecordingPresenter {
        let presenter = RecordingPresenter(url)
        FileCoordinator.addFilePresenter(presenter)
        presenters.append(presenter)
        return presenter
    }

    /// Runs `body` on another thread; returns a semaphore signalled when it ends.
    private func inBackground(_ body: @escaping @Sendable () -> Void) -> DispatchSemaphore {
        let done = DispatchSemaphore(value: 0)
        Thread { body(); done.signal() }.start()
        return done
    }

    func testAsyncAccessorsSuspendWhileHoldingTheirAccessAndAWriterWaitsForAllOfThem() async throws {
        // 20 readers that each suspend inside their access: on a cooperative pool of a thread or
        // two, blocking accessors could not all hold at once.
        let url = file("async.txt")
        let events = Events()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<20 {
                group.addTask {
                    try await FileCoordinator().coordinate(readingItemAt: url) { _ in
                        events.append("read")
                        try await Task.sleep(for: .milliseconds(200))
                        events.append("read done")
                    }
                }
            }
            while events.all.filter({ $0 == "read" }).count < 20 { try await Task.sleep(for: .milliseconds(5)) }
            group.addTask {
                try await FileCoordinator().coordinate(writingItemAt: url) { _ in events.append("write") }
            }
            try await group.waitForAll()
        }
        XCTAssertEqual(events.all.filter { $0 == "read done" }.count, 20)
        XCTAssertEqual(events.all.last, "write", "the write waited for every read")
    }

    func testReadsShare() throws {
        let note = file("note.txt")
        let inside = DispatchSemaphore(value: 0)
        let leave = DispatchSemaphore(value: 0)
        let first = inBackground {
            try? FileCoordinator().coordinate(readingItemAt: note) { _ in
                inside.signal()
                leave.wait()
            }
        }
        XCTAssertEqual(inside.wait(timeout: .now() + 3), .success)
        let events = Events()
        try FileCoordinator().coordinate(readingItemAt: note) { _ in events.append("second read") }
        XCTAssertEqual(events.all, ["second read"], "ran while the first read was held")
        leave.signal()
        XCTAssertEqual(first.wait(timeout: .now() + 3), .success)
    }

    func testAWriteExcludesReadsAndWrites() throws {
        let note = file("note.txt")
        let events = Events()
        let inside = DispatchSemaphore(value: 0)
        let leave = DispatchSemaphore(value: 0)
        let writer = inBackground {
            try? FileCoordinator().coordinate(writingItemAt: note) { _ in
                events.append("write begins")
                inside.signal()
                leave.wait()
                events.append("write ends")
            }
        }
        XCTAssertEqual(inside.wait(timeout: .now() + 3), .success)
        let reader = inBackground {
            try? FileCoordinator().coordinate(readingItemAt: note) { _ in events.append("read") }
        }
        let otherWriter = inBackground {
            try? FileCoordinator().coordinate(writingItemAt: note) { _ in events.append("second write") }
        }
        usleep(200_000)
        XCTAssertEqual(events.all, ["write begins"], "both wait for the write")
        leave.signal()
        for done in [writer, reader, otherWriter] { XCTAssertEqual(done.wait(timeout: .now() + 3), .success) }
        XCTAssertEqual(Array(events.all.prefix(2)), ["write begins", "write ends"])
        XCTAssertEqual(Set(events.all.suffix(2)), ["read", "second write"])
    }

    func testOneCoordinatorNestsWithoutDeadlock() throws {
        let note = file("note.txt")
        let coordinator = FileCoordinator()
        var ran = false
        try coordinator.coordinate(writingItemAt: note) { _ in
            try coordinator.coordinate(readingItemAt: note) { _ in ran = true }
        }
        XCTAssertTrue(ran)
    }

    func testOtherPresentersHearAWriteTheInitiatorHearsNothing() throws {
        let note = file("note.txt")
        let editor = present(note)
        let folder = present(directory)
        let writersOwn = present(note)
        let coordinator = FileCoordinator(filePresenter: writersOwn)
        try coordinator.coordinate(writingItemAt: note) { url in
            XCTAssertEqual(editor.events.all, ["relinquishToWriter"], "relinquished before the accessor runs")
            try Data("new".utf8).write(to: url)
        }
        eventually("editor told") { editor.events.all.count == 4 }
        XCTAssertEqual(editor.events.all, ["relinquishToWriter", "didChange", "reacquirerRan", "reacquire"])
        eventually("folder told") { folder.events.all == ["subitemDidChange note.txt"] }
        usleep(100_000)
        XCTAssertEqual(writersOwn.events.all, [], "the initiating presenter hears nothing")
    }

    func testACreatedItemAppearsToItsDirectory() throws {
        let folder = present(directory)
        let fresh = file("fresh.txt", contents: nil)
        try FileCoordinator().coordinate(writingItemAt: fresh) { url in
            try Data("hello".utf8).write(to: url)
        }
        eventually("appeared") { folder.events.all == ["subitemDidAppear fresh.txt"] }
    }

    func testABurstReachesAPresenterOnItsQueueInOrderEvenWhenTheQueueIsConcurrent() throws {
        let folder = RecordingPresenter(directory, concurrent: true)
        folder.callbackDelay = 0...3_000   // callbacks side by side would finish out of order
        FileCoordinator.addFilePresenter(folder)
        presenters.append(folder)
        let names = (0..<50).map { "burst\($0).txt" }
        for name in names {
            try FileCoordinator().coordinate(writingItemAt: file(name, contents: nil)) { url in
                try Data("x".utf8).write(to: url)
            }
        }
        eventually("all heard") { folder.events.all.count >= names.count }
        XCTAssertEqual(folder.events.all, names.map { "subitemDidAppear \($0)" })
    }

    func testAReadAsksPresentersToSaveFirst() throws {
        let note = file("note.txt")
        let editor = present(note)
        try FileCoordinator().coordinate(readingItemAt: note) { _ in
            XCTAssertEqual(editor.events.all, ["relinquishToReader", "save"])
        }
        eventually("reacquired") { editor.events.all.count == 4 }
        XCTAssertEqual(editor.events.all.suffix(2), ["reacquirerRan", "reacquire"])

        editor.events.clear()
        try FileCoordinator().coordinate(readingItemAt: note, options: .withoutChanges) { _ in }
        eventually("reacquired") { editor.events.all.count == 3 }
        XCTAssertEqual(editor.events.all.first, "relinquishToReader")
        XCTAssertFalse(editor.events.all.contains("save"), "withoutChanges skips saving")
    }

    func testDeletingAsksPresentersToAccommodate() throws {
        let folderURL = directory.appendingPathComponent("folder")
        try FileManager.default.createDirectory(at: folderURL, withIntermediateDirectories: true)
        let inner = folderURL.appendingPathComponent("inner.txt")
        try Data("x".utf8).write(to: inner)
        let innerPresenter = present(inner)
        let folderPresenter = present(folderURL)
        let parent = present(directory)
        try FileCoordinator().coordinate(writingItemAt: folderURL, options: .forDeleting) { url in
            XCTAssertEqual(innerPresenter.events.all, ["accommodateDeletion"])
            XCTAssertEqual(folderPresenter.events.all, ["accommodateDeletion"])
            XCTAssertEqual(parent.events.all, ["accommodateSubitemDeletion folder"])
            try FileManager.default.removeItem(at: url)
        }
    }

    func testAMoveIsToldToPresentersWhoFollowIt() throws {
        let old = file("old.txt")
        let new = directory.appendingPathComponent("new.txt")
        let editor = present(old)
        let folder = present(directory)
        let mover = FileCoordinator()
        try mover.coordinate(writingItemAt: old, options: .forMoving, writingItemAt: new, options: .forReplacing) { source, destination in
            XCTAssertEqual(editor.events.all, ["relinquishToWriter"])
            try FileManager.default.moveItem(at: source, to: destination)
            mover.item(at: source, didMoveTo: destination)
        }
        eventually("moved") { editor.events.all.count == 4 }
        XCTAssertEqual(editor.events.all, ["relinquishToWriter", "didMove \(new.path)", "reacquirerRan", "reacquire"])
        eventually("folder told") { folder.events.all == ["subitemDidMove old.txt new.txt"] }

        // The presenter now follows the new path.
        editor.events.clear()
        try FileCoordinator().coordinate(writingItemAt: new) { _ in }
        eventually("told about the new path") { editor.events.all.contains("didChange") }
    }

    func testCancelEndsAWaitingAccessWithoutRunningIt() throws {
        let note = file("note.txt")
        let inside = DispatchSemaphore(value: 0)
        let leave = DispatchSemaphore(value: 0)
        let holder = inBackground {
            try? FileCoordinator().coordinate(writingItemAt: note) { _ in
                inside.signal()
                leave.wait()
            }
        }
        XCTAssertEqual(inside.wait(timeout: .now() + 3), .success)
        let waiting = FileCoordinator()
        let events = Events()
        let waiter = inBackground {
            var error: NSError?
            waiting.coordinate(readingItemAt: note, options: [], error: &error) { _ in events.append("ran") }
            events.append("returned \(error?.domain ?? "-") \(error?.code ?? 0)")
        }
        usleep(150_000)
        XCTAssertEqual(events.all, [])
        waiting.cancel()
        XCTAssertEqual(waiter.wait(timeout: .now() + 3), .success)
        XCTAssertEqual(events.all, ["returned \(NSCocoaErrorDomain) \(NSUserCancelledError)"])
        leave.signal()
        XCTAssertEqual(holder.wait(timeout: .now() + 3), .success)

        // The coordinator stays usable.
        try waiting.coordinate(readingItemAt: note) { _ in events.append("later") }
        XCTAssertEqual(events.all.last, "later")
    }

    func testATimeoutEndsAWait() throws {
        let note = file("note.txt")
        let coordinator = FileCoordinator()
        try coordinator.coordinate(writingItemAt: note) { _ in
            let other = FileCoordinator()
            other.timeout = 0.1
            XCTAssertThrowsError(try other.coordinate(readingItemAt: note) { _ in XCTFail("must not run") }) {
                XCTAssertEqual($0 as? FileCoordinationError, .timedOut)
            }
        }
    }

    func testAStuckPresenterDelaysAWriteOnlyBoundedly() throws {
        let note = file("note.txt")
        let stuck = present(note)
        stuck.isStuck = true
        let started = Date()
        try FileCoordinator().coordinate(writingItemAt: note) { _ in }
        let waited = Date().timeIntervalSince(started)
        XCTAssertGreaterThan(waited, 1.5)
        XCTAssertLessThan(waited, 4)
        XCTAssertEqual(LocalDomain.shared.registry.unresponsivePresenters().count, 1)
    }

    func testAsynchronousIntents() throws {
        let note = file("note.txt")
        let other = file("other.txt")
        let editor = present(note)
        let queue = OperationQueue()
        let done = DispatchSemaphore(value: 0)
        let events = Events()
        FileCoordinator().coordinate(with: [.readingIntent(with: other), .writingIntent(with: note)], queue: queue) { error in
            events.append(error == nil ? "accessor" : "error \(error!)")
            events.append(contentsOf: editor.events.all)
            done.signal()
        }
        XCTAssertEqual(done.wait(timeout: .now() + 3), .success)
        XCTAssertEqual(events.all, ["accessor", "relinquishToWriter"])
        eventually("published") { editor.events.all.contains("didChange") }
    }

    func testPresentersAreListedAndRemoved() {
        let note = file("note.txt")
        let one = present(note)
        XCTAssertTrue(FileCoordinator.filePresenters.contains { $0 === one })
        FileCoordinator.removeFilePresenter(one)
        XCTAssertFalse(FileCoordinator.filePresenters.contains { $0 === one })
        let coordinator = FileCoordinator(filePresenter: one)
        XCTAssertTrue(coordinator.purposeIdentifier.hasPrefix("presenter-"))
        coordinator.purposeIdentifier = "mine"
        XCTAssertEqual(coordinator.purposeIdentifier, "mine")
    }
}

private extension Events {
    func append(contentsOf events: [String]) { for event in events { append(event) } }
}
