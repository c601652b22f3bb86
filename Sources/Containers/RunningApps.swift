import Foundation
import Glibc

/// One sandbox started by `containerfs run`: the app it runs, the inode number of its user
/// namespace (every process of the sandbox is in it, and can make no other), and the pid of the
/// `containerfs run` that waits for it.
public struct RunningApp: Sendable, Equatable {
    public var namespace: UInt64
    public var app: String
    public var launcher: Int32

    public init(namespace: UInt64, app: String, launcher: Int32) {
        self.namespace = namespace
        self.app = app
        self.launcher = launcher
    }

    /// The record's file name: `NAMESPACE.APPID`.
    var fileName: String { "\(namespace).\(app)" }
}

/// The store's running apps, one file per sandbox in `work/running`, named `NAMESPACE.APPID` and
/// holding the launcher's pid. The daemons serving the store watch the directory: a process in a
/// recorded namespace reaches only that app's container (docs/island.md).
public enum RunningApps {
    public static func directory(of store: Store) -> String { store.workPath + "/running" }

    /// Creates the directory, readable by all (the daemons of other users read it), written only by
    /// the store's owner (who runs its apps), also when a daemon running as root makes it. Reached
    /// as every directory of the store's work is (`Store.workDirectory`).
    @discardableResult
    public static func prepare(_ store: Store) throws -> DirectoryHandle {
        let directory = try store.makeWorkDirectory("running")
        var owner = stat(), current = stat()
        guard stat(store.root, &owner) == 0 else { throw posixError("stat", store.root) }
        guard fstat(directory.fd, &current) == 0 else { throw posixError("stat", directory.path) }
        if geteuid() == 0, current.st_uid != owner.st_uid, fchown(directory.fd, owner.st_uid, owner.st_gid) != 0 {
            throw ContainerError("\(directory.path): cannot give it to the store's owner (\(String(cString: strerror(errno)))).")
        }
        return directory
    }

    /// Writes the record whole (a temporary file renamed into place), so a daemon never reads half.
    public static func record(_ app: RunningApp, in store: Store) throws {
        let directory = try prepare(store)
        let path = directory.path + "/" + app.fileName
        let temporary = ".\(app.fileName).\(getpid())"
        let create = { openat(directory.fd, temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o644) }
        var file = create()
        // One left by an earlier launcher of this pid that was killed.
        if file < 0, errno == EEXIST, unlinkat(directory.fd, temporary, 0) == 0 { file = create() }
        guard file >= 0 else { throw posixError("create", directory.path + "/" + temporary) }
        let text = Array("\(app.launcher)\n".utf8)
        let written = write(file, text, text.count)
        let error = written == text.count ? 0 : (written < 0 ? errno : EIO)
        close(file)
        guard error == 0, renameat(directory.fd, temporary, directory.fd, app.fileName) == 0 else {
            let error = error != 0 ? error : errno
            unlinkat(directory.fd, temporary, 0)
            throw ContainerError("\(path): cannot record the running app (\(String(cString: strerror(error)))).")
        }
    }

    public static func remove(_ app: RunningApp, in store: Store) {
        guard let directory = try? store.workDirectory("running") else { return }
        unlinkat(directory.fd, app.fileName, 0)
    }

    /// The records whose launcher still runs. A record left by a launcher that died (killed, or a
    /// machine that stopped) is removed: its namespace is gone with its processes.
    /// Throws when the records cannot be listed: taken for none, another sandbox of an app would
    /// pass for gone.
    public static func list(in store: Store) throws -> [RunningApp] {
        guard let directory = try store.workDirectory("running") else { return [] }
        return try directory.names().compactMap { name -> RunningApp? in
            guard let (namespace, app) = parse(name),
                  let file = try? directory.openFile(name), let launcher = launcher(in: file) else { return nil }
            if kill(launcher, 0) != 0, errno == ESRCH {
                unlinkat(directory.fd, name, 0)
                return nil
            }
            return RunningApp(namespace: namespace, app: app, launcher: launcher)
        }.sorted { ($0.app, $0.namespace) < ($1.app, $1.namespace) }
    }

    /// The launcher's pid a record open as `file` holds; closes it.
    private static func launcher(in file: Int32) -> Int32? {
        defer { close(file) }
        var buffer = [UInt8](repeating: 0, count: 32)
        let count = read(file, &buffer, buffer.count)
        guard count > 0 else { return nil }
        return Int32(String(decoding: buffer[..<count], as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines))
    }

    /// The sandboxes recorded in `store`, by their records' names alone (what the daemons go by).
    /// Throws when the records cannot be listed: taken for none, an app's processes would pass
    /// for unconfined ones.
    public static func recorded(in store: Store) throws -> [(namespace: UInt64, app: String)] {
        try names(in: store).compactMap(parse)
    }

    /// The names in the records' directory (none while it does not exist).
    private static func names(in store: Store) throws -> [String] {
        try store.workDirectory("running")?.names() ?? []
    }

    /// `NAMESPACE.APPID` split, or nil for any other name (temporary files start with a dot).
    public static func parse(_ name: String) -> (UInt64, String)? {
        guard let dot = name.firstIndex(of: "."), let namespace = UInt64(name[..<dot]) else { return nil }
        let app = String(name[name.index(after: dot)...])
        guard AppID(app) != nil else { return nil }
        return (namespace, app)
    }

    /// The inode number of `pid`'s user namespace (`/proc/PID/ns/user`), or nil if it cannot be
    /// read. The path is made without allocating: daemons ask on every request while an app runs.
    public static func userNamespace(of pid: pid_t) -> UInt64? {
        withUnsafeTemporaryAllocation(of: CChar.self, capacity: 32) { buffer in
            var length = 0
            for byte in "/proc/".utf8 { buffer[length] = CChar(byte); length += 1 }
            var digits = 0, value = pid
            repeat { digits += 1; value /= 10 } while value > 0
            value = pid
            for index in stride(from: length + digits - 1, through: length, by: -1) {
                buffer[index] = CChar(UInt8(ascii: "0") + UInt8(value % 10))
                value /= 10
            }
            length += digits
            for byte in "/ns/user".utf8 { buffer[length] = CChar(byte); length += 1 }
            buffer[length] = 0
            var attributes = stat()
            guard stat(buffer.baseAddress!, &attributes) == 0 else { return nil }
            return UInt64(attributes.st_ino)
        }
    }
}
