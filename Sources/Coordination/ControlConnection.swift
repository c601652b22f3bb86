import Dispatch
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// What a connection tells the one that accepted it. Called on the connection's queue.
protocol ControlConnectionDelegate: AnyObject, Sendable {
    /// A message after the hello.
    func received(_ message: ControlMessage, on connection: ControlConnection)
    /// Once, when the connection closed.
    func closed(_ connection: ControlConnection, reason: String)
    /// The connection's unfinished frames changed by `change` bytes; why it must close, if the
    /// user now holds too many.
    func bufferedBytesChanged(on connection: ControlConnection, by change: Int) -> String?
    func logLine(_ line: String)
}

/// One client's end of the control socket: its transport (non-blocking socket, Dispatch
/// sources, the outgoing buffer) and framing (`FrameReader`, `ControlCodec`, the hello). What
/// its messages ask is its delegate's business; what the dispatcher keeps for the client rides
/// along in `holdings`. Socket, sources, frame reader and `greeted` belong to `queue`; the
/// outgoing buffer is locked, since completions write to it from any thread.
final class ControlConnection: @unchecked Sendable {
    let owner: OwnerID
    let fd: Int32
    let credentials: PeerCredentials
    let queue: DispatchQueue
    let holdings = ClientHoldings()
    /// Bytes of unfinished frames counted against the user's share; touched on `queue` only.
    private(set) var reportedBytes = 0
    private weak var delegate: (any ControlConnectionDelegate)?
    private let maxQueuedBytes: Int
    private let helloTimeout: Duration
    private let outgoing = Locked(Outgoing())
    private let clientName = Locked<String?>(nil)

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
    /// thread, and the timer seldom wakes one for nothing. Four milliseconds, not one: a loop of
    /// new files (three a millisecond) still woke the client for nearly every file, and its
    /// wake-ups took the CPU the loop needed.
    static let noticesAtOnce = 2
    static let noticeWindow: UInt64 = 4_000_000
    static let heldAtMost: UInt64 = 8_000_000

    init(owner: OwnerID, fd: Int32, credentials: PeerCredentials, maxQueuedBytes: Int, helloTimeout: Duration,
         delegate: any ControlConnectionDelegate) {
        self.owner = owner
        self.fd = fd
        self.credentials = credentials
        self.delegate = delegate
        self.maxQueuedBytes = maxQueuedBytes
        self.helloTimeout = helloTimeout
        self.queue = DispatchQueue(label: "containerfs.control.client\(owner.rawValue)")
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
        delegate?.logLine("control client \(owner): \(code.rawValue): \(message)")
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
        delegate?.closed(self, reason: reason)
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
                if let refusal = accountBufferedBytes() { return fail(.limitExceeded, refusal) }
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

    /// Counts what waits in the reader against the user's share; why the connection must
    /// close if that is over.
    private func accountBufferedBytes() -> String? {
        guard let delegate else { return nil }
        let now = reader.bufferedByteCount
        defer { reportedBytes = now }
        return delegate.bufferedBytesChanged(on: self, by: now - reportedBytes)
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
            delegate?.received(message, on: self)
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
