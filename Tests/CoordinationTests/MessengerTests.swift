@testable import Coordination
#if canImport(Glibc)
import Glibc
#endif
import Foundation
import XCTest

/// Records what was sent; optionally answers at once, as a well-behaved client would.
final class RecordingTransport: PresenterTransport {
    struct Sent: Equatable {
        let id: MessageID
        let message: PresenterMessage
        let presenter: PresenterKey
        var awaitingReply = true
    }

    let sent = EventLog<Sent>()
    private let answering = Locked<Set<PresenterKey>>([])
    private let messenger = Locked<Messenger?>(nil)

    func connect(_ messenger: Messenger) { self.messenger.withLock { $0 = messenger } }
    func answerAtOnce(_ presenter: PresenterKey) { _ = answering.withLock { $0.insert(presenter) } }

    func send(_ message: PresenterMessage, id: MessageID, to presenter: PresenterKey, awaitingReply: Bool) {
        sent.append(Sent(id: id, message: message, presenter: presenter, awaitingReply: awaitingReply))
        if awaitingReply, answering.withLock({ $0.contains(presenter) }) {
            messenger.withLock { $0 }?.receiveReply(id, from: presenter.owner)
        }
    }
}

final class MessengerTests: XCTestCase {
    private let registry = PresenterRegistry()
    private let scheduler = ManualScheduler()
    private let transport = RecordingTransport()
    private let unresponsiveLog = EventLog<PresenterKey>()
    private var messenger: Messenger!
    private let quick = PresenterKey(owner: bob, purpose: PurposeID("quick"))
    private let slow = PresenterKey(owner: carol, purpose: PurposeID("slow"))

    override func setUp() {
        registry.add(quick, path: path("a"))
        registry.add(slow, path: path("a"))
        let log = unresponsiveLog
        messenger = Messenger(registry: registry, transport: transport, replyTimeout: .seconds(2),
                              unresponsiveReplyTimeout: .milliseconds(300), scheduler: scheduler,
                              onUnresponsive: { presenter, _ in log.append(presenter) })
        transport.connect(messenger)
    }

    private func send(_ message: PresenterMessage, to presenter: PresenterKey) -> EventLog<DeliveryOutcome> {
        let outcomes = EventLog<DeliveryOutcome>()
        messenger.send(message, to: presenter) { outcomes.append($0) }
        return outcomes
    }

    func testAnswerCompletesAndCancelsTheTimer() throws {
        let outcomes = send(.savePresentedItemChanges, to: quick)
        XCTAssertEqual(outcomes.all, [])
        let sent = try XCTUnwrap(transport.sent.all.first)
        messenger.receiveReply(sent.id, from: bob)
        XCTAssertEqual(outcomes.all, [.answered])
        XCTAssertEqual(scheduler.liveTimerCount, 0)
        messenger.receiveReply(sent.id, from: bob)
        scheduler.advance(by: .seconds(10))
        XCTAssertEqual(outcomes.all, [.answered], "a duplicate reply or a late timer changes nothing")
    }

    func testSilenceCountsAsAnswerAndMarksThePresenterUnresponsive() throws {
        let outcomes = send(.relinquishPresentedItemToWriter, to: slow)
        scheduler.advance(by: .milliseconds(1999))
        XCTAssertEqual(outcomes.all, [])
        scheduler.advance(by: .milliseconds(1))
        XCTAssertEqual(outcomes.all, [.timedOut])
        XCTAssertEqual(registry.unresponsivePresenters().map(\.key), [slow])
        XCTAssertEqual(unresponsiveLog.all, [slow])
        XCTAssertEqual(CoordinationStatus(arbiter: Arbiter(), registry: registry).unresponsivePresenters.map(\.key), [slow])

        // Once unresponsive, it gets the short wait; answering makes it responsive again.
        let next = send(.savePresentedItemChanges, to: slow)
        scheduler.advance(by: .milliseconds(299))
        XCTAssertEqual(next.all, [])
        messenger.receiveReply(try XCTUnwrap(transport.sent.all.last).id, from: carol)
        XCTAssertEqual(next.all, [.answered])
        XCTAssertEqual(registry.unresponsivePresenters(), [])
        XCTAssertEqual(scheduler.liveTimerCount, 0)
    }

