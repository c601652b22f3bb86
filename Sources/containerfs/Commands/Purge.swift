import ArgumentParser
import Containers

struct PurgeCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "purge",
        abstract: "Free disk space by removing apps' cached files, least recently used first.",
        discussion: "Files that any process has open are left alone. Without --target-free every other cache file is removed; with it, purging stops once that much space is free, and the exit status is 1 if it cannot get there."
    )

    @Argument(help: "The store directory.") var store: String
    @Flag(help: "Purge Library/Caches of every app (the only kind of purge there is).") var caches = false
    @Option(help: "Stop once this much space is free, such as 2G or 500M.", transform: parseByteCount)
    var targetFree: UInt64?

    func validate() throws {
        if !caches { throw ValidationError("Say what to purge: --caches.") }
    }

    func run() throws {
        let store = try Store.open(store)
        if let targetFree, try FreeSpace.available(at: store.root) >= targetFree {
            print("\(ByteCount.describe(Int64(try FreeSpace.available(at: store.root)))) free already; nothing purged.")
            return
        }
        let openFiles = OpenFileTable.snapshot()
        let report = try CachePurger(store: store, isOpen: openFiles.contains(path:)).purge(targetFreeBytes: targetFree)
        let free = try FreeSpace.available(at: store.root)
        print("Removed \(report.removed.count) cache files (\(ByteCount.describe(Int64(report.freedBytes)))); \(ByteCount.describe(Int64(free))) free now.")
        for file in report.skippedOpen { print("Kept \(file.path): it is open.") }
        if !report.reachedTarget, let targetFree {
            printError("Free space is still below \(ByteCount.describe(Int64(targetFree))): the caches are empty or open. Free space elsewhere, or uninstall apps you no longer need.")
            throw ExitCode(1)
        }
    }
}

func parseByteCount(_ text: String) throws -> UInt64 {
    guard let bytes = ByteCount.parse(text) else {
        throw ValidationError("'\(text)' is not an amount of bytes: write a number, optionally with K, M, G or T, as in 2G.")
    }
    return bytes
}
