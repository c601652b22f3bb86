import ArgumentParser
import Containers
import FileCoordination
import Foundation

/// `containerfs versions FILE`: a file's previous versions, as the mount kept them (docs/versions.md).
struct VersionsCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "versions",
        abstract: "List, or remove, the previous versions the mount kept of a file.",
        discussion: """
        One line per version, oldest first: its identifier, when it was replaced, its size, and the \
        path where its contents can be read (in the store). `containerfs restore-version FILE ID` \
        puts one back. Versions are kept for files in Documents and Library when a whole-file write \
        or a save replaces them (mount options versions, version_age, version_space, version_floor, version_spacing).
        """
    )

    @Argument(help: "A file in a ContainerFS mount.") var path: String
    @Option(help: ArgumentHelp("Remove this version (an identifier from the list), or 'all'.", valueName: "id"))
    var remove: String?

    func run() throws {
        let url = URL(fileURLWithPath: path).standardizedFileURL
        guard let versions = FileVersion.otherVersionsOfItem(at: url) else {
            throw ContainerError("\(path): no such file.")
        }
        if versions.isEmpty {
            guard let directory = FileVersion.versionsDirectory(of: url) else {
                throw ContainerError("\(path): no versions are kept for it: it is not a file in Documents or Library of a ContainerFS mount that keeps versions (mount option versions=N).")
            }
            if access(directory, R_OK | X_OK) != 0, errno == EACCES {
                throw ContainerError("\(path): its versions are in its store, at \(directory), which only the store's owner may read.")
            }
        }
        if let remove {
            let chosen = remove == "all" ? versions : versions.filter { $0.persistentIdentifier == remove }
            guard !chosen.isEmpty else { throw ContainerError("\(path) has no version \(remove); `containerfs versions \(path)` lists them.") }
            for version in chosen { try version.remove() }
            print("Removed \(chosen.count) version\(chosen.count == 1 ? "" : "s") of \(path).")
            return
        }
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        for version in versions {
            let size = (try? FileManager.default.attributesOfItem(atPath: version.url.path)[.size] as? NSNumber)?.int64Value ?? 0
            print("\(version.persistentIdentifier)\t\(version.replacementDate.map(formatter.string) ?? "")\t\(ByteCount.describe(size))\t\(version.url.path)")
        }
    }
}

/// `containerfs restore-version FILE ID`: a previous version's contents put back, as one
/// coordinated, atomic replace (the contents it replaces become a version in turn).
struct RestoreVersionCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "restore-version",
        abstract: "Put a previous version of a file back (the current contents become a version).",
        discussion: "ID is an identifier that `containerfs versions FILE` lists. Presenters of the file hear that it changed."
    )

    @Argument(help: "A file in a ContainerFS mount.") var path: String
    @Argument(help: "The version to put back.") var id: String

    func run() throws {
        let url = URL(fileURLWithPath: path).standardizedFileURL
        guard let version = FileVersion.version(itemAt: url, forPersistentIdentifier: id), version.replacementDate != nil else {
            throw ContainerError("\(path) has no version \(id); `containerfs versions \(path)` lists them.")
        }
        var failure: Error?
        try FileCoordinator().coordinate(writingItemAt: url, options: .forReplacing) { url in
            do { try version.replaceItem(at: url) } catch { failure = error }
        }
        if let failure { throw ContainerError("\(path): could not put back version \(id): \(failure)") }
        print("Restored \(path) to version \(id).")
    }
}
