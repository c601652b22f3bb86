import Coordination
import XCTest

final class CoordinationEngineTests: XCTestCase {
    private let scheduler = ManualScheduler()
    private let transport = RecordingTransport()
    private let registry = PresenterRegistry()
    private var engine: CoordinationEngine!
    private let editor = PresenterKey(owner: bob, purpose: PurposeID("editor"))
    private let folderWatcher = PresenterKey(owner: carol, purpose: PurposeID("watcher"))

    override func setUp() {
        let messenger = Messenger(registry: registry, transport: transport, scheduler: scheduler)
        transport.connect(messenger)
        engine = CoordinationEngine(arbiter: Arbiter(scheduler: scheduler), registry: registry, messenger: messenger)
        registry.add(editor, path: path("Documents/note.txt"))
        registry.add(folderWatcher, path: path("Documents"))
    }

    private func begin(_ operation: CoordinatedOperation, owner: OwnerID = alice, isDirectory: Bool = false,
                       timeout: Duration? = nil) -> EventLog<Result<OperationSession, CoordinationError>> {
        let log = EventLog<Result<OperationSession, CoordinationError>>()
        engine.begin(operation, isDirectory: isDirectory, owner: owner, purpose: PurposeID(UUIDish.next()),
                     timeout: timeout) { log.append($0) }
        return log
    }

    private func session(_ log: EventLog<Result<OperationSession, CoordinationError>>) -> OperationSession? {
        guard case .success(let session)? = log.all.first else { return nil }
        return session
    }

    func testWriteWaitsForThePresenterThenPublishesAndReleases() throws {
        let write = begin(.write(path("Documents/note.txt")))
        XCTAssertEqual(transport.sent.all.map(\.message), [.relinquishPresentedItemToWriter])
        XCTAssertTrue(write.all.isEmpty, "the handler waits until the editor relinquished")

        messenger(reply: 0, from: bob)
        let session = try XCTUnwrap(self.session(write))
        let reader = begin(.read(path("Documents/note.txt"), options: .withoutChanges), owner: carol)
        XCTAssertTrue(reader.all.isEmpty, "the write holds the item")

        let released = EventLog<Bool>()
        session.end(tookEffect: true) { released.append(true) }
        let published = transport.sent.all[1...3]
        XCTAssertEqual(published.filter { $0.presenter == editor }.map(\.message),
                       [.presentedItemDidChange, .reacquirePresentedItem], "in plan order for each presenter")
        XCTAssertEqual(published.filter { $0.presenter == folderWatcher }.map(\.message),
                       [.presentedSubitemDidChange(at: path("Documents/note.txt"))])
        XCTAssertEqual(released.all, [true])
        XCTAssertEqual(transport.sent.all.last?.message, .relinquishPresentedItemToReader,
                       "released: the reader is granted and asks the editor in turn")
        XCTAssertTrue(reader.all.isEmpty)
        messenger(reply: transport.sent.all.count - 1, from: bob)
        XCTAssertNotNil(self.session(reader))
        session.end(tookEffect: true)
        XCTAssertEqual(released.all.count, 1, "ending twice does nothing")
    }

    func testAnOperationInsideItsOwnersAccessOnlyTellsWhatChanged() throws {
        // A client holds a coordinated write (its presenters made way then); its own write through
        // the filesystem joins it: presenters are not asked again, and reacquire only when it ends.
        // The client's other presenter hears the change; the coordinator's own does not.
        let sibling = PresenterKey(owner: alice, purpose: PurposeID("sibling"))
        registry.add(sibling, path: path("Documents/note.txt"))
        registry.add(PresenterKey(owner: alice, purpose: PurposeID("client")), path: path("Documents/note.txt"))
        let held = EventLog<Result<AccessGrant, CoordinationError>>()
        engine.arbiter.request([.write(path("Documents/note.txt"))], owner: alice, purpose: PurposeID("client")) {
            held.append($0)
        }
        XCTAssertNotNil(try held.all.first?.get())
        let log = EventLog<Result<OperationSession, CoordinationError>>()
        engine.begin(.write(path("Documents/note.txt")), owner: alice, purpose: PurposeID("fuse"),
                     joinsOwnersAccesses: true) { log.append($0) }
        let session = try XCTUnwrap(self.session(log), "granted at once, nobody asked")
        XCTAssertEqual(transport.sent.all, [])
        session.end(tookEffect: true)
        XCTAssertEqual(Set(transport.sent.all.map { "\($0.presenter.purpose) \($0.message.name)" }),
                       ["editor presentedItemDidChange", "sibling presentedItemDidChange",
                        "watcher presentedSubitemDidChange"])
    }

    func testAnUnresponsivePresenterDelaysButNeverHangsTheOperation() {
        let delete = begin(.delete(path("Documents/note.txt")))
        XCTAssertEqual(transport.sent.all.map(\.presenter), [editor, folderWatcher], "both asked in parallel")
        messenger(reply: 1, from: carol)
        XCTAssertTrue(delete.all.isEmpty)
        scheduler.advance(by: .seconds(2))
        XCTAssertNotNil(session(delete))
        XCTAssertEqual(engine.status().unresponsivePresenters.map(\.key), [editor])
    }

