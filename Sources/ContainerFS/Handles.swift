import FUSELowLevel
import Glibc

/// An open file: the descriptor reads and writes go to.
final class OpenFile {
    let descriptor: Int32
    let node: Node

    init(descriptor: Int32, node: Node) {
        self.descriptor = descriptor
        self.node = node
    }

    deinit { close(descriptor) }
}

/// An open directory and where its listing stands, as passthrough_ll's `lo_dirp`.
final class DirectoryStream {
    let stream: OpaquePointer
    var offset: off_t = 0
    /// An entry read but not yet sent, because it did not fit in the last answer.
    var pending: UnsafeMutablePointer<dirent>?

    init(stream: OpaquePointer) { self.stream = stream }

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

    static func release<T: AnyObject>(_ file: FileInfo, as type: T.Type) {
        Unmanaged<T>.fromOpaque(UnsafeRawPointer(bitPattern: UInt(file.handle))!).release()
    }
}
