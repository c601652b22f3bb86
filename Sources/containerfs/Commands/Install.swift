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

    func run() throws {
        let store = try Store.openOrCreate(store)
        let appID = try id.map(parseAppID)
        let record = try Installer.install(bundle: bundle, into: store, id: appID, progress: TerminalProgressBar())
        print("Installed \(record.bundleName) as \(record.id) in \(store.root)")
    }
}

struct List: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "List the apps installed in a store.")

    @Argument(help: "The store directory.") var store: String

    func run() throws {
        let store = try Store.open(store)
        for app in try store.apps() {
            print("\(app.id)\t\(app.bundleName)")
        }
    }
}

func parseAppID(_ text: String) throws -> AppID {
    guard let id = AppID(text) else {
        throw ValidationError("'\(text)' is not a valid app ID: use letters, digits, '.', '-' and '_', as in com.example.notes.")
    }
    return id
}
