import FUSELowLevel
import Glibc

/// What the kernel says of a process making a request.
enum ProcessState {
    /// PF_EXITING in /proc/PID/stat's flags.
    private static let exiting: UInt64 = 0x4

    /// Whether `pid` is exiting because a signal killed it. Its descriptors are then closed by the
    /// kernel, and a close of a file it was writing must not publish half of its writes.
    static func isDyingFromSignal(_ pid: pid_t) -> Bool {
        guard let stat = contents(of: "stat", of: pid, upTo: 1024),
              let nameEnd = stat.lastIndex(of: UInt8(ascii: ")")) else { return false }
        // Fields from the third on (state is field 3): flags is field 9, exit_code field 52.
        let fields = stat[(nameEnd + 2)...].split(separator: UInt8(ascii: " "))
        func field(_ number: Int) -> UInt64? {
            let index = number - 3
            guard index < fields.count else { return nil }
            return UInt64(String(decoding: fields[index].filter { $0 != UInt8(ascii: "\n") }, as: UTF8.self))
        }
        guard let flags = field(9), flags & exiting != 0, let exitCode = field(52) else { return false }
        return exitCode & 0x7f != 0
    }

    /// Whether the process making a request is in `group`: its filesystem group, or one of its
    /// supplementary groups (/proc/PID/status). False when that cannot be read.
    static func isMember(_ caller: Caller, of group: gid_t) -> Bool {
        if caller.gid == group { return true }
        guard let status = contents(of: "status", of: caller.pid, upTo: 4096) else { return false }
        for line in status.split(separator: UInt8(ascii: "\n")) where line.starts(with: Array("Groups:".utf8)) {
            return line.dropFirst(7).split(whereSeparator: { $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\t") })
                .contains { gid_t(String(decoding: $0, as: UTF8.self)) == group }
        }
        return false
    }

    /// The first `capacity` bytes of /proc/PID/`file`, or nil when they cannot be read (the
    /// process is gone).
    private static func contents(of file: String, of pid: pid_t, upTo capacity: Int) -> ArraySlice<UInt8>? {
        guard pid > 0 else { return nil }
        var path = Array("/proc/\(pid)/\(file)".utf8CString)
        let descriptor = open(&path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        var buffer = [UInt8](repeating: 0, count: capacity)
        let count = read(descriptor, &buffer, buffer.count)
        return count > 0 ? buffer[0..<count] : nil
    }
}

/// Which set-ID bits a change of a file's data drops, as the kernel's VFS decides
/// (`should_remove_suid`, `setattr_should_drop_sgid`): set-user-ID always, set-group-ID when the
/// file is group-executable or the writer is not in its group. Root keeps both (CAP_FSETID, told
/// by uid). The kernel's FUSE still clears set-group-ID by the older rule alone (group-executable),
/// so the daemon applies the rest (docs/conformance.md).
enum SetID {
    static func mode(_ mode: mode_t, group: gid_t, afterChangeBy caller: Caller) -> mode_t {
        guard caller.uid != 0, mode & (S_ISUID | S_ISGID) != 0 else { return mode }
        var cleared = mode & ~S_ISUID
        if mode & S_ISGID != 0, mode & S_IXGRP != 0 || !ProcessState.isMember(caller, of: group) {
            cleared &= ~S_ISGID
        }
        return cleared
    }
}
