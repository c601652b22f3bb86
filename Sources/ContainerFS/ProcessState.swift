import Glibc

/// What the kernel says of a process making a request.
enum ProcessState {
    /// PF_EXITING in /proc/PID/stat's flags.
    private static let exiting: UInt64 = 0x4

    /// Whether `pid` is exiting because a signal killed it. Its descriptors are then closed by the
    /// kernel, and a close of a file it was writing must not publish half of its writes.
    static func isDyingFromSignal(_ pid: pid_t) -> Bool {
        guard pid > 0 else { return false }
        var path = Array("/proc/\(pid)/stat".utf8CString)
        let descriptor = open(&path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { return false }
        defer { close(descriptor) }
        var buffer = [UInt8](repeating: 0, count: 1024)
        let count = read(descriptor, &buffer, buffer.count)
        guard count > 0, let nameEnd = buffer[0..<count].lastIndex(of: UInt8(ascii: ")")) else { return false }
        // Fields from the third on (state is field 3): flags is field 9, exit_code field 52.
        let fields = buffer[(nameEnd + 2)..<count].split(separator: UInt8(ascii: " "))
        func field(_ number: Int) -> UInt64? {
            let index = number - 3
            guard index < fields.count else { return nil }
            return UInt64(String(decoding: fields[index].filter { $0 != UInt8(ascii: "\n") }, as: UTF8.self))
        }
        guard let flags = field(9), flags & exiting != 0, let exitCode = field(52) else { return false }
        return exitCode & 0x7f != 0
    }
}
