import Coordination
import Foundation

// Where accesses are arbitrated. Inside a ContainerFS mount: the mount's daemon, over its control
// socket (one shared connection per mount and process). Anywhere else: an arbiter inside this
// process, so that the threads of one program still coordinate with each other.

/// A request on its way; `cancel()` gives it up if it is still waiting.
protocol PendingAccess: AnyObject, Sendable {
    func cancel()
}

/// A granted access, held until `end`.
protocol HeldAccess: AnyObject, Sendable {
    /// Ends the access. `tookEffect` is true when the accessor ran.
    func end(tookEffect: Bool)
}

protocol CoordinationDomain: AnyObject, Sendable {
    /// Orders domains, so that coordinators that span two of them take them in the same order.
    var identifier: String { get }
    func request(_ accesses: [ItemAccess], purpose: PurposeID, timeout: Duration?,
                 completion: @escaping @Sendable (Result<any HeldAccess, FileCoordinationError>) -> Void)
        -> any PendingAccess
    func url(for path: ItemPath) -> URL
    func addPresenter(_ id: PurposeID, path: ItemPath, awaited: PresenterRequests)
    func removePresenter(_ id: PurposeID)
    /// `FileCoordinator.item(at:didMoveTo:)`.
    func itemDidMove(from source: ItemPath, to destination: ItemPath, purpose: PurposeID)
}

/// The file URL of `path` below `root`, made without touching the filesystem: `URL(fileURLWithPath:)`
/// without `isDirectory` calls stat to find out, and a presenter's callback must never wait on the
/// mount, since the operation it is hearing about may be waiting for its answer.
func fileURL(root: String, _ path: ItemPath) -> URL {
    let relative = String(decoding: path.bytes, as: UTF8.self)
    let joined = relative.isEmpty ? root : root.hasSuffix("/") ? root + relative : root + "/" + relative
    return URL(fileURLWithPath: joined, isDirectory: relative.isEmpty)
}

/// Finds the domain and path of a URL.
enum Placement {
    /// Replaced by tests to fake mounts.
    nonisolated(unsafe) static var locator = MountLocator()
    private static let lock = NSLock()
    nonisolated(unsafe) private static var remotes: [String: RemoteDomain] = [:]

    /// With the view of the daemon's tree the URL went through (nil outside a mount).
    static func place(_ url: URL) throws(FileCoordinationError) -> (domain: any CoordinationDomain, path: ItemPath, view: MountView?) {
        let location = lock.withLock { locator }.locate(url)
        guard let location else {
            let path = url.standardizedFileURL.path
            guard let itemPath = ItemPath(path) else { throw .invalidRequest("not a usable path: \(path)") }
            return (LocalDomain.shared, itemPath, nil)
        }
        let domain = lock.withLock { () -> RemoteDomain in
            if let existing = remotes[location.socketPath] { return existing }
            let domain = RemoteDomain(socketPath: location.socketPath)
            remotes[location.socketPath] = domain
            return domain
        }
        if let view = location.view { domain.learn(view) }
        return (domain, location.itemPath, location.view)
    }

    /// For tests: forget remote domains (their connections close).
    static func reset() {
        let old = lock.withLock { () -> [RemoteDomain] in
            defer { remotes = [:] }
            return Array(remotes.values)
        }
        for domain in old { domain.disconnect() }
    }
}

/// The shared bookkeeping of a request that may be cancelled while it waits, on either domain.
final class RequestState: @unchecked Sendable {
    private let lock = NSLock()
    private var cancelled = false
    private var settled = false
    private var cancelAction: (() -> Void)?

    /// Sets what cancelling does; runs it at once if cancel came first.
    func setCancelAction(_ action: @escaping () -> Void) {
        let runNow = lock.withLock { () -> Bool in
            if settled { return false }
            if cancelled { return true }
            cancelAction = action
            return false
        }
        if runNow { action() }
    }

    func cancel() {
        let action = lock.withLock { () -> (() -> Void)? in
            guard !cancelled, !settled else { return nil }
            cancelled = true
            return cancelAction
        }
        action?()
    }

    /// Marks the request answered; returns whether it had been cancelled meanwhile.
    func settle() -> Bool {
        lock.withLock {
            settled = true
            cancelAction = nil
            return cancelled
        }
    }
}

final class PendingRequest: PendingAccess, @unchecked Sendable {
    let state = RequestState()
    func cancel() { state.cancel() }
}

// MARK: - In-process

/// Coordination between the threads of this process, for items outside any ContainerFS mount.
/// Paths are absolute paths. The whole process is one owner; coordinators and presenters are
/// told apart by purpose, so presenters of other coordinators in this process hear what one
/// coordinator does, and a coordinator's own presenter does not.
final class LocalDomain: CoordinationDomain, @unchecked Sendable {
    static let shared = LocalDomain()

