import DequeModule

// The arbitration engine (docs/coordination.md, "Arbitration rules"). Callers never wait here: a request
// either is granted at once or joins a FIFO queue, and its completion runs later on whichever
// thread releases, cancels, disconnects or times out the access that stood in its way.

public enum CoordinationError: Error, Hashable, Sendable {
    case cancelled
    case timedOut
    /// The owner's connection went away while the request was waiting.
    case disconnected
}

/// What a granted request holds until `Arbiter.release` is called with it.
public struct AccessGrant: Hashable, Sendable {
    public let ticket: AccessTicket
    public let owner: OwnerID
    public let purpose: PurposeID
    public let accesses: [ItemAccess]
    /// Granted inside an access its owner holds already (`joinsOwnersAccesses`): that access's
    /// purpose. Presenters made way for that one.
    public var joinedPurpose: PurposeID?
}

/// One access of a waiting or active request, for status output.
public struct AccessStatus: Hashable, Sendable, Codable {
    public enum State: String, Hashable, Sendable, Codable { case waiting, active }

    public let ticket: AccessTicket
    public let state: State
    public let owner: OwnerID
    public let purpose: PurposeID
    public let kind: AccessKind
    public let path: ItemPath
    public let isDirectory: Bool

    public init(ticket: AccessTicket, state: State, owner: OwnerID, purpose: PurposeID, kind: AccessKind,
                path: ItemPath, isDirectory: Bool) {
        self.ticket = ticket
        self.state = state
        self.owner = owner
        self.purpose = purpose
        self.kind = kind
        self.path = path
        self.isDirectory = isDirectory
    }
}

public final class Arbiter: Sendable {
    public typealias Completion = @Sendable (Result<AccessGrant, CoordinationError>) -> Void

    public let packageRule: PackageRule
    private let scheduler: any Scheduler
    private let state = Locked(State())

    /// - Parameters:
    ///   - packageRule: which directories are file packages (locked as a whole).
    ///   - scheduler: runs the waiting timeouts and the completions of requests that had to wait.
    public init(packageRule: PackageRule = .anyExtension, scheduler: any Scheduler = DispatchScheduler()) {
        self.packageRule = packageRule
        self.scheduler = scheduler
    }

    /// Asks for all of `accesses` at once (all-or-nothing, so two requests can never each hold
    /// half of what the other needs). `completion` is called exactly once: with the grant, or with
    /// an error on cancel, timeout or disconnect. If nothing stands in the way it is called before
    /// this method returns, on the caller's thread; a later grant runs it through the scheduler
    /// (a Dispatch queue by default). It is never called with the arbiter's lock held, so it may
    /// call back into the arbiter.
    ///
    /// - Parameters:
    ///   - purpose: requests of the same owner under the same purpose never block each other.
    ///   - timeout: how long the request may wait; nil waits until granted, cancelled or
    ///     disconnected.
    ///   - joinsOwnersAccesses: set for the filesystem's own access on behalf of a process that
    ///     is a connected client (its I/O inside a coordinated read or write it took through the
    ///     control socket). Such a request never waits for its owner's accesses, and if those
    ///     already cover it, it is granted at once, ahead of any queue: the others in the queue
    ///     are waiting for that very owner, so making it wait would deadlock.
    @discardableResult
    public func request(_ accesses: [ItemAccess], owner: OwnerID, purpose: PurposeID,
                        timeout: Duration? = nil, joinsOwnersAccesses: Bool = false,
                        completion: @escaping Completion) -> AccessTicket {
        let locks = accesses.map(lock(for:))
        var joined: PurposeID?
        let (ticket, grantedAtOnce) = state.withLock { state -> (AccessTicket, Bool) in
            state.nextTicket += 1
            let request = Request(ticket: AccessTicket(state.nextTicket), owner: owner, purpose: purpose,
                                  accesses: accesses, locks: locks, joinsOwnersAccesses: joinsOwnersAccesses,
                                  completion: completion)
            // A newcomer waits behind every earlier waiter it conflicts with, not only behind the
            // holders: this is what keeps a stream of readers from starving a writer.
            joined = joinsOwnersAccesses ? state.ownersAccessCovering(request) : nil
            // Partly inside the owner's access (an editor's save: a temporary file renamed over
            // the item it holds), it waits only for holders, not behind the queue, which waits
            // for that owner.
            let passes = state.passesWaiters(request)
            if joined != nil || state.isGrantable(request, blockedBy: state.waiting.prefix(passes ? 0 : state.waiting.count)) {
                state.active[request.ticket] = request
                return (request.ticket, true)
            }
            state.waiting.append(request)
            return (request.ticket, false)
        }
        if grantedAtOnce {
            completion(.success(AccessGrant(ticket: ticket, owner: owner, purpose: purpose, accesses: accesses,
                                            joinedPurpose: joined)))
        } else if let timeout {
            let timer = scheduler.schedule(after: timeout) { [weak self] in
                self?.finishWaiting(ticket, with: .timedOut)
            }
            // The request may have been settled while the timer was being made.
            let stillWaiting = state.withLock { state in state.setTimer(timer, for: ticket) }
            if !stillWaiting { timer.cancel() }
        }
        return ticket
    }

