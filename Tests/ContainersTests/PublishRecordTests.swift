import CLinux
@testable import Containers
import Foundation
import Glibc
import XCTest

/// A record's checksum decides, after a power cut, whether a file stays or gets its previous
/// version back: the fast CRC-32C must agree with the table, byte for byte, at every length.
final class PublishRecordTests: XCTestCase {
    func testTheChecksumIsCRC32C() {
        XCTAssertEqual(crc(Array("123456789".utf8)), 0xE306_9283)
        XCTAssertEqual(crc([UInt8](repeating: 0, count: 32)), 0x8A91_36AA)
        XCTAssertEqual(crc([UInt8](repeating: 0xFF, count: 32)), 0x62A8_AB43)
        XCTAssertEqual(crc([]), 0)
    }

    func testEveryLengthAndAlignmentAgreesWithTheTable() {
        var generator = SystemRandomNumberGenerator()
        let bytes = (0..<200_000).map { _ in UInt8.random(in: 0...255, using: &generator) }
        // Around the three-stream blocks (3 × 8,192 and 3 × 256) and the word size, and at random.
        var lengths = [0, 1, 7, 8, 9, 255, 256, 767, 768, 769, 24_575, 24_576, 24_577, 65_536, 199_992]
        lengths += (0..<300).map { _ in Int.random(in: 0..<199_992, using: &generator) }
        bytes.withUnsafeBytes { buffer in
            for length in lengths {
                for start in 0..<8 {
                    let pointer = buffer.baseAddress! + start
                    XCTAssertEqual(clinux_crc32c(0, pointer, length), clinux_crc32c_portable(0, pointer, length),
                                   "\(length) bytes from \(start)")
                }
            }
            // Continued over pieces, as a record reads a file in blocks.
            for _ in 0..<100 {
                let cut = Int.random(in: 0...bytes.count, using: &generator)
                let first = clinux_crc32c(0, buffer.baseAddress!, cut)
                XCTAssertEqual(clinux_crc32c(first, buffer.baseAddress! + cut, bytes.count - cut),
                               clinux_crc32c_portable(0, buffer.baseAddress!, bytes.count), "cut at \(cut)")
            }
        }
    }

    func testARecordChecksumsTheWholeFile() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("record-\(UUID().uuidString)").path
        defer { unlink(path) }
        var generator = SystemRandomNumberGenerator()
        let bytes = (0..<300_001).map { _ in UInt8.random(in: 0...255, using: &generator) }
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        let descriptor = open(path, O_RDONLY)
        XCTAssertGreaterThanOrEqual(descriptor, 0)
        defer { close(descriptor) }
        let (record, error) = PublishRecord.of(descriptor, size: UInt64(bytes.count))
        XCTAssertEqual(error, 0)
        XCTAssertEqual(record, PublishRecord(size: UInt64(bytes.count), checksum: crc(bytes)))
        XCTAssertTrue(record?.matches(descriptor) == true)
        XCTAssertFalse(PublishRecord(size: UInt64(bytes.count), checksum: crc(bytes) ^ 1).matches(descriptor))
    }

    private func crc(_ bytes: [UInt8]) -> UInt32 {
        bytes.withUnsafeBytes { UInt32(clinux_crc32c_portable(0, $0.baseAddress, $0.count)) }
    }
}
