
// Presenters registered by clients, keyed by the item they present. They are indexed by path in a
// tree of names, so that a lookup costs the depth of the path and the presenters found, never the
// number of presenters elsewhere: one client's thousands of presenters must not slow another
// user's operations (docs/coordination.md).

/// A presenter is named by its client connection plus the id the client gave it. The id doubles
/// as the presenter's purpose: its own coordinated accesses never wait for each other.
public struct PresenterKey: Hashable, Sendable, Codable, Comparable, CustomStringConvertible {
    public let owner: OwnerID
    public let purpose: PurposeID

    public init(owner: OwnerID, purpose: PurposeID) {
        self.owner = owner
        self.purpose = purpose
    }

    public var description: String { "\(owner)/\(purpose)" }

    public static func < (lhs: PresenterKey, rhs: PresenterKey) -> Bool {
        (lhs.owner, lhs.purpose) < (rhs.owner, rhs.purpose)
    }
}

public struct PresenterRecord: Hashable, Sendable, Codable {
    public let key: PresenterKey
    /// Where the presented item is now; follows renames.
    public internal(set) var path: ItemPath
    /// Set when the presenter let a message time out; cleared when it answers again.
    public internal(set) var isUnresponsive: Bool = false
    /// The requests an operation waits for this presenter to answer; it hears the others without
    /// being waited for. Not part of the status the daemon reports.
    public private(set) var awaited: PresenterRequests = .all

    private enum CodingKeys: String, CodingKey { case key, path, isUnresponsive }

    public init(key: PresenterKey, path: ItemPath, isUnresponsive: Bool = false, awaited: PresenterRequests = .all) {
        self.key = key
        self.path = path
        self.isUnresponsive = isUnresponsive
        self.awaited = awaited
    }

    /// Whether an operation waits for this presenter's answer to `message`.
    public func awaits(_ message: PresenterMessage) -> Bool {
        message.request.map(awaited.contains) ?? false
    }

    public var owner: OwnerID { key.owner }
    public var purpose: PurposeID { key.purpose }
}

/// The presenters around one item (`PresenterRegistry.around`).
public struct PresentersAround: Sendable {
    /// Of each directory above the item, nearest first (the root's last), each one's by key: they
    /// hear the presentedSubitem… messages.
    public var above: [[PresenterRecord]] = []
    /// Of the packages among those directories, nearest first: an item inside a package is part
    /// of it, so they hear what its own presenters hear.
    public var packagesAbove: [PresenterRecord] = []
    /// Of the item itself, by key.
    public var at: [PresenterRecord] = []
    /// Of the items strictly inside it, deepest last.
    public var inside: [PresenterRecord] = []
}

public final class PresenterRegistry: Sendable {
    public let packageRule: PackageRule
    private let index = Locked(Index())

    public init(packageRule: PackageRule = .anyExtension) {
        self.packageRule = packageRule
    }

    /// Registers (or moves) a presenter. Registering again under the same key replaces the path.
    public func add(_ key: PresenterKey, path: ItemPath, awaited: PresenterRequests = .all) {
        index.withLock { index in
            index.remove(key)
            index.insert(PresenterRecord(key: key, path: path, awaited: awaited))
        }
    }

    @discardableResult
    public func remove(_ key: PresenterKey) -> PresenterRecord? {
        index.withLock { $0.remove(key) }
    }

    /// Drops every presenter of a client at once (its connection closed).
    @discardableResult
    public func removeAll(owner: OwnerID) -> [PresenterRecord] {
        index.withLock { index in
            (index.byOwner[owner] ?? []).compactMap { index.remove($0) }
        }.sorted { $0.key < $1.key }
    }

    public func record(_ key: PresenterKey) -> PresenterRecord? {
        index.withLock { $0.records[key] }
    }

    /// How many presenters a client has.
    public func count(owner: OwnerID) -> Int {
        index.withLock { $0.byOwner[owner]?.count ?? 0 }
    }

    /// Every presenter, sorted by key, for status output.
    public func all() -> [PresenterRecord] {
        index.withLock { Array($0.records.values) }.sorted { ($0.path, $0.key) < ($1.path, $1.key) }
    }

    /// Presenters of exactly this item.
    public func presenters(of path: ItemPath) -> [PresenterRecord] {
        index.withLock { index in
            index.records(index.tree.keys(at: path.components[...]))
        }
    }

    /// Whether anyone presents `path`, an item above it or one inside it: the only presenters an
    /// operation on it can concern. One walk down the tree, where a plan's look-ups take several.
    public func presentsAnything(around path: ItemPath) -> Bool {
        index.withLock { $0.tree.holdsKeys(along: path.components[...]) }
    }

    /// Everyone presenting something around the item at `path`, read in one walk down the tree
    /// (where a look-up a directory would walk it again for each).
    public func around(_ path: ItemPath) -> PresentersAround {
        let components = path.components
        let rule = packageRule
        var found = index.withLock { index -> PresentersAround in
            var around = PresentersAround()
            around.above.reserveCapacity(components.count)
            var tree: PathTree? = index.tree
            var packages: [[PresenterRecord]] = []
            // At step `depth`, `tree` is the directory made of the first `depth` names.
            for (depth, component) in components.enumerated() {
                let here = tree.map { index.records($0.keys) } ?? []
                around.above.append(here)
                if rule.isPackage(components[..<depth]) { packages.append(here) }
                tree = tree?.children[component]
            }
            around.above.reverse()
            around.packagesAbove = packages.reversed().flatMap { $0 }
            guard let tree else { return around }
            around.at = index.records(tree.keys)
            var keys: [PresenterKey] = []
            for child in tree.children.values { child.collect(into: &keys) }
            around.inside = keys.compactMap { index.records[$0] }
            return around
        }
        found.inside.sort { ($0.path, $0.key) < ($1.path, $1.key) }
        return found
    }

