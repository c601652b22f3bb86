import Crypto
import Foundation

/// The backup archive format (documented in docs/lifecycle.md). Big-endian throughout:
///
///     magic       "CFSBACKUP\n" 0x1A 0x01            (the last byte is the format version)
///     record*     tag u8 ('D' directory, 'F' file, 'L' symlink)
///                 path u16-length bytes               relative to the container root
///                 mode u32, atime i64 s + u32 ns, mtime i64 s + u32 ns
///                 xattrs u16 count, each: name u8-length bytes, value u32-length bytes
///                 'F': size u64, then the data; 'L': target u16-length bytes
///     end         'Z', record count u64, SHA-256 of every byte before the digest
///
/// Restore reads everything before trusting anything: the digest catches truncated or damaged archives.
enum BackupArchive {
    static let magic: [UInt8] = Array("CFSBACKUP\n".utf8) + [0x1A, 0x01]
    static let maximumXattrValue = 1 << 16
    static let maximumXattrs = 4096

    enum Tag: UInt8 {
        case directory = 0x44, file = 0x46, symlink = 0x4C, end = 0x5A
    }

    /// What every record carries.
    struct Header {
        var tag: Tag
        var path: String
        var mode: UInt32
        var atime: timespec
        var mtime: timespec
        var xattrs: [(name: String, value: [UInt8])]
    }
}

/// Writes an archive to a file descriptor, hashing as it goes.
final class ArchiveWriter {
    private let fd: Int32
    private let path: String
    private var buffer: [UInt8] = []
    private var hash = SHA256()
    private(set) var records: UInt64 = 0

    init(fd: Int32, path: String) {
        self.fd = fd
        self.path = path
        buffer.reserveCapacity(1 << 20)
        append(BackupArchive.magic)
    }

    func write(_ header: BackupArchive.Header) throws {
        append([header.tag.rawValue])
        try appendString(header.path, lengthBytes: 2)
        append(header.mode)
        appendTime(header.atime)
        appendTime(header.mtime)
        append(UInt16(header.xattrs.count))
        for (name, value) in header.xattrs {
            try appendString(name, lengthBytes: 1)
            append(UInt32(value.count))
            append(value)
        }
        records += 1
        if buffer.count >= 1 << 20 { try flush() }
    }

    /// A file's data: exactly `size` bytes from `source`, which must not shrink meanwhile.
    func writeData(from source: Int32, size: UInt64, sourcePath: String, progress: ProgressListener?) throws {
        append(size)
        var chunk = [UInt8](repeating: 0, count: 1 << 20)
        var left = size
        while left > 0 {
            let count = chunk.withUnsafeMutableBytes { read(source, $0.baseAddress, Int(min(UInt64($0.count), left))) }
            if count < 0 { if errno == EINTR { continue }; throw posixError("read", sourcePath) }
            if count == 0 {
                throw ContainerError("\(sourcePath) shrank while it was being backed up; back up again when the app is not writing it.")
            }
            append(chunk[0..<count])
            left -= UInt64(count)
            progress?.advance(by: Int64(count))
            if buffer.count >= 1 << 20 { try flush() }
        }
    }

    func writeTarget(_ target: String) throws {
        try appendString(target, lengthBytes: 2)
    }

    /// Ends the archive with the record count and the digest, and makes it durable.
    func finish() throws {
        append([BackupArchive.Tag.end.rawValue])
        append(records)
        try flush()
        buffer = Array(hash.finalize())
        try flushUnhashed()
        guard fsync(fd) == 0 else { throw posixError("fsync", path) }
    }

    private func append<Bytes: Collection>(_ bytes: Bytes) where Bytes.Element == UInt8 {
        buffer.append(contentsOf: bytes)
    }

    private func append<Integer: FixedWidthInteger>(_ value: Integer) {
        withUnsafeBytes(of: value.bigEndian) { buffer.append(contentsOf: $0) }
    }

    private func appendTime(_ time: timespec) {
        append(Int64(time.tv_sec))
        append(UInt32(time.tv_nsec))
    }

    private func appendString(_ text: String, lengthBytes: Int) throws {
        let bytes = Array(text.utf8)
        let limit = lengthBytes == 1 ? Int(UInt8.max) : Int(UInt16.max)
        guard bytes.count <= limit else { throw ContainerError("\(text): name too long to archive") }
        if lengthBytes == 1 { append(UInt8(bytes.count)) } else { append(UInt16(bytes.count)) }
        append(bytes)
    }

    private func flush() throws {
        buffer.withUnsafeBytes { hash.update(bufferPointer: $0) }
        try flushUnhashed()
    }

    private func flushUnhashed() throws {
        var written = 0
        while written < buffer.count {
            let result = buffer.withUnsafeBytes { Glibc.write(fd, $0.baseAddress! + written, $0.count - written) }
            if result < 0 { if errno == EINTR { continue }; throw posixError("write", path) }
            written += result
        }
        buffer.removeAll(keepingCapacity: true)
    }
}

/// Reads an archive from a file descriptor, hashing what it consumes.
final class ArchiveReader {
    private let fd: Int32
    private let path: String
    private var buffer = [UInt8](repeating: 0, count: 1 << 20)
    private var start = 0
    private var end = 0
    private var hash = SHA256()
    private let progress: ProgressListener?

