import Coordination
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A connection to a mount's control socket (docs/control-protocol.md), for the library and
/// the command line. Blocking calls are fine here: this is the client side. One reader thread
/// per connection takes frames off the socket and hands them to whoever waits for them;
/// presenter messages go to `onPresenterMessage` (which must not block the reader for long).
public final class ControlClient: @unchecked Sendable {
    public let socketPath: String
    /// The id the daemon gave this connection (its `OwnerID`).
    public let clientID: OwnerID

    private let fd: Int32
    private let writeLock = NSLock()
    private let state = NSLock()
    private var waiters: [UInt64: (Result<Void, FileCoordinationError>) -> Void] = [:]
    private var statusWaiters: [(Result<CoordinationStatus, FileCoordinationError>) -> Void] = []
    private var nextRequestID: UInt64 = 0
    private var isClosed = false
    private var closeHandlers: [() -> Void] = []
    private let onPresenterMessage: @Sendable (ControlMessage.PresenterNotice) -> Void
    private let onError: @Sendable (ControlMessage.ControlError) -> Void

    /// Connects and says hello; throws if there is no daemon or it speaks another version.
    public init(socketPath: String, clientName: String,
                onPresenterMessage: @escaping @Sendable (ControlMessage.PresenterNotice) -> Void = { _ in },
                onError: @escaping @Sendable (ControlMessage.ControlError) -> Void = { _ in }) throws {
        self.socketPath = socketPath
        self.onPresenterMessage = onPresenterMessage
        self.onError = onError
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw FileCoordinationError.connectionFailed("socket: \(String(cString: strerror(errno)))") }
        let valid = isValidSocketPath(socketPath)
        guard valid, withSocketAddress(socketPath, { address, length in connect(fd, address, length) == 0 }) else {
            let reason = valid ? String(cString: strerror(errno)) : "socket path too long"
            Glibc.close(fd)
            throw FileCoordinationError.connectionFailed("\(socketPath): \(reason)")
        }
        self.fd = fd
        var reader = FrameReader()
        // A daemon that accepts but never answers must not hang the caller: bound the hello.
        Self.setReceiveTimeout(fd, seconds: 5)
        defer { Self.setReceiveTimeout(fd, seconds: 0) }
        do {
            // A refused client finds the connection closed under its hello; the daemon's reason
            // is already waiting to be read.
            var helloError: (any Error)?
            do { try Self.write(fd, .hello(.init(clientName: clientName, processID: getpid()))) } catch { helloError = error }
            var buffer: [UInt8] = []
            guard let reply = try? Self.readOne(fd, &reader, buffer: &buffer) ?? nil else {
                throw helloError ?? FileCoordinationError.connectionFailed("the daemon closed the connection")
            }
            switch reply {
            case .helloReply(let body): clientID = body.clientID
            case .error(let error): throw FileCoordinationError.connectionFailed("\(error.code.rawValue): \(error.message)")
            default: throw FileCoordinationError.connectionFailed("unexpected answer to hello")
            }
        } catch {
            Glibc.close(fd)
            throw error
        }
        let thread = Thread { [self, reader] in readLoop(reader) }
        thread.name = "containerfs control reader"
        thread.start()
    }

    deinit {
        Glibc.close(fd)
    }

    public var isConnected: Bool { state.withLock { !isClosed } }

    /// Runs `handler` once when the connection closes (at once if it already has).
    public func onClose(_ handler: @escaping () -> Void) {
        let now = state.withLock { () -> Bool in
            if isClosed { return true }
            closeHandlers.append(handler)
            return false
        }
        if now { handler() }
    }

    /// Closes the connection: the daemon drops this client's presenters and accesses.
    public func close() {
        shutdown(fd, Int32(SHUT_RDWR))
    }

    // MARK: - Requests

    public func send(_ message: ControlMessage) throws {
        try writeLock.withLock { try Self.write(fd, message) }
    }

    /// A fresh request id.
    public func makeRequestID() -> UInt64 {
        state.withLock {
            nextRequestID += 1
            return nextRequestID
        }
    }

    /// Asks for `accesses`; `completion` runs on the reader thread when granted or denied.
    public func coordinate(_ accesses: [ItemAccess], purpose: PurposeID, requestID: UInt64,
                           timeout: Duration? = nil,
                           completion: @escaping (Result<Void, FileCoordinationError>) -> Void) {
        let registered = state.withLock { () -> Bool in
            guard !isClosed else { return false }
            waiters[requestID] = completion
            return true
        }
        guard registered else { return completion(.failure(.disconnected("connection closed"))) }
        let milliseconds = timeout.map { duration -> UInt64 in
            let (seconds, attoseconds) = duration.components
            return UInt64(max(0, seconds)) * 1000 + UInt64(max(0, attoseconds) / 1_000_000_000_000_000)
        }
        do {
            try send(.coordinate(.init(requestID: requestID, purpose: purpose, accesses: accesses,
                                       timeoutMilliseconds: milliseconds)))
        } catch {
            if let waiter = state.withLock({ waiters.removeValue(forKey: requestID) }) {
                waiter(.failure(.disconnected("\(error)")))
            }
        }
    }

    public func release(requestID: UInt64) {
        try? send(.release(.init(requestID: requestID)))
    }

    public func cancel(requestID: UInt64) {
        try? send(.cancel(.init(requestID: requestID)))
    }

    /// The daemon's status (blocks until it answers).
    public func status() throws -> CoordinationStatus {
        let semaphore = DispatchSemaphore(value: 0)
        nonisolated(unsafe) var result: Result<CoordinationStatus, FileCoordinationError> = .failure(.disconnected("no answer"))
        let registered = state.withLock { () -> Bool in
            guard !isClosed else { return false }
            statusWaiters.append { result = $0; semaphore.signal() }
            return true
        }
        guard registered else { throw FileCoordinationError.disconnected("connection closed") }
        try send(.statusRequest)
        semaphore.wait()
        return try result.get()
    }

    // MARK: - Reading

    private func readLoop(_ initial: FrameReader) {
        var reader = initial
        var buffer: [UInt8] = []
        var reason = "the daemon closed the connection"
        while true {
            do {
                guard let message = try Self.readOne(fd, &reader, buffer: &buffer) else { break }
                dispatch(message)
            } catch {
                reason = "\(error)"
                break
            }
        }
        // Whatever ended the loop, end the connection for the daemon too.
        shutdown(fd, Int32(SHUT_RDWR))
        let (pending, statuses, handlers) = state.withLock { () -> ([(Result<Void, FileCoordinationError>) -> Void], [(Result<CoordinationStatus, FileCoordinationError>) -> Void], [() -> Void]) in
            isClosed = true
            defer { waiters = [:]; statusWaiters = []; closeHandlers = [] }
            return (Array(waiters.values), statusWaiters, closeHandlers)
        }
        for waiter in pending { waiter(.failure(.disconnected(reason))) }
        for waiter in statuses { waiter(.failure(.disconnected(reason))) }
        for handler in handlers { handler() }
    }

    private func dispatch(_ message: ControlMessage) {
        switch message {
        case .granted(let body):
            state.withLock { waiters.removeValue(forKey: body.requestID) }?(.success(()))
        case .denied(let body):
            let error: FileCoordinationError
            switch body.reason {
            case .cancelled: error = .cancelled
            case .timedOut: error = .timedOut
            case .disconnected: error = .disconnected(body.detail ?? "disconnected")
            case .invalidRequest: error = .invalidRequest(body.detail ?? "invalid request")
            case .accessDenied: error = .accessDenied(body.detail ?? "access denied")
            }
            state.withLock { waiters.removeValue(forKey: body.requestID) }?(.failure(error))
        case .presenterMessage(let notice):
            onPresenterMessage(notice)
        case .statusReply(let status):
            let waiter = state.withLock { statusWaiters.isEmpty ? nil : statusWaiters.removeFirst() }
            waiter?(.success(status))
        case .error(let error):
            onError(error)
            if error.code == .internalError {
                let waiter = state.withLock { statusWaiters.isEmpty ? nil : statusWaiters.removeFirst() }
                waiter?(.failure(.invalidRequest(error.message)))
            }
        default:
            break
        }
    }

    // MARK: - Socket I/O

    /// 0 waits forever.
    private static func setReceiveTimeout(_ fd: Int32, seconds: Int) {
        var value = timeval(tv_sec: seconds, tv_usec: 0)
        _ = setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &value, socklen_t(MemoryLayout<timeval>.size))
    }

    private static func write(_ fd: Int32, _ message: ControlMessage) throws {
        let frame = try ControlCodec.encode(message)
        var offset = 0
        while offset < frame.count {
            let sent = frame[offset...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if sent < 0 {
                if errno == EINTR { continue }
                throw FileCoordinationError.disconnected(String(cString: strerror(errno)))
            }
            offset += sent
        }
    }

    /// The next message, or nil at a clean end of stream. `buffer`: what to receive into, kept by
    /// the caller so that a message costs no allocation of it.
    private static func readOne(_ fd: Int32, _ reader: inout FrameReader, buffer: inout [UInt8]) throws -> ControlMessage? {
        // Often the frames of one read: no receive needed.
        if let message = try reader.next() { return message }
        if buffer.isEmpty { buffer = [UInt8](repeating: 0, count: 65536) }
        while true {
            if let message = try reader.next() { return message }
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count > 0 {
                reader.append(buffer[..<count])
            } else if count == 0 {
                try reader.finish()
                return nil
            } else if errno != EINTR {
                throw FileCoordinationError.disconnected(String(cString: strerror(errno)))
            }
        }
    }
}
