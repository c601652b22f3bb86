import Foundation

/// Linux calls that Swift's Glibc module does not import (they sit behind `_GNU_SOURCE` or in
/// `<sys/xattr.h>`), looked up once in the C library.
enum LinuxCalls {
    static let renameNoReplace: UInt32 = 1 // RENAME_NOREPLACE
    static let renameExchange: UInt32 = 2 // RENAME_EXCHANGE

    private typealias RenameAt2 = @convention(c) (Int32, UnsafePointer<CChar>?, Int32, UnsafePointer<CChar>?, UInt32) -> Int32
    private typealias FListXattr = @convention(c) (Int32, UnsafeMutablePointer<CChar>?, Int) -> Int
    private typealias FGetXattr = @convention(c) (Int32, UnsafePointer<CChar>?, UnsafeMutableRawPointer?, Int) -> Int
    private typealias FSetXattr = @convention(c) (Int32, UnsafePointer<CChar>?, UnsafeRawPointer?, Int, Int32) -> Int32

    private static func symbol<T>(_ name: String, as type: T.Type) -> T? {
        guard let pointer = dlsym(nil, name) else { return nil }
        return unsafeBitCast(pointer, to: type)
    }

    private static let renameat2Function = symbol("renameat2", as: RenameAt2.self)
    private static let flistxattrFunction = symbol("flistxattr", as: FListXattr.self)
    private static let fgetxattrFunction = symbol("fgetxattr", as: FGetXattr.self)
    private static let fsetxattrFunction = symbol("fsetxattr", as: FSetXattr.self)

    /// `renameat2(2)`; fails with ENOSYS where the C library lacks it.
    static func renameat2(_ fromDir: Int32, _ from: String, _ toDir: Int32, _ to: String, _ flags: UInt32) -> Int32 {
        guard let call = renameat2Function else { errno = ENOSYS; return -1 }
        return call(fromDir, from, toDir, to, flags)
    }

    /// The names of `fd`'s extended attributes.
    static func xattrNames(_ fd: Int32) -> [String]? {
        guard let list = flistxattrFunction else { errno = ENOTSUP; return nil }
        while true {
            let size = list(fd, nil, 0)
            if size < 0 { return errno == ENOTSUP ? [] : nil }
            if size == 0 { return [] }
            var buffer = [CChar](repeating: 0, count: size)
            let got = list(fd, &buffer, size)
            if got < 0 { if errno == ERANGE { continue }; return nil }
            return buffer[0..<got].split(separator: 0).map { String(decoding: $0.map { UInt8(bitPattern: $0) }, as: UTF8.self) }
        }
    }

    /// The value of `fd`'s extended attribute `name`, or nil with errno set (ENODATA when absent).
    static func xattr(_ fd: Int32, _ name: String) -> [UInt8]? {
        guard let get = fgetxattrFunction else { errno = ENOTSUP; return nil }
        while true {
            let size = get(fd, name, nil, 0)
            if size < 0 { return nil }
            var buffer = [UInt8](repeating: 0, count: size)
            let got = buffer.withUnsafeMutableBytes { get(fd, name, $0.baseAddress, size) }
            if got < 0 { if errno == ERANGE { continue }; return nil }
            return Array(buffer[0..<got])
        }
    }

    static func setXattr(_ fd: Int32, _ name: String, _ value: [UInt8]) -> Int32 {
        guard let set = fsetxattrFunction else { errno = ENOTSUP; return -1 }
        return value.withUnsafeBytes { set(fd, name, $0.baseAddress, value.count, 0) }
    }
}
