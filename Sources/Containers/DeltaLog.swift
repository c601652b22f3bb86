import CLinux
import Crypto
import Foundation

/// The redo log of a rewrite that changes part of a large file (docs/atomic-replace.md, "Large
/// files"): what the writer wrote and truncated, in order, instead of a shadow copy of the whole
/// file. Its publish commits the log, applies it to the file in place, syncs the file, and only
/// then removes the log; a daemon or a machine that stops in between leaves a committed log, which
/// the next mount (or `containerfs check`) applies again. Applying a log twice gives what applying
/// it once does. A log without its commit record is discarded, and the file keeps its previous
/// version.
///
/// Records: a 32-byte header (magic, kind, offset, length, then zeros), followed for a write by its
/// `length` bytes of data, and for a commit by the SHA-256 of the log's name and every byte before
/// it: a log is synced once, with its commit, and a commit whose log did not reach the disk whole
/// does not count, nor one found under another name (an earlier log whose file became this one's:
/// a cut may keep the names made for it and lose its new content, docs/atomic-replace.md).
public enum DeltaLog {
    public static let headerSize = 32
    /// Log files in a daemon's shadow directory are named with this prefix, and the file a committed
    /// log applies to is linked beside it under the log's name and `targetSuffix`.
    public static let prefix = "delta-"
    public static let targetSuffix = ".target"
    private static let magic: UInt32 = 0x4446_5343   // "CSFD"

    public enum Kind: UInt32, Sendable {
        /// `length` bytes of data at `offset` follow the header.
        case write = 1
        /// The file is truncated (or extended) to `offset` bytes.
        case truncate = 2
        /// Everything before is durable; the log is to be applied. (Logs of earlier versions,
        /// which synced the records before appending it.)
        case commit = 3
        /// The log is to be applied if the SHA-256 of everything before it, which follows the
        /// header (`length` bytes), matches. (Logs of earlier versions.)
        case checkedCommit = 4
        /// As `checkedCommit`, the digest taken of the log's name, a NUL, then everything before.
        case namedCommit = 5
    }

    private static let digestSize = SHA256.byteCount

    public struct Record: Equatable, Sendable {
        public let kind: Kind
        public let offset: off_t
        public let length: off_t
        /// Where a write's data starts in the log.
        public let dataPosition: off_t
    }

    /// Writes a record's header at `position`. The data of a write goes after it first, so that a
    /// header never names data that was not written.
    public static func writeHeader(_ log: Int32, at position: off_t, kind: Kind, offset: off_t, length: off_t) -> Int32 {
        var header = [UInt64](repeating: 0, count: headerSize / 8)
        header[0] = UInt64(magic) | UInt64(kind.rawValue) << 32
        header[1] = UInt64(bitPattern: Int64(offset))
        header[2] = UInt64(bitPattern: Int64(length))
        let written = header.withUnsafeBytes { pwrite(log, $0.baseAddress, headerSize, position) }
        if written == headerSize { return 0 }
        return written < 0 ? errno : EIO
    }

    /// Appends a truncation to `size` at `end`, which it moves past the record.
    public static func appendTruncate(_ log: Int32, end: inout off_t, size: off_t) -> Int32 {
        let error = writeHeader(log, at: end, kind: .truncate, offset: size, length: 0)
        if error == 0 { end += off_t(headerSize) }
        return error
    }

    /// Commits the log named `name` (in its directory): appends the commit record with the digest
    /// of its name and what it holds, then `sync`s the log (its `fsync` by default; the daemon
    /// syncs the log's directory together with it where the log's sync does not make the names
    /// durable too: the log's own and its target's link, `Backing.fileSyncCarriesNames`). One
    /// sync: a cut during it leaves a commit whose digest does not match, or none, or names that
    /// lead to no log.
    public static func commit(_ log: Int32, named name: some Sequence<UInt8>, end: inout off_t,
                              sync: (Int32) -> Int32 = { fsync($0) == 0 ? 0 : errno }) -> Int32 {
        let (digest, readError) = self.digest(of: log, upTo: end, named: Array(name))
        guard readError == 0 else { return readError }
        guard let digest else { return EIO }   // shorter than its records: the log is not whole
        let error = writeHeader(log, at: end, kind: .namedCommit, offset: 0, length: off_t(digestSize))
        guard error == 0 else { return error }
        let written = digest.withUnsafeBytes { pwrite(log, $0.baseAddress, digestSize, end + off_t(headerSize)) }
        guard written == digestSize else { return written < 0 ? errno : EIO }
        end += off_t(headerSize + digestSize)
        return sync(log)
    }

    /// The SHA-256 of the log's name and a NUL, if `name`, then of its first `length` bytes; nil if
    /// the log is shorter.
    static func digest(of log: Int32, upTo length: off_t, named name: [UInt8]?) -> (digest: [UInt8]?, error: Int32) {
        var hash = SHA256()
        if let name { hash.update(data: name + [0]) }
        var buffer = [UInt8](repeating: 0, count: min(Int(length), 1 << 20))
        var position: off_t = 0
        while position < length {
            let want = min(buffer.count, Int(length - position))
            let read = buffer.withUnsafeMutableBytes { pread(log, $0.baseAddress, want, position) }
            if read < 0 && errno == EINTR { continue }
            if read < 0 { return (nil, errno) }
            if read == 0 { return (nil, 0) }
            buffer.withUnsafeBytes { hash.update(bufferPointer: UnsafeRawBufferPointer(rebasing: $0[..<read])) }
            position += off_t(read)
        }
        return (Array(hash.finalize()), 0)
    }

