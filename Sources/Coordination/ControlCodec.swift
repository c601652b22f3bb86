import Foundation

// Framing and JSON encoding of control messages (docs/control-protocol.md). Every frame is a
// 4-byte big-endian payload length, then a JSON object {"version": 1, "type": ..., "body": ...}.
// Decoding is strict and total: any input either yields a message or a ControlCodecError.

public enum ControlCodecError: Error, Hashable, Sendable {
    /// Fewer bytes than the header or the announced payload needs.
    case truncated(needed: Int, available: Int)
    /// The announced payload is larger than the limit; the stream cannot be resynchronised.
    case oversized(length: Int, limit: Int)
    /// Not JSON, not an object, a missing or mistyped field, an unknown option, a bad path…
    case malformed(String)
    case unsupportedVersion(Int)
    case unknownMessageType(String)
}

public enum ControlCodec {
    public static let protocolVersion = 1
    public static let headerSize = 4
    /// The largest payload either side sends or accepts: 1 MiB.
    public static let maxPayloadSize = 1 << 20

    /// One complete frame, header included.
    public static func encode(_ message: ControlMessage) throws(ControlCodecError) -> [UInt8] {
        // The payload goes after room for its header, which is filled in once its length is known.
        var frame: [UInt8] = [0, 0, 0, 0]
        if case .presenterMessage(let notice) = message {
            frame.reserveCapacity(256)
            appendNotice(notice, to: &frame)
        } else {
            frame += try encodePayload(message)
        }
        let length = frame.count - headerSize
        guard length <= maxPayloadSize else { throw .oversized(length: length, limit: maxPayloadSize) }
        for index in 0..<headerSize { frame[index] = UInt8(truncatingIfNeeded: length >> (8 * (headerSize - 1 - index))) }
        return frame
    }

    /// Decodes exactly one frame: missing bytes are `truncated`, extra bytes are `malformed`.
    public static func decode(frame: [UInt8]) throws(ControlCodecError) -> ControlMessage {
        guard frame.count >= headerSize else { throw .truncated(needed: headerSize, available: frame.count) }
        let length = try payloadLength(frame[0..<headerSize])
        let needed = headerSize + length
        guard frame.count >= needed else { throw .truncated(needed: needed, available: frame.count) }
        guard frame.count == needed else { throw .malformed("\(frame.count - needed) bytes after the frame") }
        return try decodePayload(frame[headerSize...])
    }

    /// Reads a frame header: the payload length, checked against the limit.
    static func payloadLength(_ header: ArraySlice<UInt8>) throws(ControlCodecError) -> Int {
        let bytes = Array(header)
        let length = Int(bytes[0]) << 24 | Int(bytes[1]) << 16 | Int(bytes[2]) << 8 | Int(bytes[3])
        guard length <= maxPayloadSize else { throw .oversized(length: length, limit: maxPayloadSize) }
        return length
    }

