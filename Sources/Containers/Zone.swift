/// Where an item sits in a container, which decides what may be done to it.
///
/// A zone follows from the parent's zone and the item's name alone, so the
/// filesystem can tell the zone of a name before it looks the name up.
public enum Zone: UInt8, Sendable, CaseIterable {
    /// The top of a whole-store mount: one entry per app.
    case mountRoot
    /// An app's container root (its home directory).
    case containerRoot
    /// The sealed bundle `Name.app` and everything in it.
    case bundle
    /// `Documents/` itself.
    case documents
    /// `Documents/Inbox` itself.
    case inbox
    /// Anything below `Documents/Inbox`.
    case inboxItem
    /// `Library/` itself.
    case library
    /// Ordinary items below `Documents/` and `Library/`.
    case data
    /// `Library/Caches` itself: may be purged; written in place.
    case caches
    /// `Library/Application Support` and `Library/Preferences` themselves: fixed, like `Library/`.
    case libraryDirectory
    /// Anything below `Library/Caches`.
    case cachesItem
    /// `tmp/` itself.
    case tmp
    /// Anything below `tmp/`.
    case tmpItem
    /// An entry of the container root that is none of the fixed ones (left by hand in the store).
    case stray
    /// An app group's shared container (`group.ID` in a mount of the whole store): its apps keep
    /// files at its top, beside its fixed `Library`.
    case groupRoot

    public static let bundleExtension = ".app"

    /// The zone of the entry `name` inside a directory of this zone.
    public func child(named name: UnsafeRawBufferPointer) -> Zone {
        switch self {
        case .mountRoot:
            return name.count > AppID.groupPrefix.utf8.count && name.starts(with: AppID.groupPrefix.utf8) ? .groupRoot : .containerRoot
        case .groupRoot: return name.elementsEqual("Library".utf8) ? .library : .data
        case .containerRoot:
            if name.elementsEqual("Documents".utf8) { return .documents }
            if name.elementsEqual("Library".utf8) { return .library }
            if name.elementsEqual("tmp".utf8) { return .tmp }
            if name.count > 4, name.suffix(4).elementsEqual(Zone.bundleExtension.utf8) { return .bundle }
            return .stray
        case .bundle: return .bundle
        case .documents: return name.elementsEqual("Inbox".utf8) ? .inbox : .data
        case .inbox, .inboxItem: return .inboxItem
        case .library:
            if name.elementsEqual("Caches".utf8) { return .caches }
            if name.elementsEqual("Application Support".utf8) || name.elementsEqual("Preferences".utf8) { return .libraryDirectory }
            return .data
        case .libraryDirectory: return .data
        case .data: return .data
        case .caches, .cachesItem: return .cachesItem
        case .tmp, .tmpItem: return .tmpItem
        case .stray: return .stray
        }
    }

    public func child(named name: String) -> Zone {
        var name = name
        return name.withUTF8 { child(named: UnsafeRawBufferPointer($0)) }
    }

    /// Whether an item of this zone is one of the directories the container's layout makes (the
    /// mount never renames or removes them: `Policy.remove`), each of which gives its children a
    /// zone of their own.
    public var isFixedPlace: Bool {
        switch self {
        case .bundle, .inboxItem, .data, .cachesItem, .tmpItem, .stray: return false
        case .mountRoot, .containerRoot, .groupRoot, .documents, .inbox, .library, .libraryDirectory, .caches, .tmp: return true
        }
    }

    /// Whether a name missing from a directory of this zone can appear only through the mount, so
    /// that the kernel may remember for a while that it is missing. Not at the top of the store or
    /// of a container, where installs add items; not in an Inbox, which `deliver` fills; not in a
    /// bundle, which an install replaces; nor where the container's own directories go
    /// (`isFixedPlace`: `deliver` makes an Inbox that is missing).
    public func keepsMissingName(_ name: UnsafeRawBufferPointer) -> Bool {
        switch self {
        case .documents, .data, .library, .libraryDirectory, .caches, .cachesItem, .tmp, .tmpItem:
            return !child(named: name).isFixedPlace
        case .mountRoot, .containerRoot, .groupRoot, .bundle, .inbox, .inboxItem, .stray:
            return false
        }
    }

    /// Whether everything below an item of this zone is in this zone too.
    public var isInheritedByChildren: Bool { !isFixedPlace }

    /// Items that move or link only within their own kind of place: tmp is a volume of its own.
    var renameDomain: RenameDomain {
        switch self {
        case .tmp, .tmpItem: return .temporary
        case .groupRoot, .documents, .inbox, .inboxItem, .library, .libraryDirectory, .data, .caches, .cachesItem: return .data
        case .mountRoot, .containerRoot, .bundle, .stray: return .fixed
        }
    }

    enum RenameDomain { case data, temporary, fixed }

    /// Whether writes to files here go straight to the file instead of through atomic replace.
    public var writesInPlaceByDefault: Bool {
        switch self {
        case .tmp, .tmpItem, .caches, .cachesItem: return true
        default: return false
        }
    }
}
