import Coordination
import Foundation

/// Coordinated reading and writing of files: Foundation's `NSFileCoordinator` for Linux, with
/// the same methods and options.
///
/// **Where coordination happens.** For an item inside a ContainerFS mount (recognised by the
/// mount's `user.containerfs.*` extended attributes, see `MountLocator`), accesses are
/// arbitrated by the mount's daemon, through one control-socket connection shared by the whole
/// process and made at first use. They then coordinate with every other process using the
/// library, and with ordinary programs (shell tools, editors) that use the mount: the daemon
/// coordinates their operations too. Presenters registered for such items hear what other
/// processes, and ordinary programs, do through the mount; the notifications come from the
/// daemon when the operation happens (an accessor that writes through the mount makes the
/// daemon send relinquish, did-change… to other processes' presenters).
///
/// If the mount's daemon cannot be reached, the call fails with
/// `FileCoordinationError.connectionFailed` (it does not fall back to the in-process mode).
///
/// **Outside a mount** accesses are arbitrated inside this process only:
/// the threads of one program coordinate with each other, presenters of this process hear what
/// its other coordinators do (relinquish, save, did change, did move, accommodate deletion), but
/// other processes know nothing of it. This is the in-process mode.
///
/// In both modes: coordinated reads share, a write excludes other reads and writes of the item;
/// waiters are served in order; accesses of one coordinator (one purpose) never wait for each
/// other, so nested coordination with the same coordinator does not deadlock; the presenter a
/// coordinator was made for hears nothing about that coordinator's accesses.
///
/// Blocking calls wait on the calling thread. As on Apple's systems, do not coordinate from a
/// presenter's own operation queue with a coordinator made for another presenter on that queue.
public final class FileCoordinator: @unchecked Sendable {
    public struct ReadingOptions: OptionSet, Hashable, Sendable {
        public let rawValue: UInt
        public init(rawValue: UInt) { self.rawValue = rawValue }
        public static let withoutChanges = ReadingOptions(rawValue: 1 << 0)
        public static let resolvesSymbolicLink = ReadingOptions(rawValue: 1 << 1)
        public static let immediatelyAvailableMetadataOnly = ReadingOptions(rawValue: 1 << 2)
        public static let forUploading = ReadingOptions(rawValue: 1 << 3)
    }

    public struct WritingOptions: OptionSet, Hashable, Sendable {
        public let rawValue: UInt
        public init(rawValue: UInt) { self.rawValue = rawValue }
        public static let forDeleting = WritingOptions(rawValue: 1 << 0)
        public static let forMoving = WritingOptions(rawValue: 1 << 1)
        public static let forMerging = WritingOptions(rawValue: 1 << 2)
        public static let forReplacing = WritingOptions(rawValue: 1 << 3)
        public static let contentIndependentMetadataOnly = WritingOptions(rawValue: 1 << 4)
    }

    private let lock = NSLock()
    private let filePresenter: (any FilePresenter)?
    private var purpose: String
    private var inFlight: [ObjectIdentifier: any PendingAccess] = [:]
    private var timeoutValue: TimeInterval?

    /// - Parameter filePresenter: the presenter this coordinator works for; it hears nothing
    ///   about this coordinator's accesses, and its own accesses never wait for each other.
    public init(filePresenter: (any FilePresenter)? = nil) {
        self.filePresenter = filePresenter
        if let filePresenter {
            purpose = PresenterTable.shared.id(for: filePresenter).rawValue
        } else {
            purpose = UUID().uuidString
        }
    }

    /// Accesses under the same purpose never block each other. Defaults to a unique string, or
    /// to the presenter's identity for a coordinator made with a presenter.
    public var purposeIdentifier: String {
        get { lock.withLock { purpose } }
        set { lock.withLock { purpose = newValue } }
    }

    /// How long an access may wait before failing with `FileCoordinationError.timedOut`; nil
    /// (the default, as on Apple's systems) waits until granted or cancelled.
    public var timeout: TimeInterval? {
        get { lock.withLock { timeoutValue } }
        set { lock.withLock { timeoutValue = newValue } }
    }

    // MARK: - Presenters

    /// Registers a presenter: from now on it hears about its `presentedItemURL`.
    public static func addFilePresenter(_ presenter: any FilePresenter) {
        PresenterTable.shared.add(presenter)
    }

    public static func removeFilePresenter(_ presenter: any FilePresenter) {
        PresenterTable.shared.remove(presenter)
    }

