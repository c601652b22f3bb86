
// Sends presenter messages and waits for replies without blocking any thread, each wait bounded
// (docs/coordination.md, "Presenters and messages"): a presenter that does not answer in time counts as
// having answered and is marked unresponsive; its next message gets a shorter wait, and once that
// runs out too its messages are sent without waiting until it answers again. So a presenter that
// never answers costs others one long and one short wait in all, not a wait per operation.

/// Carries messages to the client that owns a presenter (in the daemon: the control socket).
public protocol PresenterTransport: Sendable {
    /// Must not block. When `awaitingReply`, the client is asked to answer, and the answer comes as
    /// a later `Messenger.receiveReply(_:from:error:)` with the same id.
    func send(_ message: PresenterMessage, id: MessageID, to presenter: PresenterKey, awaitingReply: Bool)
}

public enum DeliveryOutcome: Hashable, Sendable {
    /// The presenter answered.
    case answered
    /// The presenter answered with a failure (e.g. it could not save); the operation goes on.
    case failed(String)
    /// No answer in time: treated as answered; the presenter is now marked unresponsive.
    case timedOut
    /// The presenter is not registered (any more); nothing was sent or its client went away.
    case presenterGone
    /// A notification, sent without waiting for a reply.
    case notified
}

public struct DeliveryResult: Hashable, Sendable {
    public let delivery: PresenterDelivery
    public let outcome: DeliveryOutcome
}

public final class Messenger: Sendable {
    public typealias Completion = @Sendable (DeliveryOutcome) -> Void

    public let replyTimeout: Duration
    /// The wait granted to a presenter whose last wait ran out, so that one stuck client does
    /// not slow every operation by the full timeout. A presenter that lets this run out too is
    /// not waited for until it answers.
    public let unresponsiveReplyTimeout: Duration

    private let registry: PresenterRegistry
    private let transport: any PresenterTransport
    private let scheduler: any Scheduler
    private let onUnresponsive: @Sendable (PresenterKey, PresenterMessage) -> Void
    private let state = Locked(PendingReplies())

    /// - Parameter onUnresponsive: called when a presenter's time runs out (for the daemon log).
    public init(registry: PresenterRegistry, transport: any PresenterTransport,
                replyTimeout: Duration = .seconds(2), unresponsiveReplyTimeout: Duration = .milliseconds(250),
                scheduler: any Scheduler = DispatchScheduler(),
                onUnresponsive: @escaping @Sendable (PresenterKey, PresenterMessage) -> Void = { _, _ in }) {
        self.registry = registry
        self.transport = transport
        self.replyTimeout = replyTimeout
        self.unresponsiveReplyTimeout = min(unresponsiveReplyTimeout, replyTimeout)
        self.scheduler = scheduler
        self.onUnresponsive = onUnresponsive
    }

    /// Sends one message; `completion` is called exactly once, possibly before this returns.
    public func send(_ message: PresenterMessage, to presenter: PresenterKey, completion: @escaping Completion) {
        guard let record = registry.record(presenter) else { return completion(.presenterGone) }
        guard record.awaits(message) else {
            transport.send(message, id: state.withLock { $0.allocateID() }, to: presenter, awaitingReply: false)
            return completion(.notified)
        }
        let (id, timeout) = state.withLock { pending -> (MessageID, Duration?) in
            let id = pending.allocateID()
            let timeout: Duration? = switch pending.silences[presenter, default: 0] {
            case 0: replyTimeout
            case 1: unresponsiveReplyTimeout
            default: nil
            }
            if timeout == nil {
                pending.leftUnanswered(id, by: presenter)
            } else {
                pending.waiting[id] = PendingReply(presenter: presenter, message: message, completion: completion)
            }
            return (id, timeout)
        }
        transport.send(message, id: id, to: presenter, awaitingReply: true)
        guard let timeout else { return completion(.timedOut) }
        let timer = scheduler.schedule(after: timeout) { [weak self] in self?.expire(id) }
        let stillPending = state.withLock { pending -> Bool in
            guard pending.waiting[id] != nil else { return false }
            pending.waiting[id]!.timer = timer
            return true
        }
        if !stillPending { timer.cancel() }
    }

