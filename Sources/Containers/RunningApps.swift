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
    /// the store's owner (who runs its apps), also when a daemon running as root makes it.
    public static func prepare(_ store: Store) throws {
        let path = directory(of: store)
        if mkdir(path, 0o755) != 0 {
            guard errno == EEXIST else { throw ContainerError("\(path): cannot create (\(String(cString: strerror(errno)))).") }
            return
        }
        var owner = stat()
        guard stat(store.root, &owner) == 0 else { throw ContainerError("\(store.root): \(String(cString: strerror(errno)))") }
        if owner.st_uid != geteuid(), chown(path, owner.st_uid, owner.st_gid) != 0 {
            throw ContainerError("\(path): cannot give it to the store's owner (\(String(cString: strerror(errno)))).")
        }
    }

    /// Writes the record whole (a temporary file renamed into place), so a daemon never reads half.
    public static func record(_ app: RunningApp, in store: Store) throws {
        try prepare(store)
        let path = directory(of: store) + "/" + app.fileName
        let temporary = directory(of: store) + "/.\(app.fileName).\(getpid())"
        do {
            try Data("\(app.launcher)\n".utf8).write(to: URL(fileURLWithPath: temporary))
        } catch {
            throw ContainerError("\(temporary): cannot write the running app's record (\(error.localizedDescription)).")
        }
        guard rename(temporary, path) == 0 else {
            let error = errno
            unlink(temporary)
            throw ContainerError("\(path): cannot record the running app (\(String(cString: strerror(error)))).")
        }
    }

    public static func remove(_ app: RunningApp, in store: Store) {
        unlink(directory(of: store) + "/" + app.fileName)
    }

    /// The records whose launcher still runs. A record left by a launcher that died (killed, or a
    /// machine that stopped) is removed: its namespace is gone with its processes.
    /// Throws when the records cannot be listed: taken for none, another sandbox of an app would
    /// pass for gone.
    public static func list(in store: Store) throws -> [RunningApp] {
        return try names(in: store).compactMap { name -> RunningApp? in
            guard let (namespace, app) = parse(name) else { return nil }
            let path = directory(of: store) + "/" + name
            guard let text = try? String(contentsOfFile: path, encoding: .utf8),
                  let launcher = Int32(text.trimmingCharacters(in: .whitespacesAndNewlines)) else { return nil }
            if kill(launcher, 0) != 0, errno == ESRCH {
                unlink(path)
                return nil
            }
            return RunningApp(namespace: namespace, app: app, launcher: launcher)
        }.sorted { ($0.app, $0.namespace) < ($1.app, $1.namespace) }
    }

    /// The sandboxes recorded in `store`, by their records' names alone (what the daemons go by).
    /// Throws when the records cannot be listed: taken for none, an app's processes would pass
    /// for unconfined ones.
    public static func recorded(in store: Store) throws -> [(namespace: UInt64, app: String)] {
        try names(in: store).compactMap(parse)
    }

    /// The names in the records' directory (none while it does not exist).
    private static func names(in store: Store) throws -> [String] {
        try DirectoryHandle.names(ifPresentAt: directory(of: store))
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
