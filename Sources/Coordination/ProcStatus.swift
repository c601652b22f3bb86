/// Fields of a /proc/PID/status, read from its bytes without a String per line: the daemon asks on
/// request paths (who is writing a file) and at each control connection (who the client is).
public enum ProcStatus {
    /// The number on the line that starts with `name` (such as "Tgid:"); nil if there is none.
    public static func value(of name: StaticString, in status: UnsafeBufferPointer<UInt8>) -> Int32? {
        let prefix = UnsafeBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount)
        for line in status.split(separator: UInt8(ascii: "\n")) where line.starts(with: prefix) {
            var value: Int32 = 0
            var digits = 0
            for byte in line.dropFirst(prefix.count) where byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9") {
                value = value &* 10 &+ Int32(byte - UInt8(ascii: "0"))
                digits += 1
            }
            return digits > 0 ? value : nil
        }
        return nil
    }
}
