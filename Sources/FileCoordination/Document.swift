import Coordination
import Foundation

/// A document in the spirit of UIDocument and NSDocument, the way Apple's guide to file
/// coordination recommends handling user documents: it reads and saves through coordination, saves
/// each change as one atomic replace, autosaves, and presents its file, so that a change another
/// process makes is noticed and either reloaded (nothing unsaved here) or kept as a conflict copy
/// beside the file (docs/client-library.md, "Documents").
///
/// Subclass it: override `contents()` and `load(fromContents:)`, call `updateChangeCount()` after
/// each edit. All state is guarded by the document's queue (`presentedItemOperationQueue`, serial);
/// the public methods may be called from any thread.
open class Document: FilePresenter, @unchecked Sendable {
    /// Where the document is; follows moves.
    public var fileURL: URL { state.withLock { $0.url } }
    public var presentedItemURL: URL? { fileURL }
    public let presentedItemOperationQueue: OperationQueue
    /// Seconds between an edit and its autosave; nil turns autosave off.
    public let autosaveDelay: Double?

    private struct State {
        var url: URL
        var unsaved = 0
        var isOpen = false
        var autosave: DispatchWorkItem?
    }
    private let state: Locked<State>

    public init(fileURL: URL, autosaveDelay: Double? = 2) {
        state = Locked(State(url: fileURL))
        self.autosaveDelay = autosaveDelay
        presentedItemOperationQueue = OperationQueue()
        presentedItemOperationQueue.maxConcurrentOperationCount = 1
    }

    // MARK: Overridden by subclasses

    /// The document's contents, to save.
    open func contents() throws -> Data { Data() }

    /// Takes contents read from the file (at open, or when another process changed it).
    open func load(fromContents data: Data) throws {}

    /// Another process changed the file while this one had unsaved changes: the other version is
    /// kept at `conflictURL`, and this document keeps its own. The default does nothing more.
    open func conflictKept(at conflictURL: URL) {}

    // MARK: Opening, editing, saving

    public var hasUnsavedChanges: Bool { state.withLock { $0.unsaved > 0 } }

    /// Reads the file through a coordinated read and starts presenting it.
    public func open() throws {
        try reload()
        let first = state.withLock { state -> Bool in
            defer { state.isOpen = true }
            return !state.isOpen
        }
        if first { FileCoordinator.addFilePresenter(self) }
    }

    /// Saves what is unsaved, and stops presenting the file.
    public func close() throws {
        defer {
            let wasOpen = state.withLock { state -> Bool in
                state.autosave?.cancel()
                defer { state.isOpen = false }
                return state.isOpen
            }
            if wasOpen { FileCoordinator.removeFilePresenter(self) }
        }
        if hasUnsavedChanges { try save() }
    }

    /// Records an edit; an autosave follows after `autosaveDelay`.
    public func updateChangeCount() {
        guard let autosaveDelay else { return state.withLock { $0.unsaved += 1 } }
        let item = DispatchWorkItem { [weak self] in try? self?.save() }
        state.withLock { state in
            state.unsaved += 1
            state.autosave?.cancel()
            state.autosave = item
        }
        DispatchQueue.global().asyncAfter(deadline: .now() + autosaveDelay, execute: item)
    }

    /// Writes the contents through a coordinated write, as one atomic replace of the file: a
    /// reader sees the previous version or this one, never half of it.
    public func save() throws {
        try save { url, write in
            try FileCoordinator(filePresenter: self).coordinate(writingItemAt: url, options: .forReplacing) { try write($0) }
        }
    }

    /// Saves through `coordinate`, which runs the write given inside a coordinated access, or not.
    private func save(_ coordinate: (URL, (URL) throws -> Void) throws -> Void) throws {
        let (url, edits) = state.withLock { ($0.url, $0.unsaved) }
        let data = try contents()
        try coordinate(url) { try Document.replace($0, with: data) }
        state.withLock { $0.unsaved = max(0, $0.unsaved - edits) }
    }