    /// Delivers a plan's messages: each presenter's messages in order, one after the other's
    /// reply; different presenters in parallel, so the total wait is bounded by the busiest
    /// presenter's share rather than by the number of presenters. Results keep the input order.
    /// If no reply had to be awaited, `completion` runs before this returns; otherwise it runs
    /// through the scheduler, never on the thread that delivered the last reply (the control
    /// socket's reader must not end up performing file operations).
    public func deliver(_ deliveries: [PresenterDelivery], completion: @escaping @Sendable ([DeliveryResult]) -> Void) {
        guard !deliveries.isEmpty else { return completion([]) }
        let batch = DeliveryBatch(deliveries: deliveries, scheduler: scheduler, completion: completion)
        var queues: [PresenterKey: [Int]] = [:]
        var order: [PresenterKey] = []
        for (index, delivery) in deliveries.enumerated() {
            if queues[delivery.presenter] == nil { order.append(delivery.presenter) }
            queues[delivery.presenter, default: []].append(index)
        }
        for presenter in order {
            sendInOrder(queues[presenter]![...], of: batch)
        }
        batch.finishLaunching()
    }

    /// A client's answer to a message. Replies from anyone but the presenter's own client are
    /// ignored. A late reply completes nothing, but shows the presenter is back: its next message
    /// is waited for again (briefly, until it answers one in time).
    public func receiveReply(_ id: MessageID, from owner: OwnerID, error: String? = nil) {
        let answered = state.withLock { pending -> PendingReply? in
            if pending.waiting[id]?.presenter.owner == owner {
                let answered = pending.waiting.removeValue(forKey: id)!
                pending.heard(from: answered.presenter, inTime: true)
                return answered
            }
            if let presenter = pending.unanswered[id], presenter.owner == owner {
                pending.heard(from: presenter, inTime: false)
            }
            return nil
        }
        guard let answered else { return }
        answered.timer?.cancel()
        if registry.record(answered.presenter)?.isUnresponsive == true {
            registry.setUnresponsive(answered.presenter, false)
        }
        answered.completion(error.map(DeliveryOutcome.failed) ?? .answered)
    }

    /// Forgets what is known of a presenter that was removed.
    public func forget(_ presenter: PresenterKey) {
        state.withLock { pending in
            pending.silences[presenter] = nil
            if let id = pending.lastUnanswered.removeValue(forKey: presenter) { pending.unanswered[id] = nil }
        }
    }

    /// Settles every message waiting on `owner`'s presenters at once (its connection closed).
    public func disconnect(_ owner: OwnerID) {
        let dropped = state.withLock { pending -> [PendingReply] in
            let ids = pending.waiting.filter { $0.value.presenter.owner == owner }.map(\.key)
            pending.forget(owner)
            return ids.compactMap { pending.waiting.removeValue(forKey: $0) }
        }
        for reply in dropped {
            reply.timer?.cancel()
            reply.completion(.presenterGone)
        }
    }

    /// Whether a presenter of `owner` has been asked something and not answered yet: the owner is
    /// answering (saving, or letting go) for someone else's access.
    public func isAwaitingAnswer(from owner: OwnerID) -> Bool {
        state.withLock { pending in pending.waiting.values.contains { $0.presenter.owner == owner } }
    }

    /// Messages sent and not yet answered, for status output.
    public func pendingMessages() -> [PendingMessageStatus] {
        state.withLock { pending in
            pending.waiting.sorted { $0.key.rawValue < $1.key.rawValue }
                .map { PendingMessageStatus(id: $0.key, presenter: $0.value.presenter, message: $0.value.message) }
        }
    }

    // MARK: - Internals

    private func expire(_ id: MessageID) {
        let expired = state.withLock { pending -> PendingReply? in
            guard let expired = pending.waiting.removeValue(forKey: id) else { return nil }
            pending.silences[expired.presenter, default: 0] += 1
            pending.leftUnanswered(id, by: expired.presenter)
            return expired
        }
        guard let expired else { return }
        registry.setUnresponsive(expired.presenter)
        onUnresponsive(expired.presenter, expired.message)
        expired.completion(.timedOut)
    }

