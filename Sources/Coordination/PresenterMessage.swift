// The messages a presenter hears, named after the NSFilePresenter callbacks they stand for.

public enum PresenterMessage: Hashable, Sendable {
    case relinquishPresentedItemToReader
    case relinquishPresentedItemToWriter
    case savePresentedItemChanges
    case accommodatePresentedItemDeletion
    case accommodatePresentedSubitemDeletion(at: ItemPath)
    case presentedItemDidChange
    case presentedSubitemDidChange(at: ItemPath)
    case presentedSubitemDidAppear(at: ItemPath)
    case presentedItemDidMove(to: ItemPath)
    case presentedSubitemDidMove(from: ItemPath, to: ItemPath)
    /// The reacquirer block that `relinquishPresentedItemTo…` handed out: the access has ended.
    case reacquirePresentedItem
    /// A previous version of the item was kept (its identifier among the item's versions).
    case presentedItemDidGainVersion(String)
    case presentedSubitemDidGainVersion(at: ItemPath, version: String)

    /// Messages that hold up the operation until the presenter answers (or its time runs out),
    /// unless the presenter awaits none of their kind: the requests. The others are notifications,
    /// sent without waiting.
    public var expectsReply: Bool { request != nil }

    /// The request this message is; nil for a notification.
    public var request: PresenterRequests? {
        switch self {
        case .relinquishPresentedItemToReader: return .relinquishToReader
        case .relinquishPresentedItemToWriter: return .relinquishToWriter
        case .savePresentedItemChanges: return .save
        case .accommodatePresentedItemDeletion: return .accommodateDeletion
        case .accommodatePresentedSubitemDeletion: return .accommodateSubitemDeletion
        case .presentedItemDidChange, .presentedSubitemDidChange, .presentedSubitemDidAppear,
             .presentedItemDidMove, .presentedSubitemDidMove, .reacquirePresentedItem,
             .presentedItemDidGainVersion, .presentedSubitemDidGainVersion:
            return nil
        }
    }

    /// The paths the message tells its presenter of, besides the presenter's own item.
    public var revealedPaths: [ItemPath] {
        switch self {
        case .accommodatePresentedSubitemDeletion(let path), .presentedSubitemDidChange(let path),
             .presentedSubitemDidAppear(let path), .presentedItemDidMove(let path),
             .presentedSubitemDidGainVersion(let path, _):
            return [path]
        case .presentedSubitemDidMove(let from, let to):
            return [from, to]
        case .relinquishPresentedItemToReader, .relinquishPresentedItemToWriter, .savePresentedItemChanges,
             .accommodatePresentedItemDeletion, .presentedItemDidChange, .reacquirePresentedItem,
             .presentedItemDidGainVersion:
            return []
        }
    }

    public var name: String {
        switch self {
        case .relinquishPresentedItemToReader: return "relinquishPresentedItemToReader"
        case .relinquishPresentedItemToWriter: return "relinquishPresentedItemToWriter"
        case .savePresentedItemChanges: return "savePresentedItemChanges"
        case .accommodatePresentedItemDeletion: return "accommodatePresentedItemDeletion"
        case .accommodatePresentedSubitemDeletion: return "accommodatePresentedSubitemDeletion"
        case .presentedItemDidChange: return "presentedItemDidChange"
        case .presentedSubitemDidChange: return "presentedSubitemDidChange"
        case .presentedSubitemDidAppear: return "presentedSubitemDidAppear"
        case .presentedItemDidMove: return "presentedItemDidMove"
        case .presentedSubitemDidMove: return "presentedSubitemDidMove"
        case .reacquirePresentedItem: return "reacquirePresentedItem"
        case .presentedItemDidGainVersion: return "presentedItemDidGainVersion"
        case .presentedSubitemDidGainVersion: return "presentedSubitemDidGainVersion"
        }
    }
}

// Wire form: {"name": "...", "path": [...]} or {"name": ..., "from": [...], "to": [...]}, and
// "version" for the version messages.
extension PresenterMessage: Codable {
    private enum CodingKeys: String, CodingKey { case name, path, from, to, version }