    private func reload() throws {
        let url = fileURL
        let data = try FileCoordinator(filePresenter: self).coordinate(readingItemAt: url) { try Data(contentsOf: $0) }
        try load(fromContents: data)
    }

    /// Writes `data` as `url`'s new version, whole or not at all. Inside a ContainerFS mount a
    /// truncating write is that already: the daemon writes a shadow and publishes it at the close,
    /// and no temporary file shows to folder presenters. Elsewhere, a temporary file beside `url`,
    /// synced and renamed over it, as a local disk offers.
    static func replace(_ url: URL, with data: Data) throws {
        let inMount = Placement.locator.locate(url.deletingLastPathComponent()) != nil
        let target = inMount ? url : url.deletingLastPathComponent()
            .appendingPathComponent(".\(url.lastPathComponent).saving-\(getpid())-\(UInt32.random(in: 0...UInt32.max))")
        let descriptor = Glibc.open(target.path, O_WRONLY | O_CREAT | O_CLOEXEC | (inMount ? O_TRUNC : O_EXCL), 0o644)
        guard descriptor >= 0 else { throw CocoaError.error(.fileWriteUnknown, userInfo: nil, url: target) }
        var failure: Int32 = 0
        data.withUnsafeBytes { bytes in
            var offset = 0
            while offset < bytes.count {
                let written = write(descriptor, bytes.baseAddress! + offset, bytes.count - offset)
                if written < 0 { if errno == EINTR { continue }; failure = errno; return }
                offset += written
            }
        }
        if failure == 0, fsync(descriptor) != 0 { failure = errno }
        if Glibc.close(descriptor) != 0, failure == 0 { failure = errno }
        if failure == 0, !inMount, rename(target.path, url.path) != 0 { failure = errno }
        if failure != 0 {
            if !inMount { unlink(target.path) }
            throw CocoaError.error(.fileWriteUnknown, userInfo: [NSUnderlyingErrorKey: POSIXError(POSIXErrorCode(rawValue: failure) ?? .EIO)], url: url)
        }
    }

    // MARK: FilePresenter

    /// Another process saved: reload, or keep its version as a conflict copy if this one has
    /// unsaved changes. Not on the presenter's queue: the writer's access ends only once this
    /// callback has returned, and the read must wait for that.
    public func presentedItemDidChange() {
        DispatchQueue.global().async { self.otherVersionSaved() }
    }

    private func otherVersionSaved() {
        guard state.withLock({ $0.isOpen }) else { return }
        guard hasUnsavedChanges else {
            try? reload()
            return
        }
        let url = fileURL
        let name = url.deletingPathExtension().lastPathComponent + " (conflict)"
        let conflictURL = url.deletingLastPathComponent()
            .appendingPathComponent(url.pathExtension.isEmpty ? name : name + "." + url.pathExtension)
        do {
            try FileCoordinator(filePresenter: self).coordinate(readingItemAt: url, options: [.withoutChanges],
                                                               writingItemAt: conflictURL, options: .forReplacing) { source, copy in
                try Document.replace(copy, with: Data(contentsOf: source))
            }
            conflictKept(at: conflictURL)
        } catch {
            return
        }
    }

    /// A reader of another process waits, its access granted, for this save: written without a
    /// coordinator of its own, which would wait for that reader.
    public func savePresentedItemChanges(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        do {
            if hasUnsavedChanges { try save { url, write in try write(url) } }
            completionHandler(nil)
        } catch {
            completionHandler(error)
        }
    }

    public func presentedItemDidMove(to newURL: URL) {
        state.withLock { $0.url = newURL }
    }

    public func accommodatePresentedItemDeletion(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        let wasOpen = state.withLock { state -> Bool in
            state.autosave?.cancel()
            defer { state.isOpen = false }
            return state.isOpen
        }
        if wasOpen { FileCoordinator.removeFilePresenter(self) }
        completionHandler(nil)
    }
}
