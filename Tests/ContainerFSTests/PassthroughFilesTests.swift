@testable import ContainerFS
import Foundation
import Glibc
import XCTest

/// Which descriptor a passthrough registration gives the kernel, decided without a mount.
final class PassthroughFilesTests: XCTestCase {
    /// A descriptor open to read and write is registered as it is; one the kernel could not write
    /// through, or whose append, sync or direct flags it might impose on every writer, is reopened
    /// (docs/atomic-replace.md).
    func testOnlyAPlainReadWriteDescriptorServesEveryWriter() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("backing-\(UUID().uuidString)").path
        XCTAssertTrue(FileManager.default.createFile(atPath: path, contents: Data("x".utf8)))
        defer { unlink(path) }
        let cases: [(flags: Int32, serves: Bool)] = [
            (O_RDWR, true), (O_RDONLY, false), (O_WRONLY, false),
            (O_RDWR | O_APPEND, false), (O_RDWR | O_DSYNC, false), (O_RDWR | O_SYNC, false),
            (O_RDWR | O_DIRECT, false),
        ]
        for (flags, serves) in cases {
            let descriptor = open(path, flags | O_CLOEXEC)
            if descriptor < 0, errno == EINVAL, flags & O_DIRECT != 0 {
                print("PassthroughFilesTests: the temporary directory's filesystem refuses O_DIRECT; that case is not checked")
                continue
            }
            XCTAssertGreaterThanOrEqual(descriptor, 0)
            XCTAssertEqual(PassthroughFiles.servesEveryWriter(descriptor), serves, "flags \(String(flags, radix: 8))")
            close(descriptor)
        }
        XCTAssertFalse(PassthroughFiles.servesEveryWriter(-1), "a descriptor that cannot be asked")
    }
}
