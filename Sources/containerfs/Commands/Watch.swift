import ArgumentParser
import FileCoordination
import Foundation

struct WatchCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "watch",
        abstract: "Register file presenters for items in a ContainerFS mount and print what they hear.",
        discussion: """
        One line per event, named after the FilePresenter callback (presentedItemDidChange, \
        presentedItemDidMove, accommodatePresentedItemDeletion, presentedSubitemDidAppear, \
        relinquishPresentedItemToWriter, savePresentedItemChanges, presentedItemDidGainVersion, ...), \
        then the path, and the new path for moves. With --json, one JSON object a line: {"event", \
        "path", "newPath"?, "watched"}. \
        --on-save and --on-relinquish run a shell command (sh -c) when asked to save or to \
        relinquish, and answer the daemon when it ends; the command sees CONTAINERFS_EVENT and \
        CONTAINERFS_PATH. Other processes' operations wait only for those answers: without them the \
        watcher hears every request but holds nothing up. Runs until interrupted.
        """
    )

    @Flag(help: "Print one JSON object a line.") var json = false
    @Option(help: ArgumentHelp("Run this shell command when asked to save; answer when it ends.", valueName: "command"))
    var onSave: String?
    @Option(help: ArgumentHelp("Run this shell command when asked to relinquish (to a reader or a writer); answer when it ends.",
                               valueName: "command"))
    var onRelinquish: String?
    @Flag(help: "Also watch paths outside a ContainerFS mount (only this process's own accesses would be heard).")
    var allowOutsideMount = false
    @Argument(help: "Files or directories to watch.") var paths: [String]

    func validate() throws {
        guard !paths.isEmpty else { throw ValidationError("Give at least one path to watch.") }
    }

    func run() throws {
        let output = EventPrinter(json: json)
        FileCoordinator.connectionLostHandler = { socketPath in
            printError("containerfs watch: lost the connection to the daemon at \(socketPath); presenters are gone.")
            Foundation.exit(1)
        }
        var presenters: [WatchPresenter] = []
        for path in paths {
            let url = URL(fileURLWithPath: path).standardizedFileURL
            let location = MountLocator().locate(url)
            if location == nil && !allowOutsideMount {
                printError("\(path) is not in a ContainerFS mount (it has no user.containerfs.control-socket attribute); nothing would be heard.")
                throw ExitCode(1)
            }
            // The library registers presenters whenever it can reach the daemon; a watcher that
            // cannot now would sit hearing nothing.
            if let location {
                do {
                    try ControlClient(socketPath: location.socketPath, clientName: "containerfs watch").close()
                } catch {
                    printError("containerfs watch: \(error); nothing would be heard from \(path).")
                    throw ExitCode(1)
                }
            }
            let presenter = WatchPresenter(url: url, output: output, onSave: onSave, onRelinquish: onRelinquish)
            FileCoordinator.addFilePresenter(presenter)
            presenters.append(presenter)
        }
        withExtendedLifetime(presenters) {
            dispatchMain()
        }
    }
}

/// Prints events, one line each, flushed at once.
final class EventPrinter: @unchecked Sendable {
    private let json: Bool
    private let lock = NSLock()

    init(json: Bool) { self.json = json }

    func print(_ event: String, path: URL, newPath: URL? = nil, watched: URL) {
        var line: String
        if json {
            var object: [String: String] = ["event": event, "path": path.path, "watched": watched.path]
            if let newPath { object["newPath"] = newPath.path }
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
            line = (try? String(decoding: encoder.encode(object), as: UTF8.self)) ?? "{}"
        } else {
            line = "\(event) \(path.path)"
            if let newPath { line += " \(newPath.path)" }
        }
        lock.withLock {
            FileHandle.standardOutput.write(Data((line + "\n").utf8))
        }
    }
}

