import Foundation

/// Which daemons serve a store right now. Each running daemon holds an exclusive `flock` on a
/// file of its own in STORE/work/mounts; the kernel drops the lock when the daemon dies, so a
/// crashed daemon never looks alive.
public struct ActiveMount: Codable, Sendable, Equatable {
    public var mountPoint: String
    /// The app mounted alone, or nil for the whole store.
    public var app: String?
    public var pid: Int32
    /// With `app`: the directory of its container mounted as the root (`root=`), or nil for the container.
    public var root: String?
    /// The mount's device (`major:minor`, as /proc/self/mountinfo shows it, shared by bind mounts of
    /// it), once mounted: while no mount has it, the daemon is finishing.
    public var device: String?
    /// Set once its FUSE session has ended: its mounts are gone, and it is finishing (shadows, tmp).
    /// A daemon with no mount left that is not finishing serves the files still open in a mount
    /// that was unmounted lazily (`umount -l`).
    public var finishing: Bool?

    public init(mountPoint: String, app: String?, pid: Int32, root: String? = nil) {
        self.mountPoint = mountPoint
        self.app = app
        self.pid = pid
        self.root = root
    }

    public func covers(_ id: AppID) -> Bool { app == nil || app == id.rawValue }

    /// Whether the two mounts show a container in common: one of the whole store shows every app's
    /// and group's, one of an app alone only that app's.
    public func overlaps(_ other: ActiveMount) -> Bool { app == nil || other.app == nil || app == other.app }

    /// Where in this mount `wanted` shows already, for a bind mount of it; nil if it shows only part.
    public func place(of wanted: ActiveMount) -> String? {
        var path = mountPoint
        if app == nil {
            guard let wantedApp = wanted.app else { return wanted.root == nil ? path : nil }
            path += "/" + wantedApp
        } else if app != wanted.app {
            return nil
        }
        switch (root, wanted.root) {
        case (nil, nil): return path
        case (nil, let wantedRoot?): return path + "/" + wantedRoot
        case (let root?, let wantedRoot?) where root == wantedRoot: return path
        default: return nil
        }
    }
}

public enum MountRegistry {
    /// What a registering daemon locks, in STORE/work/mounts.
    static let registrationLock = "registering.lock"

    /// Registers this process as serving `mount`; the returned descriptor holds the lock until closed or exit.
    /// Refused while another daemon serves a container this one would, unless `allowingOverlap`
    /// (docs/lifecycle.md, "One daemon a container").
    /// `notShared`: why the mount did not share the running one (docs/lifecycle.md), for the refusal.
    /// `isMounted`: whether a running daemon's mount is still there. One whose mount is gone is
    /// finishing (`umount` returns before its daemon exits), and is waited for, up to 10 s; or,
    /// if it does not say so within a second, it serves files left open in a lazily unmounted
    /// mount, and the mount is refused.
    public static func register(_ mount: ActiveMount, in store: Store, allowingOverlap: Bool = false,
                                notShared: String? = nil, isMounted: (ActiveMount) -> Bool = { _ in true }) throws -> Int32 {
        // One registration at a time: two daemons starting together would each miss the other. The
        // wait for a finishing daemon is outside the lock, which that daemon takes at its end.
        for wait in 0...1000 {
            let registered = try excludingRegistrations(in: store) { directory in
                try register(mount, in: directory, of: store, allowingOverlap: allowingOverlap, notShared: notShared,
                             isMounted: isMounted, waited: wait)
            }
            if let registered { return registered }
            usleep(10_000)
        }
        preconditionFailure("the last try registers or throws")
    }

    /// Writes the record of the running daemon that holds `descriptor` (its lease) again, as
    /// `mount` now says (its device, once mounted).
    public static func update(_ descriptor: Int32, to mount: ActiveMount, in store: Store) throws {
        try write(mount, to: descriptor, at: store.workPath + "/mounts/\(mount.pid).json")
    }

    private static func write(_ mount: ActiveMount, to descriptor: Int32, at path: String) throws {
        let data = try JSONEncoder().encode(mount)
        // Others read the record to find the mount: a short or failed write is an error.
        guard ftruncate(descriptor, 0) == 0 else { throw posixError("truncate", path) }
        let written = data.withUnsafeBytes { pwrite(descriptor, $0.baseAddress, $0.count, 0) }
        guard written == data.count else { throw written < 0 ? posixError("write", path) : ContainerError("\(path): short write") }
    }

