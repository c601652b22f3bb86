import CFuse
import Glibc

/// The inode number the kernel uses to name a file in requests (`fuse_ino_t`).
public typealias InodeNumber = UInt64

/// The root directory's inode number, fixed by the protocol.
public let rootInode: InodeNumber = 1

/// Who made a request.
public struct Caller: Sendable {
    public let uid: uid_t
    public let gid: gid_t
    public let pid: pid_t
    public let umask: mode_t
}

/// One request from the kernel. It must be answered exactly once, by one of the `reply` methods,
/// from any thread and at any time: a handler may keep it and answer later.
public struct FuseRequest: @unchecked Sendable {
    public let raw: fuse_req_t

    @inlinable init(_ raw: fuse_req_t) { self.raw = raw }

    public var caller: Caller {
        let context = fuse_req_ctx(raw)!.pointee
        return Caller(uid: context.uid, gid: context.gid, pid: context.pid, umask: context.umask)
    }

    /// Answers with an errno, or success (0) for requests that return nothing else.
    @inlinable public func reply(error: Int32) { fuse_reply_err(raw, error) }

    @inlinable public func replySuccess() { fuse_reply_err(raw, 0) }

    @inlinable public func reply(entry: inout fuse_entry_param) { fuse_reply_entry(raw, &entry) }

    @inlinable public func reply(created entry: inout fuse_entry_param, file: FileInfo, passthrough backingID: Int32) {
        cfuse_reply_create_passthrough(raw, &entry, file.raw.pointee.fh, backingID, file.noFlush ? 1 : 0)
    }

    @inlinable public func reply(created entry: inout fuse_entry_param, file: FileInfo) {
        fuse_reply_create(raw, &entry, file.raw)
    }

    @inlinable public func reply(attributes: inout stat, validFor seconds: Double) {
        fuse_reply_attr(raw, &attributes, seconds)
    }

    @inlinable public func reply(linkTarget: UnsafePointer<CChar>) { fuse_reply_readlink(raw, linkTarget) }

    @inlinable public func reply(opened file: FileInfo) { fuse_reply_open(raw, file.raw) }

    /// Answers an open with a file the kernel reads and writes itself (see `BackingFileRegistry`);
    /// of `file`, only its handle and `noFlush` count.
    @inlinable public func reply(opened file: FileInfo, passthrough backingID: Int32) {
        cfuse_reply_open_passthrough(raw, file.raw.pointee.fh, backingID, file.noFlush ? 1 : 0)
    }

    @inlinable public func reply(written count: Int) { fuse_reply_write(raw, count) }

    @inlinable public func reply(buffer: UnsafeRawBufferPointer) {
        fuse_reply_buf(raw, buffer.baseAddress?.assumingMemoryBound(to: CChar.self), buffer.count)
    }

    /// Answers a read with `size` bytes of `descriptor` at `offset`; libfuse splices them when it can.
    @inlinable public func reply(dataFrom descriptor: Int32, size: Int, offset: off_t) {
        _ = cfuse_reply_fd_read(raw, descriptor, size, offset)
    }

    @inlinable public func reply(statistics: inout statvfs) { fuse_reply_statfs(raw, &statistics) }

    /// Answers a `getxattr` or `listxattr` that asked only for the size.
    @inlinable public func reply(extendedAttributeSize size: Int) { fuse_reply_xattr(raw, size) }

    @inlinable public func reply(offset: off_t) { fuse_reply_lseek(raw, offset) }
}

/// The kernel's view of an open file (`struct fuse_file_info`), valid during the request only.
public struct FileInfo: @unchecked Sendable {
    public let raw: UnsafeMutablePointer<fuse_file_info>

    @inlinable public init(_ raw: UnsafeMutablePointer<fuse_file_info>) { self.raw = raw }

    /// The `open(2)` flags.
    @inlinable public var flags: Int32 { raw.pointee.flags }

    /// The handle the filesystem chose at open, handed back with every later request on the file.
    @inlinable public var handle: UInt64 {
        get { raw.pointee.fh }
        nonmutating set { raw.pointee.fh = newValue }
    }

    @inlinable public var directIO: Bool {
        get { raw.pointee.direct_io != 0 }
        nonmutating set { raw.pointee.direct_io = newValue ? 1 : 0 }
    }

    /// Closes without a FLUSH request: for handles whose flush would do nothing.
    @inlinable public var noFlush: Bool {
        get { raw.pointee.noflush != 0 }
        nonmutating set { raw.pointee.noflush = newValue ? 1 : 0 }
    }

    /// Keeps the kernel's cached pages of the file at open (they still match it).
    @inlinable public var keepCache: Bool {
        get { raw.pointee.keep_cache != 0 }
        nonmutating set { raw.pointee.keep_cache = newValue ? 1 : 0 }
    }

    @inlinable public var lockOwner: UInt64 { raw.pointee.lock_owner }
}

/// A name from a request, as the kernel sent it (NUL-terminated, valid during the request only).
public struct FileName: @unchecked Sendable {
    public let pointer: UnsafePointer<CChar>
    public let length: Int

    @inlinable public init(_ pointer: UnsafePointer<CChar>) {
        self.pointer = pointer
        self.length = strlen(pointer)
    }

    @inlinable public var bytes: UnsafeRawBufferPointer { UnsafeRawBufferPointer(start: pointer, count: length) }

    /// `.` and `..` never name an entry of their own.
    @inlinable public var isDotOrDotDot: Bool {
        pointer[0] == 0x2E && (length == 1 || (length == 2 && pointer[1] == 0x2E))
    }

    /// A copy that outlives the request, for work answered later.
    public var copy: [UInt8] { Array(bytes) }
}

/// Which fields a `setattr` changes.
public struct AttributeFields: OptionSet, Sendable {
    public let rawValue: Int32
    public init(rawValue: Int32) { self.rawValue = rawValue }

    public static let mode = AttributeFields(rawValue: FUSE_SET_ATTR_MODE)
    public static let uid = AttributeFields(rawValue: FUSE_SET_ATTR_UID)
    public static let gid = AttributeFields(rawValue: FUSE_SET_ATTR_GID)
    public static let size = AttributeFields(rawValue: FUSE_SET_ATTR_SIZE)
    public static let accessTime = AttributeFields(rawValue: FUSE_SET_ATTR_ATIME)
    public static let modificationTime = AttributeFields(rawValue: FUSE_SET_ATTR_MTIME)
    public static let accessTimeNow = AttributeFields(rawValue: FUSE_SET_ATTR_ATIME_NOW)
    public static let modificationTimeNow = AttributeFields(rawValue: FUSE_SET_ATTR_MTIME_NOW)
    public static let changeTime = AttributeFields(rawValue: FUSE_SET_ATTR_CTIME)

    /// Fields that only metadata calls (chmod, chown, utimes) change.
    public static let metadata: AttributeFields = [.mode, .uid, .gid, .accessTime, .modificationTime,
                                                   .accessTimeNow, .modificationTimeNow, .changeTime]
}
