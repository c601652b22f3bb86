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

    public init(accesses: [AccessStatus] = [], presenters: [PresenterRecord] = [],
                pendingMessages: [PendingMessageStatus] = []) {
        self.accesses = accesses
        self.presenters = presenters
        self.pendingMessages = pendingMessages
    }

    public init(arbiter: Arbiter, registry: PresenterRegistry, messenger: Messenger? = nil) {
        self.init(accesses: arbiter.status(), presenters: registry.all(),
                  pendingMessages: messenger?.pendingMessages() ?? [])
    }

    public var unresponsivePresenters: [PresenterRecord] { presenters.filter(\.isUnresponsive) }
}
