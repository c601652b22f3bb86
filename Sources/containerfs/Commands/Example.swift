import ArgumentParser
import FileCoordination
import Foundation

/// A small app written the way an iOS app uses NSFileCoordinator and NSFilePresenter, against the
/// FileCoordination library's public API only: it presents a notes folder, keeps an INDEX.md of
/// the notes' titles up to date as notes appear, change, move or go away, and can add a note.
/// Hidden; documented in docs/client-library.md.
struct ExampleNotesCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "example-notes",
        abstract: "Example app: keep DIRECTORY/INDEX.md listing the titles of the *.txt notes in DIRECTORY.",
        shouldDisplay: false
    )

    @Option(help: "Add a note with this title (and a body from --body) first.") var add: String?
    @Option(help: "The new note's body.") var body: String = ""
    @Flag(help: "Index once and exit instead of following changes.") var once = false
    @Option(name: .customLong("for"), help: "Follow changes for this many seconds, then exit.") var duration: Double?
    @Argument(help: "The notes directory.") var directory: String

    func run() throws {
        let folder = NotesFolder(URL(fileURLWithPath: directory, isDirectory: true).standardizedFileURL)
        FileCoordinator.addFilePresenter(folder)
        defer { FileCoordinator.removeFilePresenter(folder) }
        if let add { try folder.addNote(title: add, body: body) }
        try folder.rebuildIndex()
        if once { return }
        if let duration {
            Thread.sleep(forTimeInterval: duration)
        } else {
            dispatchMain()
        }
    }
}

/// The notes folder, as the example app presents it.
final class NotesFolder: FilePresenter, @unchecked Sendable {
    static let indexName = "INDEX.md"

    let presentedItemURL: URL?
    let presentedItemOperationQueue: OperationQueue = {
        let queue = OperationQueue()
        queue.maxConcurrentOperationCount = 1
        queue.name = "notes folder presenter"
        return queue
    }()
    private let directory: URL

    init(_ directory: URL) {
        self.directory = directory
        self.presentedItemURL = directory
    }

    /// Writes a new note through a coordinated write: other presenters of the folder hear that a
    /// subitem appeared; this one, whose coordinator it is, does not.
    func addNote(title: String, body: String) throws {
        let name = title.lowercased().map { $0.isLetter || $0.isNumber ? $0 : "-" }
        let url = directory.appendingPathComponent(String(name) + ".txt")
        try FileCoordinator(filePresenter: self).coordinate(writingItemAt: url) { url in
            try Data("\(title)\n\(body)\n".utf8).write(to: url, options: .atomic)
        }
        print("added \(url.lastPathComponent)")
    }

    /// Reads every note's first line under coordinated reads, then writes the index under a
    /// coordinated write.
    func rebuildIndex() throws {
        let coordinator = FileCoordinator(filePresenter: self)
        let names = try coordinator.coordinate(readingItemAt: directory) { url in
            try FileManager.default.contentsOfDirectory(atPath: url.path).filter { $0.hasSuffix(".txt") }.sorted()
        }
        var entries: [String] = []
        for name in names {
            let note = directory.appendingPathComponent(name)
            let title: String? = try? coordinator.coordinate(readingItemAt: note) { url in
                let text = try String(contentsOf: url, encoding: .utf8)
                return text.split(separator: "\n", omittingEmptySubsequences: true).first.map(String.init)
            }
            entries.append("- \(title ?? name) (\(name))")
        }
        let index = "# Notes\n\n" + entries.map { $0 + "\n" }.joined()
        try coordinator.coordinate(writingItemAt: directory.appendingPathComponent(Self.indexName)) { url in
            try Data(index.utf8).write(to: url, options: .atomic)
        }
        print("indexed \(names.count) notes")
        fflush(nil)  // every output stream: Glibc's stdout is a global variable
    }

    private func changed(_ url: URL) {
        guard url.lastPathComponent != Self.indexName else { return }
        // Off the presenter queue: coordinating from it could wait for this presenter itself.
        DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(100)) { [self] in
            do { try rebuildIndex() } catch { printError("example-notes: \(error)") }
        }
    }

    func presentedSubitemDidAppear(at url: URL) { changed(url) }
    func presentedSubitemDidChange(at url: URL) { changed(url) }
    func presentedSubitem(at oldURL: URL, didMoveTo newURL: URL) { changed(newURL) }

    func accommodatePresentedSubitemDeletion(at url: URL, completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        completionHandler(nil)
        changed(url)
    }

    /// Nothing is ever left unsaved: every change is written at once.
    func savePresentedItemChanges(completionHandler: @escaping @Sendable ((any Error)?) -> Void) { completionHandler(nil) }
}

/// An example app's document, for trying `Document` between processes: opens FILE, optionally
/// edits it (unsaved), waits, and reports what it holds and any conflict copy. Hidden; used by the
/// tests of documents in a mount.
struct ExampleDocumentCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "example-document",
        abstract: "Example app: open a text document, edit it, save it, and report conflicts.",
        shouldDisplay: false
    )

    @Option(help: "Replace the text with this (an unsaved edit).") var edit: String?
    @Option(help: "Seconds to wait before the edit.") var delay: Double = 0
    @Flag(help: "Save right after the edit.") var save = false
    @Option(help: "Seconds to stay open after the edit, hearing other processes.") var wait: Double = 0
    @Flag(help: "Save before closing (after the wait).") var saveAtEnd = false
    @Argument(help: "The document.") var file: String

    func run() throws {
        let document = TextDocument(fileURL: URL(fileURLWithPath: file).standardizedFileURL, autosaveDelay: nil)
        try document.open()
        print("opened: \(document.text)")
        fflush(nil)
        if let edit {
            Thread.sleep(forTimeInterval: delay)
            document.text = edit
            document.updateChangeCount()
            if save { try document.save() }
        }
        Thread.sleep(forTimeInterval: wait)
        for conflict in document.conflicts { print("conflict kept: \(conflict.lastPathComponent)") }
        if saveAtEnd { try document.save() }
        print("holds: \(document.text)")
        try document.close()
    }
}

/// The example's document: plain text.
final class TextDocument: Document, @unchecked Sendable {
    private let lock = NSLock()
    private var storage = ""
    private var kept: [URL] = []
    var text: String {
        get { lock.withLock { storage } }
        set { lock.withLock { storage = newValue } }
    }
    var conflicts: [URL] { lock.withLock { kept } }

    override func contents() throws -> Data { Data(text.utf8) }
    override func load(fromContents data: Data) throws { text = String(decoding: data, as: UTF8.self) }
    override func conflictKept(at conflictURL: URL) { lock.withLock { kept.append(conflictURL) } }
}
