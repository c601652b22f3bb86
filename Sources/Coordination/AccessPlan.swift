/// What presenters hear about one access of a coordinator (a client's, or the library's own):
/// NotificationPlan's table, chosen from the access kind. `before` goes out before the accessor
/// runs; once it has, `after(tookEffect:)`: for a write, a change, or an appearance if the item
/// did not exist before; in any case the reacquires.
public struct AccessPlan: Sendable {
    public let before: [PresenterDelivery]
    private let published: [PresenterDelivery]
    private let appeared: [PresenterDelivery]?
    /// Only the reacquires, for a coordinator that reports no change itself (the daemon's clients,
    /// whose changes presenters hear from the filesystem).
    public let reacquire: [PresenterDelivery]
    private let path: ItemPath
    private let existedBefore: Bool
    private let publishesOnlyAReplacement: Bool
    private let exists: @Sendable (ItemPath) -> Bool

    /// - Parameter exists: whether an item is there (asked before the access, and after it).
    public init(access: ItemAccess, initiator: Initiator, registry: PresenterRegistry,
                exists: @escaping @Sendable (ItemPath) -> Bool) {
        path = access.path
        self.exists = exists
        existedBefore = exists(access.path)
        func plan(_ operation: CoordinatedOperation) -> NotificationPlan {
            NotificationPlan(for: operation, initiator: initiator, registry: registry)
        }
        var create: NotificationPlan?
        var replacement = false
        let main: NotificationPlan
        switch access.kind {
        case .read(let options):
            main = plan(.read(access.path, options: options))
        case .write(let options) where options.contains(.forDeleting):
            main = plan(.delete(access.path))
        case .write(let options) where options.contains(.forMoving):
            // Presenters let go now; where it went is told by item(at:didMoveTo:).
            var moving = plan(.move(from: access.path, to: access.path, replacesDestination: false))
            moving.after = moving.after.filter { $0.message == .reacquirePresentedItem }
            main = moving
        case .write(let options) where options.contains(.contentIndependentMetadataOnly):
            main = plan(.metadataChange(access.path))
        case .write(let options) where options.contains(.forReplacing):
            // Replacing an existing item (an editor's save by rename) is a change to it, never a
            // deletion; an item moved into an empty place is told by item(at:didMoveTo:).
            main = plan(.write(access.path))
            replacement = true
        case .write:
            main = plan(.write(access.path))
            if !existedBefore { create = plan(.create(access.path)) }
        }
        before = main.before
        published = main.after
        appeared = create?.after
        reacquire = main.after.filter { $0.message == .reacquirePresentedItem }
        publishesOnlyAReplacement = replacement
    }

    public func after(tookEffect: Bool) -> [PresenterDelivery] {
        guard tookEffect else { return reacquire }
        if publishesOnlyAReplacement && !existedBefore { return reacquire }
        if let appeared, exists(path) { return appeared }
        return published
    }
}
