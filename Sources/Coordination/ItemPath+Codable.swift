// On the wire a path is a list of names. A name that is valid UTF-8 is a plain string; any other
// name is {"hex": "..."} so that no byte is lost (JSON strings cannot carry invalid UTF-8).

extension PathComponent: Codable {
    private enum CodingKeys: String, CodingKey { case hex }

    public init(from decoder: Decoder) throws {
        let bytes: [UInt8]
        if let string = try? decoder.singleValueContainer().decode(String.self) {
            bytes = Array(string.utf8)
        } else {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            let hex = try container.decode(String.self, forKey: .hex)
            guard let decoded = decodeHex(hex) else {
                throw DecodingError.dataCorruptedError(forKey: .hex, in: container, debugDescription: "bad hex")
            }
            bytes = decoded
        }
        guard let component = PathComponent(bytes: bytes) else {
            throw DecodingError.dataCorrupted(.init(
                codingPath: decoder.codingPath, debugDescription: "not a valid name: \(bytes.count) bytes"))
        }
        self = component
    }

    public func encode(to encoder: Encoder) throws {
        if let string {
            var container = encoder.singleValueContainer()
            try container.encode(string)
        } else {
            var container = encoder.container(keyedBy: CodingKeys.self)
            try container.encode(encodeHex(bytes), forKey: .hex)
        }
    }
}

extension ItemPath: Codable {
    public init(from decoder: Decoder) throws {
        self.init(components: try decoder.singleValueContainer().decode([PathComponent].self))
    }

    public func encode(to encoder: Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(components)
    }
}

func encodeHex(_ bytes: [UInt8]) -> String {
    let digits = Array("0123456789abcdef".utf8)
    var result: [UInt8] = []
    result.reserveCapacity(bytes.count * 2)
    for byte in bytes {
        result.append(digits[Int(byte >> 4)])
        result.append(digits[Int(byte & 0xF)])
    }
    return String(decoding: result, as: UTF8.self)
}

func decodeHex(_ text: String) -> [UInt8]? {
    func value(_ digit: UInt8) -> UInt8? {
        switch digit {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return digit - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return digit - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return digit - UInt8(ascii: "A") + 10
        default: return nil
        }
    }
    let digits = Array(text.utf8)
    guard digits.count % 2 == 0 else { return nil }
    var result: [UInt8] = []
    result.reserveCapacity(digits.count / 2)
    var index = 0
    while index < digits.count {
        guard let high = value(digits[index]), let low = value(digits[index + 1]) else { return nil }
        result.append(high << 4 | low)
        index += 2
    }
    return result
}
