import Coordination
import FUSELowLevel
import Glibc

/// How the filesystem takes part in coordination for the programs that use the mount.
///
/// Ordinary programs share one owner and one purpose: among themselves they behave as on any
/// disk (atomic replace keeps every reader consistent), while coordination-aware clients wait
/// for their operations and they wait for the clients'. Every operation is announced to
/// presenters either way.
public final class MountCoordination: @unchecked Sendable {
    public let engine: CoordinationEngine
    /// How long an ordinary program waits for a client's coordinated access before going ahead.
    public let waitLimit: Duration
    /// The control-socket client a process belongs to, once the control server runs.
    public var clientOf: @Sendable (pid_t) -> OwnerID? = { _ in nil }
    /// Whether any client is connected. Without one there is nobody to coordinate with (ordinary
    /// programs never block each other) and no presenter to tell, so operations skip the engine.
    public var hasClients: @Sendable () -> Bool = { true }

    static let ordinaryPurpose = PurposeID("containerfs.ordinary-programs")
    static let clientPurpose = PurposeID("containerfs.filesystem")

    public init(engine: CoordinationEngine, waitLimit: Duration = .seconds(30)) {
        self.engine = engine
        self.waitLimit = waitLimit
    }

    /// Tells the presenters of the item at `path`, and of its directories, that a previous version
    /// of it was kept (docs/versions.md).
    func announceVersion(_ version: String, of path: ItemPath) {
        guard hasClients() else { return }
        engine.messenger.deliver(NotificationPlan.versionAdded(at: path, version: version, registry: engine.registry)) { _ in }
    }

    /// Runs `body` inside a coordinated `operation` made for `caller`, now or later on another
    /// thread. `body` must end the access it gets.
    func perform(_ operation: @autoclosure () -> CoordinatedOperation, isDirectory: Bool, caller: Caller,
                 _ body: @escaping @Sendable (CoordinatedAccess) -> Void) {
        guard hasClients() else { return body(CoordinatedAccess(session: nil)) }
        let operation = operation()
        let client = clientOf(caller.pid)
        // A client answering a presenter message (saving its document for a reader, as Apple's
        // presenters do in savePresentedItemChanges) works for the access that asked, which
        // waits for it: its operations go ahead uncoordinated until it has answered.
        if let client, engine.messenger.isAwaitingAnswer(from: client) { return body(CoordinatedAccess(session: nil)) }
        let owner = client ?? .ordinaryPrograms
        let purpose = client == nil ? MountCoordination.ordinaryPurpose : MountCoordination.clientPurpose
        engine.begin(operation, isDirectory: isDirectory, owner: owner, purpose: purpose,
                     initiator: Initiator(owner: owner), timeout: client == nil ? waitLimit : nil,
                     joinsOwnersAccesses: client != nil) { result in
            switch result {
            case .success(let session): body(CoordinatedAccess(session: session))
            // Waited too long, or the arbiter let go: the operation goes ahead uncoordinated.
            case .failure: body(CoordinatedAccess(session: nil))
            }
        }
    }
}

/// A coordinated access while the filesystem works under it.
struct CoordinatedAccess: @unchecked Sendable {
    let session: OperationSession?

    /// Releases the access; when the operation took effect, presenters hear what changed.
    func end(tookEffect: Bool) {
        session?.end(tookEffect: tookEffect)
    }
}

/// A name copied out of a request, for work finished after the request's buffers are gone.
struct OwnedName: @unchecked Sendable {
    private let storage: [CChar]

    init(_ name: FileName) {
        storage = Array(UnsafeBufferPointer(start: name.pointer, count: name.length + 1))
    }

    func withPointer<R>(_ body: (UnsafePointer<CChar>) -> R) -> R {
        storage.withUnsafeBufferPointer { body($0.baseAddress!) }
    }

    var bytes: ArraySlice<UInt8> {
        storage.dropLast().withUnsafeBytes { ArraySlice($0.bindMemory(to: UInt8.self)) }
    }
}
