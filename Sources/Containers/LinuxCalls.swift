import CLinux
import Foundation

/// Friendlier shapes for the Linux calls of `CLinux`.
enum LinuxCalls {
    static let renameNoReplace = clinux_RENAME_NOREPLACE
    static let renameExchange = clinux_RENAME_EXCHANGE

    static func renameat2(_ fromDir: Int32, _ from: String, _ toDir: Int32, _ to: String, _ flags: UInt32) -> Int32 {
        clinux_renameat2(fromDir, from, toDir, to, flags)
    }

    /// The names of `fd`'s extended attributes.
    static func xattrNames(_ fd: Int32) -> [String]? {
        while true {
            let size = clinux_flistxattr(fd, nil, 0)
            if size < 0 { return errno == ENOTSUP ? [] : nil }
            if size == 0 { return [] }
            var buffer = [CChar](repeating: 0, count: size)
            let got = clinux_flistxattr(fd, &buffer, size)
            if got < 0 { if errno == ERANGE { continue }; return nil }
            return buffer[0..<got].split(separator: 0).map { String(decoding: $0.map { UInt8(bitPattern: $0) }, as: UTF8.self) }
        }
    }

    /// The value of `fd`'s extended attribute `name`, or nil with errno set (ENODATA when absent).
    static func xattr(_ fd: Int32, _ name: String) -> [UInt8]? {
        while true {
            let size = clinux_fgetxattr(fd, name, nil, 0)
            if size < 0 { return nil }
            var buffer = [UInt8](repeating: 0, count: size)
            let got = buffer.withUnsafeMutableBytes { clinux_fgetxattr(fd, name, $0.baseAddress, size) }
            if got < 0 { if errno == ERANGE { continue }; return nil }
            return Array(buffer[0..<got])
        }
    }

    static func setXattr(_ fd: Int32, _ name: String, _ value: [UInt8]) -> Int32 {
        value.withUnsafeBytes { clinux_fsetxattr(fd, name, $0.baseAddress, value.count, 0) }
    }
}

/// File data copied by the kernel.
public enum FileData {
    /// Copies `length` bytes at `sourceOffset` of `source` to `destinationOffset` of `destination`
    /// (copy_file_range, which the kernel does itself, a reflink where it can, for two files of one
    /// filesystem, as a store's are). 0, or an errno; `ifSourceEnds` when the source ends first.
    public static func copy(from source: Int32, at sourceOffset: off_t, to destination: Int32, at destinationOffset: off_t,
                            length: off_t, ifSourceEnds: Int32) -> Int32 {
        var input = sourceOffset, output = destinationOffset
        let end = sourceOffset + length
        while input < end {
            let copied = clinux_copy_file_range(source, &input, destination, &output, Int(end - input), 0)
            if copied > 0 { continue }
            if copied == 0 { return ifSourceEnds }
            if errno == EINTR { continue }
            return errno
        }
        return 0
    }
}
