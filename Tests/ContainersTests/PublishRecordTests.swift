import CLinux
@testable import Containers
import Foundation
import Glibc
import XCTest

/// A record's checksum decides, after a power cut, whether a file stays or gets its previous
/// version back: ISA-L's CRC-32C must agree with the definition, byte for byte, at every length.
final class PublishRecordTests: XCTestCase {
    func testTheChecksumIsCRC32C() {
        XCTAssertEqual(crc(Array("123456789".utf8)), 0xE306_9283)
        XCTAssertEqual(crc([UInt8](repeating: 0, count: 32)), 0x8A91_36AA)
        XCTAssertEqual(crc([UInt8](repeating: 0xFF, count: 32)), 0x62A8_AB43)
        XCTAssertEqual(crc([]), 0)
        XCTAssertEqual(Self.definition(Array("123456789".utf8)), 0xE306_9283)
    }

    func testEveryLengthAndAlignmentAgreesWithTheDefinition() {
        var generator = SystemRandomNumberGenerator()
        let bytes = (0..<200_000).map { _ in UInt8.random(in: 0...255, using: &generator) }
        // Around the sizes where ISA-L's code changes its steps (16, 64, 256 bytes and the
        // 64-byte folds past them), and at random.
        var lengths = [0, 1, 7, 8, 15, 16, 17, 31, 32, 63, 64, 65, 127, 128, 255, 256, 257, 511, 512, 1_023, 1_024,
                       4_095, 4_096, 65_536, 199_992]
        lengths += (0..<100).map { _ in Int.random(in: 0..<199_992, using: &generator) }
        bytes.withUnsafeBytes { buffer in
            for length in lengths {
                for start in 0..<8 {
                    let piece = UnsafeRawBufferPointer(rebasing: buffer[start..<(start + length)])
                    XCTAssertEqual(UInt32(clinux_crc32c(0, piece.baseAddress, length)), Self.definition(piece),
                                   "\(length) bytes from \(start)")
                }
            }
            // Continued over pieces, as a record reads a file in blocks.
            let whole = Self.definition(buffer)
            for _ in 0..<100 {
                let cut = Int.random(in: 0...bytes.count, using: &generator)
                let first = clinux_crc32c(0, buffer.baseAddress!, cut)
                XCTAssertEqual(UInt32(clinux_crc32c(first, buffer.baseAddress! + cut, bytes.count - cut)), whole,
                               "cut at \(cut)")
            }
        }
    }

    /// ISA-L takes an `int` length (which it reads as 32 bits unsigned): a longer buffer goes in
    /// parts, and must sum as one. Past 4 GiB, so that a length cut to 32 bits shows. Zero pages,
    /// mapped and never written, so they cost no memory.
    func testABufferPastTheLengthOfOneCallIsSummedWhole() throws {
        let length = 4 * Int(CLINUX_CRC32C_PART) + 4_097
        let memory = mmap(nil, length, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
        guard let memory, memory != MAP_FAILED else { throw XCTSkip("no room for \(length) bytes of address space") }
        defer { munmap(memory, length) }
        let whole = clinux_crc32c(0, memory, length)
        // In parts of a call each, cut elsewhere than the wrapper cuts.
        var sum: UInt32 = 0, done = 0
        for part in [Int(Int32.max), Int(CLINUX_CRC32C_PART) / 3, length] {
            let count = min(part, length - done)
            sum = clinux_crc32c(sum, memory + done, count)
            done += count
        }
        XCTAssertEqual(done, length)
        XCTAssertEqual(whole, sum)
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
        bytes.withUnsafeBytes { UInt32(clinux_crc32c(0, $0.baseAddress, $0.count)) }
    }

    /// CRC-32C as defined, a bit at a time (reflected, polynomial 0x82F63B78, inverted in and out).
    private static func definition<Bytes: Sequence<UInt8>>(_ bytes: Bytes) -> UInt32 {
        var crc: UInt32 = 0xFFFF_FFFF
        for byte in bytes {
            crc ^= UInt32(byte)
            for _ in 0..<8 { crc = crc & 1 == 1 ? (crc >> 1) ^ 0x82F6_3B78 : crc >> 1 }
        }
        return ~crc
    }
}
