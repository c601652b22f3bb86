import Coordination
import Foundation

/// The presenters of this process, by the id they are known by to their domain. Turns presenter
/// messages into callbacks on the presenter's operation queue, and answers when the callback's
/// completion handler (or reader/writer block) runs.
final class PresenterTable: @unchecked Sendable {
    static let shared = PresenterTable()

    private struct Entry {
        let presenter: any FilePresenter
        let id: PurposeID
        var domain: (any CoordinationDomain)?
        /// Where its URL led into a mount: its callbacks' URLs are made in the same view.
        var view: MountView?
        /// Blocks handed over by relinquish callbacks, run at the matching reacquire.
        var reacquirers: [(() -> Void)?] = []
        let mailbox = Mailbox()
    }

    /// A presenter's messages not yet called back, and whether an operation to call them is on
    /// its queue: messages that come while one waits join it, so that a burst (an `rm -rf` of a
    /// presented folder) costs the queue one operation, and its thread one wake-up, not one per
    /// message. One operation at a time keeps them in order on a concurrent queue too.
    private final class Mailbox: @unchecked Sendable {
        let lock = NSLock()
        var waiting: [@Sendable () -> Void] = []
        var scheduled = false
    }

    private let lock = NSLock()
    private var entries: [PurposeID: Entry] = [:]
    /// Ids given to presenter objects, registered or not (a coordinator made for a presenter
    /// uses the presenter's id as its purpose).
    private var ids: [ObjectIdentifier: PurposeID] = [:]

    func id(for presenter: any FilePresenter) -> PurposeID {
        lock.withLock {
            let key = ObjectIdentifier(presenter)
            if let id = ids[key] { return id }
            let id = PurposeID("presenter-" + UUID().uuidString)
            ids[key] = id
            return id
        }
    }

    func add(_ presenter: any FilePresenter) {
        let id = id(for: presenter)
        let isNew = lock.withLock { () -> Bool in
            guard entries[id] == nil else { return false }
            entries[id] = Entry(presenter: presenter, id: id)
            return true
        }
        guard isNew, let url = presenter.presentedItemURL,
              let (domain, path, view) = try? Placement.place(url) else { return }
        lock.withLock {
            entries[id]?.domain = domain
            entries[id]?.view = view
        }
        domain.addPresenter(id, path: path, awaited: presenter.awaitedRequests)
    }

    func remove(_ presenter: any FilePresenter) {
        let id = id(for: presenter)
        let entry = lock.withLock { entries.removeValue(forKey: id) }
        entry?.domain?.removePresenter(id)
    }

    var all: [any FilePresenter] {
        lock.withLock { entries.values.sorted { $0.id < $1.id }.map(\.presenter) }
    }

