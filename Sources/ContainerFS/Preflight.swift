import Containers
import FUSELowLevel
import Foundation

/// The checks made before mounting, each failing with a message that says what to do.
enum Preflight {
    static func checkFuseDevice() throws {
        guard access("/dev/fuse", F_OK) == 0 else {
            throw ContainerError("/dev/fuse is missing: load the FUSE module with `modprobe fuse`, or in a container start it with `--device /dev/fuse --cap-add SYS_ADMIN`.")
        }
        guard access("/dev/fuse", R_OK | W_OK) == 0 else {
            throw ContainerError("/dev/fuse is not readable and writable by you: run as root, or add yourself to the group that owns it.")
        }
    }

    /// Unprivileged mounts and every unmount go through fusermount3.
    static func fusermountPath() -> String? {
        for directory in ["/usr/bin", "/bin", "/usr/local/bin", "/usr/sbin", "/sbin"] {
            let path = directory + "/fusermount3"
            if access(path, X_OK) == 0 { return path }
        }
        return nil
    }

    static func checkFusermount() throws {
        guard fusermountPath() != nil else {
            throw ContainerError("fusermount3 is missing: install it with `apt-get install fuse3`.")
        }
    }

    /// The mount point must be an empty directory. A mount left by a killed daemon is cleared first.
    static func prepareMountPoint(_ path: String) throws {
        var info = stat()
        if stat(path, &info) != 0 {
            switch errno {
            case ENOTCONN:
                try clearStaleMount(path)
                return try prepareMountPoint(path)
            case ENOENT:
                throw ContainerError("\(path): no such directory. Create the mount point first: mkdir -p \(path)")
            default:
                throw ContainerError("\(path): \(String(cString: strerror(errno)))")
            }
        }
        guard info.st_mode & S_IFMT == S_IFDIR else {
            throw ContainerError("\(path) is not a directory: a mount point must be an empty directory.")
        }
        if MountTable.isMountPoint(path) {
            // Cached attributes can make a dead mount look alive to stat; statfs always asks the daemon.
            var statistics = statvfs()
            if statvfs(path, &statistics) != 0 && errno == ENOTCONN {
                try clearStaleMount(path)
                return try prepareMountPoint(path)
            }
            throw ContainerError("\(path) is already a mount point: unmount it first (containerfs unmount \(path)).")
        }
        let entries: [String]
        do { entries = try DirectoryHandle.names(ifPresentAt: path) } catch {
            throw ContainerError("\(error). A mount point must be an empty directory: one that cannot be listed may hide what is in it.")
        }
        guard entries.isEmpty else {
            throw ContainerError("\(path) is not empty (\(entries.count) entries): mount on an empty directory, so nothing in it is hidden.")
        }
    }

    /// A mount point inside the store would make the daemon serve its own backing files through itself.
    static func checkMountPointOutside(_ store: String, mountPoint: String) throws {
        let storePath = URL(fileURLWithPath: store).resolvingSymlinksInPath().path
        let mountPath = URL(fileURLWithPath: mountPoint).resolvingSymlinksInPath().path
        if mountPath == storePath || mountPath.hasPrefix(storePath + "/") {
            throw ContainerError("\(mountPoint) is inside the store \(store): choose a mount point outside it.")
        }
        if storePath.hasPrefix(mountPath + "/") {
            throw ContainerError("the store \(store) is inside the mount point \(mountPoint): mounting would hide it; choose another mount point.")
        }
    }

    /// Lazily detaches a dead FUSE mount (its daemon is gone: every access says ENOTCONN).
    static func clearStaleMount(_ path: String) throws {
        FileHandle.standardError.write("containerfs: \(path) holds a stale mount left by a daemon that died; clearing it.\n".data(using: .utf8)!)
        if let fusermount = fusermountPath(), run(fusermount, ["-u", "-z", path]) == 0 { return }
        if umount2(path, Int32(MNT_DETACH)) == 0 { return }
        throw ContainerError("\(path) holds a stale mount that could not be cleared (\(String(cString: strerror(errno)))): run `fusermount3 -u -z \(path)` as its owner or as root.")
    }