/// A presenter that reports every callback and optionally runs a command before answering.
final class WatchPresenter: FilePresenter, @unchecked Sendable {
    private let lock = NSLock()
    private var url: URL
    private let watched: URL
    private let output: EventPrinter
    private let onSave: String?
    private let onRelinquish: String?
    let presentedItemOperationQueue: OperationQueue = {
        let queue = OperationQueue()
        queue.maxConcurrentOperationCount = 1
        return queue
    }()

    init(url: URL, output: EventPrinter, onSave: String?, onRelinquish: String?) {
        self.url = url
        self.watched = url
        self.output = output
        self.onSave = onSave
        self.onRelinquish = onRelinquish
    }

    var presentedItemURL: URL? { lock.withLock { url } }

    /// Only what a hook acts on is worth waiting for; the rest is printed and answered at once.
    var awaitedRequests: FilePresenterRequests {
        var requests: FilePresenterRequests = []
        if onSave != nil { requests.insert(.save) }
        if onRelinquish != nil { requests.formUnion([.relinquishToReader, .relinquishToWriter]) }
        return requests
    }
    private var current: URL { lock.withLock { url } }

    private func report(_ event: String, _ path: URL? = nil, newPath: URL? = nil) {
        output.print(event, path: path ?? current, newPath: newPath, watched: watched)
    }

    /// Runs `sh -c command` and calls `done` with its success once it ends, off the presenter's queue.
    private func run(_ command: String?, event: String, done: @escaping @Sendable (Bool) -> Void) {
        guard let command else { return done(true) }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/sh")
        process.arguments = ["-c", command]
        var environment = ProcessInfo.processInfo.environment
        environment["CONTAINERFS_EVENT"] = event
        environment["CONTAINERFS_PATH"] = current.path
        process.environment = environment
        process.terminationHandler = { done($0.terminationStatus == 0) }
        do {
            try process.run()
        } catch {
            printError("cannot run \(command): \(error)")
            done(false)
        }
    }

    func relinquishPresentedItem(toReader reader: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) {
        report("relinquishPresentedItemToReader")
        run(onRelinquish, event: "relinquishPresentedItemToReader") { _ in reader(nil) }
    }

    func relinquishPresentedItem(toWriter writer: @escaping @Sendable ((@Sendable () -> Void)?) -> Void) {
        report("relinquishPresentedItemToWriter")
        run(onRelinquish, event: "relinquishPresentedItemToWriter") { _ in writer(nil) }
    }

    func reacquirePresentedItem() { report("reacquirePresentedItem") }

    func savePresentedItemChanges(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        report("savePresentedItemChanges")
        run(onSave, event: "savePresentedItemChanges") { succeeded in
            completionHandler(succeeded ? nil : CocoaError(.fileWriteUnknown))
        }
    }

    func accommodatePresentedItemDeletion(completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        report("accommodatePresentedItemDeletion")
        completionHandler(nil)
    }

    func presentedItemDidMove(to newURL: URL) {
        let old = current
        lock.withLock { url = newURL }
        report("presentedItemDidMove", old, newPath: newURL)
    }

    func presentedItemDidChange() { report("presentedItemDidChange") }
    func presentedSubitemDidAppear(at url: URL) { report("presentedSubitemDidAppear", url) }
    func presentedSubitemDidChange(at url: URL) { report("presentedSubitemDidChange", url) }
    func presentedSubitem(at oldURL: URL, didMoveTo newURL: URL) { report("presentedSubitemDidMove", oldURL, newPath: newURL) }
    func presentedItemDidGain(_ version: FileVersion) { report("presentedItemDidGainVersion") }
    func presentedSubitem(at url: URL, didGain version: FileVersion) { report("presentedSubitemDidGainVersion", url) }

    func accommodatePresentedSubitemDeletion(at url: URL, completionHandler: @escaping @Sendable ((any Error)?) -> Void) {
        report("accommodatePresentedSubitemDeletion", url)
        completionHandler(nil)
    }
}
