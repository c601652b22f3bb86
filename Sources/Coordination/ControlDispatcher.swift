import Dispatch
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// What the dispatcher keeps for one client: its presenters and its unreleased requests.
final class ClientHoldings: @unchecked Sendable {
    /// Locked: completions write to it from any thread.
    let requests = Locked<[UInt64: RequestEntry]>([:])
    /// Ids of this client's presenters; touched on the connection's queue only.
    var presenters: Set<PurposeID> = []
    /// Directories lately found listable or not by this client's user, each answer kept for a
    /// second (as the kernel keeps attributes): one operation's messages to a client's many
    /// presenters in a directory then cost one check, not one each.
    private let listings = Locked<[ItemPath: (allowed: Bool, at: ContinuousClock.Instant)]>([:])

    func mayList(_ directory: ItemPath, check: () -> Bool) -> Bool {
        let now = ContinuousClock.now
        if let known = listings.withLock({ $0[directory] }), now - known.at < .seconds(1) { return known.allowed }
        let allowed = check()
        listings.withLock { answers in
            // Full of fresh answers (an `rm -rf` goes through hundreds of directories a second):
            // start again, rather than check every later directory anew.
            if answers.count >= 64 { answers = answers.filter { now - $0.value.at < .seconds(1) } }
            if answers.count >= 64 { answers.removeAll(keepingCapacity: true) }
            answers[directory] = (allowed, now)
        }
        return allowed
    }

}

enum RequestEntry {
    /// `Arbiter.request` has not returned yet.
    case requesting
    case waiting(AccessTicket)
    /// Granted by the arbiter; the presenters are asked to make way (a cancel meanwhile is noted).
    case asking(AccessTicket, reacquire: [PresenterDelivery], cancelled: Bool)
    case granted(AccessTicket, reacquire: [PresenterDelivery])
}

/// Carries out what clients ask of the coordination engine (docs/control-protocol.md):
/// presenters, coordinated accesses and their release or cancellation, presenters' replies.
/// It answers on the client's connection and knows nothing of sockets or frames.
final class ControlDispatcher: Sendable {
    let engine: CoordinationEngine
    private let mayAccess: ControlServer.AccessCheck
    private let maxPresentersPerClient: Int
    private let maxRequestsPerClient: Int
    private let userLimits: UserLimits
    /// Shared with the server, which admits clients against it.
    private let shares: Locked<UserShares>
    /// The status as a peer may see it; nil once the server is gone.
    private let status: @Sendable (PeerCredentials) -> CoordinationStatus?
    private let log: @Sendable (String) -> Void

    init(engine: CoordinationEngine, mayAccess: @escaping ControlServer.AccessCheck, maxPresentersPerClient: Int,
         maxRequestsPerClient: Int, userLimits: UserLimits, shares: Locked<UserShares>,
         status: @escaping @Sendable (PeerCredentials) -> CoordinationStatus?, log: @escaping @Sendable (String) -> Void) {
        self.engine = engine
        self.mayAccess = mayAccess
        self.maxPresentersPerClient = maxPresentersPerClient
        self.maxRequestsPerClient = maxRequestsPerClient
        self.userLimits = userLimits
        self.shares = shares
        self.status = status
        self.log = log
    }

    /// Whether the client may hear of a name in `directory`: whether its user could list it.
    func mayList(_ directory: ItemPath, on connection: ControlConnection) -> Bool {
        connection.holdings.mayList(directory) { mayAccess(connection.credentials, directory, false) }
    }

    /// Lets go of what a closed connection held: its presenters that made way for its accesses
    /// reacquire, and the engine drops its presenters and accesses.
    func closed(_ connection: ControlConnection) {
        let held = connection.holdings.requests.withLock { requests in
            defer { requests.removeAll() }
            return Array(requests.values)
        }
        for entry in held {
            switch entry {
            case .granted(_, let reacquire), .asking(_, let reacquire, _): engine.messenger.deliver(reacquire) { _ in }
            case .waiting, .requesting: break
            }
        }
        engine.disconnect(connection.owner)
    }

