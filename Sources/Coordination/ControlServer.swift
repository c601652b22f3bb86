import Dispatch
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

// The daemon's end of the control socket (docs/control-protocol.md): a Unix stream socket, one
// connection per client (one OwnerID), mapped onto a CoordinationEngine. Three jobs, one type
// each: `ControlServer` listens, admits and routes (clients, status, presenter messages);
// `ControlConnection` is one client's transport and framing; `ControlDispatcher` carries out
// what the messages ask. Nothing here ever waits on a client: sockets are non-blocking, reads
// and writes run from Dispatch sources on one serial queue per connection, and what a client
// does not read in time piles up only to a bounded per-connection queue, after which the client
// is disconnected.

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
    /// What each user's clients hold together (admission, presenters, unfinished frames).
    private let shares = Locked(UserShares())
    private let owners: ClientOwners
    private let dispatcher: ControlDispatcher
    /// Connected clients, readable without the lock on every filesystem request.
    private let connectedClients = Atomic<Int>(0)

    /// Whether any client is connected: without one there are no presenters and no client accesses.
    public var hasClients: Bool { connectedClients.load(ordering: .acquiring) > 0 }
    private let acceptQueue = DispatchQueue(label: "containerfs.control.accept")

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
                  processInfo: ClientOwners.procProcessInfo, makeEngine: makeEngine)
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
        self.owners = ClientOwners(processInfo: processInfo)
        let engine = makeEngine(proxy)
        self.engine = engine
        self.dispatcher = ControlDispatcher(
            engine: engine, mayAccess: mayAccess, maxPresentersPerClient: maxPresentersPerClient,
            maxRequestsPerClient: maxRequestsPerClient, userLimits: userLimits, shares: shares,
            status: { [proxy] peer in proxy.server.withLock { $0.server }?.status(for: peer) }, log: log)
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
        let (source, connections) = state.withLock { state -> (DispatchSourceRead?, [ControlConnection]) in
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

    /// The client connection that `pid` belongs to (`ClientOwners`): nil for ordinary programs.
    public func ownerOf(pid: pid_t) -> OwnerID? { owners.owner(of: pid) }

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

    // MARK: - PresenterTransport

    public func send(_ message: PresenterMessage, id: MessageID, to presenter: PresenterKey, awaitingReply: Bool) {
        guard let connection = state.withLock({ $0.connections[presenter.owner] }) else { return }
        // A name is told only to a client that could list the directory it is in; a message that
        // would tell another is withheld, and answered for the client if it holds anything up.
        let listable = { (path: ItemPath) in
            path.parent.map { self.dispatcher.mayList($0, on: connection) } ?? true
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
                return shares.withLock {
                    $0.admit(credentials.userID, connected: state.connections.count, maxClients: maxClients, limits: userLimits)
                }
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
            let connection = state.withLock { state -> ControlConnection? in
                guard !state.stopped else { return nil }
                state.lastOwner += 1
                let connection = ControlConnection(owner: OwnerID(state.lastOwner), fd: fd, credentials: credentials,
                                                   maxQueuedBytes: maxQueuedBytes, helloTimeout: helloTimeout, delegate: self)
                state.connections[connection.owner] = connection
                connectedClients.add(1, ordering: .releasing)
                return connection
            }
            guard let connection else {
                shares.withLock { $0.left(credentials.userID, presenters: 0) }
                close(fd)
                continue
            }
            owners.connected(connection.owner, pid: credentials.processID)
            log("control client \(connection.owner) connected: pid \(credentials.processID) uid \(credentials.userID)")
            connection.start()
        }
    }

    private func removeStaleSocket() throws(ControlServerError) {
        var info = stat()
        guard lstat(socketPath, &info) == 0 else { return }
        guard info.st_mode & S_IFMT == S_IFSOCK else { throw .pathExists(socketPath) }
        switch connectionError(at: socketPath) {
        case 0: throw .addressInUse(socketPath)
        // The probe could not be made: nothing is known of the socket.
        case let error where error == EMFILE || error == ENFILE || error == ENOBUFS || error == ENOMEM:
            throw .system(call: "socket", errno: error)
        default: unlink(socketPath)
        }
    }
}

/// What a connection to the Unix socket at `path` (a valid path: `isValidSocketPath`) meets: 0
/// when someone listens there, else the errno (ECONNREFUSED: no one does).
public func connectionError(at path: String) -> Int32 {
    let probe = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard probe >= 0 else { return errno }
    defer { close(probe) }
    return withSocketAddress(path) { connect(probe, $0, $1) } == 0 ? 0 : errno
}

extension ControlServer: ControlConnectionDelegate {
    func received(_ message: ControlMessage, on connection: ControlConnection) {
        dispatcher.handle(message, from: connection)
    }

    func closed(_ connection: ControlConnection, reason: String) {
        state.withLock { state in
            if state.connections.removeValue(forKey: connection.owner) != nil {
                connectedClients.subtract(1, ordering: .releasing)
                shares.withLock { shares in
                    shares.left(connection.credentials.userID, presenters: connection.holdings.presenters.count)
                    _ = shares.buffered(connection.credentials.userID, change: -connection.reportedBytes)
                }
            }
        }
        owners.disconnected(connection.owner, pid: connection.credentials.processID)
        dispatcher.closed(connection)
        log("control client \(connection.owner) disconnected: \(reason)")
    }

    func bufferedBytesChanged(on connection: ControlConnection, by change: Int) -> String? {
        let uid = connection.credentials.userID
        let within = shares.withLock { $0.buffered(uid, change: change) <= userLimits.bufferedBytesPerUser }
        return within || UserShares.isPrivileged(uid)
            ? nil : "more than \(userLimits.bufferedBytesPerUser) bytes of unfinished messages from one user"
    }

    func logLine(_ line: String) { log(line) }
}

private struct ServerState {
    var listenSource: DispatchSourceRead?
    var stopped = false
    var lastOwner: UInt64 = 0
    var connections: [OwnerID: ControlConnection] = [:]
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
