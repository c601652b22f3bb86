import FUSELowLevel
import Glibc

/// The owner, group and other check of mode bits, for decisions the daemon makes on a caller's
/// behalf where the kernel checked nothing (an open that `create` answers).
enum Permissions {
    /// Whether `uid` (with primary group `gid`, and `groups` asked only when needed) may access an
    /// item with `attributes` as `mask` asks (R_OK, W_OK, X_OK). Root may read and write anything.
    static func permits(_ attributes: stat, uid: uid_t, gid: gid_t, groups: () -> [gid_t], mask: Int32) -> Bool {
        let wanted = mode_t(mask & (R_OK | W_OK | X_OK))
        if uid == 0 { return wanted & mode_t(X_OK) == 0 || attributes.st_mode & 0o111 != 0 }
        let shift: mode_t
        if attributes.st_uid == uid {
            shift = 6
        } else if attributes.st_gid == gid || groups().contains(attributes.st_gid) {
            shift = 3
        } else {
            shift = 0
        }
        return (attributes.st_mode >> shift) & wanted == wanted
    }

    /// EACCES unless `caller` may open the file on `descriptor` with `flags`; 0 if it may.
    static func check(opening flags: Int32, _ descriptor: Int32, by caller: Caller) -> Int32 {
        let (attributes, error) = Backing.attributes(of: descriptor)
        guard error == 0 else { return error }
        var mask: Int32 = flags & O_ACCMODE == O_WRONLY ? W_OK : flags & O_ACCMODE == O_RDWR ? R_OK | W_OK : R_OK
        if flags & O_TRUNC != 0 { mask |= W_OK }
        return permits(attributes, uid: caller.uid, gid: caller.gid, groups: { supplementaryGroups(of: caller.pid) },
                       mask: mask) ? 0 : EACCES
    }

    /// The supplementary groups of process `pid`, from /proc/PID/status (none if it is gone).
    static func supplementaryGroups(of pid: pid_t) -> [gid_t] {
        guard let file = fopen("/proc/\(pid)/status", "r") else { return [] }
        defer { fclose(file) }
        var line: UnsafeMutablePointer<CChar>?
        var capacity = 0
        defer { free(line) }
        while getline(&line, &capacity, file) > 0, let text = line {
            guard strncmp(text, "Groups:", 7) == 0 else { continue }
            return String(cString: text + 7).split(separator: " ").compactMap { gid_t($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
        }
        return []
    }
}