    private func sendInOrder(_ indices: ArraySlice<Int>, of batch: DeliveryBatch) {
        guard let index = indices.first else { return }
        let delivery = batch.deliveries[index]
        send(delivery.message, to: delivery.presenter) { [self] outcome in
            batch.record(outcome, at: index)
            sendInOrder(indices.dropFirst(), of: batch)
        }
    }
}

private struct PendingReply: Sendable {
    let presenter: PresenterKey
    let message: PresenterMessage
    let completion: Messenger.Completion
    var timer: (any TimerHandle)?
}

private struct PendingReplies: Sendable {
    var lastID: UInt64 = 0
    var waiting: [MessageID: PendingReply] = [:]
    /// Waits in a row that each presenter let run out.
    var silences: [PresenterKey: Int] = [:]
    /// The last message each silent presenter left unanswered (both ways), so that a late reply
    /// is recognised; one per presenter, so a presenter that never answers costs no memory.
    var unanswered: [MessageID: PresenterKey] = [:]
    var lastUnanswered: [PresenterKey: MessageID] = [:]

    mutating func leftUnanswered(_ id: MessageID, by presenter: PresenterKey) {
        if let previous = lastUnanswered.updateValue(id, forKey: presenter) { unanswered[previous] = nil }
        unanswered[id] = presenter
    }

    /// An answer in time clears the presenter's record; a late one earns it the short wait.
    mutating func heard(from presenter: PresenterKey, inTime: Bool) {
        if inTime {
            silences[presenter] = nil
            if let id = lastUnanswered.removeValue(forKey: presenter) { unanswered[id] = nil }
        } else if let count = silences[presenter], count > 1 {
            silences[presenter] = 1
        }
    }

    mutating func forget(_ owner: OwnerID) {
        guard !silences.isEmpty || !unanswered.isEmpty else { return }
        silences = silences.filter { $0.key.owner != owner }
        unanswered = unanswered.filter { $0.value.owner != owner }
        lastUnanswered = lastUnanswered.filter { $0.key.owner != owner }
    }

    mutating func allocateID() -> MessageID {
        lastID += 1
        return MessageID(lastID)
    }
}

/// Collects the outcomes of one `deliver` call and reports them once all are in.
private final class DeliveryBatch: Sendable {
    private struct Progress {
        var results: [DeliveryOutcome?]
        var missing: Int
        /// Still inside `deliver`: a batch finished by then is reported on the caller's thread.
        var launching = true
    }

    let deliveries: [PresenterDelivery]
    private let scheduler: any Scheduler
    private let completion: @Sendable ([DeliveryResult]) -> Void
    private let progress: Locked<Progress>

    init(deliveries: [PresenterDelivery], scheduler: any Scheduler,
         completion: @escaping @Sendable ([DeliveryResult]) -> Void) {
        self.deliveries = deliveries
        self.scheduler = scheduler
        self.completion = completion
        self.progress = Locked(Progress(results: Array(repeating: nil, count: deliveries.count),
                                       missing: deliveries.count))
    }

    func record(_ outcome: DeliveryOutcome, at index: Int) {
        let finished = progress.withLock { progress -> [DeliveryResult]? in
            guard progress.results[index] == nil else { return nil }
            progress.results[index] = outcome
            progress.missing -= 1
            return progress.missing == 0 && !progress.launching ? results(progress) : nil
        }
        guard let finished else { return }
        scheduler.execute { [completion] in completion(finished) }
    }

    func finishLaunching() {
        let finished = progress.withLock { progress -> [DeliveryResult]? in
            progress.launching = false
            return progress.missing == 0 ? results(progress) : nil
        }
        if let finished { completion(finished) }
    }

    private func results(_ progress: Progress) -> [DeliveryResult] {
        zip(deliveries, progress.results).map { DeliveryResult(delivery: $0, outcome: $1!) }
    }
}
