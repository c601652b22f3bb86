import ArgumentParser
import Containers
import Foundation

struct UninstallCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "uninstall",
        abstract: "Remove an app with its container: bundle, Documents, Library and tmp.",
        discussion: "Asks for confirmation on a terminal. Without a terminal, --force is required."
    )

    @Argument(help: "The store directory.") var store: String
    @Argument(help: "The app to remove.") var id: String
    @Flag(help: "Do not ask for confirmation.") var force = false

    func run() throws {
        let store = try Store.open(store)
        let appID = try parseAppID(id)
        let record = try store.record(appID)
        // Groups of which it is the last app lose their shared container with it.
        let lastOf = try record.groupIDs.filter { try store.members(of: $0).map(\.id) == [record.id] }
        let alsoRemoved = lastOf.isEmpty ? "" : ", and the shared container of \(lastOf.map(\.rawValue).joined(separator: ", ")), which no other app uses"
        if !force {
            guard isatty(0) == 1 else {
                throw ContainerError("Nobody can confirm on this input (it is not a terminal). Run `containerfs uninstall \(store.root) \(appID) --force` to remove \(appID) and all its data.")
            }
            guard confirm("Remove \(appID) (\(record.bundleName)) and delete its Documents and Library\(alsoRemoved)? This cannot be undone; `containerfs backup` first to keep the data.") else {
                print("Nothing removed.")
                return
            }
        }
        try Lifecycle.uninstall(store: store, id: appID, mountCheck: MountRegistry.refuseWhileMounted)
        print("Removed \(appID)\(lastOf.isEmpty ? "" : " with " + lastOf.map(\.rawValue).joined(separator: ", ")) from \(store.root).")
    }
}