    /// The payload as JSONEncoder writes it (`encode` writes presenter notices by hand, alike).
    static func encodePayload(_ message: ControlMessage) throws(ControlCodecError) -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        do {
            switch message {
            case .hello(let body): return try encode(.hello, body, encoder)
            case .helloReply(let body): return try encode(.helloReply, body, encoder)
            case .addPresenter(let body): return try encode(.addPresenter, body, encoder)
            case .removePresenter(let body): return try encode(.removePresenter, body, encoder)
            case .coordinate(let body): return try encode(.coordinate, body, encoder)
            case .granted(let body): return try encode(.granted, body, encoder)
            case .denied(let body): return try encode(.denied, body, encoder)
            case .release(let body): return try encode(.release, body, encoder)
            case .cancel(let body): return try encode(.cancel, body, encoder)
            case .presenterMessage(let body): return try encode(.presenterMessage, body, encoder)
            case .presenterReply(let body): return try encode(.presenterReply, body, encoder)
            case .statusRequest: return try encode(.statusRequest, Empty(), encoder)
            case .statusReply(let body): return try encode(.statusReply, body, encoder)
            case .error(let body): return try encode(.error, body, encoder)
            }
        } catch {
            throw .malformed("cannot encode \(message.type.rawValue): \(error)")
        }
    }

    static func decodePayload(_ payload: ArraySlice<UInt8>) throws(ControlCodecError) -> ControlMessage {
        guard !payload.isEmpty else { throw .malformed("empty payload") }
        if let notice = NoticeReader.read(payload) { return .presenterMessage(notice) }
        return try decodeJSON(payload)
    }

    /// The strict decoder, for every message.
    static func decodeJSON(_ payload: ArraySlice<UInt8>) throws(ControlCodecError) -> ControlMessage {
        let data = Data(payload)
        let decoder = JSONDecoder()
        let header: Header
        do {
            header = try decoder.decode(Header.self, from: data)
        } catch {
            throw .malformed(describe(error))
        }
        guard header.version == protocolVersion else { throw .unsupportedVersion(header.version) }
        guard let type = MessageType(rawValue: header.type) else { throw .unknownMessageType(header.type) }
        func body<Body: Decodable>(_: Body.Type) throws -> Body {
            try decoder.decode(Envelope<Body>.self, from: data).body
        }
        do {
            switch type {
            case .hello: return .hello(try body(ControlMessage.Hello.self))
            case .helloReply: return .helloReply(try body(ControlMessage.HelloReply.self))
            case .addPresenter: return .addPresenter(try body(ControlMessage.AddPresenter.self))
            case .removePresenter: return .removePresenter(try body(ControlMessage.RemovePresenter.self))
            case .coordinate: return .coordinate(try body(ControlMessage.CoordinateRequest.self))
            case .granted: return .granted(try body(ControlMessage.Granted.self))
            case .denied: return .denied(try body(ControlMessage.Denied.self))
            case .release: return .release(try body(ControlMessage.Release.self))
            case .cancel: return .cancel(try body(ControlMessage.Cancel.self))
            case .presenterMessage: return .presenterMessage(try body(ControlMessage.PresenterNotice.self))
            case .presenterReply: return .presenterReply(try body(ControlMessage.PresenterReply.self))
            case .statusRequest: _ = try body(Empty.self); return .statusRequest
            case .statusReply: return .statusReply(try body(CoordinationStatus.self))
            case .error: return .error(try body(ControlMessage.ControlError.self))
            }
        } catch {
            throw .malformed("\(type.rawValue): \(describe(error))")
        }
    }

    private static func encode<Body: Encodable>(_ type: MessageType, _ body: Body, _ encoder: JSONEncoder) throws -> [UInt8] {
        Array(try encoder.encode(Envelope(version: protocolVersion, type: type.rawValue, body: body)))
    }

    /// A presenter notice, written by hand as the encoder would write it (sorted keys, slashes
    /// unescaped): one goes out per presenter and operation, and JSONEncoder costs more than the
    /// operation itself. Appended in place, with no array made on the way.
    static func appendNotice(_ notice: ControlMessage.PresenterNotice, to payload: inout [UInt8]) {
        append(#"{"body":{"expectsReply":"#, to: &payload)
        append(notice.expectsReply ? "true" : "false", to: &payload)
        append(#","message":"#, to: &payload)
        appendJSON(notice.message, to: &payload)
        append(#","messageID":"#, to: &payload)
        appendDecimal(notice.messageID.rawValue, to: &payload)
        append(#","presenter":"#, to: &payload)
        appendJSONString(notice.presenter.rawValue, to: &payload)
        append(#"},"type":"presenterMessage","version":1}"#, to: &payload)
    }

    /// `PresenterMessage.encode(to:)`'s object, keys in sorted order: from, name, path, to, version.
    static func appendJSON(_ message: PresenterMessage, to bytes: inout [UInt8]) {
        var from: ItemPath?, path: ItemPath?, to: ItemPath?, version: String?
        switch message {
        case .accommodatePresentedSubitemDeletion(let item), .presentedSubitemDidChange(let item),
             .presentedSubitemDidAppear(let item):
            path = item
        case .presentedItemDidMove(let destination):
            to = destination
        case .presentedSubitemDidMove(let source, let destination):
            (from, to) = (source, destination)
        case .presentedItemDidGainVersion(let identifier):
            version = identifier
        case .presentedSubitemDidGainVersion(let item, let identifier):
            (path, version) = (item, identifier)
        default:
            break
        }
        bytes.append(UInt8(ascii: "{"))
        if let from {
            append(#""from":"#, to: &bytes)
            appendJSON(from, to: &bytes)
            bytes.append(UInt8(ascii: ","))
        }
        append(#""name":"#, to: &bytes)
        appendJSONString(message.name, to: &bytes)
        if let path {
            append(#","path":"#, to: &bytes)
            appendJSON(path, to: &bytes)
        }
        if let to {
            append(#","to":"#, to: &bytes)
            appendJSON(to, to: &bytes)
        }
        if let version {
            append(#","version":"#, to: &bytes)
            appendJSONString(version, to: &bytes)
        }
        bytes.append(UInt8(ascii: "}"))
    }

    /// `ItemPath`'s list of names: a string each, or `{"hex": ...}` for a name that is not UTF-8.
    static func appendJSON(_ path: ItemPath, to bytes: inout [UInt8]) {
        bytes.append(UInt8(ascii: "["))
        for (index, component) in path.components.enumerated() {
            if index > 0 { bytes.append(UInt8(ascii: ",")) }
            // Escaped from the bytes, with no String made for each name (a notice names every
            // directory of its path).
            if isValidUTF8(component.bytes) {
                appendJSONString(utf8: component.bytes, to: &bytes)
            } else {
                append(#"{"hex":""#, to: &bytes)
                bytes.append(contentsOf: encodeHex(component.bytes).utf8)
                append(#""}"#, to: &bytes)
            }
        }
        bytes.append(UInt8(ascii: "]"))
    }

    /// A JSON string literal, escaped as JSONEncoder escapes (slashes left alone).
    static func appendJSONString(_ string: String, to bytes: inout [UInt8]) {
        var string = string
        string.withUTF8 { appendJSONString(utf8: $0, to: &bytes) }
    }

    /// `appendJSONString` of bytes that are valid UTF-8.
    static func appendJSONString(utf8: [UInt8], to bytes: inout [UInt8]) {
        utf8.withUnsafeBufferPointer { appendJSONString(utf8: $0, to: &bytes) }
    }

    private static func appendJSONString(utf8: UnsafeBufferPointer<UInt8>, to bytes: inout [UInt8]) {
        bytes.append(UInt8(ascii: "\""))
        defer { bytes.append(UInt8(ascii: "\"")) }
        // Most names need no escape: copied whole.
        guard utf8.contains(where: { $0 < 0x20 || $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "\\") }) else {
            return bytes.append(contentsOf: utf8)
        }
        for byte in utf8 {
            switch byte {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"):
                bytes.append(UInt8(ascii: "\\"))
                bytes.append(byte)
            case 0x08: append(#"\b"#, to: &bytes)
            case 0x0C: append(#"\f"#, to: &bytes)
            case 0x0A: append(#"\n"#, to: &bytes)
            case 0x0D: append(#"\r"#, to: &bytes)
            case 0x09: append(#"\t"#, to: &bytes)
            case 0..<0x20:
                append(#"\u00"#, to: &bytes)
                bytes.append(hexDigit(byte >> 4))
                bytes.append(hexDigit(byte & 0xF))
            default: bytes.append(byte)
            }
        }
    }

    private static func append(_ literal: StaticString, to bytes: inout [UInt8]) {
        bytes.append(contentsOf: UnsafeBufferPointer(start: literal.utf8Start, count: literal.utf8CodeUnitCount))
    }

    private static func appendDecimal(_ value: UInt64, to bytes: inout [UInt8]) {
        var divisor: UInt64 = 1
        while value / divisor >= 10 { divisor *= 10 }
        while divisor > 0 {
            bytes.append(UInt8(ascii: "0") + UInt8(value / divisor % 10))
            divisor /= 10
        }
    }

    private static func hexDigit(_ value: UInt8) -> UInt8 {
        value < 10 ? UInt8(ascii: "0") + value : UInt8(ascii: "a") + value - 10
    }

    /// A short reason for an error report, without echoing large inputs back.
    private static func describe(_ error: any Error) -> String {
        guard let error = error as? DecodingError else { return "invalid JSON" }
        let (context, what): (DecodingError.Context, String) = switch error {
        case .typeMismatch(_, let context): (context, "wrong type")
        case .valueNotFound(_, let context): (context, "missing value")
        case .keyNotFound(let key, let context): (context, "missing field \(key.stringValue)")
        case .dataCorrupted(let context): (context, context.debugDescription)
        @unknown default: (DecodingError.Context(codingPath: [], debugDescription: ""), "invalid")
        }
        let path = context.codingPath.map { $0.intValue.map(String.init) ?? $0.stringValue }.joined(separator: ".")
        return String((path.isEmpty ? what : "\(path): \(what)").prefix(200))
    }
}

extension ControlMessage {
    /// The `type` field on the wire.
    var type: MessageType {
        switch self {
        case .hello: return .hello
        case .helloReply: return .helloReply
        case .addPresenter: return .addPresenter
        case .removePresenter: return .removePresenter
        case .coordinate: return .coordinate
        case .granted: return .granted
        case .denied: return .denied
        case .release: return .release
        case .cancel: return .cancel
        case .presenterMessage: return .presenterMessage
        case .presenterReply: return .presenterReply
        case .statusRequest: return .statusRequest
        case .statusReply: return .statusReply
        case .error: return .error
        }
    }
}

enum MessageType: String, CaseIterable {
    case hello, helloReply, addPresenter, removePresenter, coordinate, granted, denied, release, cancel
    case presenterMessage, presenterReply, statusRequest, statusReply, error
}

private struct Header: Decodable {
    let version: Int
    let type: String
}

private struct Envelope<Body> {
    let version: Int
    let type: String
    let body: Body
}

extension Envelope: Encodable where Body: Encodable {}
extension Envelope: Decodable where Body: Decodable {}

private struct Empty: Codable {}

/// Splits a byte stream into control messages. Feed it whatever the socket returns; take
/// messages out with `next()` until it returns nil; call `finish()` at end of stream.
public struct FrameReader: Sendable {
    private var buffer: [UInt8] = []
    private var start = 0
    /// Set once framing is lost (an oversized header): every later call fails the same way.
    private var broken: ControlCodecError?

    public init() {}

    public var bufferedByteCount: Int { buffer.count - start }

    public mutating func append<Bytes: Sequence<UInt8>>(_ bytes: Bytes) {
        buffer.append(contentsOf: bytes)
    }

    /// The next complete message, or nil if more bytes are needed. A malformed payload is
    /// skipped (its frame was well delimited) after its error is thrown.
    public mutating func next() throws(ControlCodecError) -> ControlMessage? {
        if let broken { throw broken }
        guard bufferedByteCount >= ControlCodec.headerSize else { return nil }
        let length: Int
        do {
            length = try ControlCodec.payloadLength(buffer[start..<start + ControlCodec.headerSize])
        } catch {
            broken = error
            throw error
        }
        guard bufferedByteCount >= ControlCodec.headerSize + length else { return nil }
        let payload = buffer[(start + ControlCodec.headerSize)..<(start + ControlCodec.headerSize + length)]
        start += ControlCodec.headerSize + length
        defer { compact() }
        return try ControlCodec.decodePayload(payload)
    }

    /// Call at end of stream: leftover bytes mean the peer stopped in the middle of a frame.
    public func finish() throws(ControlCodecError) {
        if let broken { throw broken }
        guard bufferedByteCount > 0 else { return }
        var needed = ControlCodec.headerSize
        if bufferedByteCount >= ControlCodec.headerSize {
            needed += try ControlCodec.payloadLength(buffer[start..<start + ControlCodec.headerSize])
        }
        throw .truncated(needed: needed, available: bufferedByteCount)
    }

    /// Drops consumed bytes once they are the larger part of the buffer (amortised O(1)).
    private mutating func compact() {
        if start == buffer.count {
            buffer.removeAll(keepingCapacity: buffer.count <= 2 * ControlCodec.maxPayloadSize)
            start = 0
        } else if start > 4096, start * 2 > buffer.count {
            buffer.removeFirst(start)
            start = 0
        }
    }
}
