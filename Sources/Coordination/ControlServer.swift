import Dispatch
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

// The daemon's end of the control socket (docs/control-protocol.md): a Unix stream socket, one
// connection per client (one OwnerID), mapped onto a CoordinationEngine. Nothing here ever waits
// on a client: sockets are non-blocking, reads and writes run from Dispatch sources on one serial
// queue per connection, and what a client does not read in time piles up only to a bounded
// per-connection queue, after which the client is disconnected.

/// Who is at the other end of a connection, as the kernel reports it (SO_PEERCRED) at accept.
public struct PeerCredentials: Hashable, Sendable, Codable {
    public var processID: Int32
    public var userID: UInt32
    public var groupID: UInt32

    public init(processID: Int32, userID: UInt32, groupID: UInt32) {
        self.processID = processID
        self.userID = userID
        self.groupID = groupID
    }
}

public enum ControlServerError: Error, Hashable, Sendable {
    case socketPathTooLong(String)
    /// Another server answers on this path.
    case addressInUse(String)
    /// Something that is not a socket exists at the path; it is left alone.
    case pathExists(String)
    case alreadyStarted
    case system(call: String, errno: Int32)
}

public final class ControlServer: PresenterTransport, @unchecked Sendable {
    public typealias AccessCheck = @Sendable (_ peer: PeerCredentials, _ item: ItemPath, _ write: Bool) -> Bool

    public let socketPath: String
    /// The engine every client's requests go to. The filesystem uses the same one.
    public let engine: CoordinationEngine
    /// Bytes of encoded frames that may wait for one slow client before it is disconnected.
    public let maxQueuedBytes: Int
    public let maxClients: Int
    /// Presenters and unreleased requests one client may have, so that no client can make the
    /// daemon (which runs as root) grow without bound.
    public let maxPresentersPerClient: Int
    public let maxRequestsPerClient: Int
    /// What all the clients of one user may hold together, so that no user crowds out another.
    public let userLimits: UserLimits
    /// A connection that has not said hello by then is closed, so silent connections cannot use
    /// up the `maxClients` slots.
    public let helloTimeout: Duration

    private let mayAccess: AccessCheck
    private let log: @Sendable (String) -> Void
    private let writeSessions: Locked<@Sendable () -> [WriteSessionStatus]>
    private let state = Locked(ServerState())
    /// Connected clients, readable without the lock on every filesystem request.
    private let connectedClients = Atomic<Int>(0)

    /// Whether any client is connected: without one there are no presenters and no client accesses.
    public var hasClients: Bool { connectedClients.load(ordering: .acquiring) > 0 }
    private let acceptQueue = DispatchQueue(label: "containerfs.control.accept")
    /// Reads a process's parent and thread-group ids; /proc by default, injected by tests.
    let processInfo: @Sendable (pid_t) -> (tgid: pid_t, ppid: pid_t)?

    /// - Parameters:
    ///   - socketPath: where to listen. A stale socket left there is replaced; a live one or any
    ///     other file is an error at `start()`. The socket is made mode 0666: the daemon serves
    ///     every user and checks each request with `mayAccess`.
    ///   - maxQueuedBytes: outgoing bytes one client may leave unread before it is disconnected.
    ///   - mayAccess: whether the peer may read (`write == false`) or write the item; asked for
    ///     `addPresenter` (as a read) and for every access of `coordinate`.
    ///   - writeSessions: the daemon's open write sessions, for status replies.
    ///   - log: one line per notable event (connect, disconnect, refusal, protocol error).
    ///   - makeEngine: builds the engine around the transport it is given (this server), e.g.
    ///     `{ CoordinationEngine(transport: $0, replyTimeout: .seconds(2)) }`.
    public convenience init(socketPath: String, maxQueuedBytes: Int = 4 << 20, maxClients: Int = 1024,
                            maxPresentersPerClient: Int = 10_000, maxRequestsPerClient: Int = 10_000,
                            userLimits: UserLimits = UserLimits(), helloTimeout: Duration = .seconds(5),
                mayAccess: @escaping AccessCheck,
                writeSessions: @escaping @Sendable () -> [WriteSessionStatus] = { [] },
                log: @escaping @Sendable (String) -> Void = { _ in },
                makeEngine: (any PresenterTransport) -> CoordinationEngine) {
        self.init(socketPath: socketPath, maxQueuedBytes: maxQueuedBytes, maxClients: maxClients,
                  maxPresentersPerClient: maxPresentersPerClient, maxRequestsPerClient: maxRequestsPerClient,
                  userLimits: userLimits, helloTimeout: helloTimeout,
                  mayAccess: mayAccess, writeSessions: writeSessions, log: log,
                  processInfo: ControlServer.procProcessInfo, makeEngine: makeEngine)
    }

