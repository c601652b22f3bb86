import Foundation
import XCTest
// The one line added for Linux. Everything in `NoteDocument` is written as for Foundation on
// Apple's systems (Swift 6): if a line had to change, this target would not build.
import NSFileCoordination

/// A document presenter in the pattern of Apple's guide to file coordination: it registers
/// itself, reads and saves through coordinators made with itself, lets others write, follows moves.
final class NoteDocument: NSObject, NSFilePresenter, @unchecked Sendable {
    var presentedItemURL: URL?
    let presentedItemOperationQueue: OperationQueue = {
        let queue = OperationQueue()
        queue.maxConcurrentOperationCount = 1
        return queue
    }()
    private let lock = NSLock()
    private var heard: [String] = []
    var events: [String] { lock.lock(); defer { lock.unlock() }; return heard }
    private func note(_ event: String) { lock.lock(); heard.append(event); lock.unlock() }

    init(url: URL) {
        presentedItemURL = url
        super.init()
        NSFileCoordinator.addFilePresenter(self)
    }

    func close() { NSFileCoordinator.removeFilePresenter(self) }

    func read() throws -> String {
        var coordinationError: NSError?
        var result: Result<String, Error> = .success("")
        NSFileCoordinator(filePresenter: self).coordinate(readingItemAt: presentedItemURL!, options: [],
                                                          error: &coordinationError) { url in
            result = Result { try String(contentsOf: url, encoding: .utf8) }
        }
        if let coordinationError { throw coordinationError }
        return try result.get()
    }

    func save(_ text: String) throws {
        var coordinationError: NSError?
        var writeError: Error?
        NSFileCoordinator(filePresenter: self).coordinate(writingItemAt: presentedItemURL!, options: .forReplacing,
                                                          error: &coordinationError) { url in
            do { try text.write(to: url, atomically: true, encoding: .utf8) } catch { writeError = error }
        }
        if let error = coordinationError ?? writeError { throw error }
    }

    func saveAsynchronously(_ text: String, completion: @escaping @Sendable (Error?) -> Void) {
        let intent = NSFileAccessIntent.writingIntent(with: presentedItemURL!, options: .forReplacing)
        NSFileCoordinator(filePresenter: self).coordinate(with: [intent], queue: presentedItemOperationQueue) { error in
            if let error { return completion(error) }
            completion(Result { try text.write(to: intent.url, atomically: true, encoding: .utf8) }.failureValue)
        }
    }

    func relinquishPresentedItem(toReader reader: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) {
        note("relinquish to reader")
        reader { self.note("reacquire after reader") }
    }

    func relinquishPresentedItem(toWriter writer: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) {
        note("relinquish to writer")
        writer { self.note("reacquire after writer") }
    }

    func savePresentedItemChanges(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        note("save")
        completionHandler(nil)
    }

    func accommodatePresentedItemDeletion(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        note("deleted")
        completionHandler(nil)
    }

    func presentedItemDidChange() { note("did change") }

    func presentedItemDidMove(to newURL: URL) {
        note("moved to \(newURL.lastPathComponent)")
        presentedItemURL = newURL
    }
}

private extension Result {
    var failureValue: Failure? {
        if case .failure(let error) = self { return error }
        return nil
    }
}

final class ApplePatternTests: XCTestCase {
    func testTwoDocumentsOnOneFileHearEachOtherAsOnApplesSystems() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("apple-pattern-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let url = directory.appendingPathComponent("note.txt")
        try "first".write(to: url, atomically: true, encoding: .utf8)

        let mine = NoteDocument(url: url), theirs = NoteDocument(url: url)
        defer { mine.close(); theirs.close() }
        try mine.save("second")
        XCTAssertEqual(try theirs.read(), "second")
        let saved = expectation(description: "asynchronous save")
        theirs.saveAsynchronously("third") { error in
            XCTAssertNil(error)
            saved.fulfill()
        }
        wait(for: [saved], timeout: 10)
        XCTAssertEqual(try mine.read(), "third")
        mine.presentedItemOperationQueue.waitUntilAllOperationsAreFinished()
        theirs.presentedItemOperationQueue.waitUntilAllOperationsAreFinished()
        // Each heard the other's accesses, never its own.
        XCTAssertEqual(theirs.events, ["relinquish to writer", "did change", "reacquire after writer",
                                       "relinquish to reader", "save", "reacquire after reader"])
        XCTAssertEqual(mine.events, ["relinquish to reader", "save", "reacquire after reader",
                                     "relinquish to writer", "did change", "reacquire after writer"])
    }
}
