@testable import FileCoordination
import Foundation
import XCTest

/// A text document, as an app would subclass `Document`.
private final class TextDocument: Document, @unchecked Sendable {
    private let lock = NSLock()
    private var storage = ""
    var text: String {
        get { lock.withLock { storage } }
        set { lock.withLock { storage = newValue } }
    }
    private var conflictsKept: [URL] = []
    /// Kept on the presenter's queue; read by the test.
    var conflicts: [URL] { lock.withLock { conflictsKept } }

    override func contents() throws -> Data { Data(text.utf8) }
    override func load(fromContents data: Data) throws { text = String(decoding: data, as: UTF8.self) }
    override func conflictKept(at conflictURL: URL) { lock.withLock { conflictsKept.append(conflictURL) } }
}

/// Two documents on one file behave as two apps' UIDocuments would (outside a mount: in-process
/// coordination, which follows the same plans as the daemon's).
final class DocumentTests: XCTestCase {
    private var directory: URL!
    private var url: URL { directory.appendingPathComponent("note.txt") }

    override func setUpWithError() throws {
        directory = makeTemporaryDirectory()
        Placement.locator = MountLocator()
        try Data("first".utf8).write(to: url)
    }

    override func tearDown() { try? FileManager.default.removeItem(at: directory) }

    private func eventually(_ condition: () -> Bool, _ message: String) {
        let deadline = Date().addingTimeInterval(5)
        while !condition(), Date() < deadline { usleep(10_000) }
        XCTAssertTrue(condition(), message)
    }

    private func opened(autosaveDelay: Double? = nil) throws -> TextDocument {
        let document = TextDocument(fileURL: url, autosaveDelay: autosaveDelay)
        try document.open()
        return document
    }

    func testASaveIsReloadedByAnotherDocumentWithNothingUnsaved() throws {
        let mine = try opened(), theirs = try opened()
        defer { try? mine.close(); try? theirs.close() }
        XCTAssertEqual(theirs.text, "first")
        mine.text = "second"
        mine.updateChangeCount()
        try mine.save()
        XCTAssertFalse(mine.hasUnsavedChanges)
        eventually({ theirs.text == "second" }, "the other document reloads")
        XCTAssertEqual(try String(contentsOf: url, encoding: .utf8), "second")
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: directory.path), ["note.txt"],
                       "a save leaves no temporary file")
    }

    func testAChangeMeetingUnsavedEditsIsKeptAsAConflictCopy() throws {
        let mine = try opened(), theirs = try opened()
        defer { try? mine.close(); try? theirs.close() }
        theirs.text = "their edit"
        theirs.updateChangeCount()
        mine.text = "my save"
        mine.updateChangeCount()
        try mine.save()
        let conflict = directory.appendingPathComponent("note (conflict).txt")
        eventually({ theirs.conflicts == [conflict] }, "the other version is kept beside the file")
        XCTAssertEqual(try String(contentsOf: conflict, encoding: .utf8), "my save")
        XCTAssertEqual(theirs.text, "their edit", "unsaved edits are not lost")
        try theirs.save()
        XCTAssertEqual(try String(contentsOf: url, encoding: .utf8), "their edit")
    }

    func testAReaderElsewhereGetsTheUnsavedEditsSavedFirst() throws {
        let document = try opened()
        defer { try? document.close() }
        document.text = "unsaved"
        document.updateChangeCount()
        let read = try FileCoordinator().coordinate(readingItemAt: url) { try String(contentsOf: $0, encoding: .utf8) }
        XCTAssertEqual(read, "unsaved")
        XCTAssertFalse(document.hasUnsavedChanges)
    }

    func testEditsAreAutosaved() throws {
        let document = try opened(autosaveDelay: 0.1)
        defer { try? document.close() }
        document.text = "autosaved"
        document.updateChangeCount()
        eventually({ (try? String(contentsOf: url, encoding: .utf8)) == "autosaved" }, "autosave")
        eventually({ !document.hasUnsavedChanges }, "saved")
    }
}
