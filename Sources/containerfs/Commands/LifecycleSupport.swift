import ArgumentParser
import Containers
import Foundation

/// The apps a command works on: the one named, or all of them.
func appIDs(_ text: String?, in store: Store) throws -> [AppID] {
    if let text { return [try parseAppID(text)] }
    return try store.apps().compactMap { AppID($0.id) }
}

/// Asks a yes/no question on the terminal; anything but y or yes is no.
func confirm(_ question: String) -> Bool {
    FileHandle.standardError.write(Data("\(question) [y/N] ".utf8))
    guard let answer = readLine()?.trimmingCharacters(in: .whitespaces).lowercased() else { return false }
    return answer == "y" || answer == "yes"
}

func printError(_ message: String) {
    FileHandle.standardError.write(Data((message + "\n").utf8))
}