    init(fd: Int32, path: String, progress: ProgressListener?) throws {
        self.fd = fd
        self.path = path
        self.progress = progress
        guard (try? bytes(BackupArchive.magic.count)) == BackupArchive.magic else {
            throw ContainerError("\(path) is not a containerfs backup (or is of a newer format). Give an archive made by `containerfs backup`.")
        }
    }

    /// The next record's header, or nil at the end record (whose count and digest are checked).
    func next(recordsSoFar: UInt64) throws -> BackupArchive.Header? {
        guard let tag = BackupArchive.Tag(rawValue: try integer(UInt8.self)) else { throw damaged("unknown record type") }
        if tag == .end {
            let count = try integer(UInt64.self)
            let expected = Array(hash.finalize())
            // The digest itself is not part of what it covers.
            let stored = try bytes(32, hashed: false)
            guard count == recordsSoFar, stored == expected else { throw damaged("its checksum does not match") }
            guard try isAtEndOfFile() else { throw damaged("it has data after its end") }
            return nil
        }
        let path = try string(lengthBytes: 2)
        let mode = try integer(UInt32.self)
        let atime = try time()
        let mtime = try time()
        let count = Int(try integer(UInt16.self))
        guard count <= BackupArchive.maximumXattrs else { throw damaged("too many extended attributes on \(path)") }
        var xattrs: [(name: String, value: [UInt8])] = []
        for _ in 0..<count {
            let name = try string(lengthBytes: 1)
            let length = Int(try integer(UInt32.self))
            guard length <= BackupArchive.maximumXattrValue else { throw damaged("an oversized extended attribute on \(path)") }
            xattrs.append((name, try bytes(length)))
        }
        return BackupArchive.Header(tag: tag, path: path, mode: mode, atime: atime, mtime: mtime, xattrs: xattrs)
    }

    func size() throws -> UInt64 { try integer(UInt64.self) }

    func target() throws -> String { try string(lengthBytes: 2) }

    /// Copies `count` bytes of file data to `destination`.
    func copyData(_ count: UInt64, to destination: Int32, destinationPath: String) throws {
        var left = count
        while left > 0 {
            if start == end { try fill() }
            let take = Int(min(UInt64(end - start), left))
            var written = 0
            while written < take {
                let result = buffer.withUnsafeBytes { write(destination, $0.baseAddress! + start + written, take - written) }
                if result < 0 { if errno == EINTR { continue }; throw posixError("write", destinationPath) }
                written += result
            }
            consume(take, hashed: true)
            left -= UInt64(take)
        }
    }

    /// An archive that is well formed but asks for something restore never does.
    func refused(_ why: String) -> ContainerError {
        ContainerError("\(path): refused to restore, because \(why). Nothing was restored; only restore archives made by `containerfs backup`.")
    }

    func damaged(_ why: String) -> ContainerError {
        ContainerError("\(path) is damaged or not a complete backup: \(why). Nothing was restored; use another copy of the backup.")
    }

    private func fill() throws {
        if start == end { start = 0; end = 0 }
        while true {
            let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress! + end, $0.count - end) }
            if count < 0 { if errno == EINTR { continue }; throw posixError("read", path) }
            if count == 0 { throw damaged("it ends too early") }
            end += count
            return
        }
    }

    private func isAtEndOfFile() throws -> Bool {
        if start < end { return false }
        var probe: UInt8 = 0
        return read(fd, &probe, 1) == 0
    }

    private func consume(_ count: Int, hashed: Bool) {
        if hashed { buffer.withUnsafeBytes { hash.update(bufferPointer: UnsafeRawBufferPointer(rebasing: $0[start..<start + count])) } }
        start += count
        progress?.advance(by: Int64(count))
    }

    private func bytes(_ count: Int, hashed: Bool = true) throws -> [UInt8] {
        var result: [UInt8] = []
        result.reserveCapacity(count)
        while result.count < count {
            if start == end { try fill() }
            let take = min(end - start, count - result.count)
            result.append(contentsOf: buffer[start..<start + take])
            consume(take, hashed: hashed)
        }
        return result
    }

    private func integer<Integer: FixedWidthInteger>(_ type: Integer.Type) throws -> Integer {
        try bytes(MemoryLayout<Integer>.size).reduce(0) { $0 << 8 | Integer($1) }
    }

    private func time() throws -> timespec {
        let seconds = try integer(Int64.self)
        let nanoseconds = try integer(UInt32.self)
        guard nanoseconds < 1_000_000_000 else { throw damaged("a time out of range") }
        return timespec(tv_sec: Int(seconds), tv_nsec: Int(nanoseconds))
    }

    private func string(lengthBytes: Int) throws -> String {
        let length = lengthBytes == 1 ? Int(try integer(UInt8.self)) : Int(try integer(UInt16.self))
        let raw = try bytes(length)
        guard !raw.contains(0), let text = String(bytes: raw, encoding: .utf8) else { throw damaged("a name that is not UTF-8 text") }
        return text
    }
}
