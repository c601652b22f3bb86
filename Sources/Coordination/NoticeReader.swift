import Glibc

// Reads back a presenter notice exactly as `ControlCodec.appendNotice` writes it, without
// JSONDecoder: a presenter client gets one per operation it hears of, and decoding them cost it
// more than the operation cost the daemon. Anything else (another layout, a `\u` escape, a name
// that is not valid UTF-8) makes it give up, and the strict decoder reads the frame instead, so
// what is accepted and what it means are the strict decoder's.

struct NoticeReader {
    private let bytes: ArraySlice<UInt8>
    private var index: Int

    init(_ bytes: ArraySlice<UInt8>) {
        self.bytes = bytes
        self.index = bytes.startIndex
    }

    static func read(_ payload: ArraySlice<UInt8>) -> ControlMessage.PresenterNotice? {
        var reader = NoticeReader(payload)
        return reader.notice()
    }

    private mutating func notice() -> ControlMessage.PresenterNotice? {
        guard skip(#"{"body":{"expectsReply":"#) else { return nil }
        let expectsReply: Bool
        if skip("true") { expectsReply = true } else if skip("false") { expectsReply = false } else { return nil }
        guard skip(#","message":"#), let message = message(),
              skip(#","messageID":"#), let id = unsigned(),
              skip(#","presenter":"#), let presenter = string(),
              skip(#"},"type":"presenterMessage","version":1}"#), index == bytes.endIndex
        else { return nil }
        return ControlMessage.PresenterNotice(messageID: MessageID(id), presenter: PurposeID(presenter),
                                              message: message, expectsReply: expectsReply)
    }

    /// `{["from":P,]"name":S[,"path":P][,"to":P][,"version":S]}`, the fields the name needs and no other.
    private mutating func message() -> PresenterMessage? {
        guard skip("{") else { return nil }
        var from: ItemPath?, path: ItemPath?, to: ItemPath?, version: String?
        if skip(#""from":"#) {
            guard let source = itemPath(), skip(",") else { return nil }
            from = source
        }
        guard skip(#""name":"#), let name = string() else { return nil }
        if skip(#","path":"#) { guard let item = itemPath() else { return nil }; path = item }
        if skip(#","to":"#) { guard let item = itemPath() else { return nil }; to = item }
        if skip(#","version":"#) { guard let text = string() else { return nil }; version = text }
        guard skip("}") else { return nil }
        let message: PresenterMessage
        switch (name, from, path, to, version) {
        case ("relinquishPresentedItemToReader", nil, nil, nil, nil): message = .relinquishPresentedItemToReader
        case ("relinquishPresentedItemToWriter", nil, nil, nil, nil): message = .relinquishPresentedItemToWriter
        case ("savePresentedItemChanges", nil, nil, nil, nil): message = .savePresentedItemChanges
        case ("accommodatePresentedItemDeletion", nil, nil, nil, nil): message = .accommodatePresentedItemDeletion
        case ("accommodatePresentedSubitemDeletion", nil, let path?, nil, nil): message = .accommodatePresentedSubitemDeletion(at: path)
        case ("presentedItemDidChange", nil, nil, nil, nil): message = .presentedItemDidChange
        case ("presentedSubitemDidChange", nil, let path?, nil, nil): message = .presentedSubitemDidChange(at: path)
        case ("presentedSubitemDidAppear", nil, let path?, nil, nil): message = .presentedSubitemDidAppear(at: path)
        case ("presentedItemDidMove", nil, nil, let to?, nil): message = .presentedItemDidMove(to: to)
        case ("presentedSubitemDidMove", let from?, nil, let to?, nil): message = .presentedSubitemDidMove(from: from, to: to)
        case ("reacquirePresentedItem", nil, nil, nil, nil): message = .reacquirePresentedItem
        case ("presentedItemDidGainVersion", nil, nil, nil, let version?): message = .presentedItemDidGainVersion(version)
        case ("presentedSubitemDidGainVersion", nil, let path?, nil, let version?):
            message = .presentedSubitemDidGainVersion(at: path, version: version)
        default: return nil
        }
        return message
    }

    /// `[name, ...]`, each a string or `{"hex":"..."}`.
    private mutating func itemPath() -> ItemPath? {
        guard skip("[") else { return nil }
        var components: [PathComponent] = []
        if skip("]") { return ItemPath(components: components) }
        repeat {
            let name: [UInt8]
            if skip(#"{"hex":"#) {
                guard let digits = string(), let decoded = decodeHex(digits), skip("}") else { return nil }
                name = decoded
            } else {
                guard let text = utf8(), isValidUTF8(text) else { return nil }
                name = text
            }
            guard let component = PathComponent(bytes: name) else { return nil }
            components.append(component)
        } while skip(",")
        guard skip("]") else { return nil }
        return ItemPath(components: components)
    }

    /// A string with no `\u` escape, valid UTF-8.
    private mutating func string() -> String? {
        utf8().flatMap(validatedUTF8)
    }

    /// The bytes of a string with no `\u` escape, not yet checked to be UTF-8.
    private mutating func utf8() -> [UInt8]? {
        guard skip("\"") else { return nil }
        // Most strings hold no escape: taken whole, in one allocation.
        if let end = bytes[index...].firstIndex(where: { $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "\\") || $0 < 0x20 }),
           bytes[end] == UInt8(ascii: "\"") {
            defer { index = end + 1 }
            return Array(bytes[index..<end])
        }
        var result: [UInt8] = []
        while index < bytes.endIndex {
            let byte = bytes[index]
            index += 1
            switch byte {
            case UInt8(ascii: "\""):
                return result
            case UInt8(ascii: "\\"):
                guard index < bytes.endIndex else { return nil }
                let escaped = bytes[index]
                index += 1
                switch escaped {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): result.append(escaped)
                case UInt8(ascii: "b"): result.append(0x08)
                case UInt8(ascii: "f"): result.append(0x0C)
                case UInt8(ascii: "n"): result.append(0x0A)
                case UInt8(ascii: "r"): result.append(0x0D)
                case UInt8(ascii: "t"): result.append(0x09)
                default: return nil
                }
            case 0..<0x20:
                return nil
            default:
                result.append(byte)
            }
        }
        return nil
    }

    /// Decimal digits without a leading zero, within UInt64.
    private mutating func unsigned() -> UInt64? {
        let start = index
        var value: UInt64 = 0
        while index < bytes.endIndex, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) {
            let (times, overflow1) = value.multipliedReportingOverflow(by: 10)
            let (sum, overflow2) = times.addingReportingOverflow(UInt64(bytes[index] - UInt8(ascii: "0")))
            guard !overflow1, !overflow2 else { return nil }
            value = sum
            index += 1
        }
        let count = index - start
        guard count > 0, count == 1 || bytes[start] != UInt8(ascii: "0") else { return nil }
        return value
    }

    private mutating func skip(_ literal: StaticString) -> Bool {
        let count = literal.utf8CodeUnitCount
        guard bytes.endIndex - index >= count else { return false }
        let matches = literal.withUTF8Buffer { expected in
            bytes[index..<index + count].withUnsafeBufferPointer { memcmp($0.baseAddress!, expected.baseAddress!, count) == 0 }
        }
        if matches { index += count }
        return matches
    }
}
