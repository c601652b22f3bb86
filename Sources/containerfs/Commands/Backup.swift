import ArgumentParser
import Containers

struct BackupCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "backup",
        abstract: "Save an app's Documents and Library to an archive.",
        discussion: "Leaves out tmp, Library/Caches and every item marked with the extended attribute \(Backup.excludeAttribute) (set it with `setfattr -n \(Backup.excludeAttribute) -v 1 FILE`). Keeps modes, times and user.* extended attributes."
    )

    @Argument(help: "The store directory.") var store: String
    @Argument(help: "The app to back up.") var id: String
    @Argument(help: "The archive to write (replaced only once the new one is complete).") var archive: String

    func run() throws {
        let store = try Store.open(store)
        let appID = try parseAppID(id)
        let summary = try Backup.create(store: store, id: appID, archive: archive, progress: TerminalProgressBar())
        print("Backed up \(appID) to \(archive): \(summary.files) files (\(ByteCount.describe(Int64(summary.bytes)))), \(summary.directories) folders, \(summary.symlinks) symlinks.")
        for path in summary.excluded { print("Left out \(path): marked excluded from backup.") }
        for path in summary.skipped { print("Left out \(path): not a file, folder or symlink.") }
    }
}