    public init(from decoder: Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        let name = try container.decode(String.self, forKey: .name)
        func path(_ key: CodingKeys) throws -> ItemPath { try container.decode(ItemPath.self, forKey: key) }
        switch name {
        case "relinquishPresentedItemToReader": self = .relinquishPresentedItemToReader
        case "relinquishPresentedItemToWriter": self = .relinquishPresentedItemToWriter
        case "savePresentedItemChanges": self = .savePresentedItemChanges
        case "accommodatePresentedItemDeletion": self = .accommodatePresentedItemDeletion
        case "accommodatePresentedSubitemDeletion": self = .accommodatePresentedSubitemDeletion(at: try path(.path))
        case "presentedItemDidChange": self = .presentedItemDidChange
        case "presentedSubitemDidChange": self = .presentedSubitemDidChange(at: try path(.path))
        case "presentedSubitemDidAppear": self = .presentedSubitemDidAppear(at: try path(.path))
        case "presentedItemDidMove": self = .presentedItemDidMove(to: try path(.to))
        case "presentedSubitemDidMove": self = .presentedSubitemDidMove(from: try path(.from), to: try path(.to))
        case "reacquirePresentedItem": self = .reacquirePresentedItem
        case "presentedItemDidGainVersion":
            self = .presentedItemDidGainVersion(try container.decode(String.self, forKey: .version))
        case "presentedSubitemDidGainVersion":
            self = .presentedSubitemDidGainVersion(at: try path(.path), version: try container.decode(String.self, forKey: .version))
        default:
            throw DecodingError.dataCorruptedError(
                forKey: .name, in: container, debugDescription: "unknown presenter message \(name)")
        }
    }

    public func encode(to encoder: Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(name, forKey: .name)
        switch self {
        case .accommodatePresentedSubitemDeletion(let path), .presentedSubitemDidChange(let path),
             .presentedSubitemDidAppear(let path):
            try container.encode(path, forKey: .path)
        case .presentedItemDidMove(let destination):
            try container.encode(destination, forKey: .to)
        case .presentedSubitemDidMove(let source, let destination):
            try container.encode(source, forKey: .from)
            try container.encode(destination, forKey: .to)
        case .presentedItemDidGainVersion(let version):
            try container.encode(version, forKey: .version)
        case .presentedSubitemDidGainVersion(let path, let version):
            try container.encode(path, forKey: .path)
            try container.encode(version, forKey: .version)
        default:
            break
        }
    }
}

/// The requests (messages that expect a reply) a presenter acts on before it answers. An operation
/// waits only for these; the presenter still hears the others, in order, without being waited for,
/// as Apple's coordinator does not wait for a presenter that does not implement a request's method
/// (docs/coordination.md, "Presenters and messages"). On the wire: the messages' names.
public struct PresenterRequests: OptionSet, Hashable, Sendable, Codable {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }

    public static let relinquishToReader = PresenterRequests(rawValue: 1 << 0)
    public static let relinquishToWriter = PresenterRequests(rawValue: 1 << 1)
    public static let save = PresenterRequests(rawValue: 1 << 2)
    public static let accommodateDeletion = PresenterRequests(rawValue: 1 << 3)
    public static let accommodateSubitemDeletion = PresenterRequests(rawValue: 1 << 4)
    public static let all: PresenterRequests = [.relinquishToReader, .relinquishToWriter, .save,
                                                .accommodateDeletion, .accommodateSubitemDeletion]

    private static let names: [(PresenterRequests, String)] = [
        (.relinquishToReader, "relinquishPresentedItemToReader"),
        (.relinquishToWriter, "relinquishPresentedItemToWriter"),
        (.save, "savePresentedItemChanges"),
        (.accommodateDeletion, "accommodatePresentedItemDeletion"),
        (.accommodateSubitemDeletion, "accommodatePresentedSubitemDeletion"),
    ]

    public init(from decoder: Decoder) throws {
        let container = try decoder.singleValueContainer()
        var requests: PresenterRequests = []
        for name in try container.decode([String].self) {
            guard let request = Self.names.first(where: { $0.1 == name })?.0 else {
                throw DecodingError.dataCorruptedError(in: container, debugDescription: "unknown request \(name)")
            }
            requests.insert(request)
        }
        self = requests
    }

    public func encode(to encoder: Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(Self.names.filter { contains($0.0) }.map(\.1))
    }
}

/// One message for one presenter.
public struct PresenterDelivery: Hashable, Sendable {
    public let presenter: PresenterKey
    public let message: PresenterMessage

    public init(_ message: PresenterMessage, to presenter: PresenterKey) {
        self.presenter = presenter
        self.message = message
    }
}