    func testMoveReKeysPresentersAndQueuedAccesses() throws {
        transport.answerAtOnce(editor)
        transport.answerAtOnce(folderWatcher)
        let move = begin(.move(from: path("Documents"), to: path("Archive"), replacesDestination: false),
                         isDirectory: true)
        let session = try XCTUnwrap(self.session(move))
        let queued = begin(.write(path("Documents/note.txt")), owner: carol)
        session.end(tookEffect: true)
        XCTAssertEqual(registry.record(editor)?.path, path("Archive/note.txt"))
        XCTAssertTrue(transport.sent.all.map(\.message).contains(.presentedItemDidMove(to: path("Archive/note.txt"))))
        XCTAssertEqual(self.session(queued)?.grant.accesses.map(\.path), [path("Archive/note.txt")])
    }

    func testAPresenterHearsItsItemDeletedOnceUntilAnItemIsMadeThereAgain() throws {
        transport.answerAtOnce(editor)
        transport.answerAtOnce(folderWatcher)
        let told = { self.transport.sent.all.filter { $0.presenter == self.editor && $0.message == .accommodatePresentedItemDeletion }.count }
        try XCTUnwrap(session(begin(.delete(path("Documents/note.txt"))))).end(tookEffect: true)
        XCTAssertEqual(told(), 1)
        // Its folder goes: the editor was told already; the folder's presenter hears it.
        try XCTUnwrap(session(begin(.delete(path("Documents")), isDirectory: true))).end(tookEffect: true)
        XCTAssertEqual(told(), 1)
        XCTAssertEqual(transport.sent.all.filter { $0.presenter == folderWatcher }.last?.message, .accommodatePresentedItemDeletion)
        // A note made there again is the editor's item again, and its deletion is told.
        try XCTUnwrap(session(begin(.create(path("Documents/note.txt"))))).end(tookEffect: true)
        try XCTUnwrap(session(begin(.delete(path("Documents")), isDirectory: true))).end(tookEffect: true)
        XCTAssertEqual(told(), 2)
    }

    func testFailedWriteOnlyLetsPresentersReacquire() throws {
        transport.answerAtOnce(editor)
        let write = begin(.write(path("Documents/note.txt")))
        try XCTUnwrap(session(write)).end(tookEffect: false)
        XCTAssertEqual(transport.sent.all.map(\.message), [.relinquishPresentedItemToWriter, .reacquirePresentedItem])
    }

    func testDisconnectDropsAccessesPresentersAndPendingMessages() {
        let write = begin(.write(path("Documents/note.txt")))  // waits for the editor (bob)
        let waiting = begin(.write(path("Documents/other.txt")), owner: bob)
        XCTAssertNotNil(session(waiting))
        let blocked = begin(.write(path("Documents/other.txt")), owner: carol, timeout: .seconds(60))
        engine.disconnect(bob)
        XCTAssertNotNil(session(write), "the editor's client is gone: the write goes on")
        XCTAssertNotNil(session(blocked), "bob's access was dropped")
        XCTAssertNil(registry.record(editor))
        XCTAssertEqual(engine.status().pendingMessages, [])
    }

    func testOperationAccesses() {
        XCTAssertEqual(CoordinatedOperation.move(from: path("a"), to: path("b"), replacesDestination: true)
            .accesses(isDirectory: true), [
                .write(path("a"), isDirectory: true, options: .forMoving),
                .write(path("b"), isDirectory: true, options: .forReplacing),
            ])
        XCTAssertEqual(CoordinatedOperation.delete(path("a")).accesses(), [.write(path("a"), options: .forDeleting)])
        XCTAssertEqual(CoordinatedOperation.metadataChange(path("a")).accesses(),
                       [.write(path("a"), options: .contentIndependentMetadataOnly)])
    }

    private func messenger(reply index: Int, from owner: OwnerID) {
        engine.messenger.receiveReply(transport.sent.all[index].id, from: owner)
    }
}

final class CoordinationEngineSetupTests: XCTestCase {
    func testConvenienceInitSharesOnePackageRule() {
        let engine = CoordinationEngine(transport: RecordingTransport(),
                                        packageRule: PackageRule { $0.pathExtension == Array("pages".utf8) })
        engine.registry.add(PresenterKey(owner: bob, purpose: PurposeID("p")), path: path("D/x.app"))
        engine.registry.add(PresenterKey(owner: bob, purpose: PurposeID("q")), path: path("D/y.pages"))
        XCTAssertEqual(engine.registry.packagesAbove(path("D/x.app/f")), [])
        XCTAssertEqual(engine.registry.packagesAbove(path("D/y.pages/f")).map(\.purpose),
                       [PurposeID("q")])
        let holder = Outcome()
        let inApp = Outcome()
        let inPages = Outcome()
        engine.arbiter.request([.write(path("D/x.app/f")), .write(path("D/y.pages/f"))], owner: alice,
                               purpose: PurposeID("1"), completion: holder.completion)
        engine.arbiter.request([.write(path("D/x.app/g"))], owner: bob, purpose: PurposeID("2"), completion: inApp.completion)
        engine.arbiter.request([.write(path("D/y.pages/g"))], owner: bob, purpose: PurposeID("3"), completion: inPages.completion)
        XCTAssertTrue(inApp.isGranted)
        XCTAssertTrue(inPages.isPending)
    }
}
