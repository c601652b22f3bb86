import FUSELowLevel
import Glibc
import Synchronization

/// An open file. Reads, and in-place writes, go to `descriptor`; a handle writing through atomic
/// replace has none of its own and goes to its node's write session.
final class OpenFile {
    let descriptor: Int32
    let node: Node
    let writesThroughSession: Bool
    /// Whether writes go to the end whatever their offset (`O_APPEND`).
    let appends: Bool
    /// The coordinated read, or in-place write, held while the file is open.
    let access: CoordinatedAccess?
    /// How the kernel reaches the file (`Node.openHandle`); nil for a write session's handles and other
    /// than regular files.
    let path: OpenPath?
    /// Whether an in-place handle wrote anything (presenters then hear "did change").
    var wrote = false
    /// The file's change time at the open of a writer the kernel passes through: its writes never
    /// reach the daemon, so a later change time tells that it wrote.
    private var changedAtOpen: timespec?

    /// Notes that the kernel writes for this handle itself (a writer through passthrough).
    func passesWritesThrough() {
        var attributes = stat()
        if fstat(descriptor, &attributes) == 0 { changedAtOpen = attributes.st_ctim }
    }

    /// Whether the handle wrote anything, as far as the daemon can tell.
    var hasWritten: Bool {
        guard !wrote, let before = changedAtOpen else { return wrote }
        var attributes = stat()
        guard fstat(descriptor, &attributes) == 0 else { return true }
        return attributes.st_ctim.tv_sec != before.tv_sec || attributes.st_ctim.tv_nsec != before.tv_nsec
    }

    /// The descriptor counted against its user's share, given back with the handle.
    private let charge: DescriptorCharge

    init(descriptor: Int32, node: Node, writesThroughSession: Bool = false, appends: Bool = false,
         path: OpenPath? = nil, access: CoordinatedAccess?, charge: DescriptorCharge) {
        self.charge = charge
        self.descriptor = descriptor
        self.node = node
        self.writesThroughSession = writesThroughSession
        self.appends = appends
        self.path = path
        self.access = access
        node.openHandles.add(1, ordering: .relaxed)
    }

    deinit {
        node.openHandles.subtract(1, ordering: .relaxed)
        if descriptor >= 0 { close(descriptor) }
    }
}

/// An open directory and where its listing stands, as passthrough_ll's `lo_dirp`.
final class DirectoryStream {
    let stream: OpaquePointer
    var offset: off_t = 0
    /// An entry read but not yet sent, because it did not fit in the last answer.
    var pending: UnsafeMutablePointer<dirent>?
    /// The descriptor counted against its user's share, given back with the stream.
    private let charge: DescriptorCharge

    init(stream: OpaquePointer, charge: DescriptorCharge) {
        self.stream = stream
        self.charge = charge
    }

    deinit { closedir(stream) }
}

/// Handles travel through the kernel as the `fh` of a `FileInfo`: a retained object's address.
enum Handle {
    static func store<T: AnyObject>(_ object: T, in file: FileInfo) {
        file.handle = UInt64(UInt(bitPattern: Unmanaged.passRetained(object).toOpaque()))
    }

    @inline(__always)
    static func get<T: AnyObject>(_ file: FileInfo, as type: T.Type = T.self) -> T {
        Unmanaged<T>.fromOpaque(UnsafeRawPointer(bitPattern: UInt(file.handle))!).takeUnretainedValue()
    }

    /// Gives up the handle's reference; the object lives on while others hold it.
    @discardableResult
    static func take<T: AnyObject>(_ file: FileInfo, as type: T.Type) -> T {
        Unmanaged<T>.fromOpaque(UnsafeRawPointer(bitPattern: UInt(file.handle))!).takeRetainedValue()
    }
}
