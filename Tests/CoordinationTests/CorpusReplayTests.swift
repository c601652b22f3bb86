import Coordination
import Foundation
import XCTest

/// Replays the libFuzzer corpus (Fuzz/corpus, see Fuzz/README.md) through the codec, so that every
/// input the fuzzer found interesting, and every crash it ever found, stays covered by `swift test`.
/// Files named `valid-<type>-<n>` were written by Fuzz's SeedGenerator with `ControlCodec.encode`:
/// they must decode, and re-encode to the very same bytes. Every other file must merely decode to a
/// message or a ControlCodecError, the same way whether it comes as one frame or as a stream.
final class CorpusReplayTests: XCTestCase {
    static let corpus = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent()  // CoordinationTests
        .deletingLastPathComponent()  // Tests
        .deletingLastPathComponent()  // the package root
        .appendingPathComponent("Fuzz/corpus", isDirectory: true)

    static let allTypes: Set<String> = [
        "hello", "helloReply", "addPresenter", "removePresenter", "coordinate", "granted", "denied",
        "release", "cancel", "presenterMessage", "presenterReply", "statusRequest", "statusReply", "error",
    ]

    private func corpusFiles() throws -> [(name: String, bytes: [UInt8])] {
        let names = try FileManager.default.contentsOfDirectory(atPath: Self.corpus.path).sorted()
        return try names.filter { !$0.hasPrefix(".") }.map { name in
            (name, Array(try Data(contentsOf: Self.corpus.appendingPathComponent(name))))
        }
    }

    private static func typeName(_ message: ControlMessage) -> String {
        String("\(message)".prefix(while: { $0 != "(" }).split(separator: ".").last ?? "")
    }

    func testValidSeedsDecodeAndReencodeToTheSameBytes() throws {
        let seeds = try corpusFiles().filter { $0.name.hasPrefix("valid-") }
        var types: Set<String> = []
        for (name, bytes) in seeds {
            let message: ControlMessage
            do {
                message = try ControlCodec.decode(frame: bytes)
            } catch {
                XCTFail("\(name): a valid seed does not decode: \(error)")
                continue
            }
            let type = Self.typeName(message)
            XCTAssertTrue(name.hasPrefix("valid-\(type)-"), "\(name) holds a \(type) message")
            types.insert(type)
            XCTAssertEqual(try ControlCodec.encode(message), bytes, "\(name) re-encodes differently")
            XCTAssertEqual(try ControlCodec.decode(frame: try ControlCodec.encode(message)), message, name)
            XCTAssertEqual(read(bytes, pieces: [bytes.count]).messages, [message], "\(name) as a stream")
        }
        XCTAssertEqual(types, Self.allTypes, "every message type has a valid seed")
    }

    func testEveryCorpusFileDecodesOrThrowsAlikeWholeAndInPieces() throws {
        let files = try corpusFiles()
        XCTAssertGreaterThanOrEqual(files.count, Self.allTypes.count, "the corpus is at \(Self.corpus.path)")
        var generator = SeededGenerator(seed: 0xF0CC_ACC1A)
        var accepted = 0
        for (name, bytes) in files {
            var single: ControlMessage?
            do {
                let message = try ControlCodec.decode(frame: bytes)
                single = message
                accepted += 1
                XCTAssertEqual(try ControlCodec.decode(frame: try ControlCodec.encode(message)), message,
                               "\(name): an accepted message does not survive re-encoding")
            } catch {
                // Typed throws: `error` is a ControlCodecError; nothing else can come out.
            }

            let whole = read(bytes, pieces: [bytes.count])
            if let single {
                XCTAssertEqual(whole.messages, [single], "\(name): the reader disagrees with decode(frame:)")
                XCTAssertTrue(whole.errors.isEmpty && whole.finished == nil, "\(name): \(whole)")
            }
            for _ in 0..<4 {
                var pieces: [Int] = []
                var remaining = bytes.count
                while remaining > 0 {
                    let piece = min(remaining, Int.random(in: 1...max(1, min(64, bytes.count)), using: &generator))
                    pieces.append(piece)
                    remaining -= piece
                }
                XCTAssertEqual(read(bytes, pieces: pieces), whole, "\(name): pieces \(pieces) change the outcome")
            }
        }
        XCTAssertGreaterThan(accepted, 0)
    }

    /// Decodes as a stream, failing the test if the reader ever stalls.
    private func read(_ bytes: [UInt8], pieces: [Int], file: StaticString = #filePath, line: UInt = #line) -> StreamOutcome {
        let outcome = FrameReader.decode(bytes, inPieces: pieces)
        XCTAssertTrue(outcome.madeProgress, "the reader consumed nothing", file: file, line: line)
        return outcome
    }
}
