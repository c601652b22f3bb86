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

    /// Messages that hold up the operation until the presenter answers (or its time runs out).
    /// The others are notifications, sent without waiting.
    public var expectsReply: Bool {
        switch self {
        case .relinquishPresentedItemToReader, .relinquishPresentedItemToWriter, .savePresentedItemChanges,
             .accommodatePresentedItemDeletion, .accommodatePresentedSubitemDeletion:
            return true
        case .presentedItemDidChange, .presentedSubitemDidChange, .presentedSubitemDidAppear,
             .presentedItemDidMove, .presentedSubitemDidMove, .reacquirePresentedItem,
             .presentedItemDidGainVersion, .presentedSubitemDidGainVersion:
            return false
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

/// One message for one presenter.
public struct PresenterDelivery: Hashable, Sendable {
    public let presenter: PresenterKey
    public let message: PresenterMessage

    public init(_ message: PresenterMessage, to presenter: PresenterKey) {
        self.presenter = presenter
        self.message = message
    }
}
