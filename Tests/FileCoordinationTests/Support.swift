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
    let presentedItemOperationQueue: OperationQueue = {
        let queue = OperationQueue()
        queue.maxConcurrentOperationCount = 1
        return queue
    }()
    let events = Events()
    /// When set, relinquish and save callbacks never answer.
    var isStuck = false
    /// What it tells the daemon to wait for.
    var awaited: FilePresenterRequests = .all
    var awaitedRequests: FilePresenterRequests { awaited }

    init(_ url: URL) { self.url = url }

    var presentedItemURL: URL? { lock.withLock { url } }

    func relinquishPresentedItem(toReader reader: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) {
        events.append("relinquishToReader")
        if !isStuck { reader { self.events.append("reacquirerRan") } }
    }

    func relinquishPresentedItem(toWriter writer: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) {
        events.append("relinquishToWriter")
        if !isStuck { writer { self.events.append("reacquirerRan") } }
    }

    func reacquirePresentedItem() { events.append("reacquire") }

    func savePresentedItemChanges(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        events.append("save")
        completionHandler(nil)
    }

    func accommodatePresentedItemDeletion(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        events.append("accommodateDeletion")
        completionHandler(nil)
    }

    func presentedItemDidMove(to newURL: URL) {
        events.append("didMove \(newURL.path)")
        lock.withLock { url = newURL }
    }

    func presentedItemDidChange() { events.append("didChange") }
    func presentedSubitemDidAppear(at url: URL) { events.append("subitemDidAppear \(url.lastPathComponent)") }
    func presentedSubitemDidChange(at url: URL) { events.append("subitemDidChange \(url.lastPathComponent)") }

    func presentedSubitem(at oldURL: URL, didMoveTo newURL: URL) {
        events.append("subitemDidMove \(oldURL.lastPathComponent) \(newURL.lastPathComponent)")
    }

    func accommodatePresentedSubitemDeletion(at url: URL, completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        events.append("accommodateSubitemDeletion \(url.lastPathComponent)")
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