    /// Ends a granted access and lets waiters in.
    public func release(_ grant: AccessGrant) {
        release(grant.ticket)
    }

    public func release(_ ticket: AccessTicket) {
        let granted = state.withLock { state -> [Grantee] in
            guard let released = state.active.removeValue(forKey: ticket) else { return [] }
            return state.admitWaiters(freedBy: released)
        }
        notify(granted)
    }

    /// Gives up a waiting request (its completion gets `.cancelled`). A ticket that was already
    /// granted is released instead, so that a caller racing with the grant never leaks a lock.
    public func cancel(_ ticket: AccessTicket) {
        if !finishWaiting(ticket, with: .cancelled) {
            release(ticket)
        }
    }

    /// Drops every waiting and granted access of `owner` at once (its connection closed).
    public func disconnect(_ owner: OwnerID) {
        let (dropped, granted) = state.withLock { state -> ([Request], [Grantee]) in
            let dropped = Array(state.waiting.filter { $0.owner == owner })
            state.waiting.removeAll { $0.owner == owner }
            state.active = state.active.filter { $0.value.owner != owner }
            return (dropped, state.admitWaiters())
        }
        for request in dropped {
            request.timer?.cancel()
            request.completion(.failure(.disconnected))
        }
        notify(granted)
    }

    /// Keeps every waiting and active access following an item that was renamed, so a request
    /// queued on `a/x` before `a` moved to `b` protects `b/x` once granted.
    public func itemDidMove(from source: ItemPath, to destination: ItemPath) {
        let granted = state.withLock { state -> [Grantee] in
            state.reroot(from: source, to: destination) { self.lock(for: $0) }
            // A rename can turn a name into a package name or out of one, changing conflicts.
            return state.admitWaiters()
        }
        notify(granted)
    }

    /// Every active and waiting access, active first, each group in ticket order.
    public func status() -> [AccessStatus] {
        state.withLock { state in
            let active = state.active.values.sorted { $0.ticket.rawValue < $1.ticket.rawValue }
            return active.flatMap { $0.status(.active) } + state.waiting.flatMap { $0.status(.waiting) }
        }
    }

    // MARK: - Internals

    /// Settles a waiting request with an error. Returns false if it was not waiting.
    @discardableResult
    private func finishWaiting(_ ticket: AccessTicket, with error: CoordinationError) -> Bool {
        let outcome = state.withLock { state -> (Request, [Grantee])? in
            guard let index = state.waiting.firstIndex(where: { $0.ticket == ticket }) else { return nil }
            let request = state.waiting.remove(at: index)
            // Whoever queued behind this request only for its sake may go now.
            return (request, state.admitWaiters(freedBy: request))
        }
        guard let (request, granted) = outcome else { return false }
        request.timer?.cancel()
        request.completion(.failure(error))
        notify(granted)
        return true
    }

    /// Tells the requests admitted by someone else's release. Their completions run through the
    /// scheduler, not on the releasing thread: a completion that does its work and releases would
    /// otherwise grant the next waiter inside itself, nesting as deep as the queue is long.
    private func notify(_ granted: [Grantee]) {
        for grantee in granted {
            grantee.timer?.cancel()
            scheduler.execute { grantee.completion(.success(grantee.grant)) }
        }
    }

    /// What an access really locks: an item inside a package (or the package itself) locks the
    /// whole package; a deleting, moving or replacing write also reaches inside a directory.
    private func lock(for access: ItemAccess) -> Lock {
        if let package = packageRule.enclosingPackage(of: access.path, isDirectory: access.isDirectory) {
            return Lock(path: package, isWrite: access.kind.isWrite, reachesInside: true)
        }
        switch access.kind {
        case .read:
            return Lock(path: access.path, isWrite: false, reachesInside: false)
        case .write(let options):
            return Lock(path: access.path, isWrite: true,
                        reachesInside: !options.isDisjoint(with: .reachingInside))
        }
    }
}

/// The effective lock of one access, after package and directory rules.
struct Lock: Sendable {
    let path: ItemPath
    let isWrite: Bool
    /// Also covers every item below `path`.
    let reachesInside: Bool

    func conflicts(with other: Lock) -> Bool {
        guard isWrite || other.isWrite else { return false }
        return reaches(other.path) || other.reaches(path)
    }

    /// Whether holding this lock already gives `other`: the same or a wider kind, on the same
    /// item or on a directory whose lock reaches inside.
    func covers(_ other: Lock) -> Bool {
        (isWrite || !other.isWrite) && reaches(other.path)
    }

    private func reaches(_ item: ItemPath) -> Bool {
        path == item || (reachesInside && path.isAncestor(of: item))
    }
}

/// A class so that scanning the queue copies a reference, not the whole request. Only ever
/// touched with the arbiter's lock held.
private final class Request: @unchecked Sendable {
    let ticket: AccessTicket
    let owner: OwnerID
    let purpose: PurposeID
    var accesses: [ItemAccess]
    var locks: [Lock]
    let joinsOwnersAccesses: Bool
    let completion: Arbiter.Completion
    var timer: (any TimerHandle)?

