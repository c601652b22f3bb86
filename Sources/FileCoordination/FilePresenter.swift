import Coordination
import Foundation

/// An object that presents a file or directory to the user and wants to hear when others read,
/// change, move or delete it: Foundation's `NSFilePresenter` for Linux.
///
/// Register it with `FileCoordinator.addFilePresenter(_:)`. Every callback runs on
/// `presentedItemOperationQueue`. Callbacks with a completion handler (or a reader/writer block)
/// hold up the other process's operation until the handler is called, for at most the daemon's
/// reply timeout (2 s by default); a presenter that does not answer in time is marked
/// unresponsive and the operation goes on without it. All callbacks have default
/// implementations that answer at once. Operations wait only for the requests in
/// `awaitedRequests` (all of them unless the presenter says otherwise): a presenter that only
/// listens declares none and costs the others no wait, as on Apple's systems a presenter that
/// does not implement a request's method is not waited for.
public protocol FilePresenter: AnyObject {
    /// The item presented. Update it in `presentedItemDidMove(to:)`.
    var presentedItemURL: URL? { get }
    /// Where the callbacks run. Use a serial queue (`maxConcurrentOperationCount = 1`).
    var presentedItemOperationQueue: OperationQueue { get }
    /// For a presenter of a related file (e.g. a sidecar); carried for API compatibility, not used
    /// for arbitration.
    var primaryPresentedItemURL: URL? { get }
    /// The requests this presenter acts on before it answers: other processes' operations wait
    /// for its answer to these (default: all). It hears the others too, but nobody waits for them.
    var awaitedRequests: FilePresenterRequests { get }

    /// Someone wants to read: stop writing, then call `reader`, optionally with a block to run
    /// when the read is over.
    func relinquishPresentedItem(toReader reader: @escaping @Sendable ((@Sendable () -> Void)?) -> Void)
    /// Someone wants to write: stop using the item, then call `writer`, optionally with a block
    /// to run when the write is over.
    func relinquishPresentedItem(toWriter writer: @escaping @Sendable ((@Sendable () -> Void)?) -> Void)
    /// The access that made this presenter relinquish has ended (after the block it gave, if any).
    func reacquirePresentedItem()
    /// Save unsaved changes, then call the handler (with an error if saving failed).
    func savePresentedItemChanges(completionHandler: @escaping @Sendable ((any Error)?) -> Void)
    /// The item is about to be deleted: let go of it, then call the handler.
    func accommodatePresentedItemDeletion(completionHandler: @escaping @Sendable ((any Error)?) -> Void)
    func presentedItemDidMove(to newURL: URL)
    func presentedItemDidChange()
    func presentedSubitemDidAppear(at url: URL)
    func presentedSubitemDidChange(at url: URL)
    func presentedSubitem(at oldURL: URL, didMoveTo newURL: URL)
    /// An item inside the presented directory is about to be deleted.
    func accommodatePresentedSubitemDeletion(at url: URL, completionHandler: @escaping @Sendable ((any Error)?) -> Void)
    /// The mount kept a previous version of the item (docs/versions.md). Only processes that can
    /// reach the store's versions hear it: a version they could not open is not announced.
    func presentedItemDidGain(_ version: FileVersion)
    /// The mount kept a previous version of an item inside the presented directory.
    func presentedSubitem(at url: URL, didGain version: FileVersion)
}

/// Requests (relinquish, save, accommodate a deletion) that operations wait for a presenter to answer.
public typealias FilePresenterRequests = PresenterRequests

extension FilePresenter {
    public var primaryPresentedItemURL: URL? { nil }
    public var awaitedRequests: FilePresenterRequests { .all }
    public func relinquishPresentedItem(toReader reader: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) { reader(nil) }
    public func relinquishPresentedItem(toWriter writer: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) { writer(nil) }
    public func reacquirePresentedItem() {}
    public func savePresentedItemChanges(completionHandler: @escaping @Sendable ((any Error)?) -> Void) { completionHandler(nil) }
    public func accommodatePresentedItemDeletion(completionHandler: @escaping @Sendable ((any Error)?) -> Void) { completionHandler(nil) }
    public func presentedItemDidMove(to newURL: URL) {}
    public func presentedItemDidChange() {}
    public func presentedSubitemDidAppear(at url: URL) {}
    public func presentedSubitemDidChange(at url: URL) {}
    public func presentedSubitem(at oldURL: URL, didMoveTo newURL: URL) {}
    public func accommodatePresentedSubitemDeletion(at url: URL, completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        completionHandler(nil)
    }
    public func presentedItemDidGain(_ version: FileVersion) {}
    public func presentedSubitem(at url: URL, didGain version: FileVersion) {}
}

/// Why a coordinated access did not happen.
public enum FileCoordinationError: Error, Hashable, Sendable, CustomStringConvertible {
    /// `FileCoordinator.cancel()` was called while the access waited.
    case cancelled
    /// The coordinator's `timeout` passed while the access waited.
    case timedOut
    /// The connection to the daemon was lost.
    case disconnected(String)
    /// The daemon refused: the calling user may not access the item.
    case accessDenied(String)
    case invalidRequest(String)
    /// No daemon answers on the mount's control socket.
    case connectionFailed(String)

    public var description: String {
        switch self {
        case .cancelled: return "the coordinated access was cancelled"
        case .timedOut: return "the coordinated access timed out"
        case .disconnected(let detail): return "lost the connection to the ContainerFS daemon: \(detail)"
        case .accessDenied(let detail): return "access denied: \(detail)"
        case .invalidRequest(let detail): return "invalid request: \(detail)"
        case .connectionFailed(let detail): return "cannot reach the ContainerFS daemon: \(detail)"
        }
    }

    /// The error as Foundation reports it: `NSUserCancelledError` for a cancel, as on Apple's
    /// systems; the others in `FileCoordinationError.domain`.
    public var nsError: NSError {
        let code: Int
        switch self {
        case .cancelled: return NSError(domain: NSCocoaErrorDomain, code: NSUserCancelledError,
                                        userInfo: [NSLocalizedDescriptionKey: description])
        case .timedOut: code = 1
        case .disconnected: code = 2
        case .accessDenied: code = 3
        case .invalidRequest: code = 4
        case .connectionFailed: code = 5
        }
        return NSError(domain: Self.domain, code: code, userInfo: [NSLocalizedDescriptionKey: description])
    }

    public static let domain = "ContainerFS.FileCoordination"
}

#if !canImport(ObjectiveC)
/// Foundation's error out-parameter: `var error: NSError?` … `error: &error`.
public typealias NSErrorPointer = UnsafeMutablePointer<NSError?>?
#endif