    /// Runs a program, waits, and returns its exit status.
    @discardableResult
    static func run(_ executable: String, _ arguments: [String]) -> Int32 {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        do { try process.run() } catch { return -1 }
        process.waitUntilExit()
        return process.terminationStatus
    }
}

/// Reads /proc/self/mountinfo.
public enum MountTable {
    /// One mount: its filesystem's device (`major:minor`, shared by bind mounts of it), where it
    /// shows, its type (`fuse.containerfs`) and its filesystem's options (`allow_other`, ...).
    public struct Entry: Equatable, Sendable {
        public var device: String
        /// The directory of its filesystem it shows: `/`, or deeper for a bind mount of a directory.
        public var root: String
        public var mountPoint: String
        public var type: String
        /// What was mounted: the store (STORE, or STORE:ID for an app alone) for a ContainerFS mount.
        public var source: String
        public var superOptions: [String]

        /// Where it shows `path` (a path in its filesystem, "" for the top), or nil if it does not.
        func showing(_ path: String) -> String? {
            if root == "/" { return mountPoint + path }
            guard path == root || path.hasPrefix(root + "/") else { return nil }
            return mountPoint + path.dropFirst(root.count)
        }

        /// Where this mount, one of `mount`'s daemon (its own or a bind mount of it), shows `app`'s
        /// data container, and the store's top if it shows that; nil if it does not show the
        /// container whole.
        public func places(of app: AppID, in mount: ActiveMount) -> (container: String, store: String?)? {
            guard mount.root == nil, mount.covers(app) else { return nil }
            guard let container = showing(mount.app == nil ? "/" + app.rawValue : "") else { return nil }
            return (container, mount.app == nil ? showing("") : nil)
        }
    }

    /// The mount at `mountPoint` (the last one there, which covers any before it).
    public static func mount(at mountPoint: String) -> Entry? { entries().last { $0.mountPoint == mountPoint } }

    /// The mount that holds `path` (absolute, its links resolved): the last one at the longest
    /// mount point above it or at it.
    public static func mount(holding path: String) -> Entry? {
        entries().reduce(nil) { found, entry in
            let holds = entry.mountPoint == "/" || path == entry.mountPoint || path.hasPrefix(entry.mountPoint + "/")
            return holds && entry.mountPoint.count >= (found?.mountPoint.count ?? 0) ? entry : found
        }
    }

    /// The device of the mount at `mountPoint`, or nil if nothing is mounted there.
    public static func device(at mountPoint: String) -> String? { mount(at: mountPoint)?.device }

    /// Whether a mount of `device` is still there.
    public static func isMounted(_ device: String) -> Bool { entries().contains { $0.device == device } }

    static func isMountPoint(_ path: String) -> Bool {
        let target = (path as NSString).standardizingPath
        return entries().contains { $0.mountPoint == target }
    }

    /// The mounts, in the order the kernel lists them (a later one at a path covers an earlier).
    public static func entries() -> [Entry] {
        guard let text = try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8) else { return [] }
        return text.split(separator: "\n").compactMap { entry(String($0)) }
    }

    /// A line: ID PARENT MAJOR:MINOR ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPEROPTIONS.
    static func entry(_ line: String) -> Entry? {
        let fields = line.split(separator: " ", omittingEmptySubsequences: false)
        guard fields.count > 6, let separator = fields[6...].firstIndex(of: "-"), separator + 3 < fields.count else { return nil }
        return Entry(device: String(fields[2]), root: unescape(String(fields[3])), mountPoint: unescape(String(fields[4])),
                     type: String(fields[separator + 1]), source: unescape(String(fields[separator + 2])),
                     superOptions: fields[separator + 3].split(separator: ",").map(String.init))
    }

    /// Mount paths escape space, tab, newline and backslash as octal; the rest is the path's bytes.
    private static func unescape(_ field: String) -> String {
        var bytes: [UInt8] = []
        var rest = field.utf8[...]
        while let byte = rest.popFirst() {
            if byte == UInt8(ascii: "\\"), rest.count >= 3, let code = UInt8(String(decoding: rest.prefix(3), as: UTF8.self), radix: 8) {
                bytes.append(code)
                rest = rest.dropFirst(3)
            } else {
                bytes.append(byte)
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}
