// Who hears what, and in which order, for one coordinated operation (docs/coordination.md,
// "Presenters and messages"). A plan is computed from a snapshot of the registry before the operation, so the
// "after" messages of a move already carry the new paths.

public enum CoordinatedOperation: Hashable, Sendable {
    /// Open for reading.
    case read(ItemPath, options: ReadingOptions = [])
    /// Open for writing or truncate an existing item.
    case write(ItemPath)
    /// Create a file, directory, symlink or hard link.
    case create(ItemPath)
    /// Unlink or rmdir; for a directory, presenters of everything inside hear it too.
    case delete(ItemPath)
    /// Rename; `replacesDestination` when something already existed at `destination`.
    case move(from: ItemPath, to: ItemPath, replacesDestination: Bool)
    /// An editor's safe save: a temporary file renamed over `original`. Presenters of the
    /// original hear a change, not a deletion (section 4, point 5).
    case saveByReplacing(temporary: ItemPath, original: ItemPath)
    /// chmod, chown, utimes, xattr.
    case metadataChange(ItemPath)
}

/// Who started the operation: presenters matching either field hear nothing about it. The
/// filesystem passes the client connection of the calling process (if it has one) as `owner`;
/// a library request passes its connection and its purpose.
public struct Initiator: Hashable, Sendable {
    public var owner: OwnerID?
    public var purpose: PurposeID?
    /// One presenter alone: a client's coordinator made with its own presenter, whose client's
    /// other presenters hear everything (as Apple's do).
    public var presenter: PresenterKey?

    public init(owner: OwnerID? = nil, purpose: PurposeID? = nil, presenter: PresenterKey? = nil) {
        self.owner = owner
        self.purpose = purpose
        self.presenter = presenter
    }

    func isOrigin(of presenter: PresenterRecord) -> Bool {
        presenter.owner == owner || presenter.purpose == purpose || presenter.key == self.presenter
    }
}

public struct NotificationPlan: Hashable, Sendable {
    /// To deliver (waiting for replies) before the operation may proceed.
    public var before: [PresenterDelivery] = []
    /// To deliver once the operation is done and published (for a read: when it ends).
    public var after: [PresenterDelivery] = []

    public init(before: [PresenterDelivery] = [], after: [PresenterDelivery] = []) {
        self.before = before
        self.after = after
    }

    public init(for operation: CoordinatedOperation, initiator: Initiator, registry: PresenterRegistry) {
        let around = { (path: ItemPath) in Audience(registry.around(path), initiator: initiator) }
        // Foundation's atomic write works in a temporary file of its own, which Apple's presenters
        // never hear of: only what it becomes.
        switch operation {
        case .create(let path), .write(let path), .delete(let path), .metadataChange(let path):
            if NotificationPlan.isFoundationTemporary(path) { return }
        default:
            break
        }
        // Most operations concern no presenter: one look at the registry says so.
        switch operation {
        case .move(let source, let destination, _):
            guard registry.presentsAnything(around: source) || registry.presentsAnything(around: destination) else { return }
        case .read(let path, _), .write(let path), .create(let path), .delete(let path), .metadataChange(let path),
             .saveByReplacing(_, let path):
            guard registry.presentsAnything(around: path) else { return }
        }
        switch operation {
        case .move(let source, let destination, false) where NotificationPlan.isFoundationTemporary(source):
            publish(change: .presentedSubitemDidAppear(at: destination), of: destination, audience: around(destination))

        case .read(let path, let options):
            let holders = around(path).holders
            for presenter in holders {
                add(.relinquishPresentedItemToReader, to: presenter, in: \.before)
                if !options.contains(.withoutChanges) { add(.savePresentedItemChanges, to: presenter, in: \.before) }
            }
            add(.reacquirePresentedItem, toEach: holders, in: \.after)

        case .write(let path):
            publish(change: .presentedSubitemDidChange(at: path), of: path, audience: around(path))

        case .saveByReplacing(_, let original):
            publish(change: .presentedSubitemDidChange(at: original), of: original, audience: around(original))

        case .create(let path):
            publish(change: .presentedSubitemDidAppear(at: path), of: path, audience: around(path))

        case .delete(let path):
            let audience = around(path)
            // Presenters of items deleted before, inside a folder deleted now, were told already.
            add(.accommodatePresentedItemDeletion, toEach: audience.subtree.filter {
                !registry.presentsDeletedItem($0.key)
            }, in: \.before)
            add(.accommodatePresentedSubitemDeletion(at: path), toEach: audience.directoriesAbove, in: \.before)

        case .move(let source, let destination, let replacesDestination):
            let (from, to) = (around(source), around(destination))
            if replacesDestination {
                add(.accommodatePresentedItemDeletion, toEach: to.subtree, in: \.before)
            }
            let moving = from.subtree
            add(.relinquishPresentedItemToWriter, toEach: moving + from.packagesAbove, in: \.before)
            for presenter in moving {
                let newPath = presenter.path.replacingPrefix(source, with: destination)!
                add(.presentedItemDidMove(to: newPath), to: presenter, in: \.after)
            }
            // Both the old and the new enclosing directories see the subitem move, each once.
            var directories = from.directoriesAbove
            let known = Set(directories.map(\.key))
            directories += to.directoriesAbove.filter { !known.contains($0.key) }
            add(.presentedSubitemDidMove(from: source, to: destination), toEach: directories, in: \.after)
            add(.reacquirePresentedItem, toEach: moving + from.packagesAbove, in: \.after)

        case .metadataChange(let path):
            add(.presentedItemDidChange, toEach: around(path).presenters, in: \.after)
        }
    }