    init(socketPath: String, maxQueuedBytes: Int, maxClients: Int, maxPresentersPerClient: Int = 10_000,
         maxRequestsPerClient: Int = 10_000, userLimits: UserLimits = UserLimits(),
         helloTimeout: Duration = .seconds(5), mayAccess: @escaping AccessCheck,
         writeSessions: @escaping @Sendable () -> [WriteSessionStatus], log: @escaping @Sendable (String) -> Void,
         processInfo: @escaping @Sendable (pid_t) -> (tgid: pid_t, ppid: pid_t)?,
         makeEngine: (any PresenterTransport) -> CoordinationEngine) {
        let proxy = TransportProxy()
        self.socketPath = socketPath
        self.maxQueuedBytes = maxQueuedBytes
        self.maxClients = maxClients
        self.maxPresentersPerClient = maxPresentersPerClient
        self.maxRequestsPerClient = maxRequestsPerClient
        self.userLimits = userLimits
        self.helloTimeout = helloTimeout
        self.mayAccess = mayAccess
        self.log = log
        self.writeSessions = Locked(writeSessions)
        self.processInfo = processInfo
        self.engine = makeEngine(proxy)
        proxy.server.withLock { $0 = WeakServer(server: self) }
    }

    /// Replaces the write-session hook (the filesystem may be made after the server).
    public func setWriteSessionProvider(_ provider: @escaping @Sendable () -> [WriteSessionStatus]) {
        writeSessions.withLock { $0 = provider }
    }

    // MARK: - Lifecycle

