@testable import Coordination
import XCTest

/// Reproducible randomness for the property tests (SplitMix64).
struct SeededGenerator: RandomNumberGenerator {
    private var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

final class ControlCodecTests: XCTestCase {
    static let oddName = PathComponent(bytes: [0x66, 0xFF, 0xFE, 0x22, 0x5C])!  // not UTF-8, with " and \

    static let samples: [ControlMessage] = {
        let weird = path("Documents").appending(oddName)
        let key = PresenterKey(owner: OwnerID(7), purpose: PurposeID("p"))
        return [
            .hello(.init(clientName: "notes-sync", processID: 4242)),
            .hello(.init(clientName: "")),
            .helloReply(.init(clientID: OwnerID(7))),
            .addPresenter(.init(presenter: PurposeID("A1"), path: weird)),
            .removePresenter(.init(presenter: PurposeID("A1"))),
            .coordinate(.init(requestID: 1, purpose: PurposeID("c"), accesses: [
                .write(path("Documents/a.txt"), options: .forMoving),
                .write(path("Documents/b.txt"), options: [.forReplacing, .forMerging]),
                .read(path("Documents/Talk.key"), isDirectory: true, options: [.withoutChanges, .forUploading]),
            ], timeoutMilliseconds: 2500)),
            .coordinate(.init(requestID: UInt64.max, purpose: PurposeID("ü"), accesses: [])),
            .granted(.init(requestID: 1)),
            .denied(.init(requestID: 1, reason: .timedOut, detail: "waited 2.5 s")),
            .release(.init(requestID: 1)),
            .cancel(.init(requestID: 2)),
            .presenterMessage(.init(messageID: MessageID(9), presenter: PurposeID("A1"),
                                    message: .presentedSubitemDidMove(from: weird, to: path("Archive/x")))),
            .presenterMessage(.init(messageID: MessageID(10), presenter: PurposeID("A1"),
                                    message: .relinquishPresentedItemToWriter)),
            .presenterReply(.init(messageID: MessageID(9))),
            .presenterReply(.init(messageID: MessageID(10), error: "could not save")),
            .statusRequest,
            .statusReply(CoordinationStatus(
                accesses: [AccessStatus(ticket: AccessTicket(3), state: .waiting, owner: OwnerID(7),
                                        purpose: PurposeID("c"), kind: .write(.forDeleting), path: weird,
                                        isDirectory: true)],
                presenters: [PresenterRecord(key: key, path: .root, isUnresponsive: true)],
                pendingMessages: [PendingMessageStatus(id: MessageID(4), presenter: key,
                                                       message: .accommodatePresentedSubitemDeletion(at: weird))])),
            .error(.init(code: .protocolViolation, message: "hello first")),
        ]
    }()

    private func frame(_ json: String) -> [UInt8] {
        let payload = Array(json.utf8)
        let length = UInt32(payload.count)
        return [UInt8(length >> 24), UInt8(length >> 16 & 0xFF), UInt8(length >> 8 & 0xFF), UInt8(length & 0xFF)] + payload
    }

    private func assertDecodeFails(_ bytes: [UInt8], _ expected: ControlCodecError,
                                   file: StaticString = #filePath, line: UInt = #line) {
        XCTAssertThrowsError(try ControlCodec.decode(frame: bytes), file: file, line: line) { error in
            XCTAssertEqual(error as? ControlCodecError, expected, file: file, line: line)
        }
    }

    private func assertMalformed(_ json: String, file: StaticString = #filePath, line: UInt = #line) {
        XCTAssertThrowsError(try ControlCodec.decode(frame: frame(json)), file: file, line: line) { error in
            guard case .malformed? = error as? ControlCodecError else {
                return XCTFail("expected malformed, got \(error)", file: file, line: line)
            }
        }
    }

    func testEveryMessageRoundTrips() throws {
        XCTAssertEqual(Set(Self.samples.map { "\($0)".prefix(while: { $0 != "(" }) }).count, 14, "all 14 types sampled")
        for message in Self.samples {
            let bytes = try ControlCodec.encode(message)
            XCTAssertEqual(try ControlCodec.decode(frame: bytes), message)
        }
    }

