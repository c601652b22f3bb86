import CLinux
import Coordination
import FUSELowLevel
import Glibc

/// What the kernel says of a process making a request.
enum ProcessState {
    /// PF_EXITING in /proc/PID/stat's flags.
    private static let exiting: UInt64 = 0x4

    /// Whether `pid` is exiting because a signal killed it. Its descriptors are then closed by the
    /// kernel, and a close of a file it was writing must not publish half of its writes. Asked at
    /// every close that would publish: the line is scanned in place, and read again through a
    /// descriptor kept for the thread (`StatFiles`).
    static func isDyingFromSignal(_ pid: pid_t) -> Bool {
        guard pid > 0 else { return false }
        var descriptor = statFiles.withLock { $0.take(pid) } ?? -1
        let dying = withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 1024) { buffer -> Bool? in
            guard let base = buffer.baseAddress else { return nil }
            var count = descriptor >= 0 ? pread(descriptor, base, buffer.count, 0) : -1
            if count <= 0 {
                // Kept from a thread that is gone (ESRCH), whose number another may have now.
                if descriptor >= 0 { close(descriptor) }
                descriptor = open("stat", of: pid, path: base)
                count = descriptor >= 0 ? pread(descriptor, base, buffer.count, 0) : -1
                guard count > 0 else { return nil }
            }
            return dyingFromSignal(stat: UnsafeBufferPointer(start: base, count: count))
        }
        guard let dying else {
            if descriptor >= 0 { close(descriptor) }
            return false
        }
        if let unused = statFiles.withLock({ $0.put(pid, descriptor) }) { close(unused) }
        return dying
    }

    /// The /proc/TID/stat descriptors `isDyingFromSignal` keeps: an open and a close of /proc each
    /// time cost as much as the read (2–3 µs a publishing close).
    private static let statFiles = Locked(StatFiles())

    /// Whether a /proc/PID/stat line says PF_EXITING (field 9, flags) and a signal as the exit code
    /// (field 52). The name (field 2) may hold spaces and parentheses: fields are counted from
    /// the last `)`.
    static func dyingFromSignal(stat line: UnsafeBufferPointer<UInt8>) -> Bool {
        guard let nameEnd = line.lastIndex(of: UInt8(ascii: ")")) else { return false }
        var field = 2
        var value: UInt64 = 0
        var flags: UInt64?
        for byte in line[(nameEnd + 1)...] {
            if byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\n") {
                if field == 9 { flags = value }
                if field == 52 { return (flags ?? 0) & exiting != 0 && value & 0x7f != 0 }
                field += 1
                value = 0
            } else if byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") {
                value = value &* 10 &+ UInt64(byte - UInt8(ascii: "0"))
            }
        }
        return false
    }

    /// Whether the process making a request is in `group`: its filesystem group, or one of its
    /// supplementary groups (/proc/PID/status). False when that cannot be read.
    static func isMember(_ caller: Caller, of group: gid_t) -> Bool {
        if caller.gid == group { return true }
        return withContents(of: "status", of: caller.pid, upTo: 4096) { status in
            for line in status.split(separator: UInt8(ascii: "\n")) where line.starts(with: "Groups:".utf8) {
                return line.dropFirst(7).split(whereSeparator: { $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\t") })
                    .contains { gid_t(String(decoding: $0, as: UTF8.self)) == group }
            }
            return false
        } ?? false
    }

    /// The process (thread group) of the thread `thread`, as a request names its caller's thread;
    /// nil when it is gone. A thread that leads its group, as every single-threaded process's does,
    /// is told without reading /proc.
    static func threadGroup(of thread: pid_t) -> pid_t? {
        guard thread > 0 else { return nil }
        if clinux_leads_thread_group(thread) != 0 { return thread }
        // `Tgid:` comes in the first lines.
        return withContents(of: "status", of: thread, upTo: 1024) { ProcStatus.value(of: "Tgid:", in: $0) } ?? nil
    }

    /// Hands `body` the first `capacity` bytes of /proc/PID/`file`, read into a buffer on the stack
    /// (the path too: no String per request); nil when they cannot be read (the process is gone).
    private static func withContents<Result>(of file: StaticString, of pid: pid_t, upTo capacity: Int,
                                             _ body: (UnsafeBufferPointer<UInt8>) -> Result) -> Result? {
        guard pid > 0 else { return nil }
        return withUnsafeTemporaryAllocation(of: UInt8.self, capacity: max(capacity, 64)) { buffer -> Result? in
            guard let base = buffer.baseAddress else { return nil }
            let descriptor = open(file, of: pid, path: base)
            guard descriptor >= 0 else { return nil }
            let count = read(descriptor, base, buffer.count)
            close(descriptor)
            return count > 0 ? body(UnsafeBufferPointer(start: base, count: count)) : nil
        }
    }

    /// Opens /proc/PID/`file` for reading, its path written to `path` (at least 64 bytes, free for
    /// the contents afterwards): no String per request. -1 with errno set on failure.
    private static func open(_ file: StaticString, of pid: pid_t, path base: UnsafeMutablePointer<UInt8>) -> Int32 {
        // "/proc/PID/FILE", NUL-terminated.
        var length = 0
        for byte in "/proc/".utf8 { base[length] = byte; length += 1 }
        var digits = 1, rest = Int(pid)
        while rest >= 10 { digits += 1; rest /= 10 }
        rest = Int(pid)
        for index in stride(from: length + digits - 1, through: length, by: -1) {
            base[index] = UInt8(ascii: "0") + UInt8(rest % 10)
            rest /= 10
        }
        length += digits
        base[length] = UInt8(ascii: "/")
        length += 1
        for index in 0..<file.utf8CodeUnitCount { base[length] = file.utf8Start[index]; length += 1 }
        base[length] = 0
        return UnsafeMutableRawPointer(base).withMemoryRebound(to: CChar.self, capacity: length + 1) {
            Glibc.open($0, O_RDONLY | O_CLOEXEC)
        }
    }
}

/// The /proc/TID/stat descriptors kept open for the threads whose closes were asked about last,
/// most recent last. A descriptor follows its thread, not the number: once that thread is gone it
/// reads ESRCH, and the number's next thread gets one of its own. One value behind a lock: a
/// descriptor is taken out while it is read, so that no one closes it meanwhile, and a put that
/// overflows returns the descriptor its caller closes.
struct StatFiles {
    private(set) var kept: [(thread: pid_t, descriptor: Int32)] = []
    /// A writer or a few close files at a time.
    static let limit = 8

    mutating func take(_ thread: pid_t) -> Int32? {
        guard let index = kept.firstIndex(where: { $0.thread == thread }) else { return nil }
        return kept.remove(at: index).descriptor
    }

    /// Keeps `descriptor` for `thread`; returns the one that made room (the longest unused) or that
    /// `thread` had already, for its caller to close.
    mutating func put(_ thread: pid_t, _ descriptor: Int32) -> Int32? {
        let replaced = take(thread)
        kept.append((thread, descriptor))
        if let replaced { return replaced }
        return kept.count > StatFiles.limit ? kept.removeFirst().descriptor : nil
    }
}

/// Which set-ID bits a change of a file's data drops, as the kernel's VFS decides
/// (`should_remove_suid`, `setattr_should_drop_sgid`): set-user-ID always, set-group-ID when the
/// file is group-executable or the writer is not in its group. Root keeps both (CAP_FSETID, told
/// by uid). The kernel leaves all of it to the daemon (docs/atomic-replace.md, "Set-ID bits").
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