    public static var filePresenters: [any FilePresenter] {
        PresenterTable.shared.all
    }

    nonisolated(unsafe) private static var lostHandler: (@Sendable (String) -> Void)?
    private static let handlerLock = NSLock()

    /// Not in Foundation: called (on some thread) with the control socket's path when the shared
    /// connection to a mount's daemon closes while presenters of that mount are registered,
    /// since they no longer hear anything. The next coordinated access or `addFilePresenter` on
    /// that mount reconnects and registers them again. `containerfs watch` exits on it.
    public static var connectionLostHandler: (@Sendable (_ socketPath: String) -> Void)? {
        get { handlerLock.withLock { lostHandler } }
        set { handlerLock.withLock { lostHandler = newValue } }
    }

    static func connectionLost(socketPath: String) {
        connectionLostHandler?(socketPath)
    }

    // MARK: - Blocking coordination, NSError out-parameter

    public func coordinate(readingItemAt url: URL, options: ReadingOptions = [], error outError: NSErrorPointer,
                           byAccessor reader: (URL) -> Void) {
        reportingError(outError) { try coordinate(readingItemAt: url, options: options, byAccessor: reader) }
    }

    public func coordinate(writingItemAt url: URL, options: WritingOptions = [], error outError: NSErrorPointer,
                           byAccessor writer: (URL) -> Void) {
        reportingError(outError) { try coordinate(writingItemAt: url, options: options, byAccessor: writer) }
    }

    public func coordinate(readingItemAt readingURL: URL, options readingOptions: ReadingOptions = [],
                           writingItemAt writingURL: URL, options writingOptions: WritingOptions = [],
                           error outError: NSErrorPointer, byAccessor readerWriter: (URL, URL) -> Void) {
        reportingError(outError) {
            try coordinate(readingItemAt: readingURL, options: readingOptions, writingItemAt: writingURL,
                           options: writingOptions, byAccessor: readerWriter)
        }
    }

    public func coordinate(writingItemAt url1: URL, options options1: WritingOptions = [],
                           writingItemAt url2: URL, options options2: WritingOptions = [],
                           error outError: NSErrorPointer, byAccessor writer: (URL, URL) -> Void) {
        reportingError(outError) {
            try coordinate(writingItemAt: url1, options: options1, writingItemAt: url2, options: options2,
                           byAccessor: writer)
        }
    }

    /// Lets the caller batch several coordinated accesses, as Apple's of the same name. The batch
    /// accessor runs at once, on the caller's thread, with a completion handler to call when the
    /// batch is over; each coordinate call inside it is arbitrated on its own (nothing is arranged
    /// ahead: presenters may hear each access of the batch rather than the batch once).
    public func prepare(forReadingItemsAt readingURLs: [URL], options readingOptions: ReadingOptions = [],
                        writingItemsAt writingURLs: [URL], options writingOptions: WritingOptions = [],
                        error outError: NSErrorPointer,
                        byAccessor batchAccessor: (@escaping @Sendable () -> Void) -> Void) {
        batchAccessor({})
    }

    // MARK: - Coordination from async code

    /// As the blocking `coordinate(readingItemAt:options:byAccessor:)`, but waits for the access
    /// without holding a thread, and the accessor may suspend; the access is held until it returns.
    /// Cancelling the task while it waits cancels this coordinator's waiting calls (`cancel()`).
    @discardableResult
    public func coordinate<T>(readingItemAt url: URL, options: ReadingOptions = [],
                              byAccessor reader: (URL) async throws -> T) async throws -> T {
        try await perform([(url, .read(Coordination.ReadingOptions(options)), options.contains(.resolvesSymbolicLink))]) {
            try await reader($0[0])
        }
    }

    @discardableResult
    public func coordinate<T>(writingItemAt url: URL, options: WritingOptions = [],
                              byAccessor writer: (URL) async throws -> T) async throws -> T {
        try await perform([(url, .write(Coordination.WritingOptions(options)), false)]) { try await writer($0[0]) }
    }

    // MARK: - Blocking coordination, throwing

    @discardableResult
    public func coordinate<T>(readingItemAt url: URL, options: ReadingOptions = [],
                              byAccessor reader: (URL) throws -> T) throws -> T {
        try perform([(url, .read(Coordination.ReadingOptions(options)), options.contains(.resolvesSymbolicLink))]) {
            try reader($0[0])
        }
    }

