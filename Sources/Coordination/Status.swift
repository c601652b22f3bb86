// The inspection API: everything the daemon's status command and log report.

public struct PendingMessageStatus: Hashable, Sendable, Codable {
    public let id: MessageID
    public let presenter: PresenterKey
    public let message: PresenterMessage

    public init(id: MessageID, presenter: PresenterKey, message: PresenterMessage) {
        self.id = id
        self.presenter = presenter
        self.message = message
    }
}

public struct CoordinationStatus: Hashable, Sendable, Codable {
    /// Active accesses first, then waiting ones in queue order.
    public var accesses: [AccessStatus]
    /// Every presenter, with its current path and whether it is unresponsive.
    public var presenters: [PresenterRecord]
    /// Messages sent to presenters and not answered yet.
    public var pendingMessages: [PendingMessageStatus]
    /// Connected control-socket clients (filled in by `ControlServer`; absent from the engine's
    /// own status). Optional on the wire, so version 1 receivers that predate it still decode.
    public var clients: [ClientStatus]?
    /// Open write sessions (atomic replace: docs/atomic-replace.md), filled in by the
    /// daemon through `ControlServer`'s `writeSessions` hook.
    public var writeSessions: [WriteSessionStatus]?
    /// Entries left out of each list so that the status fits in one message (absent if none).
    public var omitted: OmittedEntries?

    public init(accesses: [AccessStatus] = [], presenters: [PresenterRecord] = [],
                pendingMessages: [PendingMessageStatus] = [], clients: [ClientStatus]? = nil,
                writeSessions: [WriteSessionStatus]? = nil) {
        self.accesses = accesses
        self.presenters = presenters
        self.pendingMessages = pendingMessages
        self.clients = clients
        self.writeSessions = writeSessions
    }

    public init(arbiter: Arbiter, registry: PresenterRegistry, messenger: Messenger? = nil) {
        self.init(accesses: arbiter.status(), presenters: registry.all(),
                  pendingMessages: messenger?.pendingMessages() ?? [])
    }

    public var unresponsivePresenters: [PresenterRecord] { presenters.filter(\.isUnresponsive) }

    /// At most `count` entries of each list, the rest counted in `omitted`.
    public func limited(to count: Int) -> CoordinationStatus {
        var limited = self
        var omitted = self.omitted ?? OmittedEntries()
        func cut<Entry>(_ list: inout [Entry], _ tally: inout Int) {
            guard list.count > count else { return }
            tally += list.count - count
            list.removeLast(list.count - count)
        }
        cut(&limited.accesses, &omitted.accesses)
        cut(&limited.presenters, &omitted.presenters)
        cut(&limited.pendingMessages, &omitted.pendingMessages)
        if limited.clients != nil { cut(&limited.clients!, &omitted.clients) }
        if limited.writeSessions != nil { cut(&limited.writeSessions!, &omitted.writeSessions) }
        limited.omitted = omitted == OmittedEntries() ? nil : omitted
        return limited
    }

    /// The length of its longest list.
    public var longestList: Int {
        [accesses.count, presenters.count, pendingMessages.count, clients?.count ?? 0, writeSessions?.count ?? 0].max()!
    }
}

/// How many entries of each list a status left out.
public struct OmittedEntries: Hashable, Sendable, Codable {
    public var accesses = 0
    public var presenters = 0
    public var pendingMessages = 0
    public var clients = 0
    public var writeSessions = 0

    public init() {}
}

/// One connection of the control socket, with the peer's credentials read at accept.
public struct ClientStatus: Hashable, Sendable, Codable {
    public var owner: OwnerID
    /// From `hello`.
    public var clientName: String?
    /// From SO_PEERCRED, not from what the client claims.
    public var processID: Int32
    public var userID: UInt32
    public var groupID: UInt32

    public init(owner: OwnerID, clientName: String?, processID: Int32, userID: UInt32, groupID: UInt32) {
        self.owner = owner
        self.clientName = clientName
        self.processID = processID
        self.userID = userID
        self.groupID = groupID
    }
}

/// One write session of the filesystem (first open for writing to last close), for status
/// output. The daemon fills these in; the coordination layer only carries them.
public struct WriteSessionStatus: Hashable, Sendable, Codable {
    public var path: ItemPath
    /// Processes holding the session open, if the daemon knows them.
    public var processIDs: [Int32]
    /// Bytes written to the shadow copy so far, if known.
    public var shadowBytes: UInt64?
    /// Whether the file writes in place (opted out of atomic replace).
    public var inPlace: Bool

    public init(path: ItemPath, processIDs: [Int32] = [], shadowBytes: UInt64? = nil, inPlace: Bool = false) {
        self.path = path
        self.processIDs = processIDs
        self.shadowBytes = shadowBytes
        self.inPlace = inPlace
    }
}
