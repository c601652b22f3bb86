import ArgumentParser
import Containers

struct DeliverCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "deliver",
        abstract: "Hand files to an app (\"open in\"): copy them into its Documents/Inbox.",
        discussion: "A name already in the Inbox gets a number, as on iOS: report.pdf, report-1.pdf, report-2.pdf. Works whether or not the store is mounted; the originals stay where they are."
    )

    @Argument(help: "The store directory.") var store: String
    @Argument(help: "The app to deliver to.") var id: String
    @Argument(help: "The files or directories to deliver.") var files: [String] = []

    func validate() throws {
        if files.isEmpty { throw ValidationError("Name at least one file to deliver.") }
    }

    func run() throws {
        let store = try Store.open(store)
        let appID = try parseAppID(id)
        for item in try Inbox.deliver(files, to: appID, in: store) {
            print("\(item.source) -> \(appID)/\(item.containerPath)")
        }
    }
}
