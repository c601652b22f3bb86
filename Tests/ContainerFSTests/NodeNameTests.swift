@testable import ContainerFS
import XCTest

/// Names kept in nodes: short ones inline, long ones in an array, both read back as they came.
final class NodeNameTests: XCTestCase {
    func testNamesOfEveryLengthReadBackAsTheyCame() {
        for length in [0, 1, 15, 16, 17, 255] {
            let bytes = (0..<length).map { UInt8(truncatingIfNeeded: 0x41 + $0 % 60) } + (length > 2 ? [0xFF] : [])
            let name = NodeName(bytes)
            XCTAssertEqual(name.bytes, bytes, "\(bytes.count) bytes")
            XCTAssertTrue(name.elementsEqual(bytes))
            XCTAssertFalse(name.elementsEqual(bytes + [0x41]))
            XCTAssertEqual(name.withCString { String(cString: $0).utf8.count }, String(decoding: bytes, as: UTF8.self).utf8.count)
            name.withCString { pointer in
                XCTAssertEqual(Array(UnsafeBufferPointer(start: pointer, count: bytes.count + 1)).map { UInt8(bitPattern: $0) },
                               bytes + [0], "NUL-terminated")
            }
            XCTAssertEqual(name, NodeName(bytes[...]))
        }
        XCTAssertEqual(NodeName.empty.bytes, [])
        XCTAssertNotEqual(NodeName(Array("a".utf8)), NodeName(Array("ab".utf8)))
        XCTAssertNotEqual(NodeName(Array("sixteen-bytes-ab".utf8)), NodeName(Array("sixteen-bytes-abc".utf8)))
    }
}
