import ArgumentParser
import Containers

struct Install: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Install an app bundle into a store (created if needed).",
        discussion: "Reinstalling an app replaces its bundle and keeps its Documents and Library."
    )

    @Argument(help: "The store directory.") var store: String
    @Argument(help: "The app bundle, a directory named Name.app.") var bundle: String
    @Option(help: "The app ID (default: the bundle's CFBundleIdentifier, else local.NAME).") var id: String?
    @Option(name: .customLong("group"),
            help: "An app group the app joins, as group.com.example.shared (repeatable): a container shared by the group's apps and closed to others. A reinstall without --group keeps the app's groups.")
    var groups: [String] = []

    func run() throws {
        let store = try Store.openOrCreate(store)
        let appID = try id.map(parseAppID)
        let groupIDs = try groups.map(parseAppID)
        let record = try Installer.install(bundle: bundle, into: store, id: appID, groups: groupIDs.isEmpty ? nil : groupIDs,
                                           progress: TerminalProgressBar())
        print("Installed \(record.bundleName) as \(record.id) in \(store.root)")
        for group in record.groupIDs {
            print("In the group \(group), whose shared container is \(store.containerPath(group))")
        }
    }
}

struct List: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "List the apps installed in a store.")

    @Argument(help: "The store directory.") var store: String

    func run() throws {
        let store = try Store.open(store)
        for app in try store.apps() {
            print("\(app.id)\t\(app.bundleName)" + (app.groupIDs.isEmpty ? "" : "\t" + app.groupIDs.map(\.rawValue).joined(separator: ",")))
        }
    }
}

func parseAppID(_ text: String) throws -> AppID {
    guard let id = AppID(text) else {
        throw ValidationError("'\(text)' is not a valid app ID: use letters, digits, '.', '-' and '_', as in com.example.notes.")
    }
    return id
}