    func testWireFormatIsTheDocumentedOne() throws {
        let bytes = try ControlCodec.encode(.granted(.init(requestID: 5)))
        XCTAssertEqual(Array(bytes[0..<4]), [0, 0, 0, UInt8(bytes.count - 4)])
        XCTAssertEqual(String(decoding: bytes[4...], as: UTF8.self), #"{"body":{"requestID":5},"type":"granted","version":1}"#)
        let request = try ControlCodec.decode(frame: frame(#"""
            {"version":1,"type":"coordinate","body":{"requestID":3,"purpose":"x","accesses":[
              {"path":["Documents",{"hex":"ff"}],"isDirectory":false,"kind":{"mode":"write","options":["forDeleting"]}}]}}
            """#))
        XCTAssertEqual(request, .coordinate(.init(requestID: 3, purpose: PurposeID("x"), accesses: [
            .write(ItemPath(components: [PathComponent("Documents")!, PathComponent(bytes: [0xFF])!]),
                   options: .forDeleting),
        ])))
    }

    /// Presenter notices are written by hand: byte for byte what JSONEncoder writes, for every kind
    /// of message and awkward presenter names.
    func testPresenterNoticesAreWrittenAsTheEncoderWritesThem() throws {
        struct Envelope: Encodable {
            let version = 1
            let type = "presenterMessage"
            let body: ControlMessage.PresenterNotice
        }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        let weird = path("Documents").appending(Self.oddName)
        let messages: [PresenterMessage] = [
            .relinquishPresentedItemToReader, .relinquishPresentedItemToWriter, .savePresentedItemChanges,
            .accommodatePresentedItemDeletion, .reacquirePresentedItem, .presentedItemDidChange,
            .presentedItemDidMove(to: weird), .presentedSubitemDidAppear(at: path("Documents/a b")),
            .presentedSubitemDidChange(at: weird), .accommodatePresentedSubitemDeletion(at: path("a/b/c")),
            .presentedSubitemDidMove(from: weird, to: path("Archive/x")),
            .presentedItemDidGainVersion("v-1795620978651834880"),
            .presentedSubitemDidGainVersion(at: weird, version: "v-\"1\\"),
            // Names of ASCII with escapes, and of UTF-8 beyond ASCII: both escaped from their bytes.
            .presentedSubitemDidChange(at: ItemPath(components: [PathComponent(bytes: Array("q\"b\\\t\u{1}\u{7F}".utf8))!])),
            .presentedSubitemDidChange(at: path("Documents/ü€😀/x")),
        ]
        let control = String((0..<0x20).map { Character(Unicode.Scalar(UInt8($0))) })
        let names = ["p", "", "quote\"back\\slash/", control, "\u{7F}ü€😀", "fuse-\(UInt64.max)"]
        for (index, message) in messages.enumerated() {
            for name in names {
                for repeated in 0..<2 {
                    let notice = ControlMessage.PresenterNotice(messageID: MessageID(UInt64(index * 7 + repeated) << 40),
                                                                presenter: PurposeID(name), message: message)
                    let expected = Array(try encoder.encode(Envelope(body: notice)))
                    XCTAssertEqual(String(decoding: try ControlCodec.encode(.presenterMessage(notice)).dropFirst(4), as: UTF8.self),
                                   String(decoding: expected, as: UTF8.self))
                }
            }
        }
    }

    /// Notices are read back without JSONDecoder when they are laid out as the daemon writes them:
    /// every one of the messages above, and of mutated ones only what the strict decoder reads
    /// the same way (anything else is left to it).
    func testTheNoticeReaderAcceptsOnlyWhatTheStrictDecoderReadsAlike() throws {
        let weird = path("Documents").appending(Self.oddName)
        let messages: [PresenterMessage] = [
            .relinquishPresentedItemToReader, .savePresentedItemChanges, .accommodatePresentedItemDeletion,
            .presentedItemDidMove(to: weird), .presentedSubitemDidAppear(at: path("Documents/a b")),
            .accommodatePresentedSubitemDeletion(at: path("a/b/c")), .presentedSubitemDidMove(from: weird, to: path("x/y")),
            .presentedSubitemDidGainVersion(at: weird, version: "v-\"1\\"), .presentedItemDidGainVersion("v"),
            .presentedSubitemDidChange(at: ItemPath(components: [])),
        ]
        var frames: [[UInt8]] = []
        for (index, message) in messages.enumerated() {
            for name in ["p", "quote\"back\\slash/", "tab\there", "\u{1}", "ü€😀"] {
                let notice = ControlMessage.PresenterNotice(messageID: MessageID(UInt64(index) * 1_000_003), presenter: PurposeID(name),
                                                            message: message, expectsReply: index % 2 == 0)
                let payload = Array(try ControlCodec.encode(.presenterMessage(notice)).dropFirst(ControlCodec.headerSize))
                XCTAssertEqual(try ControlCodec.decodeJSON(payload[...]), .presenterMessage(notice))
                if name != "\u{1}" {
                    XCTAssertEqual(NoticeReader.read(payload[...]), notice, "read without JSONDecoder")
                } else {
                    XCTAssertNil(NoticeReader.read(payload[...]), "a \\u escape is left to the strict decoder")
                }
                frames.append(payload)
            }
        }
        var generator = SeededGenerator(seed: 0x5EED)
        var fastAndAlike = 0
        for _ in 0..<20_000 {
            var bytes = frames.randomElement(using: &generator)!
            let position = Int.random(in: 0..<bytes.count, using: &generator)
            switch Int.random(in: 0..<3, using: &generator) {
            case 0: bytes[position] = UInt8.random(in: 0...255, using: &generator)
            case 1: bytes.remove(at: position)
            default: bytes.insert(bytes[Int.random(in: 0..<bytes.count, using: &generator)], at: position)
            }
            guard let fast = NoticeReader.read(bytes[...]) else { continue }
            fastAndAlike += 1
            XCTAssertEqual(try? ControlCodec.decodeJSON(bytes[...]), .presenterMessage(fast), String(decoding: bytes, as: UTF8.self))
        }
        XCTAssertGreaterThan(fastAndAlike, 100, "some mutations keep the layout (a digit, a letter of a name)")
    }

    func testTruncatedOversizedAndTrailingFrames() throws {
        let good = try ControlCodec.encode(.statusRequest)
        assertDecodeFails([], .truncated(needed: 4, available: 0))
        assertDecodeFails([0, 0], .truncated(needed: 4, available: 2))
        assertDecodeFails(Array(good.dropLast()), .truncated(needed: good.count, available: good.count - 1))
        assertDecodeFails([0, 0x10, 0, 1] + Array(repeating: 0x20, count: 8), .oversized(length: (1 << 20) + 1, limit: 1 << 20))
        assertDecodeFails([0xFF, 0xFF, 0xFF, 0xFF], .oversized(length: 0xFFFF_FFFF, limit: 1 << 20))
        assertDecodeFails(good + [0], .malformed("1 bytes after the frame"))
        assertDecodeFails([0, 0, 0, 0], .malformed("empty payload"))
    }

    func testVersionAndTypeAreChecked() {
        assertDecodeFails(frame(#"{"version":2,"type":"hello","body":{"clientName":"x"}}"#), .unsupportedVersion(2))
        assertDecodeFails(frame(#"{"version":0,"type":"nonsense"}"#), .unsupportedVersion(0))
        assertDecodeFails(frame(#"{"version":1,"type":"launchMissiles","body":{}}"#), .unknownMessageType("launchMissiles"))
        assertMalformed(#"{"type":"hello","body":{"clientName":"x"}}"#)
        assertMalformed(#"{"version":"1","type":"hello","body":{"clientName":"x"}}"#)
        assertMalformed(#"{"version":1.5,"type":"hello","body":{"clientName":"x"}}"#)
    }

    func testMalformedBodiesAreRejected() {
        assertMalformed("not json")
        assertMalformed("[1,2,3]")
        assertMalformed(#"{"version":1,"type":"hello"}"#)
        assertMalformed(#"{"version":1,"type":"hello","body":{"clientName":5}}"#)
        assertMalformed(#"{"version":1,"type":"granted","body":{"requestID":-1}}"#)
        assertMalformed(#"{"version":1,"type":"granted","body":{"requestID":1e40}}"#)
        assertMalformed(#"{"version":1,"type":"addPresenter","body":{"presenter":"p","path":["a/b"]}}"#)
        assertMalformed(#"{"version":1,"type":"addPresenter","body":{"presenter":"p","path":[".."]}}"#)
        assertMalformed(#"{"version":1,"type":"addPresenter","body":{"presenter":"p","path":[{"hex":"f"}]}}"#)
        assertMalformed(#"{"version":1,"type":"addPresenter","body":{"presenter":"p","path":[{"hex":"00"}]}}"#)
        assertMalformed(#"{"version":1,"type":"coordinate","body":{"requestID":1,"purpose":"p","accesses":[{"path":[],"isDirectory":false,"kind":{"mode":"write","options":["forTeleporting"]}}]}}"#)
        assertMalformed(#"{"version":1,"type":"coordinate","body":{"requestID":1,"purpose":"p","accesses":[{"path":[],"isDirectory":false,"kind":{"mode":"execute"}}]}}"#)
        assertMalformed(#"{"version":1,"type":"presenterMessage","body":{"messageID":1,"presenter":"p","expectsReply":true,"message":{"name":"presentedItemDidMove"}}}"#)
        assertMalformed(#"{"version":1,"type":"denied","body":{"requestID":1,"reason":"bored"}}"#)
        assertMalformed("\u{FEFF}")
    }

    func testInvalidUTF8AndDeepNestingDoNotCrash() {
        let invalid = Array(#"{"version":1,"type":"hello","body":{"clientName":""#.utf8) + [0xC3, 0x28] + Array(#""}}"#.utf8)
        var framed: [UInt8] = [0, 0, 0, UInt8(invalid.count)]
        framed += invalid
        XCTAssertThrowsError(try ControlCodec.decode(frame: framed))
        let deep = String(repeating: "[", count: 200_000)
        XCTAssertThrowsError(try ControlCodec.decode(frame: frame(deep)))
        let deepBody = #"{"version":1,"type":"statusRequest","body":"# + String(repeating: #"{"a":"#, count: 100_000)
        XCTAssertThrowsError(try ControlCodec.decode(frame: frame(deepBody)))
    }

    func testFrameReaderSplitsAStreamFedInPieces() throws {
        let stream = try Self.samples.flatMap { try ControlCodec.encode($0) }
        var generator = SeededGenerator(seed: 1)
        var reader = FrameReader()
        var decoded: [ControlMessage] = []
        var offset = 0
        while offset < stream.count {
            let size = Int.random(in: 1...300, using: &generator)
            reader.append(stream[offset..<min(offset + size, stream.count)])
            offset += size
            while let message = try reader.next() { decoded.append(message) }
        }
        XCTAssertEqual(decoded, Self.samples)
        XCTAssertEqual(reader.bufferedByteCount, 0)
        XCTAssertNoThrow(try reader.finish())
    }

    func testFrameReaderReportsTruncationAtEndAndOversizeAtOnce() throws {
        var reader = FrameReader()
        let frame = try ControlCodec.encode(.statusRequest)
        reader.append(frame.dropLast(3))
        XCTAssertNil(try reader.next())
        XCTAssertThrowsError(try reader.finish()) { error in
            XCTAssertEqual(error as? ControlCodecError, .truncated(needed: frame.count, available: frame.count - 3))
        }

        var hostile = FrameReader()
        hostile.append([0x7F, 0, 0, 0])  // 2 GiB announced: rejected before any payload arrives
        XCTAssertThrowsError(try hostile.next()) { error in
            XCTAssertEqual(error as? ControlCodecError, .oversized(length: 0x7F00_0000, limit: 1 << 20))
        }
        hostile.append(try ControlCodec.encode(.statusRequest))
        XCTAssertThrowsError(try hostile.next(), "framing is lost for good")
    }

    func testFrameReaderSkipsAMalformedFrameAndGoesOn() throws {
        var reader = FrameReader()
        reader.append(frame("{}"))
        reader.append(try ControlCodec.encode(.statusRequest))
        XCTAssertThrowsError(try reader.next())
        XCTAssertEqual(try reader.next(), .statusRequest)
    }

    func testEncodingRefusesOversizedMessages() {
        let huge = ControlMessage.error(.init(code: .internalError, message: String(repeating: "x", count: 1 << 20)))
        XCTAssertThrowsError(try ControlCodec.encode(huge)) { error in
            guard case .oversized? = error as? ControlCodecError else { return XCTFail("\(error)") }
        }
    }

    /// Property: random bytes, and valid frames with random damage, never crash the decoder; each
    /// input gives a message or a ControlCodecError, and anything accepted re-encodes to itself.
    func testRandomAndMutatedInputNeverCrashes() throws {
        var generator = SeededGenerator(seed: 0xC0FFEE)
        let valid = try Self.samples.map { try ControlCodec.encode($0) }
        var accepted = 0
        var rejected: [String: Int] = [:]
        for round in 0..<6000 {
            var bytes: [UInt8]
            if round % 3 == 0 {
                let count = Int.random(in: 0...64, using: &generator)
                bytes = (0..<count).map { _ in UInt8.random(in: 0...255, using: &generator) }
                if round % 6 == 0, bytes.count >= 4 {  // make the header agree with the length sometimes
                    let length = bytes.count - 4
                    bytes[0] = 0; bytes[1] = 0; bytes[2] = UInt8(length >> 8); bytes[3] = UInt8(length & 0xFF)
                }
            } else {
                bytes = valid.randomElement(using: &generator)!
                for _ in 0..<Int.random(in: 1...4, using: &generator) {
                    mutate(&bytes, using: &generator)
                }
            }
            do {
                let message = try ControlCodec.decode(frame: bytes)
                accepted += 1
                XCTAssertEqual(try ControlCodec.decode(frame: try ControlCodec.encode(message)), message)
            } catch {
                let name = "\(error)".prefix(while: { $0 != "(" })
                rejected[String(name), default: 0] += 1
            }

            // The same bytes through the streaming reader, in random pieces: no crash either.
            var reader = FrameReader()
            var offset = 0
            streaming: while offset < bytes.count {
                let size = Int.random(in: 1...16, using: &generator)
                reader.append(bytes[offset..<min(offset + size, bytes.count)])
                offset += size
                while true {
                    do { guard try reader.next() != nil else { break } } catch { break streaming }
                }
            }
        }
        XCTAssertGreaterThan(accepted, 0, "some mutations leave a valid message")
        for kind in ["truncated", "malformed", "oversized"] {
            XCTAssertGreaterThan(rejected[kind, default: 0], 0, "no \(kind) input was produced: \(rejected)")
        }
    }

    private func mutate(_ bytes: inout [UInt8], using generator: inout SeededGenerator) {
        guard !bytes.isEmpty else { return bytes = [UInt8.random(in: 0...255, using: &generator)] }
        let index = Int.random(in: 0..<bytes.count, using: &generator)
        switch Int.random(in: 0..<6, using: &generator) {
        case 0: bytes[index] = UInt8.random(in: 0...255, using: &generator)
        case 1: bytes[index] ^= 1 << UInt8.random(in: 0..<8, using: &generator)
        case 2: bytes.removeSubrange(index...)
        case 3: bytes.insert(UInt8.random(in: 0...255, using: &generator), at: index)
        case 4: bytes.remove(at: index)
        default:
            // Replace a byte by a JSON-significant one to get past the parser more often.
            bytes[index] = Array(#"{}[]":,0 1"\"#.utf8).randomElement(using: &generator)!
        }
    }
}
