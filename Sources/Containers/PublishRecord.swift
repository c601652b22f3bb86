import CLinux
import Glibc

/// What a version published without waiting for its data was: its size and the CRC-32C of its
/// bytes. A record in the daemon's shadow directory is a link to the version, named with these;
/// after a crash or a power cut, the version stays if it still reads as recorded, and otherwise
/// goes back to its previous version (docs/atomic-replace.md, "Closes without a sync").
public struct PublishRecord: Equatable, Sendable {
    public let size: UInt64
    public let checksum: UInt32

    public init(size: UInt64, checksum: UInt32) {
        self.size = size
        self.checksum = checksum
    }

    /// Names of records of versions that replaced another: `record-PREVIOUS.SIZE.CRC`, where
    /// `PREVIOUS` is the name the previous version has in the same directory. A new file's record
    /// is its mark with the same suffix (`fresh-N.SIZE.CRC`).
    public static let replacedPrefix = "record-"

    /// The record of the file open for reading as `descriptor`, whose size `fstat` said is `size`
    /// bytes: its first `size` bytes, read without a read that finds the end (a publish holds the
    /// file still); or the errno of a read that failed (EAGAIN if it ends sooner).
    public static func of(_ descriptor: Int32, size: UInt64) -> (PublishRecord?, Int32) {
        var checksum: UInt32 = 0
        let error = withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 65536) { buffer -> Int32 in
            var offset: UInt64 = 0
            while offset < size {
                let count = pread(descriptor, buffer.baseAddress, min(buffer.count, Int(clamping: size - offset)), off_t(offset))
                if count < 0 {
                    if errno == EINTR { continue }
                    return errno
                }
                if count == 0 { return EAGAIN }
                checksum = clinux_crc32c(checksum, buffer.baseAddress, count)
                offset += UInt64(count)
            }
            return 0
        }
        return error == 0 ? (PublishRecord(size: size, checksum: checksum), 0) : (nil, error)
    }

    /// Whether the file open as `descriptor` holds exactly the recorded bytes.
    public func matches(_ descriptor: Int32) -> Bool {
        var attributes = stat()
        guard fstat(descriptor, &attributes) == 0, UInt64(attributes.st_size) == size else { return false }
        let (found, error) = PublishRecord.of(descriptor, size: size)
        return error == 0 && found == self
    }

    /// `base` (without its NUL) followed by `.SIZE.CRC` in hexadecimal, NUL-terminated.
    public func name(after base: some Collection<CChar>) -> [CChar] {
        var name = Array(base)
        if name.last == 0 { name.removeLast() }
        for value in [size, UInt64(checksum)] {
            name.append(CChar(UInt8(ascii: ".")))
            var digits = 1
            while digits < 16, value >> (4 * digits) != 0 { digits += 1 }
            for shift in stride(from: 4 * (digits - 1), through: 0, by: -4) {
                let digit = UInt8((value >> UInt64(shift)) & 0xF)
                name.append(CChar(digit < 10 ? UInt8(ascii: "0") + digit : UInt8(ascii: "a") + digit - 10))
            }
        }
        name.append(0)
        return name
    }

    /// Splits `BASE.SIZE.CRC` into its base and record; nil for any other name.
    public static func parse(_ name: String) -> (base: String, record: PublishRecord)? {
        let parts = name.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, !parts[0].isEmpty,
              let size = UInt64(parts[1], radix: 16), let checksum = UInt32(parts[2], radix: 16) else { return nil }
        return (String(parts[0]), PublishRecord(size: size, checksum: checksum))
    }
}