    init(ticket: AccessTicket, owner: OwnerID, purpose: PurposeID, accesses: [ItemAccess], locks: [Lock],
         joinsOwnersAccesses: Bool, completion: @escaping Arbiter.Completion) {
        self.ticket = ticket
        self.owner = owner
        self.purpose = purpose
        self.accesses = accesses
        self.locks = locks
        self.joinsOwnersAccesses = joinsOwnersAccesses
        self.completion = completion
    }

    func conflicts(with other: Request) -> Bool {
        if owner == other.owner {
            // Purposes are chosen by clients, so they only count within one owner.
            if purpose == other.purpose || joinsOwnersAccesses || other.joinsOwnersAccesses { return false }
        }
        return locks.contains { mine in other.locks.contains { mine.conflicts(with: $0) } }
    }

    var grant: AccessGrant {
        AccessGrant(ticket: ticket, owner: owner, purpose: purpose, accesses: accesses)
    }

    func status(_ state: AccessStatus.State) -> [AccessStatus] {
        accesses.map {
            AccessStatus(ticket: ticket, state: state, owner: owner, purpose: purpose,
                         kind: $0.kind, path: $0.path, isDirectory: $0.isDirectory)
        }
    }
}

/// A request just granted, to be told so once the lock is dropped.
private struct Grantee: Sendable {
    let grant: AccessGrant
    let completion: Arbiter.Completion
    let timer: (any TimerHandle)?
}

private struct State: Sendable {
    var nextTicket: UInt64 = 0
    var active: [AccessTicket: Request] = [:]
    var waiting: Deque<Request> = []

    func isGrantable<Earlier: Sequence<Request>>(_ request: Request, blockedBy earlier: Earlier) -> Bool {
        !active.values.contains { request.conflicts(with: $0) }
            && !earlier.contains { request.conflicts(with: $0) }
    }

    /// Whether `request` waits for holders only, not behind earlier waiters: a filesystem access
    /// of a client partly inside an access the client holds now (see `request`).
    func passesWaiters(_ request: Request) -> Bool {
        request.joinsOwnersAccesses && active.values.contains { held in
            held.owner == request.owner && request.locks.contains { wanted in held.locks.contains { $0.covers(wanted) } }
        }
    }

    /// Whether the owner's active accesses together already cover every lock of `request`.
    /// The purpose of the owner's access that covers `request`, if the owner's accesses cover it all.
    func ownersAccessCovering(_ request: Request) -> PurposeID? {
        let held = active.values.filter { $0.owner == request.owner }
        func covering(_ wanted: Lock) -> Request? { held.first { $0.locks.contains { $0.covers(wanted) } } }
        guard request.locks.allSatisfy({ covering($0) != nil }), let first = request.locks.first else { return nil }
        return covering(first)?.purpose
    }

    /// Grants, in queue order, every waiter that conflicts neither with a holder nor with an
    /// earlier waiter that is still waiting (FIFO among conflicting requests; others may pass).
    ///
    /// `freed` is the one request just released or withdrawn, if that is the only change: then
    /// only waiters that conflicted with it can have become grantable (whatever blocked any other
    /// waiter is still active or still waiting ahead of it), and the others are not re-examined.
    mutating func admitWaiters(freedBy freed: Request? = nil) -> [Grantee] {
        guard !waiting.isEmpty else { return [] }
        let queue = waiting
        var stillWaiting: [Int] = []
        var grantedIndices: [Int] = []
        for index in queue.indices {
            let request = queue[index]
            let mayProceed = freed.map(request.conflicts(with:)) ?? true
            let earlier = stillWaiting.prefix(passesWaiters(request) ? 0 : stillWaiting.count).lazy.map { queue[$0] }
            if mayProceed && isGrantable(request, blockedBy: earlier) {
                active[request.ticket] = request
                grantedIndices.append(index)
            } else {
                stillWaiting.append(index)
            }
        }
        guard !grantedIndices.isEmpty else { return [] }
        for index in grantedIndices.reversed() { waiting.remove(at: index) }
        return grantedIndices.map { index in
            Grantee(grant: queue[index].grant, completion: queue[index].completion, timer: queue[index].timer)
        }
    }

    /// Returns false if the ticket no longer waits (granted or settled before the timer existed).
    mutating func setTimer(_ timer: any TimerHandle, for ticket: AccessTicket) -> Bool {
        guard let index = waiting.firstIndex(where: { $0.ticket == ticket }) else { return false }
        waiting[index].timer = timer
        return true
    }

    func reroot(from source: ItemPath, to destination: ItemPath, lock: (ItemAccess) -> Lock) {
        for request in Array(waiting) + Array(active.values)
        where request.accesses.contains(where: { source.isEqualOrAncestor(of: $0.path) }) {
            request.accesses = request.accesses.map { access in
                var moved = access
                if let path = access.path.replacingPrefix(source, with: destination) { moved.path = path }
                return moved
            }
            request.locks = request.accesses.map(lock)
        }
    }
}
