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
