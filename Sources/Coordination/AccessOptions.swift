// The access kinds and options of NSFileCoordinator, named as in Foundation.

public struct ReadingOptions: OptionSet, Hashable, Sendable {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }

    /// Do not ask presenters to save first.
    public static let withoutChanges = ReadingOptions(rawValue: 1 << 0)
    public static let resolvesSymbolicLink = ReadingOptions(rawValue: 1 << 1)
    public static let immediatelyAvailableMetadataOnly = ReadingOptions(rawValue: 1 << 2)
    public static let forUploading = ReadingOptions(rawValue: 1 << 3)

    /// Names as used on the wire and in status output, in a fixed order.
    public static let named: [(name: String, option: ReadingOptions)] = [
        ("withoutChanges", .withoutChanges),
        ("resolvesSymbolicLink", .resolvesSymbolicLink),
        ("immediatelyAvailableMetadataOnly", .immediatelyAvailableMetadataOnly),
        ("forUploading", .forUploading),
    ]
}

public struct WritingOptions: OptionSet, Hashable, Sendable {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }

    public static let forDeleting = WritingOptions(rawValue: 1 << 0)
    public static let forMoving = WritingOptions(rawValue: 1 << 1)
    public static let forMerging = WritingOptions(rawValue: 1 << 2)
    public static let forReplacing = WritingOptions(rawValue: 1 << 3)
    public static let contentIndependentMetadataOnly = WritingOptions(rawValue: 1 << 4)

    public static let named: [(name: String, option: WritingOptions)] = [
        ("forDeleting", .forDeleting),
        ("forMoving", .forMoving),
        ("forMerging", .forMerging),
        ("forReplacing", .forReplacing),
        ("contentIndependentMetadataOnly", .contentIndependentMetadataOnly),
    ]

    /// Writes that make the item's contents go away or change place; on a directory they also
    /// reach every item inside it.
    public static let reachingInside: WritingOptions = [.forDeleting, .forMoving, .forReplacing]
}

/// A coordinated read or write with its options.
public enum AccessKind: Hashable, Sendable {
    case read(ReadingOptions)
    case write(WritingOptions)

    public var isWrite: Bool {
        if case .write = self { return true }
        return false
    }
}

/// One item a request wants to access. The caller says whether the item is a directory because
/// only the filesystem knows; the arbiter needs it to recognise file packages.
public struct ItemAccess: Hashable, Sendable {
    public var path: ItemPath
    public var isDirectory: Bool
    public var kind: AccessKind

    public init(path: ItemPath, isDirectory: Bool = false, kind: AccessKind) {
        self.path = path
        self.isDirectory = isDirectory
        self.kind = kind
    }

    public static func read(_ path: ItemPath, isDirectory: Bool = false,
                            options: ReadingOptions = []) -> ItemAccess {
        ItemAccess(path: path, isDirectory: isDirectory, kind: .read(options))
    }

    public static func write(_ path: ItemPath, isDirectory: Bool = false,
                             options: WritingOptions = []) -> ItemAccess {
        ItemAccess(path: path, isDirectory: isDirectory, kind: .write(options))
    }
}

// Options travel as lists of names, so the wire format and status output stay readable and a
// bit that one side does not know is rejected rather than silently dropped.
extension AccessKind: Codable {
    private enum CodingKeys: String, CodingKey { case mode, options }

    public var optionNames: [String] {
        switch self {
        case .read(let options): return ReadingOptions.named.filter { options.contains($0.option) }.map(\.name)
        case .write(let options): return WritingOptions.named.filter { options.contains($0.option) }.map(\.name)
        }
    }

    public init(from decoder: Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        let mode = try container.decode(String.self, forKey: .mode)
        let names = try container.decodeIfPresent([String].self, forKey: .options) ?? []
        func parse<Option: OptionSet>(_ table: [(name: String, option: Option)]) throws -> Option
            where Option.Element == Option {
            var options: Option = []
            for name in names {
                guard let entry = table.first(where: { $0.name == name }) else {
                    throw DecodingError.dataCorruptedError(
                        forKey: .options, in: container, debugDescription: "unknown option \(name) for \(mode)")
                }
                options.insert(entry.option)
            }
            return options
        }
        switch mode {
        case "read": self = .read(try parse(ReadingOptions.named))
        case "write": self = .write(try parse(WritingOptions.named))
        default:
            throw DecodingError.dataCorruptedError(
                forKey: .mode, in: container, debugDescription: "mode must be read or write, not \(mode)")
        }
    }

    public func encode(to encoder: Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(isWrite ? "write" : "read", forKey: .mode)
        try container.encode(optionNames, forKey: .options)
    }
}

extension ItemAccess: Codable {}
