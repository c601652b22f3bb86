import Foundation

/// One item handed to an app.
public struct DeliveredItem: Sendable, Equatable {
    /// The file or directory given.
    public let source: String
    /// Its name in the Inbox, which differs from the source's when that name was taken.
    public let name: String
    /// Relative to the container root: `Documents/Inbox/NAME`.
    public var containerPath: String { ContainerLayout.inbox + "/" + name }
}

/// "Open in": the only way files enter an app's `Documents/Inbox`.
///
/// Works on the store's backing directory, mounted or not: each item is copied into the store's
/// work directory, then moved into the Inbox under a name nobody has taken (`RENAME_NOREPLACE`,
/// or link-then-unlink where the filesystem lacks it), so a concurrent delivery or an app's own
/// file never gets overwritten and the app never sees a half-copied file.
public enum Inbox {
    /// The most clashing names tried before giving up.
    static let maximumAttempts = 10_000

    /// Delivers copies of `sources` (files or directories, such as document packages) to `id`.
    @discardableResult
    public static func deliver(_ sources: [String], to id: AppID, in store: Store) throws -> [DeliveredItem] {
        guard store.isInstalled(id) else {
            throw ContainerError("No app \(id) in the store \(store.root). `containerfs list \(store.root)` shows what is installed.")
        }
        try store.repairContainer(id)
        let inbox = try DirectoryHandle(in: DirectoryHandle(path: store.containerPath(id)).descend("Documents"), "Inbox")
        let work = try DirectoryHandle(path: store.workPath)
        return try sources.map { try deliver($0, into: inbox, via: work) }
    }

    private static func deliver(_ source: String, into inbox: DirectoryHandle, via work: DirectoryHandle) throws -> DeliveredItem {
        // The user's own path may go through symlinks: resolve it like any command would.
        let resolved = URL(fileURLWithPath: Store.absolute(source)).resolvingSymlinksInPath().path
        var info = stat()
        guard stat(resolved, &info) == 0 else {
            throw ContainerError("\(source): \(String(cString: strerror(errno))). Give the path of a file or directory to deliver.")
        }
        let name = (resolved as NSString).lastPathComponent
        guard !name.isEmpty, name != "/" else { throw ContainerError("\(source): the root directory cannot be delivered; name a file or folder.") }
        let staged = scratchName("deliver")
        defer { try? FileTree.removeEntry(staged, in: work) }
        switch EntryKind(info) {
        case .file: try copyFile(resolved, to: staged, in: work)
        case .directory: try TreeCopier.copy(from: resolved, to: work.path + "/" + staged)
        case .symlink, .other:
            throw ContainerError("\(source): only files and directories can be delivered, not devices, sockets or pipes.")
        }
        for attempt in 0..<maximumAttempts {
            let candidate = clashFreeName(name, attempt: attempt)
            if try place(staged, from: work, as: candidate, in: inbox, isDirectory: EntryKind(info) == .directory) {
                return DeliveredItem(source: source, name: candidate)
            }
        }
        throw ContainerError("\(inbox.path) already holds \(maximumAttempts) items named like \(name); ask the app to clear its Inbox.")
    }

    /// Moves `staged` into the Inbox as `name` unless that name exists; answers whether it did.
    private static func place(_ staged: String, from work: DirectoryHandle, as name: String,
                              in inbox: DirectoryHandle, isDirectory: Bool) throws -> Bool {
        if LinuxCalls.renameat2(work.fd, staged, inbox.fd, name, LinuxCalls.renameNoReplace) == 0 { return true }
        if errno == EEXIST { return false }
        // No RENAME_NOREPLACE here (old kernel or filesystem): a hard link never replaces either.
        guard (errno == EINVAL || errno == ENOSYS), !isDirectory else { throw posixError("rename", inbox.path + "/" + name) }
        if linkat(work.fd, staged, inbox.fd, name, 0) == 0 { return true }
        if errno == EEXIST { return false }
        throw posixError("link", inbox.path + "/" + name)
    }

    private static func copyFile(_ source: String, to name: String, in work: DirectoryHandle) throws {
        let from = Glibc.open(source, O_RDONLY | O_CLOEXEC)
        guard from >= 0 else { throw posixError("open", source) }
        defer { close(from) }
        var info = stat()
        guard fstat(from, &info) == 0 else { throw posixError("stat", source) }
        let to = openat(work.fd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard to >= 0 else { throw posixError("create", work.path + "/" + name) }
        defer { close(to) }
        try TreeCopier.copyData(from: from, to: to, path: source)
        var times = [info.st_atim, info.st_mtim]
        guard fchmod(to, info.st_mode & 0o777) == 0, futimens(to, &times) == 0, fsync(to) == 0 else {
            throw posixError("finish", work.path + "/" + name)
        }
    }

    /// The name iOS gives the `attempt`-th clash: `report.pdf`, `report-1.pdf`, `report-2.pdf`;
    /// `README`, `README-1`; `.profile`, `.profile-1`; `data.tar.gz`, `data.tar-1.gz`.
    public static func clashFreeName(_ name: String, attempt: Int) -> String {
        guard attempt > 0 else { return name }
        let dot = name.lastIndex(of: ".")
        guard let dot, dot != name.startIndex, name.index(after: dot) != name.endIndex else {
            return "\(name)-\(attempt)"
        }
        return "\(name[..<dot])-\(attempt)\(name[dot...])"
    }
}
