import ArgumentParser
import Containers

struct VerifyCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "verify",
        abstract: "Check installed bundles against the seals made when they were installed.",
        discussion: "Prints each file that was changed, added or removed since sealing, and exits with status 1 if any bundle fails its seal."
    )

    @Argument(help: "The store directory.") var store: String
    @Argument(help: "The app to check (default: every installed app).") var id: String?

    func run() throws {
        let store = try Store.open(store)
        let ids = try appIDs(id, in: store)
        if ids.isEmpty { print("No apps are installed in \(store.root).") }
        var broken: [AppID] = []
        for id in ids {
            let report = try Seal.verify(store: store, id: id, depth: .full, progress: TerminalProgressBar())
            if report.isIntact {
                print("\(id): \(report.bundleName) intact (\(report.itemsChecked) items)")
                continue
            }
            broken.append(id)
            for finding in report.findings {
                print(finding.path.isEmpty ? "\(id): \(finding)" : "\(id): \(report.bundleName)/\(finding)")
            }
        }
        if !broken.isEmpty {
            printError("\(broken.count) of \(ids.count) apps fail their seal. Reinstall each with `containerfs install \(store.root) PATH/TO/Name.app`; its Documents and Library are kept.")
            throw ExitCode(1)
        }
    }
}
