import ArgumentParser
import Containers

struct RestoreCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "restore",
        abstract: "Replace an app's Documents and Library with those in a backup archive.",
        discussion: "The archive is checked in full before anything changes; archives with absolute paths, '..' or symlinks leading out of the container are refused. Install the app first; its tmp is emptied and its caches start empty."
    )

    @Argument(help: "The store directory.") var store: String
    @Argument(help: "The app to restore.") var id: String
    @Argument(help: "An archive made by `containerfs backup`.") var archive: String

    func run() throws {
        let store = try Store.open(store)
        let appID = try parseAppID(id)
        let summary = try Backup.restore(store: store, id: appID, archive: archive, progress: TerminalProgressBar(),
                                         mountCheck: MountRegistry.refuseWhileMounted)
        print("Restored \(appID) from \(archive): \(summary.files) files (\(ByteCount.describe(Int64(summary.bytes)))), \(summary.directories) folders, \(summary.symlinks) symlinks.")
    }
}