    /// Carries out a client's message (after its hello), on its connection's queue.
    func handle(_ message: ControlMessage, from connection: ControlConnection) {
        let owner = connection.owner
        switch message {
        case .hello:
            connection.fail(.protocolViolation, "hello was already sent")
        case .addPresenter(let body):
            guard mayAccess(connection.credentials, body.path, false) else {
                log("control client \(owner): presenter \(body.presenter) refused on \(body.path)")
                return connection.enqueue(.error(.init(code: .accessDenied,
                                                       message: "presenter \(body.presenter): may not read \(body.path)")))
            }
            if !connection.holdings.presenters.contains(body.presenter) {
                guard connection.holdings.presenters.count < maxPresentersPerClient else {
                    return connection.enqueue(.error(.init(code: .limitExceeded,
                                                           message: "at most \(maxPresentersPerClient) presenters per client")))
                }
                let uid = connection.credentials.userID
                guard shares.withLock({ $0.addPresenter(uid, limits: userLimits) }) else {
                    return connection.enqueue(.error(.init(code: .limitExceeded,
                                                           message: "at most \(userLimits.presentersPerUser) presenters per user, in all of the user's clients")))
                }
                connection.holdings.presenters.insert(body.presenter)
            }
            engine.registry.add(PresenterKey(owner: owner, purpose: body.presenter), path: body.path,
                                awaited: body.awaited ?? .all)
        case .removePresenter(let body):
            if connection.holdings.presenters.remove(body.presenter) != nil {
                shares.withLock { $0.removePresenter(connection.credentials.userID) }
            }
            engine.messenger.forget(PresenterKey(owner: owner, purpose: body.presenter))
            if engine.registry.remove(PresenterKey(owner: owner, purpose: body.presenter)) == nil {
                connection.enqueue(.error(.init(code: .unknownPresenter, message: "no presenter \(body.presenter)")))
            }
        case .coordinate(let body):
            coordinate(body, for: connection)
        case .release(let body):
            guard let entry = connection.holdings.requests.withLock({ $0.removeValue(forKey: body.requestID) }) else {
                return connection.enqueue(.error(.init(code: .unknownRequest, message: "no request \(body.requestID)")))
            }
            switch entry {
            case .granted(let ticket, let reacquire), .asking(let ticket, let reacquire, _):
                endGranted(ticket, reacquire: reacquire)
            case .waiting(let ticket): engine.arbiter.cancel(ticket)
            case .requesting: break
            }
        case .cancel(let body):
            // Unknown ids are ignored: a cancel may cross a denial on the wire.
            let entry = connection.holdings.requests.withLock { requests -> RequestEntry? in
                guard let entry = requests[body.requestID] else { return nil }
                switch entry {
                case .granted: requests.removeValue(forKey: body.requestID)
                case .asking(let ticket, let reacquire, _):   // denied once the presenters answered
                    requests[body.requestID] = .asking(ticket, reacquire: reacquire, cancelled: true)
                case .waiting, .requesting: break
                }
                return entry
            }
            switch entry {
            case .waiting(let ticket)?: engine.arbiter.cancel(ticket)   // answered by denied(cancelled)
            case .granted(let ticket, let reacquire)?: endGranted(ticket, reacquire: reacquire)
            case .asking?, .requesting?, nil: break
            }
        case .presenterReply(let body):
            engine.messenger.receiveReply(body.messageID, from: owner, error: body.error)
        case .statusRequest:
            if let status = status(connection.credentials) { connection.enqueue(.statusReply(status)) }
        case .helloReply, .granted, .denied, .presenterMessage, .statusReply, .error:
            connection.fail(.protocolViolation, "\(message.type.rawValue) is sent by the daemon, not to it")
        }
    }