    let identifier = "local"
    let owner = OwnerID(1)
    let arbiter: Arbiter
    let registry: PresenterRegistry
    let messenger: Messenger

    init(replyTimeout: Duration = .seconds(2)) {
        let transport = LocalTransport()
        registry = PresenterRegistry()
        arbiter = Arbiter()
        messenger = Messenger(registry: registry, transport: transport, replyTimeout: replyTimeout)
        transport.domain = self
    }

    func request(_ accesses: [ItemAccess], purpose: PurposeID, timeout: Duration?,
                 completion: @escaping @Sendable (Result<any HeldAccess, FileCoordinationError>) -> Void)
        -> any PendingAccess {
        let pending = PendingRequest()
        let ticket = arbiter.request(accesses, owner: owner, purpose: purpose, timeout: timeout) { [self] result in
            let wasCancelled = pending.state.settle()
            switch result {
            case .failure(let error):
                completion(.failure(FileCoordinationError(error)))
            case .success(let grant):
                if wasCancelled {
                    arbiter.release(grant)
                    return completion(.failure(.cancelled))
                }
                let initiator = Initiator(purpose: purpose)
                let plans = accesses.map {
                    AccessPlan(access: $0, initiator: initiator, registry: registry, exists: LocalDomain.exists)
                }
                messenger.deliver(plans.flatMap(\.before)) { [self] _ in
                    completion(.success(LocalAccess(domain: self, grant: grant, plans: plans)))
                }
            }
        }
        pending.state.setCancelAction { [arbiter] in arbiter.cancel(ticket) }
        return pending
    }

    func url(for path: ItemPath) -> URL {
        fileURL(root: "/", path)
    }

    @Sendable static func exists(_ path: ItemPath) -> Bool {
        FileManager.default.fileExists(atPath: "/" + String(decoding: path.bytes, as: UTF8.self))
    }

    func addPresenter(_ id: PurposeID, path: ItemPath, awaited: PresenterRequests) {
        registry.add(PresenterKey(owner: owner, purpose: id), path: path, awaited: awaited)
    }

    func removePresenter(_ id: PurposeID) {
        registry.remove(PresenterKey(owner: owner, purpose: id))
        messenger.forget(PresenterKey(owner: owner, purpose: id))
    }

    func itemDidMove(from source: ItemPath, to destination: ItemPath, purpose: PurposeID) {
        // Planned before re-keying, so the plan knows who presented what where.
        let plan = NotificationPlan(for: .move(from: source, to: destination, replacesDestination: false),
                                    initiator: Initiator(purpose: purpose), registry: registry)
        let moves = plan.after.filter {
            switch $0.message {
            case .presentedItemDidMove, .presentedSubitemDidMove: return true
            default: return false
            }
        }
        registry.itemDidMove(from: source, to: destination)
        arbiter.itemDidMove(from: source, to: destination)
        messenger.deliver(moves) { _ in }
    }
}

private final class LocalAccess: HeldAccess, @unchecked Sendable {
    let domain: LocalDomain
    let grant: AccessGrant
    let plans: [AccessPlan]
    private let ended = NSLock()
    private var isEnded = false

    init(domain: LocalDomain, grant: AccessGrant, plans: [AccessPlan]) {
        self.domain = domain
        self.grant = grant
        self.plans = plans
    }

    func end(tookEffect: Bool) {
        let first = ended.withLock { () -> Bool in
            defer { isEnded = true }
            return !isEnded
        }
        guard first else { return }
        domain.messenger.deliver(plans.flatMap { $0.after(tookEffect: tookEffect) }) { [domain, grant] _ in
            domain.arbiter.release(grant)
        }
    }
}

private final class LocalTransport: PresenterTransport, @unchecked Sendable {
    weak var domain: LocalDomain?

    func send(_ message: PresenterMessage, id: MessageID, to presenter: PresenterKey, awaitingReply: Bool) {
        guard let domain else { return }
        PresenterTable.shared.deliver(message, to: presenter.purpose, in: domain) { [weak domain] error in
            guard awaitingReply, let domain else { return }
            domain.messenger.receiveReply(id, from: presenter.owner, error: error)
        }
    }
}

// MARK: - A ContainerFS mount

/// One mount's daemon. The connection is made at first use and shared by every coordinator and
/// presenter of this process; if it drops, the next use reconnects and registers the presenters
/// again.
final class RemoteDomain: CoordinationDomain, @unchecked Sendable {
    let socketPath: String
    var identifier: String { "mount:" + socketPath }
    private let lock = NSLock()
    private var client: ControlClient?
    /// The views of the daemon's tree through which this process reached it, the latest first.
    private var views: [MountView] = []
    private var presenters: [PurposeID: (path: ItemPath, awaited: PresenterRequests)] = [:]

