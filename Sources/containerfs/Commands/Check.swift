import ArgumentParser
import Containers
import Foundation

struct CheckCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "check",
        abstract: "Check a store's consistency, and repair what can be repaired safely.",
        discussion: "Reports containers and records that do not match, missing fixed directories, bundles that fail their seal, and scratch left by processes that died. Exits with status 1 when problems remain."
    )

    @Argument(help: "The store directory.") var store: String
    @Flag(help: "Recreate missing directories and remove leftovers of dead processes. Never removes data.")
    var repair = false

    func run() throws {
        let store = try Store.open(store)
        var remaining = 0
        for problem in StoreCheck.problems(in: store) {
            if repair, let mend = problem.repair {
                do {
                    try mend()
                    print("repaired: \(problem)")
                } catch {
                    // The others are still worth mending; what failed stays as it was, to try again.
                    let reason = (error as? POSIXError).map { String(cString: strerror($0.code.rawValue)) } ?? "\(error)"
                    printError("not repaired: \(problem) (\(reason))")
                    remaining += 1
                }
            } else {
                print(problem.repair == nil ? problem.description : "\(problem) (--repair mends it)")
                remaining += 1
            }
        }
        if remaining == 0 {
            print("\(store.root): consistent.")
        } else {
            throw ExitCode(1)
        }
    }
}