    func testAPresenterThatStaysSilentIsNoLongerWaitedForUntilItAnswers() throws {
        let first = send(.relinquishPresentedItemToWriter, to: slow)
        scheduler.advance(by: .seconds(2))
        let second = send(.relinquishPresentedItemToWriter, to: slow)
        scheduler.advance(by: .milliseconds(300))
        XCTAssertEqual(first.all + second.all, [.timedOut, .timedOut])

        // Silent twice: later messages still go out, but nobody waits for them.
        let third = send(.accommodatePresentedItemDeletion, to: slow)
        XCTAssertEqual(third.all, [.timedOut])
        XCTAssertEqual(scheduler.liveTimerCount, 0)
        XCTAssertEqual(transport.sent.all.map(\.message).last, .accommodatePresentedItemDeletion)
        let results = EventLog<[DeliveryResult]>()
        messenger.deliver([PresenterDelivery(.savePresentedItemChanges, to: slow),
                           PresenterDelivery(.relinquishPresentedItemToReader, to: slow)]) { results.append($0) }
        XCTAssertEqual(results.all.first?.map(\.outcome), [.timedOut, .timedOut], "a plan is not held up")
        XCTAssertEqual(registry.unresponsivePresenters().map(\.key), [slow])

        // A late answer shows it is back: the short wait again, and an answer in time restores the long one.
        messenger.receiveReply(try XCTUnwrap(transport.sent.all.last).id, from: carol)
        let fourth = send(.savePresentedItemChanges, to: slow)
        XCTAssertEqual(fourth.all, [])
        messenger.receiveReply(try XCTUnwrap(transport.sent.all.last).id, from: carol)
        XCTAssertEqual(fourth.all, [.answered])
        let fifth = send(.savePresentedItemChanges, to: slow)
        scheduler.advance(by: .milliseconds(1999))
        XCTAssertEqual(fifth.all, [], "the long wait")
        scheduler.advance(by: .milliseconds(1))
        XCTAssertEqual(fifth.all, [.timedOut])
    }

    func testALateReplyFromAnotherClientOrAForgottenPresenterChangesNothing() throws {
        for wait in [Duration.seconds(2), .milliseconds(300)] {
            _ = send(.savePresentedItemChanges, to: slow)
            scheduler.advance(by: wait)
        }
        _ = send(.savePresentedItemChanges, to: slow)
        let unanswered = try XCTUnwrap(transport.sent.all.last).id
        messenger.receiveReply(unanswered, from: bob)
        XCTAssertEqual(send(.savePresentedItemChanges, to: slow).all, [.timedOut], "still not waited for")
        messenger.forget(slow)
        XCTAssertEqual(send(.savePresentedItemChanges, to: slow).all, [], "a presenter added again starts afresh")
    }

    func testNotificationsAreNotWaitedFor() {
        let outcomes = send(.presentedItemDidChange, to: slow)
        XCTAssertEqual(outcomes.all, [.notified])
        XCTAssertEqual(scheduler.liveTimerCount, 0)
        XCTAssertEqual(transport.sent.all.map(\.message), [.presentedItemDidChange])
    }

    func testRequestsAPresenterDoesNotAwaitAreSentWithoutWaiting() {
        let listener = PresenterKey(owner: bob, purpose: PurposeID("listener"))
        registry.add(listener, path: path("a"), awaited: [.save])
        XCTAssertEqual(send(.accommodatePresentedItemDeletion, to: listener).all, [.notified])
        XCTAssertEqual(send(.relinquishPresentedItemToWriter, to: listener).all, [.notified])
        XCTAssertEqual(scheduler.liveTimerCount, 0)
        XCTAssertEqual(transport.sent.all.map(\.awaitingReply), [false, false], "the client is told not to answer")
        XCTAssertEqual(transport.sent.all.map(\.message), [.accommodatePresentedItemDeletion, .relinquishPresentedItemToWriter],
                       "it still hears them, in order")

        let save = send(.savePresentedItemChanges, to: listener)
        XCTAssertEqual(save.all, [], "what it declared is waited for")
        XCTAssertEqual(transport.sent.all.last?.awaitingReply, true)
        messenger.receiveReply(transport.sent.all.last!.id, from: bob)
        XCTAssertEqual(save.all, [.answered])
    }