    /// Runs the callback for `message` on the presenter's queue; `reply` gets nil or an error
    /// text once the presenter has answered (for notifications: once the callback returned).
    func deliver(_ message: PresenterMessage, to id: PurposeID, in domain: any CoordinationDomain,
                 reply: @escaping @Sendable (String?) -> Void) {
        guard let (found, mailbox, view) = lock.withLock({ entries[id].map { ($0.presenter, $0.mailbox, $0.view) } }) else {
            return reply(nil)
        }
        // As with Apple's NSFilePresenter, a presenter is called only on its own operation queue.
        nonisolated(unsafe) let presenter = found
        let url = { @Sendable (path: ItemPath) in view?.url(for: path) ?? domain.url(for: path) }
        let answerOnce = Once(reply)
        post({ [self] in
            switch message {
            case .relinquishPresentedItemToReader:
                presenter.relinquishPresentedItem(toReader: { reacquirer in
                    self.pushReacquirer(reacquirer, for: id)
                    answerOnce(nil)
                })
            case .relinquishPresentedItemToWriter:
                presenter.relinquishPresentedItem(toWriter: { reacquirer in
                    self.pushReacquirer(reacquirer, for: id)
                    answerOnce(nil)
                })
            case .savePresentedItemChanges:
                presenter.savePresentedItemChanges { error in answerOnce(error.map { "\($0)" }) }
            case .accommodatePresentedItemDeletion:
                presenter.accommodatePresentedItemDeletion { error in answerOnce(error.map { "\($0)" }) }
            case .accommodatePresentedSubitemDeletion(let path):
                presenter.accommodatePresentedSubitemDeletion(at: url(path)) { error in
                    answerOnce(error.map { "\($0)" })
                }
            case .presentedItemDidChange:
                presenter.presentedItemDidChange()
                answerOnce(nil)
            case .presentedSubitemDidChange(let path):
                presenter.presentedSubitemDidChange(at: url(path))
                answerOnce(nil)
            case .presentedSubitemDidAppear(let path):
                presenter.presentedSubitemDidAppear(at: url(path))
                answerOnce(nil)
            case .presentedItemDidMove(let path):
                presenter.presentedItemDidMove(to: url(path))
                answerOnce(nil)
            case .presentedSubitemDidMove(let source, let destination):
                presenter.presentedSubitem(at: url(source), didMoveTo: url(destination))
                answerOnce(nil)
            case .reacquirePresentedItem:
                popReacquirer(for: id)?()
                presenter.reacquirePresentedItem()
                answerOnce(nil)
            case .presentedItemDidGainVersion(let identifier):
                if let item = presenter.presentedItemURL,
                   let version = FileVersion.version(itemAt: item, forPersistentIdentifier: identifier) {
                    presenter.presentedItemDidGain(version)
                }
                answerOnce(nil)
            case .presentedSubitemDidGainVersion(let path, let identifier):
                let item = url(path)
                if let version = FileVersion.version(itemAt: item, forPersistentIdentifier: identifier) {
                    presenter.presentedSubitem(at: item, didGain: version)
                }
                answerOnce(nil)
            }
        }, to: mailbox, on: presenter.presentedItemOperationQueue)
    }

    private func post(_ callback: @escaping @Sendable () -> Void, to mailbox: Mailbox, on queue: OperationQueue) {
        let schedule = mailbox.lock.withLock { () -> Bool in
            mailbox.waiting.append(callback)
            defer { mailbox.scheduled = true }
            return !mailbox.scheduled
        }
        if schedule { queue.addOperation { Self.callBack(mailbox, on: queue) } }
    }

    /// Calls what waited when the operation began; what came since gets an operation of its own,
    /// so that other work on the queue is not held back by a long burst.
    private static func callBack(_ mailbox: Mailbox, on queue: OperationQueue) {
        let callbacks = mailbox.lock.withLock { () -> [@Sendable () -> Void] in
            defer { mailbox.waiting = [] }
            return mailbox.waiting
        }
        for callback in callbacks { callback() }
        let more = mailbox.lock.withLock { () -> Bool in
            mailbox.scheduled = !mailbox.waiting.isEmpty
            return mailbox.scheduled
        }
        if more { queue.addOperation { callBack(mailbox, on: queue) } }
    }

    private func pushReacquirer(_ reacquirer: (() -> Void)?, for id: PurposeID) {
        lock.withLock { entries[id]?.reacquirers.append(reacquirer) }
    }

    private func popReacquirer(for id: PurposeID) -> (() -> Void)? {
        lock.withLock { () -> (() -> Void)? in
            guard let entry = entries[id], !entry.reacquirers.isEmpty else { return nil }
            return entries[id]!.reacquirers.removeFirst()
        }
    }
}

/// Calls a reply closure at most once, whatever the presenter does with its handler.
private final class Once: @unchecked Sendable {
    private let lock = NSLock()
    private var body: (@Sendable (String?) -> Void)?

    init(_ body: @escaping @Sendable (String?) -> Void) { self.body = body }

    func callAsFunction(_ error: String?) {
        let body = lock.withLock { () -> (@Sendable (String?) -> Void)? in
            defer { self.body = nil }
            return self.body
        }
        body?(error)
    }
}