    init(socketPath: String) {
        self.socketPath = socketPath
    }

    func learn(_ view: MountView) {
        lock.withLock {
            guard views.first != view else { return }
            views.removeAll { $0 == view }
            views.insert(view, at: 0)
            if views.count > 16 { views.removeLast() }
        }
    }

    /// Closes the connection on purpose (no connection-lost report).
    func disconnect() {
        lock.withLock { () -> ControlClient? in
            defer { client = nil }
            return client
        }?.close()
    }

    /// The live connection, made (and presenters re-registered) if needed.
    func connection() throws(FileCoordinationError) -> ControlClient {
        lock.lock()
        defer { lock.unlock() }
        if let client, client.isConnected { return client }
        let name = ProcessInfo.processInfo.processName
        let made: ControlClient
        do {
            made = try ControlClient(socketPath: socketPath, clientName: name,
                                     onPresenterMessage: { [weak self] notice in self?.receive(notice) })
        } catch let error as FileCoordinationError {
            throw error
        } catch {
            throw .connectionFailed("\(error)")
        }
        client = made
        made.onClose { [weak self, weak made] in
            guard let self else { return }
            let (current, hadPresenters) = lock.withLock { (self.client, !self.presenters.isEmpty) }
            if hadPresenters, current === made {
                FileCoordinator.connectionLost(socketPath: socketPath)
            }
        }
        for (id, presenter) in presenters.sorted(by: { $0.key < $1.key }) {
            try? made.send(.addPresenter(.init(presenter: id, path: presenter.path, awaited: presenter.awaited)))
        }
        return made
    }

    private func receive(_ notice: ControlMessage.PresenterNotice) {
        let client = lock.withLock { () -> ControlClient? in
            // Keep the path to register again after a reconnection current.
            if case .presentedItemDidMove(let path) = notice.message, presenters[notice.presenter] != nil {
                presenters[notice.presenter]!.path = path
            }
            return self.client
        }
        PresenterTable.shared.deliver(notice.message, to: notice.presenter, in: self) { error in
            guard notice.expectsReply else { return }
            try? client?.send(.presenterReply(.init(messageID: notice.messageID, error: error)))
        }
    }

    func request(_ accesses: [ItemAccess], purpose: PurposeID, timeout: Duration?,
                 completion: @escaping @Sendable (Result<any HeldAccess, FileCoordinationError>) -> Void)
        -> any PendingAccess {
        let pending = PendingRequest()
        let client: ControlClient
        do {
            client = try connection()
        } catch {
            completion(.failure(error))
            return pending
        }
        let requestID = client.makeRequestID()
        client.coordinate(accesses, purpose: purpose, requestID: requestID, timeout: timeout) { result in
            let wasCancelled = pending.state.settle()
            switch result {
            case .success:
                // A cancel that crossed the grant on the wire made the daemon release it.
                if wasCancelled { return completion(.failure(.cancelled)) }
                completion(.success(RemoteAccess(client: client, requestID: requestID)))
            case .failure(let error):
                completion(.failure(error))
            }
        }
        pending.state.setCancelAction { client.cancel(requestID: requestID) }
        return pending
    }

    /// Through the latest view that shows the item (a presenter's own view comes first:
    /// `PresenterTable`).
    func url(for path: ItemPath) -> URL {
        lock.withLock { views.lazy.compactMap { $0.url(for: path) }.first } ?? fileURL(root: "/", path)
    }

    func addPresenter(_ id: PurposeID, path: ItemPath, awaited: PresenterRequests) {
        lock.withLock { presenters[id] = (path, awaited) }
        try? connection().send(.addPresenter(.init(presenter: id, path: path, awaited: awaited)))
    }

    func removePresenter(_ id: PurposeID) {
        let client = lock.withLock { () -> ControlClient? in
            presenters.removeValue(forKey: id)
            return self.client
        }
        try? client?.send(.removePresenter(.init(presenter: id)))
    }

    /// The daemon learns about moves from the rename itself, made through the mount.
    func itemDidMove(from source: ItemPath, to destination: ItemPath, purpose: PurposeID) {}
}

private final class RemoteAccess: HeldAccess, @unchecked Sendable {
    let client: ControlClient
    let requestID: UInt64
    private let lock = NSLock()
    private var isEnded = false

    init(client: ControlClient, requestID: UInt64) {
        self.client = client
        self.requestID = requestID
    }

    func end(tookEffect: Bool) {
        let first = lock.withLock { () -> Bool in
            defer { isEnded = true }
            return !isEnded
        }
        if first { client.release(requestID: requestID) }
    }
}

extension FileCoordinationError {
    init(_ error: CoordinationError) {
        switch error {
        case .cancelled: self = .cancelled
        case .timedOut: self = .timedOut
        case .disconnected: self = .disconnected("disconnected")
        }
    }
}
