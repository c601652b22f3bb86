@testable import Coordination
import Foundation
import XCTest
#if canImport(Glibc)
import Glibc
#endif

/// The control socket server over a real Unix socket in a temporary directory (no FUSE). The
/// test plays both the client (a raw socket speaking frames) and the daemon (calling the engine).
final class ControlServerTests: XCTestCase {
    private var directory: String!
    private var server: ControlServer!
    private let log = EventLog<String>()

    override func setUp() {
        var template = Array("/tmp/cfs-ctl-XXXXXX".utf8CString)
        directory = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
    }

    override func tearDown() {
        server?.stop()
        server = nil
        rmdir(directory)
    }

    private var socketPath: String { directory + "/control" }

    @discardableResult
    private func startServer(replyTimeout: Duration = .seconds(2), maxQueuedBytes: Int = 4 << 20, limit: Int = 10_000,
                             helloTimeout: Duration = .seconds(5),
                             mayAccess: @escaping ControlServer.AccessCheck = { _, _, _ in true },
                             processInfo: @escaping @Sendable (pid_t) -> (tgid: pid_t, ppid: pid_t)? = ClientOwners.procProcessInfo)
        throws -> ControlServer {
        let log = self.log
        let server = ControlServer(socketPath: socketPath, maxQueuedBytes: maxQueuedBytes, maxClients: 64,
                                   maxPresentersPerClient: limit, maxRequestsPerClient: limit,
                                   helloTimeout: helloTimeout, mayAccess: mayAccess, writeSessions: { [WriteSessionStatus(path: path("Documents/a.txt"))] },
                                   log: { log.append($0) }, processInfo: processInfo) {
            CoordinationEngine(transport: $0, replyTimeout: replyTimeout)
        }
        try server.start()
        self.server = server
        return server
    }

    private func connect(greet: Bool = true) throws -> TestClient {
        let client = try TestClient(path: socketPath)
        if greet {
            try client.send(.hello(.init(clientName: "test", processID: getpid())))
            guard case .helloReply? = try client.receive() else {
                XCTFail("no helloReply")
                return client
            }
        }
        return client
    }

    /// Polls until `condition` holds (the server works on its own queues).
    private func eventually(_ what: String, timeout: TimeInterval = 3, _ condition: () -> Bool,
                            file: StaticString = #filePath, line: UInt = #line) {
        let deadline = Date().addingTimeInterval(timeout)
        while !condition() {
            if Date() > deadline { return XCTFail("timed out waiting for: \(what)", file: file, line: line) }
            usleep(5_000)
        }
    }

    private func begin(_ operation: CoordinatedOperation, isDirectory: Bool = false)
        -> EventLog<Result<OperationSession, CoordinationError>> {
        let outcome = EventLog<Result<OperationSession, CoordinationError>>()
        server.engine.begin(operation, isDirectory: isDirectory, owner: .ordinaryPrograms,
                            purpose: PurposeID("fuse-\(UUIDish.next())"), timeout: .seconds(10)) { outcome.append($0) }
        return outcome
    }

    private func session(_ log: EventLog<Result<OperationSession, CoordinationError>>) -> OperationSession? {
        guard case .success(let session)? = log.all.first else { return nil }
        return session
    }

    // MARK: - Session set-up

    func testHelloGetsAClientIDAndTheSocketIsWorldWritable() throws {
        try startServer()
        var info = stat()
        XCTAssertEqual(stat(socketPath, &info), 0)
        XCTAssertEqual(info.st_mode & 0o777, 0o666)
        let first = try TestClient(path: socketPath)
        try first.send(.hello(.init(clientName: "one")))
        let second = try TestClient(path: socketPath)
        try second.send(.hello(.init(clientName: "two")))
        guard case .helloReply(let a)? = try first.receive(), case .helloReply(let b)? = try second.receive() else {
            return XCTFail("no helloReply")
        }
        XCTAssertNotEqual(a.clientID, b.clientID)
        XCTAssertNotEqual(a.clientID, .ordinaryPrograms)
        eventually("both clients listed with their names") {
            Set(server.clients().compactMap(\.clientName)) == ["one", "two"]
        }
    }