    func testRequestsAreNamedOnTheWire() throws {
        let requests: PresenterRequests = [.save, .accommodateSubitemDeletion]
        let encoded = try JSONEncoder().encode(requests)
        XCTAssertEqual(String(decoding: encoded, as: UTF8.self), #"["savePresentedItemChanges","accommodatePresentedSubitemDeletion"]"#)
        XCTAssertEqual(try JSONDecoder().decode(PresenterRequests.self, from: encoded), requests)
        XCTAssertThrowsError(try JSONDecoder().decode(PresenterRequests.self, from: Data(#"["presentedItemDidChange"]"#.utf8)),
                             "a notification is not a request")
    }

    func testUnknownPresenterIsGoneAndHearsNothing() {
        let outcomes = send(.savePresentedItemChanges, to: PresenterKey(owner: bob, purpose: PurposeID("nobody")))
        XCTAssertEqual(outcomes.all, [.presenterGone])
        XCTAssertEqual(transport.sent.all, [])
    }

    func testRepliesFromAnotherClientAreIgnoredAndErrorsAreReported() throws {
        let outcomes = send(.savePresentedItemChanges, to: quick)
        let id = try XCTUnwrap(transport.sent.all.first).id
        messenger.receiveReply(id, from: carol)
        XCTAssertEqual(outcomes.all, [])
        messenger.receiveReply(id, from: bob, error: "disk full")
        XCTAssertEqual(outcomes.all, [.failed("disk full")])
    }

    func testDeliverKeepsPerPresenterOrderAndRunsPresentersInParallel() throws {
        let results = EventLog<[DeliveryResult]>()
        let plan = [
            PresenterDelivery(.relinquishPresentedItemToReader, to: slow),
            PresenterDelivery(.relinquishPresentedItemToReader, to: quick),
            PresenterDelivery(.savePresentedItemChanges, to: slow),
            PresenterDelivery(.savePresentedItemChanges, to: quick),
        ]
        messenger.deliver(plan) { results.append($0) }
        XCTAssertEqual(transport.sent.all.map(\.presenter), [slow, quick],
                       "each presenter's first message goes out at once; its second waits for the reply")
        messenger.receiveReply(transport.sent.all[1].id, from: bob)
        XCTAssertEqual(transport.sent.all.map(\.message).last, .savePresentedItemChanges)
        XCTAssertEqual(transport.sent.all.last?.presenter, quick)
        messenger.receiveReply(transport.sent.all[2].id, from: bob)
        XCTAssertEqual(results.all.count, 0, "the slow presenter has not answered yet")

        scheduler.advance(by: .seconds(2))  // slow's first message times out, its second goes out
        XCTAssertEqual(transport.sent.all.count, 4)
        XCTAssertEqual(results.all.count, 0)
        scheduler.advance(by: .milliseconds(300))  // now unresponsive: the short wait
        let outcome = try XCTUnwrap(results.all.first)
        XCTAssertEqual(results.all.count, 1)
        XCTAssertEqual(outcome.map(\.delivery), plan)
        XCTAssertEqual(outcome.map(\.outcome), [.timedOut, .answered, .timedOut, .answered])
    }

    func testDeliverWithPromptPresentersFinishesSynchronously() {
        transport.answerAtOnce(quick)
        let results = EventLog<[DeliveryOutcome]>()
        messenger.deliver([PresenterDelivery(.relinquishPresentedItemToWriter, to: quick),
                           PresenterDelivery(.presentedItemDidChange, to: quick),
                           PresenterDelivery(.reacquirePresentedItem, to: quick)]) { results.append($0.map(\.outcome)) }
        XCTAssertEqual(results.all, [[.answered, .notified, .notified]])
        messenger.deliver([]) { results.append($0.map(\.outcome)) }
        XCTAssertEqual(results.all.last, [])
    }

    func testDisconnectSettlesPendingMessagesAtOnce() {
        let outcomes = send(.accommodatePresentedItemDeletion, to: slow)
        XCTAssertEqual(messenger.pendingMessages().map(\.presenter), [slow])
        messenger.disconnect(carol)
        XCTAssertEqual(outcomes.all, [.presenterGone])
        XCTAssertEqual(messenger.pendingMessages(), [])
        XCTAssertEqual(scheduler.liveTimerCount, 0)
    }

    func testAFinishedBatchIsNotReportedOnTheReplyingThread() throws {
        let transport = RecordingTransport()
        let real = Messenger(registry: registry, transport: transport)
        let replyThread = pthread_self()
        let reported = expectation(description: "reported on another thread")
        real.deliver([PresenterDelivery(.savePresentedItemChanges, to: quick)]) { results in
            XCTAssertEqual(results.map(\.outcome), [.answered])
            if pthread_equal(pthread_self(), replyThread) == 0 { reported.fulfill() }
        }
        real.receiveReply(try XCTUnwrap(transport.sent.all.first).id, from: bob)
        wait(for: [reported], timeout: 5)
    }

    func testRealTimerNeverHangs() {
        let real = Messenger(registry: registry, transport: RecordingTransport(), replyTimeout: .milliseconds(50))
        let done = expectation(description: "timed out")
        real.send(.savePresentedItemChanges, to: slow) { outcome in
            XCTAssertEqual(outcome, .timedOut)
            done.fulfill()
        }
        wait(for: [done], timeout: 5)
    }
}