    @discardableResult
    public func coordinate<T>(writingItemAt url: URL, options: WritingOptions = [],
                              byAccessor writer: (URL) throws -> T) throws -> T {
        try perform([(url, .write(Coordination.WritingOptions(options)), false)]) { try writer($0[0]) }
    }

    @discardableResult
    public func coordinate<T>(readingItemAt readingURL: URL, options readingOptions: ReadingOptions = [],
                              writingItemAt writingURL: URL, options writingOptions: WritingOptions = [],
                              byAccessor readerWriter: (URL, URL) throws -> T) throws -> T {
        try perform([
            (readingURL, .read(Coordination.ReadingOptions(readingOptions)),
             readingOptions.contains(.resolvesSymbolicLink)),
            (writingURL, .write(Coordination.WritingOptions(writingOptions)), false),
        ]) { try readerWriter($0[0], $0[1]) }
    }

    @discardableResult
    public func coordinate<T>(writingItemAt url1: URL, options options1: WritingOptions = [],
                              writingItemAt url2: URL, options options2: WritingOptions = [],
                              byAccessor writer: (URL, URL) throws -> T) throws -> T {
        try perform([
            (url1, .write(Coordination.WritingOptions(options1)), false),
            (url2, .write(Coordination.WritingOptions(options2)), false),
        ]) { try writer($0[0], $0[1]) }
    }

    // MARK: - Asynchronous coordination

    /// Waits for all intents without blocking the caller, then runs `accessor` on `queue` with
    /// nil (the accesses are held until it returns) or with the error that prevented them.
    public func coordinate(with intents: [FileAccessIntent], queue: OperationQueue,
                           byAccessor accessor: @escaping (Error?) -> Void) {
        // Apple's signature: the accessor is not @Sendable, and runs on `queue` alone.
        nonisolated(unsafe) let accessor = accessor
        let items = intents.map { ($0.url, $0.kind, $0.resolvesSymbolicLink) }
        let groups: [Group]
        do {
            groups = try place(items)
        } catch {
            queue.addOperation { accessor(error) }
            return
        }
        acquire(groups[...], held: []) { result in
            queue.addOperation {
                switch result {
                case .failure(let error):
                    accessor(error)
                case .success(let held):
                    accessor(nil)
                    for access in held.reversed() { access.end(tookEffect: true) }
                }
            }
        }
    }

    // MARK: - Moves and cancel

    /// Call inside a coordinated write `forMoving` once the item has moved: presenters of it (and
    /// of what is inside it) hear `presentedItemDidMove(to:)`, directories above hear
    /// `presentedSubitem(at:didMoveTo:)`, and waiting accesses follow it. In a ContainerFS mount
    /// the daemon learns this from the rename itself, so there it does nothing.
    public func item(at oldURL: URL, didMoveTo newURL: URL) {
        guard let (domain, source, _) = try? Placement.place(oldURL),
              let (other, destination, _) = try? Placement.place(newURL), other === domain else { return }
        domain.itemDidMove(from: source, to: destination, purpose: PurposeID(purposeIdentifier))
    }

    /// Announces a move before it happens (used on Apple's systems for ubiquitous items); nothing
    /// to do here.
    public func item(at oldURL: URL, willMoveTo newURL: URL) {}

    /// Gives up every access of this coordinator that is still waiting: the blocking calls
    /// return `NSUserCancelledError` (`FileCoordinationError.cancelled`) without running their
    /// accessor. Accesses already granted are not affected.
    public func cancel() {
        let pending = lock.withLock { Array(inFlight.values) }
        for request in pending { request.cancel() }
    }

    // MARK: - Internals

    private struct Group {
        let domain: any CoordinationDomain
        let accesses: [ItemAccess]
    }

    private func reportingError(_ outError: NSErrorPointer, _ body: () throws -> Void) {
        do {
            try body()
            outError?.pointee = nil
        } catch let error as FileCoordinationError {
            outError?.pointee = error.nsError
        } catch {
            outError?.pointee = error as NSError
        }
    }