    /// Runs `body` (given the registry's directory) while no daemon registers: what it finds
    /// registered stays so, but for daemons that stop. The lock is a file only the store's owner
    /// opens: anyone may lock a directory they can read, and hold every mount of the store back.
    @discardableResult
    public static func excludingRegistrations<T>(in store: Store, _ body: (DirectoryHandle) throws -> T) throws -> T {
        let directory = try store.makeWorkDirectory("mounts")
        let registering = openat(directory.fd, registrationLock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard registering >= 0 else { throw posixError("open", directory.path + "/" + registrationLock) }
        defer { close(registering) }
        guard flock(registering, LOCK_EX) == 0 else { throw posixError("lock", directory.path + "/" + registrationLock) }
        return try body(directory)
    }

    private static func register(_ mount: ActiveMount, in directory: DirectoryHandle, of store: Store,
                                 allowingOverlap: Bool, notShared: String?, isMounted: (ActiveMount) -> Bool,
                                 waited: Int) throws -> Int32? {
        let name = "\(mount.pid).json"
        let path = directory.path + "/" + name
        // Emptied only once locked: a record by this name that someone holds is a live daemon's.
        let descriptor = openat(directory.fd, name, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o644)
        guard descriptor >= 0 else { throw posixError("open", path) }
        guard flock(descriptor, LOCK_EX | LOCK_NB) == 0 else {
            let error = errno == EWOULDBLOCK
                ? ContainerError("""
                    \(path): a daemon with pid \(mount.pid) serves this store already, in another process \
                    namespace (records are named by pid): mount the store from that namespace, or from one \
                    whose daemons' pids differ.
                    """)
                : posixError("lock", path)
            close(descriptor)
            throw error
        }
        if !allowingOverlap {
            do {
                let others = try active(in: directory, skipping: name).filter { $0.overlaps(mount) }
                if let gone = others.first(where: { !isMounted($0) }) {
                    // Waited for in tries 10 ms apart: a daemon says it is finishing as soon as it
                    // hears its mount went.
                    if waited < (gone.finishing == true ? 1000 : 100) {
                        unlinkat(directory.fd, name, 0)
                        close(descriptor)
                        return nil
                    }
                    throw ContainerError(gone.finishing == true ? """
                        \(store.root): the daemon (pid \(gone.pid)) of the mount that was at \(gone.mountPoint) is \
                        still finishing after 10 s (its shadows, tmp). Mount again once it has exited.
                        """ : """
                        \(store.root): the daemon (pid \(gone.pid)) of the mount that was at \(gone.mountPoint) has \
                        not ended: it serves files still open in that mount if it was unmounted lazily (`umount -l`, \
                        `fusermount3 -u -z`), and a second daemon would share no locks with it. Close them (the daemon \
                        then exits), or stop it (`kill \(gone.pid)`; they then fail with ENOTCONN), and mount again.
                        """)
                }
                if let other = others.first {
                    let bind = other.place(of: mount).map {
                        " (as root, `mount --bind \(shellWord($0)) \(shellWord(mount.mountPoint))` shows it here\(notShared.map { "; this mount did not share it, as a mount as root does, since \($0)" } ?? ""))"
                    } ?? ""
                    throw ContainerError("""
                        \(store.root): \(other.app.map { "\($0) is mounted alone" } ?? "the whole store is mounted") at \
                        \(other.mountPoint) (daemon pid \(other.pid)), which shows containers this mount would show too. \
                        A second daemon shares no locks with the first (the kernel keeps each mount's apart: flock and \
                        SQLite through the two would not exclude each other), nor presenters or caches. Use that \
                        mount\(bind), unmount it first (`containerfs unmount \(other.mountPoint)`), or mount with \
                        -o allow_overlap to run both all the same.
                        """)
                }
            } catch {
                unlinkat(directory.fd, name, 0)
                close(descriptor)
                throw error
            }
        }
        do { try write(mount, to: descriptor, at: path) } catch {
            close(descriptor)
            unlinkat(directory.fd, name, 0)
            throw error
        }
        return descriptor
    }

    /// The daemons serving the store now. Records left by dead daemons are removed. Throws when
    /// that cannot be told (a listing, or a running daemon's record, that cannot be read): taken
    /// for none, a running daemon would pass for a dead one, and its work for leftovers.
    public static func active(in store: Store) throws -> [ActiveMount] {
        guard let directory = try store.workDirectory("mounts") else { return [] }
        return try active(in: directory)
    }

    /// The daemons serving the store now, from records only `owner` can have written (the
    /// registry's directory and each record its, and no one else's to write), or nil: what a
    /// process of `owner` may act on as it would on its own (`MountSharing` binds what a record
    /// names, as root).
    public static func active(in store: Store, writableOnlyBy owner: uid_t) throws -> [ActiveMount]? {
        guard let directory = try store.workDirectory("mounts") else { return [] }
        var attributes = stat()
        guard fstat(directory.fd, &attributes) == 0, attributes.st_uid == owner, attributes.st_mode & 0o022 == 0 else { return nil }
        var foreign = false
        let mounts = try active(in: directory) { descriptor in
            var attributes = stat()
            if fstat(descriptor, &attributes) != 0 || attributes.st_uid != owner || attributes.st_mode & 0o022 != 0 { foreign = true }
        }
        return foreign ? nil : mounts
    }

    /// The same, in the registry's directory, but for the record `skipping` (the caller's own);
    /// `inspect` sees each running daemon's record.
    private static func active(in directory: DirectoryHandle, skipping: String? = nil,
                               inspect: (Int32) -> Void = { _ in }) throws -> [ActiveMount] {
        try directory.names().filter { $0.hasSuffix(".json") && $0 != skipping }.compactMap { name in
            let path = directory.path + "/" + name
            let descriptor = openat(directory.fd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
            guard descriptor >= 0 else {
                if errno == ENOENT { return nil }   // its daemon stopped meanwhile
                throw posixError("open", path)
            }
            defer { close(descriptor) }
            guard flock(descriptor, LOCK_SH | LOCK_NB) != 0 else {
                unlinkat(directory.fd, name, 0)
                return nil
            }
            guard errno == EWOULDBLOCK else { throw posixError("lock", path) }
            inspect(descriptor)
            return try record(in: descriptor, at: path)
        }
    }

    /// The record a running daemon holds open as `descriptor`. A daemon locks its record before
    /// it writes it: an empty or partial one is read again for up to a second.
    private static func record(in descriptor: Int32, at path: String) throws -> ActiveMount {
        var lastError: any Error = ContainerError("empty")
        for _ in 0..<100 {
            var data = Data()
            var buffer = [UInt8](repeating: 0, count: 4096)
            while true {
                let count = pread(descriptor, &buffer, buffer.count, off_t(data.count))
                guard count >= 0 else { throw posixError("read", path) }
                if count == 0 { break }
                data.append(contentsOf: buffer[..<count])
            }
            do { return try JSONDecoder().decode(ActiveMount.self, from: data) } catch { lastError = error }
            usleep(10_000)
        }
        throw ContainerError("\(path): a running daemon's record cannot be read (\(lastError)); stop that daemon (its pid is the file's name), then try again.")
    }

    /// `path` as one word of a shell command, for a message to copy from.
    static func shellWord(_ path: String) -> String {
        let plain = path.utf8.allSatisfy { byte in
            (byte >= 0x30 && byte <= 0x39) || (byte | 0x20 >= 0x61 && byte | 0x20 <= 0x7a) || "/._-+,:@".utf8.contains(byte)
        }
        return plain && !path.isEmpty ? path : "'" + path.replacingOccurrences(of: "'", with: "'\\''") + "'"
    }

    /// Fails with a message that says how to go on when a daemon serves `id`.
    public static func refuseWhileMounted(_ store: Store, _ id: AppID) throws {
        if let mount = try active(in: store).first(where: { $0.covers(id) }) {
            throw ContainerError("\(id) is mounted at \(mount.mountPoint) (daemon pid \(mount.pid)): unmount it first with `containerfs unmount \(mount.mountPoint)`.")
        }
    }
}