    /// Binds, listens and starts accepting. Returns at once. A server starts once; after `stop()`
    /// make a new one.
    public func start() throws(ControlServerError) {
        guard state.withLock({ $0.listenSource == nil && !$0.stopped }) else { throw .alreadyStarted }
        guard isValidSocketPath(socketPath) else { throw .socketPathTooLong(socketPath) }
        try removeStaleSocket()
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw .system(call: "socket", errno: errno) }
        var failure: ControlServerError?
        if withSocketAddress(socketPath, { address, length in bind(fd, address, length) }) != 0 {
            failure = .system(call: "bind", errno: errno)
        } else if chmod(socketPath, 0o666) != 0 {
            failure = .system(call: "chmod", errno: errno)
        } else if listen(fd, 128) != 0 {
            failure = .system(call: "listen", errno: errno)
        } else if !setNonBlocking(fd) {
            failure = .system(call: "fcntl", errno: errno)
        }
        if let failure {
            close(fd)
            if case .system(let call, _) = failure, call != "bind" { unlink(socketPath) }
            throw failure
        }
        let source = DispatchSource.makeReadSource(fileDescriptor: fd, queue: acceptQueue)
        source.setEventHandler { [weak self] in self?.acceptPending(fd) }
        source.setCancelHandler { close(fd) }
        state.withLock { $0.listenSource = source }
        source.resume()
        log("control socket listening at \(socketPath)")
    }

    /// Stops accepting, closes every connection (each client's presenters and accesses are
    /// dropped from the engine) and removes the socket file. Must not be called from a
    /// completion that runs on a connection's queue.
    public func stop() {
        let (source, connections) = state.withLock { state -> (DispatchSourceRead?, [Connection]) in
            state.stopped = true
            defer { state.listenSource = nil }
            return (state.listenSource, Array(state.connections.values))
        }
        if let source {
            source.cancel()
            unlink(socketPath)
        }
        for connection in connections {
            connection.queue.sync { connection.close(reason: "server stopping") }
        }
    }

    // MARK: - Queries for the daemon

    /// The client connection that `pid` belongs to: the connected process itself, a thread of it
    /// (FUSE reports thread ids), or a descendant of it (e.g. the command that
    /// `containerfs coordinate` runs inside its coordinated access). Nil for ordinary programs.
    ///
    /// Answers are cached for a second (the filesystem asks on every request; walking /proc is
    /// not free), and the cache is dropped whenever a client connects or disconnects. If one
    /// process holds several connections, the oldest one is its owner.
    public func ownerOf(pid: pid_t) -> OwnerID? {
        let now = DispatchTime.now().uptimeNanoseconds
        enum Step { case noClients, known(OwnerID?), unknown(generation: UInt64) }
        // The answer for a process or thread: a client's, one cached, or to be found from /proc.
        let look = { (pid: pid_t) in
            self.state.withLock { state -> Step in
                guard !state.ownersByPID.isEmpty else { return .noClients }
                if let owners = state.ownersByPID[pid] { return .known(owners.min()) }
                if let cached = state.ownerCache[pid], cached.expires > now { return .known(cached.owner) }
                return .unknown(generation: state.ownerGeneration)
            }
        }
        // Walks up the ancestors and remembers the answer for each one it went through, so that
        // the next process a shell starts asks /proc once, not once per ancestor.
        var visited: [pid_t] = []
        var generation: UInt64 = 0
        var current = pid
        var owner: OwnerID?
        walk: for _ in 0..<64 {
            switch look(current) {
            case .noClients: return nil
            case .known(let known):
                owner = known
                break walk
            case .unknown(let seen):
                if visited.isEmpty { generation = seen }
            }
            visited.append(current)
            guard current > 1, let info = processInfo(current) else { break }
            if info.tgid != current, case .known(let known?) = look(info.tgid) {
                owner = known
                break
            }
            guard info.ppid > 0, info.ppid != current else { break }
            current = info.ppid
        }
        // Asked for every request: a cached answer takes the lock once.
        guard !visited.isEmpty else { return owner }
        state.withLock { state in
            // A client that came or went meanwhile may have changed the answer.
            guard state.ownerGeneration == generation else { return }
            if state.ownerCache.count + visited.count > 4096 { state.ownerCache.removeAll() }
            for pid in visited { state.ownerCache[pid] = OwnerCacheEntry(owner: owner, expires: now + 1_000_000_000) }
        }
        return owner
    }

    /// The peer credentials of a connected client.
    public func credentials(of owner: OwnerID) -> PeerCredentials? {
        state.withLock { $0.connections[owner]?.credentials }
    }

    /// Connected clients, by owner id.
    public func clients() -> [ClientStatus] {
        let connections = state.withLock { Array($0.connections.values) }
        return connections.map(\.statusRecord).sorted { $0.owner < $1.owner }
    }

    /// The engine's status plus clients and write sessions: what `statusReply` carries.
    public func status() -> CoordinationStatus {
        var status = engine.status()
        status.clients = clients()
        status.writeSessions = writeSessions.withLock { $0 }()
        return status
    }

    /// The status as one peer may see it: root and the daemon's own user see everything; others
    /// see only their own clients, presenters, accesses and messages, and the write sessions of
    /// items they may read.
    public func status(for peer: PeerCredentials) -> CoordinationStatus {
        var status = status()
        guard peer.userID != 0, peer.userID != getuid() else { return status }
        let own = Set(state.withLock { state in
            state.connections.values.filter { $0.credentials.userID == peer.userID }.map(\.owner)
        })
        status.clients = status.clients?.filter { own.contains($0.owner) }
        status.presenters = status.presenters.filter { own.contains($0.owner) }
        status.accesses = status.accesses.filter { own.contains($0.owner) }
        status.pendingMessages = status.pendingMessages.filter { own.contains($0.presenter.owner) }
        status.writeSessions = status.writeSessions?.filter { mayAccess(peer, $0.path, false) }
        return status
    }

    /// Records a change of a user's unfinished-frame bytes; false if the user is now over the limit.
    fileprivate func bufferedBytesChanged(_ uid: uid_t, by change: Int) -> Bool {
        state.withLock { state in
            state.shares.buffered(uid, change: change) <= userLimits.bufferedBytesPerUser || UserShares.isPrivileged(uid)
        }
    }

    // MARK: - PresenterTransport

    public func send(_ message: PresenterMessage, id: MessageID, to presenter: PresenterKey, awaitingReply: Bool) {
        guard let connection = state.withLock({ $0.connections[presenter.owner] }) else { return }
        // A name is told only to a client that could list the directory it is in; a message that
        // would tell another is withheld, and answered for the client if it holds anything up.
        let listable = { (path: ItemPath) in
            path.parent.map { directory in
                connection.mayList(directory) { self.mayAccess(connection.credentials, directory, false) }
            } ?? true
        }
        guard message.revealedPaths.allSatisfy(listable) else {
            if awaitingReply {
                DispatchQueue.global().async { self.engine.messenger.receiveReply(id, from: presenter.owner, error: nil) }
            }
            return
        }
        connection.enqueue(.presenterMessage(.init(messageID: id, presenter: presenter.purpose, message: message,
                                                   expectsReply: awaitingReply)))
    }

    // MARK: - Internals

    private func acceptPending(_ listenFD: Int32) {
        while true {
            let fd = accept(listenFD, nil, nil)
            if fd < 0 {
                if errno == EINTR { continue }
                if errno != EAGAIN && errno != EWOULDBLOCK && errno != ECONNABORTED {
                    log("control socket accept failed: errno \(errno)")
                }
                if errno == ECONNABORTED { continue }
                return
            }
            // A client's socket must not reach a program the daemon starts.
            guard fcntl(fd, F_SETFD, FD_CLOEXEC) == 0, setNonBlocking(fd), let credentials = peerCredentials(fd) else {
                close(fd)
                continue
            }
            let refusal = state.withLock { state -> String? in
                guard !state.stopped else { return "the daemon is stopping" }
                return state.shares.admit(credentials.userID, connected: state.connections.count,
                                          maxClients: maxClients, limits: userLimits)
            }
            if let refusal {
                log("control socket: refusing a client (pid \(credentials.processID) uid \(credentials.userID)): \(refusal)")
                // Told once, without waiting: the client sees why before the connection closes.
                if let frame = try? ControlCodec.encode(.error(.init(code: .limitExceeded, message: refusal))) {
                    let sent = sendWithoutWaiting(fd, frame)
                    if sent < 0 { log("control socket: could not tell the refused client why: errno \(errno)") }
                }
                close(fd)
                continue
            }
            let connection = state.withLock { state -> Connection? in
                guard !state.stopped else { return nil }
                state.lastOwner += 1
                let connection = Connection(owner: OwnerID(state.lastOwner), fd: fd, credentials: credentials,
                                            server: self)
                state.connections[connection.owner] = connection
                connectedClients.add(1, ordering: .releasing)
                state.ownersByPID[credentials.processID, default: []].insert(connection.owner)
                state.ownerCache.removeAll()
                state.ownerGeneration += 1
                return connection
            }
            guard let connection else {
                state.withLock { $0.shares.left(credentials.userID, presenters: 0) }
                close(fd)
                continue
            }
            log("control client \(connection.owner) connected: pid \(credentials.processID) uid \(credentials.userID)")
            connection.start()
        }
    }

    /// Called once per connection, on its queue, when it closed.
    fileprivate func connectionClosed(_ connection: Connection, reason: String) {
        state.withLock { state in
            if state.connections.removeValue(forKey: connection.owner) != nil {
                connectedClients.subtract(1, ordering: .releasing)
                state.shares.left(connection.credentials.userID, presenters: connection.presenters.count)
                state.shares.buffered(connection.credentials.userID, change: -connection.reportedBytes)
            }
            let pid = connection.credentials.processID
            state.ownersByPID[pid]?.remove(connection.owner)
            if state.ownersByPID[pid]?.isEmpty == true { state.ownersByPID.removeValue(forKey: pid) }
            state.ownerCache.removeAll()
            state.ownerGeneration += 1
        }
        // Presenters that made way for this client's accesses reacquire; the arbiter lets go below.
        let held = connection.requests.withLock { requests in
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
        log("control client \(connection.owner) disconnected: \(reason)")
    }

    fileprivate func handle(_ message: ControlMessage, from connection: Connection) {
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
            if !connection.presenters.contains(body.presenter) {
                guard connection.presenters.count < maxPresentersPerClient else {
                    return connection.enqueue(.error(.init(code: .limitExceeded,
                                                           message: "at most \(maxPresentersPerClient) presenters per client")))
                }
                let uid = connection.credentials.userID
                guard state.withLock({ $0.shares.addPresenter(uid, limits: userLimits) }) else {
                    return connection.enqueue(.error(.init(code: .limitExceeded,
                                                           message: "at most \(userLimits.presentersPerUser) presenters per user, in all of the user's clients")))
                }
                connection.presenters.insert(body.presenter)
            }
            engine.registry.add(PresenterKey(owner: owner, purpose: body.presenter), path: body.path,
                                awaited: body.awaited ?? .all)
        case .removePresenter(let body):
            if connection.presenters.remove(body.presenter) != nil {
                state.withLock { $0.shares.removePresenter(connection.credentials.userID) }
            }
            engine.messenger.forget(PresenterKey(owner: owner, purpose: body.presenter))
            if engine.registry.remove(PresenterKey(owner: owner, purpose: body.presenter)) == nil {
                connection.enqueue(.error(.init(code: .unknownPresenter, message: "no presenter \(body.presenter)")))
            }
        case .coordinate(let body):
            coordinate(body, for: connection)
        case .release(let body):
            guard let entry = connection.requests.withLock({ $0.removeValue(forKey: body.requestID) }) else {
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
            let entry = connection.requests.withLock { requests -> RequestEntry? in
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
            connection.enqueue(.statusReply(status(for: connection.credentials)))
        case .helloReply, .granted, .denied, .presenterMessage, .statusReply, .error:
            connection.fail(.protocolViolation, "\(message.type.rawValue) is sent by the daemon, not to it")
        }
    }

    private func coordinate(_ body: ControlMessage.CoordinateRequest, for connection: Connection) {
        let id = body.requestID
        func deny(_ reason: ControlMessage.Denied.Reason, _ detail: String) {
            connection.enqueue(.denied(.init(requestID: id, reason: reason, detail: detail)))
        }
        guard !body.accesses.isEmpty else { return deny(.invalidRequest, "no accesses") }
        if let refused = body.accesses.first(where: { !mayAccess(connection.credentials, $0.path, $0.kind.isWrite) }) {
            log("control client \(connection.owner): \(refused.kind.isWrite ? "write" : "read") of \(refused.path) refused")
            return deny(.accessDenied, "may not \(refused.kind.isWrite ? "write" : "read") \(refused.path)")
        }
        let admission = connection.requests.withLock { requests -> String? in
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
                let kept = connection?.requests.withLock { requests -> Bool in
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
                _ = connection?.requests.withLock { $0.removeValue(forKey: id) }
                connection?.enqueue(.denied(.init(requestID: id, reason: .init(error))))
            }
        }
        connection.requests.withLock { requests in
            if case .requesting? = requests[id] { requests[id] = .waiting(ticket) }
        }
    }

    /// A client's access is granted once the presenters made way: unless it was cancelled meanwhile.
    private func presentersMadeWay(for id: UInt64, of connection: Connection?) {
        guard let connection else { return }
        enum Outcome { case grant, cancel(AccessTicket, [PresenterDelivery]), ended }
        let outcome = connection.requests.withLock { requests -> Outcome in
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

    private func removeStaleSocket() throws(ControlServerError) {
        var info = stat()
        guard lstat(socketPath, &info) == 0 else { return }
        guard info.st_mode & S_IFMT == S_IFSOCK else { throw .pathExists(socketPath) }
        let probe = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard probe >= 0 else { throw .system(call: "socket", errno: errno) }
        defer { close(probe) }
        let live = withSocketAddress(socketPath) { address, length in connect(probe, address, length) == 0 }
        if live { throw .addressInUse(socketPath) }
        unlink(socketPath)
    }

    /// Thread group and parent of a process, from /proc/PID/status.
    static let procProcessInfo: @Sendable (pid_t) -> (tgid: pid_t, ppid: pid_t)? = { pid in
        let fd = open("/proc/\(pid)/status", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var bytes = [UInt8](repeating: 0, count: 4096)
        let count = bytes.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        guard count > 0 else { return nil }
        return bytes.withUnsafeBufferPointer { all in
            let status = UnsafeBufferPointer(rebasing: all[..<count])
            guard let tgid = ProcStatus.value(of: "Tgid:", in: status),
                  let ppid = ProcStatus.value(of: "PPid:", in: status) else { return nil }
            return (tgid, ppid)
        }
    }
}

private struct ServerState {
    var listenSource: DispatchSourceRead?
    var stopped = false
    var lastOwner: UInt64 = 0
    var connections: [OwnerID: Connection] = [:]
    var ownersByPID: [pid_t: Set<OwnerID>] = [:]
    var ownerCache: [pid_t: OwnerCacheEntry] = [:]
    /// Counts the times the cache was dropped (a client came or went).
    var ownerGeneration: UInt64 = 0
    var shares = UserShares()
}

private struct OwnerCacheEntry {
    let owner: OwnerID?
    /// Monotonic nanoseconds.
    let expires: UInt64
}

private struct WeakServer {
    weak var server: ControlServer?
}

/// The engine's transport, made before the server exists; forwards to it.
private final class TransportProxy: PresenterTransport, @unchecked Sendable {
    let server = Locked(WeakServer())

    func send(_ message: PresenterMessage, id: MessageID, to presenter: PresenterKey, awaitingReply: Bool) {
        server.withLock { $0.server }?.send(message, id: id, to: presenter, awaitingReply: awaitingReply)
    }
}

private enum RequestEntry {
    /// `Arbiter.request` has not returned yet.
    case requesting
    case waiting(AccessTicket)
    /// Granted by the arbiter; the presenters are asked to make way (a cancel meanwhile is noted).
    case asking(AccessTicket, reacquire: [PresenterDelivery], cancelled: Bool)
    case granted(AccessTicket, reacquire: [PresenterDelivery])
}

/// One client. Socket, sources, frame reader and `greeted` belong to `queue`; the outgoing
/// buffer and the request table are locked, since completions write to them from any thread.
private final class Connection: @unchecked Sendable {
    let owner: OwnerID
    let fd: Int32
    let credentials: PeerCredentials
    let queue: DispatchQueue
    let requests = Locked<[UInt64: RequestEntry]>([:])
    /// Ids of this client's presenters; touched on `queue` only.
    var presenters: Set<PurposeID> = []
    /// Bytes of unfinished frames counted against the user's share; touched on `queue` only.
    var reportedBytes = 0
    private weak var server: ControlServer?
    private let maxQueuedBytes: Int
    private let helloTimeout: Duration
    private let outgoing = Locked(Outgoing())
    private let clientName = Locked<String?>(nil)
    /// Directories lately found listable or not by this client's user, each answer kept for a
    /// second (as the kernel keeps attributes): one operation's messages to a client's many
    /// presenters in a directory then cost one check, not one each.
    private let listings = Locked<[ItemPath: (allowed: Bool, at: ContinuousClock.Instant)]>([:])

    // Queue-confined.
    private var readSource: DispatchSourceRead?
    private var writeSource: DispatchSourceWrite?
    private var writeSourceResumed = false
    private var reader = FrameReader()
    private var greeted = false
    private var closed = false
    private var closing = false
    private var openSources = 0

    private struct Outgoing {
        var bytes: [UInt8] = []
        var start = 0
        var closed = false
        /// Notices sent at once in the window that began at `windowStart` (uptime, ns).
        var windowStart: UInt64 = 0
        var sentInWindow = 0
        /// A timer will send what is held, if nothing sent it before.
        var timerSet = false
        var pendingCount: Int { bytes.count - start }

        /// Sends what is pending until done or the socket is full; the error of a failed send.
        mutating func writeOut(_ fd: Int32) -> Int32? {
            while pendingCount > 0 {
                let sent = bytes[start...].withUnsafeBytes {
                    Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT | MSG_NOSIGNAL))
                }
                let error = sent < 0 ? errno : 0
                if sent > 0 {
                    start += sent
                } else if error == EAGAIN || error == EWOULDBLOCK {
                    break
                } else if error != EINTR {
                    return error
                }
            }
            if pendingCount == 0 {
                bytes.removeAll(keepingCapacity: bytes.count < 65536)
                start = 0
            } else if start > 65536 {
                bytes.removeFirst(start)
                start = 0
            }
            return nil
        }
    }

    /// Notices (messages that await no reply) beyond `noticesAtOnce` within `noticeWindow` are
    /// held and sent together with the next frame that goes: each send to an idle client wakes its
    /// reader (about 17 µs of the daemon's CPU and 30 of the client's, docs/coordination.md), so a
    /// burst (an `rm -rf`, an untar in a presented folder) costs a wake-up per window, not per
    /// notice. A lone notice, and anything that awaits an answer, goes at once, with what was
    /// held before it. What a burst's end leaves held goes within `heldAtMost`, by a timer: set
    /// for later than the window, so that in a burst the next notice sends the held ones on its
    /// thread, and the timer seldom wakes one for nothing.
    static let noticesAtOnce = 2
    static let noticeWindow: UInt64 = 1_000_000
    static let heldAtMost: UInt64 = 4_000_000

    init(owner: OwnerID, fd: Int32, credentials: PeerCredentials, server: ControlServer) {
        self.owner = owner
        self.fd = fd
        self.credentials = credentials
        self.server = server
        self.maxQueuedBytes = server.maxQueuedBytes
        self.helloTimeout = server.helloTimeout
        self.queue = DispatchQueue(label: "containerfs.control.client\(owner.rawValue)")
    }

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

    var statusRecord: ClientStatus {
        ClientStatus(owner: owner, clientName: clientName.withLock { $0 }, processID: credentials.processID,
                     userID: credentials.userID, groupID: credentials.groupID)
    }

    func start() {
        queue.async { [self] in
            guard !closed else { return }   // stopped before it started; close() closed the descriptor
            let read = DispatchSource.makeReadSource(fileDescriptor: fd, queue: queue)
            let write = DispatchSource.makeWriteSource(fileDescriptor: fd, queue: queue)
            read.setEventHandler { [weak self] in self?.readAvailable() }
            write.setEventHandler { [weak self] in self?.flush() }
            let release: @Sendable () -> Void = { [self] in sourceCancelled() }
            read.setCancelHandler(handler: release)
            write.setCancelHandler(handler: release)
            readSource = read
            writeSource = write
            openSources = 2
            read.resume()
            flush()
            queue.asyncAfter(deadline: .now() + helloTimeout.dispatchInterval) { [weak self] in
                guard let self, !greeted, !closed else { return }
                fail(.protocolViolation, "no hello in time")
            }
        }
    }

    /// Queues a frame for the client. Never blocks; a client that lets more than the limit pile
    /// up is disconnected.
    func enqueue(_ message: ControlMessage) {
        var frame: [UInt8] = []
        do {
            frame = try ControlCodec.encode(message)
        } catch {
            guard case .statusReply(let status) = message else { return }
            // Larger than a frame (thousands of presenters): the lists are cut, and say how much.
            var count = status.longestList / 2
            while count > 0 {
                if let cut = try? ControlCodec.encode(.statusReply(status.limited(to: count))) {
                    frame = cut
                    break
                }
                count /= 2
            }
            guard count > 0 else { return enqueue(.error(.init(code: .internalError, message: "status too large to send"))) }
        }
        enum Outcome { case written, queued, held(flushAt: UInt64?), overflow, closed, failed(Int32) }
        let isNotice = if case .presenterMessage(let notice) = message { !notice.expectsReply } else { false }
        // Written at once when nothing waits before it (the common case: a thread hop less per
        // message, which a presenter's answer costs twice); held or queued for the connection's
        // queue otherwise. The lock keeps frames whole and in order, and the descriptor open.
        let outcome = outgoing.withLock { out -> Outcome in
            guard !out.closed else { return .closed }
            guard out.pendingCount + frame.count <= maxQueuedBytes else {
                out.closed = true
                return .overflow
            }
            out.bytes.append(contentsOf: frame)
            if isNotice {
                let now = DispatchTime.now().uptimeNanoseconds
                if now &- out.windowStart >= Self.noticeWindow {
                    out.windowStart = now
                    out.sentInWindow = 0
                }
                if out.sentInWindow >= Self.noticesAtOnce {
                    if out.timerSet { return .held(flushAt: nil) }
                    out.timerSet = true
                    return .held(flushAt: now + Self.heldAtMost)
                }
                out.sentInWindow += 1
            }
            // Held notices go first; whatever the socket does not take waits for the queue.
            if let error = out.writeOut(fd) {
                out.closed = true
                return .failed(error)
            }
            return out.pendingCount == 0 ? .written : .queued
        }
        switch outcome {
        case .written, .closed, .held(flushAt: nil): break
        case .queued: queue.async { [self] in flush() }
        case .held(let deadline?):
            queue.asyncAfter(deadline: DispatchTime(uptimeNanoseconds: deadline)) { [weak self] in self?.flushHeld() }
        case .overflow: queue.async { [self] in close(reason: "outgoing queue overflow (client does not read)") }
        case .failed(let error): queue.async { [self] in close(reason: "write failed: errno \(error)") }
        }
    }

    /// Sends an error and closes: the error is written if the socket takes it now.
    func fail(_ code: ControlMessage.ControlError.Code, _ message: String) {
        guard !closing else { return }
        server?.logLine("control client \(owner): \(code.rawValue): \(message)")
        enqueue(.error(.init(code: code, message: message)))
        closing = true
        readSource?.suspend()   // read no more; balanced in close()
        flush()
        if outgoing.withLock({ $0.pendingCount }) == 0 {
            close(reason: "\(code.rawValue): \(message)")
        } else {
            queue.asyncAfter(deadline: .now() + .milliseconds(200)) { [self] in
                close(reason: "\(code.rawValue): \(message)")
            }
        }
    }

    func close(reason: String) {
        guard !closed else { return }
        closed = true
        outgoing.withLock { $0.closed = true; $0.bytes = []; $0.start = 0 }
        if closing { readSource?.resume() }
        readSource?.cancel()
        if let writeSource {
            if !writeSourceResumed { writeSource.resume() }
            writeSource.cancel()
        }
        if readSource == nil && writeSource == nil { Glibc.close(fd) }
        server?.connectionClosed(self, reason: reason)
    }

    private func sourceCancelled() {
        openSources -= 1
        if openSources == 0 { Glibc.close(fd) }
    }

    private func readAvailable() {
        guard !closed, !closing else { return }
        var buffer = [UInt8](repeating: 0, count: 65536)
        // A few reads per event at most, so one chatty client cannot hog the queue's thread.
        for _ in 0..<4 {
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
            if count > 0 {
                reader.append(buffer[..<count])
                processFrames()
                if closed || closing { return }
                guard accountBufferedBytes() else {
                    return fail(.limitExceeded, "more than \(server?.userLimits.bufferedBytesPerUser ?? 0) bytes of unfinished messages from one user")
                }
            } else if count == 0 {
                return close(reason: "end of stream")
            } else if errno == EINTR {
                continue
            } else if errno == EAGAIN || errno == EWOULDBLOCK {
                return
            } else {
                return close(reason: "read failed: errno \(errno)")
            }
        }
    }

    /// Counts what waits in the reader against the user's share; false if that is over.
    private func accountBufferedBytes() -> Bool {
        guard let server else { return true }
        let now = reader.bufferedByteCount
        defer { reportedBytes = now }
        return server.bufferedBytesChanged(credentials.userID, by: now - reportedBytes)
    }

    private func processFrames() {
        while !closed, !closing {
            let message: ControlMessage
            do {
                guard let next = try reader.next() else { return }
                message = next
            } catch {
                switch error {
                case .unsupportedVersion(let version):
                    return fail(.unsupportedVersion, "protocol version \(version) is not supported; this daemon speaks \(ControlCodec.protocolVersion)")
                default:
                    return fail(.malformedMessage, "\(error)")
                }
            }
            guard greeted else {
                guard case .hello(let hello) = message else {
                    return fail(.protocolViolation, "the first message must be hello")
                }
                greeted = true
                clientName.withLock { $0 = hello.clientName }
                enqueue(.helloReply(.init(clientID: owner)))
                continue
            }
            server?.handle(message, from: self)
        }
    }

    /// Sends the notices a burst's end left held.
    private func flushHeld() {
        outgoing.withLock { $0.timerSet = false }
        flush()
    }

    private func flush() {
        guard !closed else { return }
        var failure: Int32?
        let pending = outgoing.withLock { out -> Int in
            failure = out.writeOut(fd)
            return out.pendingCount
        }
        if let failure { return close(reason: "write failed: errno \(failure)") }
        // Watch for writability only while something waits to be written.
        if pending > 0, !writeSourceResumed, let writeSource {
            writeSource.resume()
            writeSourceResumed = true
        } else if pending == 0, writeSourceResumed, let writeSource {
            writeSource.suspend()
            writeSourceResumed = false
        }
    }
}

extension ControlServer {
    fileprivate func logLine(_ line: String) { log(line) }
}

private func setNonBlocking(_ fd: Int32) -> Bool {
    let flags = fcntl(fd, F_GETFL)
    return flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0
}

private func peerCredentials(_ fd: Int32) -> PeerCredentials? {
    // struct ucred { pid_t pid; uid_t uid; gid_t gid; } (Glibc hides it behind _GNU_SOURCE).
    var credentials: (Int32, UInt32, UInt32) = (0, 0, 0)
    var length = socklen_t(MemoryLayout<(Int32, UInt32, UInt32)>.size)
    let soPeerCred: Int32 = 17
    guard getsockopt(fd, SOL_SOCKET, soPeerCred, &credentials, &length) == 0 else { return nil }
    return PeerCredentials(processID: credentials.0, userID: credentials.1, groupID: credentials.2)
}

/// The process listening on a control socket, as the kernel names it to the caller
/// (SO_PEERCRED, taken at its `listen`): 0 when it runs in a process namespace the caller does not
/// see into, so its socket's name (its pid there) says nothing here; nil when nothing answers.
public func controlServerProcess(at socketPath: String) -> pid_t? {
    guard isValidSocketPath(socketPath) else { return nil }
    let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    guard withSocketAddress(socketPath, { address, length in connect(fd, address, length) == 0 }) else { return nil }
    return peerCredentials(fd)?.processID
}

/// Runs `body` with a `sockaddr_un` for `path`, which must be valid (`isValidSocketPath`).
public func withSocketAddress<Result, Failure: Error>(
    _ path: String, _ body: (UnsafePointer<sockaddr>, socklen_t) throws(Failure) -> Result
) throws(Failure) -> Result where Failure: Error {
    var address = sockaddr_un()
    address.sun_family = sa_family_t(AF_UNIX)
    let bytes = Array(path.utf8)
    let capacity = MemoryLayout.size(ofValue: address.sun_path)
    precondition(bytes.count < capacity, "checked by callers")
    withUnsafeMutableBytes(of: &address.sun_path) { raw in
        for (index, byte) in bytes.enumerated() { raw[index] = byte }
        raw[bytes.count] = 0
    }
    let length = socklen_t(MemoryLayout<sa_family_t>.size + bytes.count + 1)
    return try withUnsafePointer(to: &address) { pointer throws(Failure) -> Result in
        try pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { address throws(Failure) -> Result in
            try body(address, length)
        }
    }
}

/// Whether `path` fits in a `sockaddr_un`.
public func isValidSocketPath(_ path: String) -> Bool {
    let capacity = MemoryLayout.size(ofValue: sockaddr_un().sun_path)
    return !path.utf8.isEmpty && path.utf8.count < capacity && !path.utf8.contains(0)
}

/// One send that never blocks (outside the server's scope, whose `send` is the transport's).
private func sendWithoutWaiting(_ fd: Int32, _ bytes: [UInt8]) -> Int {
    bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT | MSG_NOSIGNAL)) }
}
