import Coordination
@testable import FileCoordination
import Foundation
import XCTest

/// Thread-safe list of events.
final class Events: @unchecked Sendable {
    private let lock = NSLock()
    private var items: [String] = []
    func append(_ event: String) { lock.withLock { items.append(event) } }
    var all: [String] { lock.withLock { items } }
    func clear() { lock.withLock { items = [] } }
}

/// A presenter that writes down every callback, named as in the protocol.
final class RecordingPresenter: FilePresenter, @unchecked Sendable {
    private let lock = NSLock()
    private var url: URL?
    let presentedItemOperationQueue = OperationQueue()
    let events = Events()
    /// When set, relinquish and save callbacks never answer.
    var isStuck = false
    /// What it tells the daemon to wait for.
    var awaited: FilePresenterRequests = .all
    var awaitedRequests: FilePresenterRequests { awaited }

    /// - Parameter concurrent: its queue runs operations side by side (Apple's presenters are
    ///   asked for a serial one, but nothing stops them).
    init(_ url: URL, concurrent: Bool = false) {
        self.url = url
        presentedItemOperationQueue.maxConcurrentOperationCount = concurrent ? 4 : 1
    }

    /// How long each callback takes, at random in this range (a presenter that works as it hears).
    var callbackDelay: ClosedRange<useconds_t> = 0...0

    /// Every callback is written down, and flagged if it came anywhere but the presenter's queue.
    private func note(_ event: String) {
        if callbackDelay.upperBound > 0 { usleep(.random(in: callbackDelay)) }
        events.append(OperationQueue.current === presentedItemOperationQueue ? event : "off its queue: " + event)
    }

    var presentedItemURL: URL? { lock.withLock { url } }

    func relinquishPresentedItem(toReader reader: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) {
        note("relinquishToReader")
        if !isStuck { reader { self.note("reacquirerRan") } }
    }

    func relinquishPresentedItem(toWriter writer: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) {
        note("relinquishToWriter")
        if !isStuck { writer { self.note("reacquirerRan") } }
    }

    func reacquirePresentedItem() { note("reacquire") }

    func savePresentedItemChanges(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        note("save")
        completionHandler(nil)
    }

    func accommodatePresentedItemDeletion(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        note("accommodateDeletion")
        completionHandler(nil)
    }

    func presentedItemDidMove(to newURL: URL) {
        note("didMove \(newURL.path)")
        lock.withLock { url = newURL }
    }

    func presentedItemDidChange() { note("didChange") }
    func presentedSubitemDidAppear(at url: URL) { note("subitemDidAppear \(url.lastPathComponent)") }
    func presentedSubitemDidChange(at url: URL) { note("subitemDidChange \(url.lastPathComponent)") }

    func presentedSubitem(at oldURL: URL, didMoveTo newURL: URL) {
        note("subitemDidMove \(oldURL.lastPathComponent) \(newURL.lastPathComponent)")
    }

    func accommodatePresentedSubitemDeletion(at url: URL, completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        note("accommodateSubitemDeletion \(url.lastPathComponent)")
        completionHandler(nil)
    }
}

extension XCTestCase {
    /// Polls until `condition` holds.
    func eventually(_ what: String, timeout: TimeInterval = 3, _ condition: () -> Bool,
                    file: StaticString = #filePath, line: UInt = #line) {
        let deadline = Date().addingTimeInterval(timeout)
        while !condition() {
            if Date() > deadline { return XCTFail("timed out waiting for: \(what)", file: file, line: line) }
            usleep(5_000)
        }
    }

    func makeTemporaryDirectory() -> URL {
        var template = Array("/tmp/cfs-fc-XXXXXX".utf8CString)
        let path = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
        return URL(fileURLWithPath: path, isDirectory: true)
    }
}
