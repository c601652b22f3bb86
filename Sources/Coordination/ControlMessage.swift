// The messages of the control socket between the daemon and coordination-aware clients
// (docs/control-protocol.md). Encoding lives in ControlCodec.swift.

public enum ControlMessage: Hashable, Sendable {
    /// Client → daemon, first frame of every connection.
    case hello(Hello)
    /// Daemon → client, answer to `hello`.
    case helloReply(HelloReply)
    case addPresenter(AddPresenter)
    case removePresenter(RemovePresenter)
    /// Client → daemon: take coordinated access to some items.
    case coordinate(CoordinateRequest)
    case granted(Granted)
    case denied(Denied)
    /// Client → daemon: a granted access has ended.
    case release(Release)
    /// Client → daemon: give up a request that is still waiting (or release it if granted).
    case cancel(Cancel)
    /// Daemon → client: a message for one of the client's presenters.
    case presenterMessage(PresenterNotice)
    /// Client → daemon: a presenter's answer.
    case presenterReply(PresenterReply)
    case statusRequest
    case statusReply(CoordinationStatus)
    case error(ControlError)

    public struct Hello: Hashable, Sendable, Codable {
        /// For the daemon's log and status.
        public var clientName: String
        public var processID: Int32?

        public init(clientName: String, processID: Int32? = nil) {
            self.clientName = clientName
            self.processID = processID
        }
    }

    public struct HelloReply: Hashable, Sendable, Codable {
        /// The owner id the daemon gave this connection; it appears in status output.
        public var clientID: OwnerID

        public init(clientID: OwnerID) { self.clientID = clientID }
    }

    public struct AddPresenter: Hashable, Sendable, Codable {
        /// Chosen by the client, unique within its connection; also the presenter's purpose.
        public var presenter: PurposeID
        /// Relative to the mount root.
        public var path: ItemPath
        /// The requests operations wait for this presenter to answer; none given means all.
        public var awaited: PresenterRequests?

        public init(presenter: PurposeID, path: ItemPath, awaited: PresenterRequests? = nil) {
            self.presenter = presenter
            self.path = path
            self.awaited = awaited
        }
    }

    public struct RemovePresenter: Hashable, Sendable, Codable {
        public var presenter: PurposeID

        public init(presenter: PurposeID) { self.presenter = presenter }
    }

    public struct CoordinateRequest: Hashable, Sendable, Codable {
        /// Chosen by the client, unique within its connection; names the request from now on.
        public var requestID: UInt64
        public var purpose: PurposeID
        /// Granted all at once or not at all.
        public var accesses: [ItemAccess]
        /// How long to wait before giving up; none waits until granted, cancelled or disconnected.
        public var timeoutMilliseconds: UInt64?

        public init(requestID: UInt64, purpose: PurposeID, accesses: [ItemAccess], timeoutMilliseconds: UInt64? = nil) {
            self.requestID = requestID
            self.purpose = purpose
            self.accesses = accesses
            self.timeoutMilliseconds = timeoutMilliseconds
        }

        public var timeout: Duration? {
            timeoutMilliseconds.map { .milliseconds(Int64(clamping: $0)) }
        }
    }

    public struct Granted: Hashable, Sendable, Codable {
        public var requestID: UInt64

        public init(requestID: UInt64) { self.requestID = requestID }
    }

    public struct Denied: Hashable, Sendable, Codable {
        public enum Reason: String, Hashable, Sendable, Codable {
            case cancelled, timedOut, disconnected
            /// The request itself was unacceptable (e.g. a path outside the mount, a duplicate id).
            case invalidRequest
            /// The client's user may not read (or write) one of the items.
            case accessDenied

            public init(_ error: CoordinationError) {
                switch error {
                case .cancelled: self = .cancelled
                case .timedOut: self = .timedOut
                case .disconnected: self = .disconnected
                }
            }
        }

        public var requestID: UInt64
        public var reason: Reason
        public var detail: String?

        public init(requestID: UInt64, reason: Reason, detail: String? = nil) {
            self.requestID = requestID
            self.reason = reason
            self.detail = detail
        }
    }

    public struct Release: Hashable, Sendable, Codable {
        public var requestID: UInt64

        public init(requestID: UInt64) { self.requestID = requestID }
    }

    public struct Cancel: Hashable, Sendable, Codable {
        public var requestID: UInt64

        public init(requestID: UInt64) { self.requestID = requestID }
    }

    public struct PresenterNotice: Hashable, Sendable, Codable {
        public var messageID: MessageID
        public var presenter: PurposeID
        public var message: PresenterMessage
        /// When true the client must send a `presenterReply` with this message id, in time.
        public var expectsReply: Bool

        public init(messageID: MessageID, presenter: PurposeID, message: PresenterMessage, expectsReply: Bool? = nil) {
            self.messageID = messageID
            self.presenter = presenter
            self.message = message
            self.expectsReply = expectsReply ?? message.expectsReply
        }
    }

    public struct PresenterReply: Hashable, Sendable, Codable {
        public var messageID: MessageID
        /// Set when the presenter failed (e.g. could not save); the operation still goes on.
        public var error: String?

        public init(messageID: MessageID, error: String? = nil) {
            self.messageID = messageID
            self.error = error
        }
    }

    public struct ControlError: Hashable, Sendable, Codable {
        public enum Code: String, Hashable, Sendable, Codable {
            /// A frame could not be decoded; the daemon closes the connection after this.
            case malformedMessage
            case unsupportedVersion
            /// Something other than `hello` came first, or `hello` came twice.
            case protocolViolation
            case unknownRequest
            case unknownPresenter
            /// The client's user may not access the item (e.g. `addPresenter` on an item it cannot read).
            case accessDenied
            /// The client has as many presenters as the daemon allows one client.
            case limitExceeded
            case internalError
        }

        public var code: Code
        public var message: String

        public init(code: Code, message: String) {
            self.code = code
            self.message = message
        }
    }
}
