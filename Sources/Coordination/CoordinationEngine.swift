
// One coordinated operation from start to end, as a FUSE handler or the control socket needs it:
// wait for the accesses, let presenters relinquish and save, hand over, then publish what
// happened and release. Nothing here blocks; every step continues from a completion.

extension CoordinatedOperation {
    /// The accesses this operation coordinates as (section 3.2's table).
    /// - Parameter isDirectory: whether the item (for a move: the source) is a directory.
    public func accesses(isDirectory: Bool = false) -> [ItemAccess] {
        switch self {
        case .read(let path, let options):
            return [.read(path, isDirectory: isDirectory, options: options)]
        case .write(let path), .create(let path):
            return [.write(path, isDirectory: isDirectory)]
        case .delete(let path):
            return [.write(path, isDirectory: isDirectory, options: .forDeleting)]
        case .move(let source, let destination, let replacesDestination):
            let moving = ItemAccess.write(source, isDirectory: isDirectory, options: .forMoving)
            guard replacesDestination else { return [moving] }
            return [moving, .write(destination, isDirectory: isDirectory, options: .forReplacing)]
        case .saveByReplacing(let temporary, let original):
            return [.write(temporary, options: .forMoving), .write(original, options: .forReplacing)]
        case .metadataChange(let path):
            return [.write(path, isDirectory: isDirectory, options: .contentIndependentMetadataOnly)]
        }
    }
}

public final class CoordinationEngine: Sendable {
    public let arbiter: Arbiter
    public let registry: PresenterRegistry
    public let messenger: Messenger

    public init(arbiter: Arbiter, registry: PresenterRegistry, messenger: Messenger) {
        self.arbiter = arbiter
        self.registry = registry
        self.messenger = messenger
    }

    /// The usual set-up: one package rule shared by the arbiter and the registry, Dispatch timers.
    public convenience init(transport: any PresenterTransport,
                            packageRule: PackageRule = .anyExtension,
                            replyTimeout: Duration = .seconds(2),
                            onUnresponsive: @escaping @Sendable (PresenterKey, PresenterMessage) -> Void = { _, _ in }) {
        let registry = PresenterRegistry(packageRule: packageRule)
        self.init(arbiter: Arbiter(packageRule: packageRule), registry: registry,
                  messenger: Messenger(registry: registry, transport: transport, replyTimeout: replyTimeout,
                                       onUnresponsive: onUnresponsive))
    }

    /// Starts `operation`. `completion` gets a session once the accesses are granted and the
    /// presenters have answered (or run out of time), or the arbiter's error. The caller then
    /// performs the operation and calls `session.end(tookEffect:)`.
    @discardableResult
    public func begin(_ operation: CoordinatedOperation, isDirectory: Bool = false,
                      owner: OwnerID, purpose: PurposeID, initiator: Initiator? = nil,
                      timeout: Duration? = nil, joinsOwnersAccesses: Bool = false,
                      completion: @escaping @Sendable (Result<OperationSession, CoordinationError>) -> Void)
        -> AccessTicket {
        let given = initiator ?? Initiator(owner: owner, purpose: purpose)
        return arbiter.request(operation.accesses(isDirectory: isDirectory), owner: owner, purpose: purpose,
                               timeout: timeout, joinsOwnersAccesses: joinsOwnersAccesses) { result in
            switch result {
            case .failure(let error):
                completion(.failure(error))
            case .success(let grant):
                // Planned once granted, so that the presenters asked are those present now. Inside
                // its owner's access, presenters made way for that access and reacquire when it
                // ends: they only hear what changed, all but that access's own presenter.
                let plan: NotificationPlan
                if let joined = grant.joinedPurpose {
                    let initiator = Initiator(presenter: PresenterKey(owner: owner, purpose: joined))
                    let full = NotificationPlan(for: operation, initiator: initiator, registry: self.registry)
                    plan = NotificationPlan(after: full.after.filter { $0.message != .reacquirePresentedItem })
                } else {
                    plan = NotificationPlan(for: operation, initiator: given, registry: self.registry)
                }
                self.messenger.deliver(plan.before) { _ in
                    completion(.success(OperationSession(engine: self, operation: operation, grant: grant, plan: plan)))
                }
            }
        }
    }

    /// Drops everything of a client whose connection closed: accesses, presenters, pending messages.
    public func disconnect(_ owner: OwnerID) {
        arbiter.disconnect(owner)
        registry.removeAll(owner: owner)
        messenger.disconnect(owner)
    }

    public func status() -> CoordinationStatus {
        CoordinationStatus(arbiter: arbiter, registry: registry, messenger: messenger)
    }
}

/// A granted operation, between `begin` and `end`.
public final class OperationSession: Sendable {
    public let operation: CoordinatedOperation
    public let grant: AccessGrant
    public let plan: NotificationPlan
    private let engine: CoordinationEngine
    private let ended = Locked(false)

    init(engine: CoordinationEngine, operation: CoordinatedOperation, grant: AccessGrant, plan: NotificationPlan) {
        self.engine = engine
        self.operation = operation
        self.grant = grant
        self.plan = plan
    }

    /// What the operation did to the items presenters present: moved them, deleted them (who was
    /// told hears it once), or made one at their path again.
    private func noteItems(of operation: CoordinatedOperation) {
        let registry = engine.registry
        switch operation {
        case .move(let source, let destination, _):
            let told = plan.before.filter { $0.message == .accommodatePresentedItemDeletion }.map(\.presenter)
            registry.itemsWereDeleted(told)
            registry.itemDidMove(from: source, to: destination)
            engine.arbiter.itemDidMove(from: source, to: destination)
            registry.itemDidAppear(at: destination)
        case .delete:
            registry.itemsWereDeleted(plan.before.filter { $0.message == .accommodatePresentedItemDeletion }.map(\.presenter))
        case .create(let path), .saveByReplacing(_, let path):
            registry.itemDidAppear(at: path)
        case .read, .write, .metadataChange:
            break
        }
    }

    /// Ends the operation (only the first call counts). If it took effect, a move re-keys the
    /// presenters and waiting accesses, and presenters hear the "after" messages; in any case the
    /// accesses are released once those are sent. `completion` runs after the release.
    public func end(tookEffect: Bool, completion: (@Sendable () -> Void)? = nil) {
        let first = ended.withLock { ended in
            defer { ended = true }
            return !ended
        }
        guard first else { return }
        if tookEffect { noteItems(of: operation) }
        // A failed read still ends, so its presenters must reacquire; a failed write changed nothing.
        let after = tookEffect ? plan.after : plan.after.filter { $0.message == .reacquirePresentedItem }
        engine.messenger.deliver(after) { [engine, grant] _ in
            engine.arbiter.release(grant)
            completion?()
        }
    }
}