    /// The temporary file of Foundation's atomic write (`Data.write(to:options: .atomic)` and
    /// the like on Linux): `.dat.nosync` and a suffix, beside the file it will replace.
    public static func isFoundationTemporary(_ path: ItemPath) -> Bool {
        guard let name = path.lastComponent?.bytes, name.count > foundationTemporaryPrefix.count else { return false }
        return name.starts(with: foundationTemporaryPrefix)
    }

    private static let foundationTemporaryPrefix = Array(".dat.nosync".utf8)

    /// A previous version of the item at `path` was kept: its presenters, and those of the
    /// directories around it, hear of it. Nobody is left out (no access of anyone's made it).
    public static func versionAdded(at path: ItemPath, version: String, registry: PresenterRegistry) -> [PresenterDelivery] {
        guard registry.presentsAnything(around: path) else { return [] }
        let audience = Audience(registry.around(path), initiator: Initiator())
        var plan = NotificationPlan()
        plan.add(.presentedItemDidGainVersion(version), toEach: audience.presenters, in: \.after)
        plan.add(.presentedSubitemDidGainVersion(at: path, version: version), toEach: audience.directoriesAbove, in: \.after)
        return plan.after
    }

    /// The write pattern: relinquish to writer; once published, the item did change and its
    /// enclosing directories hear `directoryMessage`; then reacquire.
    private mutating func publish(change directoryMessage: PresenterMessage, of path: ItemPath, audience: Audience) {
        let holders = audience.holders
        add(.relinquishPresentedItemToWriter, toEach: holders, in: \.before)
        add(.presentedItemDidChange, toEach: audience.presenters, in: \.after)
        add(directoryMessage, toEach: audience.directoriesAbove, in: \.after)
        add(.reacquirePresentedItem, toEach: holders, in: \.after)
    }

    private mutating func add(_ message: PresenterMessage, to presenter: PresenterRecord,
                              in phase: WritableKeyPath<NotificationPlan, [PresenterDelivery]>) {
        self[keyPath: phase].append(PresenterDelivery(message, to: presenter.key))
    }

    private mutating func add(_ message: PresenterMessage, toEach presenters: [PresenterRecord],
                              in phase: WritableKeyPath<NotificationPlan, [PresenterDelivery]>) {
        for presenter in presenters { add(message, to: presenter, in: phase) }
    }
}

/// The presenters around one item, seen from one operation: the initiator's own are left out.
private struct Audience {
    /// The item's own.
    let presenters: [PresenterRecord]
    /// Of the directories above, nearest first.
    let directoriesAbove: [PresenterRecord]
    /// Of the packages above, nearest first.
    let packagesAbove: [PresenterRecord]
    /// Of the items inside it.
    private let inside: [PresenterRecord]

    init(_ around: PresentersAround, initiator: Initiator) {
        let others = { (presenters: [PresenterRecord]) in presenters.filter { !initiator.isOrigin(of: $0) } }
        presenters = others(around.at)
        directoriesAbove = others(around.above.flatMap { $0 })
        packagesAbove = others(around.packagesAbove)
        inside = others(around.inside)
    }

    /// Whoever holds the item in the sense of coordination: its presenters, and the presenters
    /// of packages around it, since a package is one item as a whole.
    var holders: [PresenterRecord] { presenters + packagesAbove }

    /// The item's presenters and those of everything inside it.
    var subtree: [PresenterRecord] { presenters + inside }
}