    func testAnotherProtocolVersionIsRefusedAndClosed() throws {
        try startServer()
        let client = try connect(greet: false)
        try client.sendRaw(TestClient.frame(#"{"body":{"clientName":"future"},"type":"hello","version":2}"#))
        guard case .error(let error)? = try client.receive() else { return XCTFail("expected an error frame") }
        XCTAssertEqual(error.code, .unsupportedVersion)
        XCTAssertNil(try client.receive(), "then the daemon closes the connection")
    }

    func testASilentConnectionIsClosedAfterTheHelloTimeout() throws {
        try startServer(helloTimeout: .milliseconds(150))
        let silent = try connect(greet: false)
        let polite = try connect()
        let started = Date()
        guard case .error(let error)? = try silent.receive(timeout: 3) else { return XCTFail("expected an error") }
        XCTAssertEqual(error.code, .protocolViolation)
        XCTAssertNil(try silent.receive(timeout: 3))
        XCTAssertLessThan(Date().timeIntervalSince(started), 2)
        usleep(200_000)
        try polite.send(.statusRequest)
        guard case .statusReply? = try polite.receive() else { return XCTFail("a greeted client stays") }
    }

    func testAStatusLargerThanOneMessageIsCutAndSaysHowMuch() throws {
        try startServer()
        let total = 12_000
        for index in 0..<total {
            server.engine.registry.add(PresenterKey(owner: OwnerID(UInt64(1000 + index % 3)),
                                                    purpose: PurposeID("presenter-with-a-rather-long-name-\(index)")),
                                       path: path("Documents/folder-\(index % 50)/file-\(index).txt"))
        }
        let client = try connect()
        try client.send(.statusRequest)
        guard case .statusReply(let status)? = try client.receive(timeout: 10) else { return XCTFail("no status") }
        let omitted = try XCTUnwrap(status.omitted, "too large for one frame: something left out")
        XCTAssertGreaterThan(status.presenters.count, 1000)
        XCTAssertEqual(status.presenters.count + omitted.presenters, total)
        XCTAssertEqual(status.clients?.count, 1, "short lists are whole")
        XCTAssertEqual(omitted.clients, 0)
    }

    func testAnythingBeforeHelloOrASecondHelloIsAProtocolViolation() throws {
        try startServer()
        let early = try connect(greet: false)
        try early.send(.statusRequest)
        guard case .error(let error)? = try early.receive() else { return XCTFail("expected an error frame") }
        XCTAssertEqual(error.code, .protocolViolation)
        XCTAssertNil(try early.receive())

        let twice = try connect()
        try twice.send(.hello(.init(clientName: "again")))
        guard case .error(let again)? = try twice.receive() else { return XCTFail("expected an error frame") }
        XCTAssertEqual(again.code, .protocolViolation)
        XCTAssertNil(try twice.receive())
    }

    func testAStaleSocketIsReplacedButALiveServerOrAFileIsNot() throws {
        try startServer()
        let second = ControlServer(socketPath: socketPath, mayAccess: { _, _, _ in true }) {
            CoordinationEngine(transport: $0)
        }
        XCTAssertThrowsError(try second.start()) { XCTAssertEqual($0 as? ControlServerError, .addressInUse(socketPath)) }
        server.stop()
        XCTAssertNotEqual(access(socketPath, F_OK), 0, "stop removes the socket")

        // A socket file nobody listens on (a killed daemon's) is replaced.
        let stale = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        XCTAssertEqual(withSocketAddress(socketPath) { bind(stale, $0, $1) }, 0)
        close(stale)
        try startServer()
        _ = try connect()
        server.stop()

        let file = directory + "/plain"
        XCTAssertTrue(FileManager.default.createFile(atPath: file, contents: Data("x".utf8)))
        defer { unlink(file) }
        let onFile = ControlServer(socketPath: file, mayAccess: { _, _, _ in true }) { CoordinationEngine(transport: $0) }
        XCTAssertThrowsError(try onFile.start()) { XCTAssertEqual($0 as? ControlServerError, .pathExists(file)) }
    }

    // MARK: - Presenters

    func testAPresenterHearsWhatAnOperationOfTheDaemonProducesInOrder() throws {
        try startServer()
        let client = try connect()
        try client.send(.addPresenter(.init(presenter: PurposeID("editor"), path: path("Documents/note.txt"))))
        try client.send(.addPresenter(.init(presenter: PurposeID("folder"), path: path("Documents"))))
        eventually("presenters registered") { server.engine.registry.all().count == 2 }

        let write = begin(.write(path("Documents/note.txt")))
        guard case .presenterMessage(let relinquish)? = try client.receive() else { return XCTFail("no message") }
        XCTAssertEqual(relinquish.presenter, PurposeID("editor"))
        XCTAssertEqual(relinquish.message, .relinquishPresentedItemToWriter)
        XCTAssertTrue(relinquish.expectsReply)
        usleep(100_000)
        XCTAssertNil(self.session(write), "the operation waits for the presenter's answer")

        try client.send(.presenterReply(.init(messageID: relinquish.messageID)))
        eventually("granted once the presenter answered") { self.session(write) != nil }
        let session = try XCTUnwrap(self.session(write))
        session.end(tookEffect: true)

        var heard: [(PurposeID, PresenterMessage, Bool)] = []
        for _ in 0..<3 {
            guard case .presenterMessage(let notice)? = try client.receive() else { return XCTFail("missing message") }
            heard.append((notice.presenter, notice.message, notice.expectsReply))
        }
        XCTAssertEqual(heard.filter { $0.0 == PurposeID("editor") }.map(\.1),
                       [.presentedItemDidChange, .reacquirePresentedItem])
        XCTAssertEqual(heard.filter { $0.0 == PurposeID("folder") }.map(\.1),
                       [.presentedSubitemDidChange(at: path("Documents/note.txt"))])
        XCTAssertTrue(heard.allSatisfy { !$0.2 }, "notifications expect no reply")

        try client.send(.removePresenter(.init(presenter: PurposeID("editor"))))
        eventually("presenter removed") { server.engine.registry.all().count == 1 }
        try client.send(.removePresenter(.init(presenter: PurposeID("nobody"))))
        guard case .error(let error)? = try client.receive() else { return XCTFail("expected an error") }
        XCTAssertEqual(error.code, .unknownPresenter)
    }

    func testABurstOfNoticesArrivesWholeAndInOrderAndAnAnswerAfterItWaitsForNothingHeld() throws {
        try startServer()
        let client = try connect()
        try client.send(.addPresenter(.init(presenter: PurposeID("folder"), path: path("Documents"), awaited: [])))
        eventually("presenter registered") { server.engine.registry.all().count == 1 }

        // More notices than go at once in a window: the rest are held, then sent with nothing
        // else to carry them.
        let names = (0..<20).map { "Documents/file\($0)" }
        for name in names {
            let deletion = begin(.delete(path(name)))
            try XCTUnwrap(self.session(deletion), "nobody to wait for").end(tookEffect: true)
        }
        var heard: [PresenterMessage] = []
        while heard.count < names.count, case .presenterMessage(let notice)? = try client.receive(timeout: 2) {
            XCTAssertFalse(notice.expectsReply)
            heard.append(notice.message)
        }
        XCTAssertEqual(heard, names.map { .accommodatePresentedSubitemDeletion(at: path($0)) })

        // Held notices go out before whatever comes after them.
        for name in names {
            let deletion = begin(.delete(path(name)))
            try XCTUnwrap(self.session(deletion)).end(tookEffect: true)
        }
        try client.send(.statusRequest)
        var order: [String] = []
        while let message = try client.receive(timeout: 2) {
            if case .presenterMessage = message { order.append("notice") }
            if case .statusReply = message { order.append("status"); break }
        }
        XCTAssertEqual(order, Array(repeating: "notice", count: names.count) + ["status"])
    }

    func testNamesAreToldOnlyToClientsThatMayListTheirDirectory() throws {
        try startServer(mayAccess: { _, item, _ in item.components.first?.string != "private" })
        let client = try connect()
        try client.send(.addPresenter(.init(presenter: PurposeID("all"), path: path(""))))
        eventually("presenter registered") { server.engine.registry.all().count == 1 }

        // Withheld, and answered for the client, so the deletion goes on at once.
        let hidden = begin(.delete(path("private/diary")))
        eventually("the deletion is not held up") { self.session(hidden) != nil }
        try XCTUnwrap(self.session(hidden)).end(tookEffect: true)

        let shown = begin(.delete(path("shared/list")))
        guard case .presenterMessage(let asked)? = try client.receive() else { return XCTFail("no message") }
        XCTAssertEqual(asked.message, .accommodatePresentedSubitemDeletion(at: path("shared/list")),
                       "the first message heard is about the listable item")
        try client.send(.presenterReply(.init(messageID: asked.messageID)))
        eventually("granted once answered") { self.session(shown) != nil }
        try XCTUnwrap(self.session(shown)).end(tookEffect: true)
    }

    func testAClientsOwnOperationsAreNotToldToItsPresenters() throws {
        try startServer()
        let client = try connect()
        try client.send(.addPresenter(.init(presenter: PurposeID("mine"), path: path("a.txt"))))
        eventually("presenter registered") { server.engine.registry.all().count == 1 }
        let owner = try XCTUnwrap(server.ownerOf(pid: getpid()))
        let outcome = EventLog<Result<OperationSession, CoordinationError>>()
        server.engine.begin(.write(path("a.txt")), owner: owner, purpose: PurposeID("fuse-9"),
                            joinsOwnersAccesses: true) { outcome.append($0) }
        XCTAssertNotNil(session(outcome), "no presenter to ask: granted at once")
        session(outcome)?.end(tookEffect: true)
        XCTAssertNil(try client.receive(timeout: 0.3), "its own presenter hears nothing")
    }

    func testAnUnresponsiveClientIsMarkedAndDelaysNoLongerThanTheTimeout() throws {
        try startServer(replyTimeout: .milliseconds(300))
        let client = try connect()
        try client.send(.addPresenter(.init(presenter: PurposeID("sleepy"), path: path("Documents/x"))))
        eventually("presenter registered") { server.engine.registry.all().count == 1 }

        let started = Date()
        let delete = begin(.delete(path("Documents/x")))
        eventually("granted after the timeout") { session(delete) != nil }
        let waited = Date().timeIntervalSince(started)
        XCTAssertGreaterThanOrEqual(waited, 0.25)
        XCTAssertLessThan(waited, 1.5, "bounded by the reply timeout")
        session(delete)?.end(tookEffect: true)
        let status = server.status()
        XCTAssertEqual(status.unresponsivePresenters.map(\.key.purpose), [PurposeID("sleepy")])
        XCTAssertTrue(log.all.contains { $0.contains("connected") })

        // Marked: the next message gets the short wait.
        let again = Date()
        let write = begin(.write(path("Documents/x")))
        eventually("granted") { session(write) != nil }
        XCTAssertLessThan(Date().timeIntervalSince(again), 0.29 + 0.5)
        session(write)?.end(tookEffect: true)

        // Silent twice: no longer waited for. The messages still go out.
        let unwaited = Date()
        let read = begin(.read(path("Documents/x")))
        eventually("granted") { session(read) != nil }
        XCTAssertLessThan(Date().timeIntervalSince(unwaited), 0.2)
        session(read)?.end(tookEffect: true)

        // Answering, even late, earns it a wait again; answering in time clears the mark.
        func answerAll(until expected: PresenterMessage?) throws -> Bool {
            while let message = try client.receive(timeout: expected == nil ? 0.5 : 1) {
                guard case .presenterMessage(let notice) = message else { continue }
                if notice.message.expectsReply { try client.send(.presenterReply(.init(messageID: notice.messageID))) }
                if notice.message == expected { return true }
            }
            return false
        }
        XCTAssertFalse(try answerAll(until: nil), "everything sent so far answered, late")
        try client.send(.statusRequest)   // answered in order: the replies above are in
        while let message = try client.receive(timeout: 1) {
            if case .statusReply = message { break }
        }
        let second = begin(.read(path("Documents/x")))
        XCTAssertTrue(try answerAll(until: .savePresentedItemChanges))
        eventually("mark cleared") { server.status().unresponsivePresenters.isEmpty }
        eventually("read granted") { session(second) != nil }
        session(second)?.end(tookEffect: true)
    }

    // MARK: - Coordinated accesses

    /// Apple's order for a client's coordinated write: every other presenter, the client's own
    /// other presenters included, makes way before the grant; they reacquire once it is released;
    /// the coordinator's own presenter hears nothing.
    func testAClientsAccessIsGrantedOnceOtherPresentersMadeWayAndTheyReacquireAfter() throws {
        try startServer()
        let editor = try connect()
        let writer = try connect()
        try editor.send(.addPresenter(.init(presenter: PurposeID("editor"), path: path("Documents/x"))))
        try writer.send(.addPresenter(.init(presenter: PurposeID("own"), path: path("Documents/x"))))
        try writer.send(.addPresenter(.init(presenter: PurposeID("sibling"), path: path("Documents/x"))))
        eventually("presenters registered") { server.engine.registry.all().count == 3 }

        try writer.send(.coordinate(.init(requestID: 1, purpose: PurposeID("own"), accesses: [.write(path("Documents/x"))])))
        guard case .presenterMessage(let asked)? = try editor.receive() else { return XCTFail("the editor was not asked") }
        XCTAssertEqual(asked.message, .relinquishPresentedItemToWriter)
        guard case .presenterMessage(let sibling)? = try writer.receive() else { return XCTFail("the sibling was not asked") }
        XCTAssertEqual(sibling.presenter, PurposeID("sibling"))
        XCTAssertEqual(sibling.message, .relinquishPresentedItemToWriter)
        try writer.send(.presenterReply(.init(messageID: sibling.messageID)))
        XCTAssertNil(try writer.receive(timeout: 0.3), "not granted while the editor has not made way")
        try editor.send(.presenterReply(.init(messageID: asked.messageID)))
        guard case .granted(let granted)? = try writer.receive() else { return XCTFail("not granted") }
        XCTAssertEqual(granted.requestID, 1)
        XCTAssertNil(try editor.receive(timeout: 0.2), "nothing more before the release")

        try writer.send(.release(.init(requestID: 1)))
        guard case .presenterMessage(let back)? = try editor.receive() else { return XCTFail("the editor did not reacquire") }
        XCTAssertEqual(back.message, .reacquirePresentedItem)
        guard case .presenterMessage(let siblingBack)? = try writer.receive() else { return XCTFail("the sibling did not reacquire") }
        XCTAssertEqual(siblingBack.presenter, PurposeID("sibling"))
        XCTAssertEqual(siblingBack.message, .reacquirePresentedItem)
        XCTAssertNil(try writer.receive(timeout: 0.3), "the coordinator's own presenter hears nothing")
        eventually("released") { server.status().accesses.isEmpty }
    }

    func testAClientsAccessCancelledWhilePresentersMakeWayIsDeniedAndTheyReacquire() throws {
        try startServer()
        let editor = try connect()
        let writer = try connect()
        try editor.send(.addPresenter(.init(presenter: PurposeID("editor"), path: path("Documents/x"))))
        eventually("presenter registered") { server.engine.registry.all().count == 1 }
        try writer.send(.coordinate(.init(requestID: 4, purpose: PurposeID("w"), accesses: [.read(path("Documents/x"))])))
        guard case .presenterMessage(let asked)? = try editor.receive() else { return XCTFail("the editor was not asked") }
        XCTAssertEqual(asked.message, .relinquishPresentedItemToReader)
        try writer.send(.cancel(.init(requestID: 4)))
        // A status request's answer on the writer's connection comes after its cancel took effect:
        // a reply handled first, on the editor's, would grant the access before the cancel.
        try writer.send(.statusRequest)
        guard case .statusReply? = try writer.receive() else { return XCTFail("no status") }
        try editor.send(.presenterReply(.init(messageID: asked.messageID)))
        var heard: [PresenterMessage] = []
        while let message = try editor.receive(timeout: 0.5) {
            guard case .presenterMessage(let notice) = message else { continue }
            heard.append(notice.message)
            if notice.message.expectsReply { try editor.send(.presenterReply(.init(messageID: notice.messageID))) }
        }
        XCTAssertEqual(heard, [.savePresentedItemChanges, .reacquirePresentedItem])
        guard case .denied(let denied)? = try writer.receive() else { return XCTFail("expected a denial") }
        XCTAssertEqual(denied.requestID, 4)
        XCTAssertEqual(denied.reason, .cancelled)
        eventually("nothing held") { server.status().accesses.isEmpty }
    }

    func testCoordinateGrantReleaseCancelAndDuplicateIDs() throws {
        try startServer()
        let writer = try connect()
        let other = try connect()
        let note = ItemAccess.write(path("Documents/note.txt"))
        try writer.send(.coordinate(.init(requestID: 1, purpose: PurposeID("w"), accesses: [note])))
        XCTAssertEqual(try writer.receive(), .granted(.init(requestID: 1)))
        try writer.send(.coordinate(.init(requestID: 1, purpose: PurposeID("w"), accesses: [note])))
        guard case .denied(let duplicate)? = try writer.receive() else { return XCTFail("expected denied") }
        XCTAssertEqual(duplicate.reason, .invalidRequest)

        try other.send(.coordinate(.init(requestID: 7, purpose: PurposeID("o"),
                                         accesses: [.read(path("Documents/note.txt"))])))
        XCTAssertNil(try other.receive(timeout: 0.2), "the read waits for the write")
        try other.send(.cancel(.init(requestID: 7)))
        guard case .denied(let cancelled)? = try other.receive() else { return XCTFail("expected denied") }
        XCTAssertEqual(cancelled.requestID, 7)
        XCTAssertEqual(cancelled.reason, .cancelled)

        try other.send(.coordinate(.init(requestID: 8, purpose: PurposeID("o"),
                                         accesses: [.read(path("Documents/note.txt"))], timeoutMilliseconds: 100)))
        guard case .denied(let timedOut)? = try other.receive() else { return XCTFail("expected denied") }
        XCTAssertEqual(timedOut.reason, .timedOut)

        try other.send(.coordinate(.init(requestID: 9, purpose: PurposeID("o"),
                                         accesses: [.read(path("Documents/note.txt"))])))
        XCTAssertNil(try other.receive(timeout: 0.1))
        try writer.send(.release(.init(requestID: 1)))
        XCTAssertEqual(try other.receive(), .granted(.init(requestID: 9)))
        try writer.send(.release(.init(requestID: 1)))
        guard case .error(let unknown)? = try writer.receive() else { return XCTFail("expected an error") }
        XCTAssertEqual(unknown.code, .unknownRequest)

        XCTAssertEqual(server.status().accesses.map(\.state), [.active])
        try other.send(.cancel(.init(requestID: 9)))   // on a granted request: a release
        eventually("released") { server.status().accesses.isEmpty }
    }

    func testDisconnectDropsPresentersAndAccessesAtOnce() throws {
        try startServer()
        let leaving = try connect()
        let waiting = try connect()
        try leaving.send(.addPresenter(.init(presenter: PurposeID("p"), path: path("Documents"))))
        try leaving.send(.coordinate(.init(requestID: 1, purpose: PurposeID("p"),
                                           accesses: [.write(path("Documents"), isDirectory: true, options: .forMoving)])))
        XCTAssertEqual(try leaving.receive(), .granted(.init(requestID: 1)))
        try leaving.send(.coordinate(.init(requestID: 2, purpose: PurposeID("q"),
                                           accesses: [.write(path("Other"))])))
        XCTAssertEqual(try leaving.receive(), .granted(.init(requestID: 2)))
        try waiting.send(.coordinate(.init(requestID: 1, purpose: PurposeID("w"),
                                           accesses: [.write(path("Documents/inside.txt"))])))
        XCTAssertNil(try waiting.receive(timeout: 0.2))
        XCTAssertEqual(server.engine.registry.all().count, 1)

        leaving.close()
        XCTAssertEqual(try waiting.receive(), .granted(.init(requestID: 1)), "the leaver's accesses are gone")
        eventually("presenters gone") { server.engine.registry.all().isEmpty }
        eventually("one client left") { server.clients().count == 1 }
        XCTAssertEqual(server.status().accesses.map(\.owner), [server.clients()[0].owner])
        XCTAssertTrue(log.all.contains { $0.contains("disconnected") })
    }

    // MARK: - Hostile clients

    func testGarbageOrAnOversizedFrameClosesOnlyThatClient() throws {
        try startServer()
        let good = try connect()
        try good.send(.addPresenter(.init(presenter: PurposeID("keeps"), path: path("a"))))

        let garbage = try connect()
        try garbage.send(.addPresenter(.init(presenter: PurposeID("goes"), path: path("b"))))
        try garbage.sendRaw(TestClient.frame("this is not json"))
        guard case .error(let malformed)? = try garbage.receive() else { return XCTFail("expected an error") }
        XCTAssertEqual(malformed.code, .malformedMessage)
        XCTAssertNil(try garbage.receive())

        let oversized = try connect()
        try oversized.sendRaw([0x7F, 0, 0, 0] + Array(repeating: 0x41, count: 1000))
        guard case .error(let tooBig)? = try oversized.receive() else { return XCTFail("expected an error") }
        XCTAssertEqual(tooBig.code, .malformedMessage)
        XCTAssertNil(try oversized.receive())

        let wrongDirection = try connect()
        try wrongDirection.send(.granted(.init(requestID: 1)))
        guard case .error(let violation)? = try wrongDirection.receive() else { return XCTFail("expected an error") }
        XCTAssertEqual(violation.code, .protocolViolation)
        XCTAssertNil(try wrongDirection.receive())

        try good.send(.statusRequest)
        guard case .statusReply(let status)? = try good.receive() else { return XCTFail("the good client still works") }
        XCTAssertEqual(status.presenters.map(\.key.purpose), [PurposeID("keeps")], "the garbage client's presenter is gone")
        XCTAssertEqual(status.clients?.count, 1)
        XCTAssertEqual(status.writeSessions, [WriteSessionStatus(path: path("Documents/a.txt"))])
    }

    func testAClientThatDoesNotReadIsDisconnectedWithoutBlockingTheServer() throws {
        try startServer(maxQueuedBytes: 64 << 10)
        let sluggish = try connect()
        try sluggish.send(.addPresenter(.init(presenter: PurposeID("slow"), path: path("a"))))
        eventually("registered") { server.engine.registry.all().count == 1 }
        let key = server.engine.registry.all()[0].key
        let started = Date()
        for index in 0..<40_000 {
            server.send(.presentedSubitemDidAppear(at: path("a/item-\(index)")), id: MessageID(UInt64(index)), to: key, awaitingReply: false)
        }
        XCTAssertLessThan(Date().timeIntervalSince(started), 5, "sending never waits for the client")
        eventually("disconnected", timeout: 5) { server.clients().isEmpty }
        XCTAssertTrue(server.engine.registry.all().isEmpty)
        XCTAssertTrue(log.all.contains { $0.contains("overflow") })
    }

    /// A message the socket refuses (the client stopped reading: EPIPE) ends that connection, and
    /// with it the client's presenters, as a closed connection does.
    func testAClientWhoseSocketRefusesAMessageIsDisconnected() throws {
        try startServer()
        let client = try connect()
        try client.send(.addPresenter(.init(presenter: PurposeID("gone"), path: path("a"))))
        eventually("registered") { server.engine.registry.all().count == 1 }
        let key = server.engine.registry.all()[0].key
        XCTAssertEqual(shutdown(client.fd, Int32(SHUT_RD)), 0)
        server.send(.presentedItemDidChange, id: MessageID(1), to: key, awaitingReply: false)
        eventually("disconnected") { server.clients().isEmpty }
        XCTAssertTrue(server.engine.registry.all().isEmpty)
        XCTAssertTrue(log.all.contains { $0.contains("write failed") }, "\(log.all)")
    }

    func testAClientCannotGrowTheDaemonWithoutBound() throws {
        try startServer(limit: 2)
        let client = try connect()
        for name in ["a", "b", "a"] {   // registering "a" again moves it: no new presenter
            try client.send(.addPresenter(.init(presenter: PurposeID(name), path: path(name))))
        }
        try client.send(.addPresenter(.init(presenter: PurposeID("c"), path: path("c"))))
        guard case .error(let error)? = try client.receive() else { return XCTFail("expected an error") }
        XCTAssertEqual(error.code, .limitExceeded)
        try client.send(.removePresenter(.init(presenter: PurposeID("a"))))
        try client.send(.addPresenter(.init(presenter: PurposeID("c"), path: path("c"))))
        eventually("room again") { Set(server.engine.registry.all().map(\.key.purpose.rawValue)) == ["b", "c"] }

        for id in 1...2 {
            try client.send(.coordinate(.init(requestID: UInt64(id), purpose: PurposeID("p"), accesses: [.read(path("r\(id)"))])))
            XCTAssertEqual(try client.receive(), .granted(.init(requestID: UInt64(id))))
        }
        try client.send(.coordinate(.init(requestID: 3, purpose: PurposeID("p"), accesses: [.read(path("r3"))])))
        guard case .denied(let denied)? = try client.receive() else { return XCTFail("expected denied") }
        XCTAssertEqual(denied.reason, .invalidRequest)
        try client.send(.release(.init(requestID: 1)))
        try client.send(.coordinate(.init(requestID: 3, purpose: PurposeID("p"), accesses: [.read(path("r3"))])))
        XCTAssertEqual(try client.receive(), .granted(.init(requestID: 3)))
    }

    // MARK: - Credentials and access checks

    func testPeerCredentialsAreReadAtAccept() throws {
        let parentOfChild: pid_t = 999_999
        try startServer(processInfo: { pid in
            pid == parentOfChild ? (tgid: pid, ppid: getpid()) : ClientOwners.procProcessInfo(pid)
        })
        XCTAssertNil(server.ownerOf(pid: getpid()), "no clients yet")
        let client = try connect()
        try client.send(.statusRequest)
        guard case .statusReply(let status)? = try client.receive() else { return XCTFail("no status") }
        let record = try XCTUnwrap(status.clients?.first)
        XCTAssertEqual(record.processID, getpid())
        XCTAssertEqual(record.userID, getuid())
        XCTAssertEqual(record.groupID, getgid())
        XCTAssertEqual(record.clientName, "test")
        XCTAssertEqual(server.ownerOf(pid: getpid()), record.owner)
        XCTAssertEqual(server.credentials(of: record.owner)?.processID, getpid())
        XCTAssertEqual(server.ownerOf(pid: parentOfChild), record.owner, "a child process belongs to its client")
        XCTAssertNil(server.ownerOf(pid: 1))

        client.close()
        eventually("forgotten") { server.ownerOf(pid: getpid()) == nil }
    }

    func testTheProcessesAShellStartsCostOneLookEachAndAClientThatComesStartsAfresh() throws {
        let asked = EventLog<pid_t>()
        let tree: [pid_t: pid_t] = [1001: 1000, 1002: 1000, 1000: 900, 900: 1, 2001: getpid(), 2002: 2001]
        try startServer(processInfo: { pid in
            asked.append(pid)
            return tree[pid].map { (tgid: pid, ppid: $0) } ?? ClientOwners.procProcessInfo(pid)
        })
        let client = try connect()
        let owner = try XCTUnwrap(server.ownerOf(pid: getpid()))
        XCTAssertEqual(asked.all, [], "a client's own process is known")

        XCTAssertNil(server.ownerOf(pid: 1001))
        XCTAssertEqual(asked.all, [1001, 1000, 900], "up to init, which is not asked")
        XCTAssertNil(server.ownerOf(pid: 1002))
        XCTAssertEqual(asked.all, [1001, 1000, 900, 1002], "its parent's answer was kept")
        XCTAssertEqual(server.ownerOf(pid: 2002), owner, "a descendant of the client")
        XCTAssertEqual(server.ownerOf(pid: 2001), owner)
        XCTAssertEqual(asked.all.suffix(2), [2002, 2001])

        let other = try connect()
        eventually("the second client counted") { server.clients().count == 2 }
        XCTAssertNil(server.ownerOf(pid: 1002))
        XCTAssertEqual(asked.all.suffix(3), [1002, 1000, 900], "what was learnt went with the new client")
        client.close()
        other.close()
    }

    func testSeveralConnectionsOfOneProcessBelongToTheOldest() throws {
        try startServer()
        let first = try connect()
        let second = try connect()
        let owners = server.clients().map(\.owner)
        XCTAssertEqual(owners.count, 2)
        XCTAssertEqual(server.ownerOf(pid: getpid()), owners.min())
        first.close()
        eventually("the other connection owns the process now") { server.ownerOf(pid: getpid()) == owners.max() }
        second.close()
        eventually("no owner") { server.ownerOf(pid: getpid()) == nil }
    }

    func testOtherUsersSeeOnlyTheirOwnClientsAndTheSessionsOfWhatTheyMayReadInTheStatus() throws {
        let stranger = PeerCredentials(processID: 4242, userID: 12_345, groupID: 12_345)
        try startServer(mayAccess: { peer, item, _ in
            peer.userID != stranger.userID || item.components.first?.string != "private"
        })
        server.engine.registry.add(PresenterKey(owner: OwnerID(50), purpose: PurposeID("a")), path: path("private/diary"))
        server.engine.registry.add(PresenterKey(owner: OwnerID(50), purpose: PurposeID("b")), path: path("shared/list"))
        server.engine.arbiter.request([.write(path("private/diary"))], owner: .ordinaryPrograms,
                                      purpose: PurposeID("fuse-1")) { _ in }
        let strangers = server.status(for: stranger)
        XCTAssertTrue(strangers.presenters.isEmpty, "not even of items they may read")
        XCTAssertTrue(strangers.accesses.isEmpty)
        XCTAssertEqual(strangers.writeSessions, [WriteSessionStatus(path: path("Documents/a.txt"))])
        let roots = server.status(for: PeerCredentials(processID: 1, userID: 0, groupID: 0))
        XCTAssertEqual(roots.presenters.count, 2)
        XCTAssertEqual(roots.accesses.count, 1)
    }

    func testAccessIsCheckedWithTheDaemonsClosure() throws {
        let asked = EventLog<String>()
        try startServer(mayAccess: { peer, item, write in
            asked.append("\(peer.userID == getuid()) \(item) \(write)")
            if item.components.first?.string == "secret" { return false }
            return !(write && item.components.first?.string == "Notes.app")
        })
        let client = try connect()
        try client.send(.addPresenter(.init(presenter: PurposeID("spy"), path: path("secret/diary"))))
        guard case .error(let refused)? = try client.receive() else { return XCTFail("expected an error") }
        XCTAssertEqual(refused.code, .accessDenied)
        XCTAssertTrue(server.engine.registry.all().isEmpty)

        try client.send(.coordinate(.init(requestID: 1, purpose: PurposeID("x"),
                                          accesses: [.read(path("Notes.app/Info.plist")),
                                                     .write(path("Notes.app/Info.plist"))])))
        guard case .denied(let denied)? = try client.receive() else { return XCTFail("expected denied") }
        XCTAssertEqual(denied.reason, .accessDenied)
        XCTAssertTrue(server.status().accesses.isEmpty, "nothing of a refused request is held")

        try client.send(.coordinate(.init(requestID: 2, purpose: PurposeID("x"),
                                          accesses: [.read(path("Notes.app/Info.plist"))])))
        XCTAssertEqual(try client.receive(), .granted(.init(requestID: 2)))
        XCTAssertTrue(asked.all.contains("true secret/diary false"))
        XCTAssertTrue(asked.all.contains("true Notes.app/Info.plist true"))
        // still connected: a refusal is not a protocol error
        try client.send(.statusRequest)
        guard case .statusReply? = try client.receive() else { return XCTFail("still served") }
    }
}

/// A blocking client that speaks raw frames, for driving the server from tests.
final class TestClient {
    let fd: Int32
    private var reader = FrameReader()

    init(path: String) throws {
        fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0, withSocketAddress(path, { connect(fd, $0, $1) }) == 0 else {
            throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO)
        }
    }

    deinit { Glibc.close(fd) }

    static func frame(_ json: String) -> [UInt8] {
        let payload = Array(json.utf8)
        let length = UInt32(payload.count)
        return [UInt8(length >> 24), UInt8(length >> 16 & 0xFF), UInt8(length >> 8 & 0xFF), UInt8(length & 0xFF)] + payload
    }

    func send(_ message: ControlMessage) throws {
        try sendRaw(try ControlCodec.encode(message))
    }

    func sendRaw(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let sent = bytes[offset...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard sent > 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
            offset += sent
        }
    }

    /// The next message; nil at end of stream or if nothing came within `timeout` seconds.
    func receive(timeout: TimeInterval = 5) throws -> ControlMessage? {
        let deadline = Date().addingTimeInterval(timeout)
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            if let message = try reader.next() { return message }
            let remaining = deadline.timeIntervalSinceNow
            guard remaining > 0 else { return nil }
            var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&poller, 1, Int32(remaining * 1000) + 1) > 0 else { return nil }
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count <= 0 { return nil }
            reader.append(buffer[..<count])
        }
    }

    func close() {
        shutdown(fd, Int32(SHUT_RDWR))
    }
}
