import CLinux
import Containers
import Coordination
import Foundation

/// A second mount of what a running daemon shows already: as root, it becomes a bind mount of that
/// daemon's mount, as the kernel shares a block device's filesystem among all its mounts. Two
/// daemons of one container would share no locks, presenters or caches (docs/lifecycle.md, "One
/// daemon a container").
enum MountSharing {
    /// Options of the filesystem itself: a bind mount has the running mount's, so it must have them.
    static let filesystemOptions: Set<String> = ["allow_other", "allow_root", "default_permissions"]
    /// Options of each mount, which a bind mount takes on its own.
    static let mountFlags: [String: UInt] = ["ro": UInt(MS_RDONLY), "noexec": UInt(MS_NOEXEC), "nosuid": UInt(MS_NOSUID),
                                             "nodev": UInt(MS_NODEV), "noatime": UInt(MS_NOATIME), "nodiratime": UInt(MS_NODIRATIME)]

    /// The flags of a bind mount of `running` that gives what `configuration` asks, or why there
    /// is none: an option of the daemon's own (a daemon runs with its own), or of the filesystem
    /// that the running mount lacks.
    static func flags(for configuration: MountConfiguration, sharing running: MountTable.Entry) -> Result<UInt, Refusal> {
        guard configuration.asksNoDaemonOptions else { return .failure(Refusal("it asks for options of a daemon's own")) }
        var flags: UInt = 0
        var subtype = "containerfs"
        for option in configuration.fuseOptions.flatMap({ $0.split(separator: ",").map(String.init) }) {
            if let flag = mountFlags[option] {
                flags |= flag
            } else if option.hasPrefix("subtype=") {
                subtype = String(option.dropFirst(8))
            } else if option.hasPrefix("fsname=") {
                continue
            } else if !filesystemOptions.contains(option) {
                return .failure(Refusal("-o \(option) is an option of a daemon's own mount"))
            } else if !running.superOptions.contains(option) {
                return .failure(Refusal("the running mount has no \(option)"))
            }
        }
        let type = subtype.isEmpty ? "fuse" : "fuse." + subtype
        guard running.type == type else { return .failure(Refusal("the running mount's type is \(running.type), not \(type)")) }
        return .success(flags)
    }

    struct Refusal: Error, Equatable {
        var reason: String
        init(_ reason: String) { self.reason = reason }
    }

    /// Shows at `mountPoint` what `place` shows, a directory of the mount `running` of the daemon
    /// `daemon`. False, with nothing mounted, when `place` is not that daemon's mount any more
    /// (unmounted, or another mount over it); throws when the kernel refuses the bind mount.
    static func bind(_ place: String, of daemon: pid_t, in running: MountTable.Entry, to mountPoint: String,
                     flags: UInt) throws -> Bool {
        // What is checked is what is bound: the descriptor, not a path that could change between.
        let source = open(place, O_PATH | O_DIRECTORY | O_CLOEXEC)
        guard source >= 0 else { return false }
        defer { close(source) }
        let path = "/proc/self/fd/\(source)"
        var attributes = stat()
        guard fstat(source, &attributes) == 0, "\(clinux_major(attributes.st_dev)):\(clinux_minor(attributes.st_dev))" == running.device,
              servingDaemon(of: path) == daemon else { return false }
        guard mount(path, mountPoint, nil, UInt(MS_BIND), nil) == 0 else {
            throw ContainerError("\(mountPoint): cannot bind the running mount \(place) there: \(String(cString: strerror(errno)))")
        }
        guard flags != 0 else { return true }
        // A remount sets every flag of the mount: set-user-ID bits and devices stay off, as in the
        // daemon's own mounts.
        let all = UInt(MS_REMOUNT) | UInt(MS_BIND) | UInt(MS_NOSUID) | UInt(MS_NODEV) | flags
        guard mount(nil, mountPoint, nil, all, nil) == 0 else {
            let error = errno
            guard umount2(mountPoint, Int32(MNT_DETACH)) == 0 else {
                throw ContainerError("\(mountPoint): a bind mount of \(place) whose flags could not be set (\(String(cString: strerror(error)))) and that could not be unmounted: \(String(cString: strerror(errno))); unmount it")
            }
            throw ContainerError("\(mountPoint): cannot set the bind mount's flags: \(String(cString: strerror(error)))")
        }
        return true
    }

    /// The daemon whose control socket the mount at `path` names.
    private static func servingDaemon(of path: String) -> pid_t? {
        var buffer = [UInt8](repeating: 0, count: 4096)
        let length = clinux_getxattr(path, ContainerFileSystem.controlSocketAttribute, &buffer, buffer.count)
        guard length > 0 else { return nil }
        return controlServerProcess(at: String(decoding: buffer[..<length], as: UTF8.self))
    }
}