    /// Places every item and groups the accesses by domain, in a fixed domain order.
    private func place(_ items: [(URL, AccessKind, Bool)]) throws(FileCoordinationError) -> [Group] {
        var groups: [String: (any CoordinationDomain, [ItemAccess])] = [:]
        for (url, kind, resolves) in items {
            let target = resolves ? url.resolvingSymlinksInPath() : url
            let (domain, path, _) = try Placement.place(target)
            var isDirectory: ObjCBool = false
            let exists = FileManager.default.fileExists(atPath: target.path, isDirectory: &isDirectory)
            let access = ItemAccess(path: path, isDirectory: exists && isDirectory.boolValue, kind: kind)
            groups[domain.identifier, default: (domain, [])].1.append(access)
        }
        return groups.sorted { $0.key < $1.key }.map { Group(domain: $0.value.0, accesses: $0.value.1) }
    }

    private var timeoutDuration: Duration? {
        timeout.map { .milliseconds(Int64(max(0, $0) * 1000)) }
    }

    /// Takes the groups one after the other (all of one domain at once).
    private func acquire(_ groups: ArraySlice<Group>, held: [any HeldAccess],
                         completion: @escaping @Sendable (Result<[any HeldAccess], FileCoordinationError>) -> Void) {
        guard let group = groups.first else { return completion(.success(held)) }
        let token = Token()
        let key = ObjectIdentifier(token)
        let pending = group.domain.request(group.accesses, purpose: PurposeID(purposeIdentifier),
                                           timeout: timeoutDuration) { [self] result in
            lock.withLock {
                token.isDone = true
                _ = inFlight.removeValue(forKey: key)
            }
            switch result {
            case .failure(let error):
                for access in held.reversed() { access.end(tookEffect: false) }
                completion(.failure(error))
            case .success(let access):
                acquire(groups.dropFirst(), held: held + [access], completion: completion)
            }
        }
        // The completion may have run already, before `request` returned.
        lock.withLock {
            if !token.isDone { inFlight[key] = pending }
        }
    }

    private func perform<T>(_ items: [(URL, AccessKind, Bool)], _ accessor: ([URL]) async throws -> T) async throws -> T {
        let groups = try place(items)
        let held: [any HeldAccess] = try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                acquire(groups[...], held: []) { continuation.resume(with: $0.mapError { $0 as any Error }) }
            }
        } onCancel: { self.cancel() }
        defer { for access in held.reversed() { access.end(tookEffect: true) } }
        return try await accessor(items.map { $0.2 ? $0.0.resolvingSymlinksInPath() : $0.0 })
    }

    private func perform<T>(_ items: [(URL, AccessKind, Bool)], _ accessor: ([URL]) throws -> T) throws -> T {
        let groups = try place(items)
        let semaphore = DispatchSemaphore(value: 0)
        nonisolated(unsafe) var outcome: Result<[any HeldAccess], FileCoordinationError> = .success([])
        acquire(groups[...], held: []) { result in
            outcome = result
            semaphore.signal()
        }
        semaphore.wait()
        let held = try outcome.get()
        defer { for access in held.reversed() { access.end(tookEffect: true) } }
        let urls = items.map { $0.2 ? $0.0.resolvingSymlinksInPath() : $0.0 }
        return try accessor(urls)
    }
}

/// Names one request in `inFlight`; `isDone` is guarded by the coordinator's lock.
private final class Token: @unchecked Sendable {
    var isDone = false
}

/// One item of `FileCoordinator.coordinate(with:queue:byAccessor:)`.
public final class FileAccessIntent: @unchecked Sendable {
    public let url: URL
    let kind: AccessKind
    let resolvesSymbolicLink: Bool

    private init(url: URL, kind: AccessKind, resolvesSymbolicLink: Bool) {
        self.url = url
        self.kind = kind
        self.resolvesSymbolicLink = resolvesSymbolicLink
    }

    public static func readingIntent(with url: URL, options: FileCoordinator.ReadingOptions = []) -> FileAccessIntent {
        FileAccessIntent(url: url, kind: .read(Coordination.ReadingOptions(options)),
                         resolvesSymbolicLink: options.contains(.resolvesSymbolicLink))
    }

    public static func writingIntent(with url: URL, options: FileCoordinator.WritingOptions = []) -> FileAccessIntent {
        FileAccessIntent(url: url, kind: .write(Coordination.WritingOptions(options)), resolvesSymbolicLink: false)
    }
}

extension Coordination.ReadingOptions {
    init(_ options: FileCoordinator.ReadingOptions) { self.init(rawValue: UInt32(truncatingIfNeeded: options.rawValue)) }
}

extension Coordination.WritingOptions {
    init(_ options: FileCoordinator.WritingOptions) { self.init(rawValue: UInt32(truncatingIfNeeded: options.rawValue)) }
}