    /// The log's records in order, up to the first one that is missing or torn. `committed`: the
    /// last record read is a commit of the log named `name` (one that says whose it is).
    public static func records(of log: Int32, named name: some Sequence<UInt8>) -> (records: [Record], committed: Bool, error: Int32) {
        var records: [Record] = []
        var position: off_t = 0
        var header = [UInt64](repeating: 0, count: headerSize / 8)
        while true {
            let read = header.withUnsafeMutableBytes { pread(log, $0.baseAddress, headerSize, position) }
            if read < 0 { return (records, false, errno) }
            guard read == headerSize, UInt32(truncatingIfNeeded: header[0]) == magic,
                  let kind = Kind(rawValue: UInt32(truncatingIfNeeded: header[0] >> 32)) else { break }
            let record = Record(kind: kind, offset: off_t(Int64(bitPattern: header[1])), length: off_t(Int64(bitPattern: header[2])),
                                dataPosition: position + off_t(headerSize))
            guard record.offset >= 0, record.length >= 0 else { break }
            if kind == .commit { return (records, true, 0) }
            if kind == .checkedCommit || kind == .namedCommit {
                guard record.length == off_t(digestSize) else { break }
                var stored = [UInt8](repeating: 0, count: digestSize)
                let read = stored.withUnsafeMutableBytes { pread(log, $0.baseAddress, digestSize, record.dataPosition) }
                if read < 0 { return (records, false, errno) }
                // A read that fails is an error (the log stays), not a log found torn.
                let (digest, error) = digest(of: log, upTo: position, named: kind == .namedCommit ? Array(name) : nil)
                if error != 0 { return (records, false, error) }
                return (records, read == digestSize && digest == stored, 0)
            }
            records.append(record)
            position = record.dataPosition + (kind == .write ? record.length : 0)
        }
        return (records, false, 0)
    }

    /// Applies `records` of `log` to `target`, in order.
    public static func apply(_ records: [Record], of log: Int32, to target: Int32) -> Int32 {
        for record in records {
            switch record.kind {
            case .write:
                // A log shorter than its record says is no log to trust.
                let error = FileData.copy(from: log, at: record.dataPosition, to: target, at: record.offset,
                                          length: record.length, ifSourceEnds: EIO)
                if error != 0 { return error }
            case .truncate:
                if ftruncate(target, record.offset) != 0 { return errno }
            case .commit, .checkedCommit, .namedCommit:
                return 0
            }
        }
        return 0
    }

    /// Whether applying `records` to `target` leaves its size as it is: writes within it, no truncation.
    public static func keepsSize(_ records: [Record], of target: Int32) -> Bool {
        var attributes = stat()
        guard fstat(target, &attributes) == 0 else { return false }
        return records.allSatisfy { $0.kind == .write && $0.offset + $0.length <= attributes.st_size }
    }

    /// Reserves the blocks the writes of `records` need in `target`, so that applying them cannot
    /// run out of space halfway (the file's size stays).
    public static func reserve(_ records: [Record], in target: Int32) -> Int32 {
        for record in records where record.kind == .write && record.length > 0 {
            if clinux_fallocate(target, 1 /* FALLOC_FL_KEEP_SIZE */, record.offset, record.length) != 0 {
                // A filesystem without fallocate gets its blocks as the data is copied.
                if errno == EOPNOTSUPP { return 0 }
                return errno
            }
        }
        return 0
    }

    /// Applies the committed logs that a daemon which stopped left in its shadow directory
    /// (open as `directory`) to their files, syncs them, and removes the logs. Uncommitted logs are
    /// removed (their files keep their previous version). Returns the first error; a log it could
    /// not apply stays, for the next attempt.
    public static func recover(in directory: Int32) -> Int32 {
        let names: [String]
        switch DirectoryHandle.names(of: directory) {
        case .success(let listed): names = listed
        case .failure(let error): return error.code.rawValue
        }
        var firstError: Int32 = 0
        for name in names where name.hasPrefix(prefix) && !name.hasSuffix(targetSuffix) {
            let error = recover(name, in: directory)
            if error != 0, firstError == 0 { firstError = error }
        }
        return firstError
    }

    private static func recover(_ name: String, in directory: Int32) -> Int32 {
        let log = openat(directory, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
        guard log >= 0 else { return errno == ENOENT ? 0 : errno }
        defer { close(log) }
        let (records, committed, readError) = records(of: log, named: name.utf8)
        guard readError == 0 else { return readError }
        if committed {
            let target = openat(directory, name + targetSuffix, O_WRONLY | O_NOFOLLOW | O_CLOEXEC)
            // Without its target the log was being retired: the file was synced before that began.
            if target < 0, errno != ENOENT { return errno }
            if target >= 0 {
                var error = apply(records, of: log, to: target)
                if error == 0, fsync(target) != 0 { error = errno }
                close(target)
                if error != 0 { return error }
            }
        }
        // The target's link goes first: a log whose target is gone is never applied again.
        if unlinkat(directory, name + targetSuffix, 0) != 0, errno != ENOENT { return errno }
        if fsync(directory) != 0 { return errno }
        return unlinkat(directory, name, 0) == 0 || errno == ENOENT ? 0 : errno
    }
}