    private func coordinate(_ body: ControlMessage.CoordinateRequest, for connection: ControlConnection) {
        let id = body.requestID
        func deny(_ reason: ControlMessage.Denied.Reason, _ detail: String) {
            connection.enqueue(.denied(.init(requestID: id, reason: reason, detail: detail)))
        }
        guard !body.accesses.isEmpty else { return deny(.invalidRequest, "no accesses") }
        if let refused = body.accesses.first(where: { !mayAccess(connection.credentials, $0.path, $0.kind.isWrite) }) {
            log("control client \(connection.owner): \(refused.kind.isWrite ? "write" : "read") of \(refused.path) refused")
            return deny(.accessDenied, "may not \(refused.kind.isWrite ? "write" : "read") \(refused.path)")
        }
        let admission = connection.holdings.requests.withLock { requests -> String? in
            guard requests[id] == nil else { return "request id \(id) is in use" }
            guard requests.count < maxRequestsPerClient else {
                return "at most \(maxRequestsPerClient) unreleased requests per client"
            }
            requests[id] = .requesting
            return nil
        }
        if let admission { return deny(.invalidRequest, admission) }
        let arbiter = engine.arbiter
        let ticket = arbiter.request(body.accesses, owner: connection.owner, purpose: body.purpose,
                                     timeout: body.timeout) { [weak connection, self] result in
            switch result {
            case .success(let grant):
                // As Apple's coordinators: the other presenters (the client's own included, but for
                // the coordinator's) make way before the accessor runs, and reacquire once it ends.
                // What changed meanwhile they hear from the filesystem.
                let initiator = Initiator(presenter: PresenterKey(owner: grant.owner, purpose: body.purpose))
                let plans = body.accesses.map {
                    AccessPlan(access: $0, initiator: initiator, registry: engine.registry, exists: { _ in true })
                }
                let reacquire = plans.flatMap(\.reacquire)
                let kept = connection?.holdings.requests.withLock { requests -> Bool in
                    guard requests[id] != nil else { return false }
                    requests[id] = .asking(grant.ticket, reacquire: reacquire, cancelled: false)
                    return true
                } ?? false
                // Released or cancelled while the grant was on its way, or the client is gone.
                guard kept, let connection else { return arbiter.release(grant.ticket) }
                engine.messenger.deliver(plans.flatMap(\.before)) { [weak connection, self] _ in
                    self.presentersMadeWay(for: id, of: connection)
                }
            case .failure(let error):
                _ = connection?.holdings.requests.withLock { $0.removeValue(forKey: id) }
                connection?.enqueue(.denied(.init(requestID: id, reason: .init(error))))
            }
        }
        connection.holdings.requests.withLock { requests in
            if case .requesting? = requests[id] { requests[id] = .waiting(ticket) }
        }
    }

    /// A client's access is granted once the presenters made way: unless it was cancelled meanwhile.
    private func presentersMadeWay(for id: UInt64, of connection: ControlConnection?) {
        guard let connection else { return }
        enum Outcome { case grant, cancel(AccessTicket, [PresenterDelivery]), ended }
        let outcome = connection.holdings.requests.withLock { requests -> Outcome in
            // Not asking any more: released, or the client is gone, and ended there.
            guard case .asking(let ticket, let reacquire, let cancelled)? = requests[id] else { return .ended }
            if cancelled {
                requests.removeValue(forKey: id)
                return .cancel(ticket, reacquire)
            }
            requests[id] = .granted(ticket, reacquire: reacquire)
            return .grant
        }
        switch outcome {
        case .grant: connection.enqueue(.granted(.init(requestID: id)))
        case .cancel(let ticket, let reacquire):
            endGranted(ticket, reacquire: reacquire)
            connection.enqueue(.denied(.init(requestID: id, reason: .init(CoordinationError.cancelled))))
        case .ended: break
        }
    }

    /// Ends a client's granted access: presenters reacquire, then the arbiter lets waiters in.
    private func endGranted(_ ticket: AccessTicket, reacquire: [PresenterDelivery]) {
        engine.messenger.deliver(reacquire) { [engine] _ in engine.arbiter.release(ticket) }
    }
}