    /// Re-keys every presenter at or below `source` after a rename; returns them with new paths.
    @discardableResult
    public func itemDidMove(from source: ItemPath, to destination: ItemPath) -> [PresenterRecord] {
        index.withLock { index -> [PresenterRecord] in
            guard let moved = index.tree.detach(at: source.components[...]) else { return [] }
            var keys: [PresenterKey] = []
            moved.collect(into: &keys)
            index.tree.graft(moved, at: destination.components[...])
            return keys.compactMap { key in
                guard let path = index.records[key]?.path.replacingPrefix(source, with: destination) else { return nil }
                index.records[key]!.path = path
                return index.records[key]
            }
        }.sorted { $0.key < $1.key }
    }

    /// Notes that these presenters heard their item deleted: a later deletion of a folder above
    /// it does not tell them again, until an item is made at their path (`itemDidAppear`).
    public func itemsWereDeleted(_ keys: [PresenterKey]) {
        index.withLock { index in
            for key in keys where index.records[key] != nil { index.deleted.insert(key) }
        }
    }

    /// An item was made (or moved, or saved) at `path`: its presenters present something again.
    public func itemDidAppear(at path: ItemPath) {
        index.withLock { index in
            for key in index.tree.keys(at: path.components[...]) { index.deleted.remove(key) }
        }
    }

    /// Whether the presenter heard its item deleted, and nothing was made at its path since.
    public func presentsDeletedItem(_ key: PresenterKey) -> Bool {
        index.withLock { $0.deleted.contains(key) }
    }

    /// Returns false if there is no such presenter.
    @discardableResult
    public func setUnresponsive(_ key: PresenterKey, _ unresponsive: Bool = true) -> Bool {
        index.withLock { index in
            guard index.records[key] != nil else { return false }
            index.records[key]!.isUnresponsive = unresponsive
            return true
        }
    }

    public func unresponsivePresenters() -> [PresenterRecord] {
        all().filter(\.isUnresponsive)
    }

    // MARK: - Internals

    private struct Index {
        var records: [PresenterKey: PresenterRecord] = [:]
        var tree = PathTree()
        var byOwner: [OwnerID: Set<PresenterKey>] = [:]
        /// Presenters told their item was deleted (`itemsWereDeleted`).
        var deleted: Set<PresenterKey> = []

        mutating func insert(_ record: PresenterRecord) {
            records[record.key] = record
            tree.insert(record.key, at: record.path.components[...])
            byOwner[record.owner, default: []].insert(record.key)
        }

        @discardableResult
        mutating func remove(_ key: PresenterKey) -> PresenterRecord? {
            guard let record = records.removeValue(forKey: key) else { return nil }
            deleted.remove(key)
            tree.remove(key, at: record.path.components[...])
            byOwner[key.owner]?.remove(key)
            if byOwner[key.owner]?.isEmpty == true { byOwner[key.owner] = nil }
            return record
        }

        func records(_ keys: Set<PresenterKey>) -> [PresenterRecord] {
            keys.isEmpty ? [] : keys.sorted().compactMap { records[$0] }
        }
    }

    /// The presenters' keys by path, a level of the tree per name.
    private struct PathTree {
        var keys: Set<PresenterKey> = []
        var children: [PathComponent: PathTree] = [:]

        var isEmpty: Bool { keys.isEmpty && children.isEmpty }

        mutating func insert(_ key: PresenterKey, at path: ArraySlice<PathComponent>) {
            guard let first = path.first else {
                keys.insert(key)
                return
            }
            children[first, default: PathTree()].insert(key, at: path.dropFirst())
        }

        mutating func remove(_ key: PresenterKey, at path: ArraySlice<PathComponent>) {
            guard let first = path.first else {
                keys.remove(key)
                return
            }
            children[first]?.remove(key, at: path.dropFirst())
            if children[first]?.isEmpty == true { children[first] = nil }
        }

        func subtree(at path: ArraySlice<PathComponent>) -> PathTree? {
            guard let first = path.first else { return self }
            return children[first]?.subtree(at: path.dropFirst())
        }

        /// Whether a key is held here or on the way to `path`, at it, or below it (an empty
        /// subtree is never kept).
        func holdsKeys(along path: ArraySlice<PathComponent>) -> Bool {
            guard keys.isEmpty else { return true }
            guard let first = path.first else { return !children.isEmpty }
            return children[first]?.holdsKeys(along: path.dropFirst()) ?? false
        }

        func keys(at path: ArraySlice<PathComponent>) -> Set<PresenterKey> {
            subtree(at: path)?.keys ?? []
        }

        func collect(into keys: inout [PresenterKey]) {
            keys.append(contentsOf: self.keys)
            for child in children.values { child.collect(into: &keys) }
        }

        /// Takes out the subtree at `path` (all of it for the root).
        mutating func detach(at path: ArraySlice<PathComponent>) -> PathTree? {
            guard let first = path.first else {
                defer { self = PathTree() }
                return isEmpty ? nil : self
            }
            guard children[first] != nil else { return nil }
            let taken = children[first]!.detach(at: path.dropFirst())
            if children[first]?.isEmpty == true { children[first] = nil }
            return taken
        }

        /// Puts `tree` at `path`, merged with what is there.
        mutating func graft(_ tree: PathTree, at path: ArraySlice<PathComponent>) {
            guard let first = path.first else { return merge(tree) }
            children[first, default: PathTree()].graft(tree, at: path.dropFirst())
        }

        private mutating func merge(_ other: PathTree) {
            keys.formUnion(other.keys)
            for (name, child) in other.children { children[name, default: PathTree()].merge(child) }
        }
    }
}
