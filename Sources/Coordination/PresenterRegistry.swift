
// Presenters registered by clients, keyed by the item they present. Lookups scan all presenters;
// a mount has few presenters compared with file operations, and a scan keeps re-keying on moves
// trivially correct.

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

    public init(key: PresenterKey, path: ItemPath, isUnresponsive: Bool = false) {
        self.key = key
        self.path = path
        self.isUnresponsive = isUnresponsive
    }

    public var owner: OwnerID { key.owner }
    public var purpose: PurposeID { key.purpose }
}

public final class PresenterRegistry: Sendable {
    public let packageRule: PackageRule
    private let presenters = Locked<[PresenterKey: PresenterRecord]>([:])

    public init(packageRule: PackageRule = .anyExtension) {
        self.packageRule = packageRule
    }

    /// Registers (or moves) a presenter. Registering again under the same key replaces the path.
    public func add(_ key: PresenterKey, path: ItemPath) {
        presenters.withLock { $0[key] = PresenterRecord(key: key, path: path) }
    }

    @discardableResult
    public func remove(_ key: PresenterKey) -> PresenterRecord? {
        presenters.withLock { $0.removeValue(forKey: key) }
    }

    /// Drops every presenter of a client at once (its connection closed).
    @discardableResult
    public func removeAll(owner: OwnerID) -> [PresenterRecord] {
        presenters.withLock { all in
            let removed = all.values.filter { $0.owner == owner }
            for record in removed { all.removeValue(forKey: record.key) }
            return removed.sorted { $0.key < $1.key }
        }
    }

    public func record(_ key: PresenterKey) -> PresenterRecord? {
        presenters.withLock { $0[key] }
    }

    /// Every presenter, sorted by key, for status output.
    public func all() -> [PresenterRecord] {
        select { _ in true }
    }

    /// Presenters of exactly this item.
    public func presenters(of path: ItemPath) -> [PresenterRecord] {
        select { $0 == path }
    }

    /// Presenters of items strictly inside `path` (deepest last).
    public func presenters(inside path: ItemPath) -> [PresenterRecord] {
        select { path.isAncestor(of: $0) }
    }

    /// Presenters of the directories above `path`, nearest directory first; they hear the
    /// presentedSubitem… messages.
    public func presentersOfEnclosingDirectories(of path: ItemPath) -> [PresenterRecord] {
        presenters(ofEach: path.ancestors)
    }

    /// Presenters of the packages above `path`, nearest first: an item inside a package is part
    /// of the package, so they hear what its own presenters hear.
    public func presentersOfEnclosingPackages(of path: ItemPath) -> [PresenterRecord] {
        presenters(ofEach: packageRule.packagesAbove(path))
    }

    /// Re-keys every presenter at or below `source` after a rename; returns them with new paths.
    @discardableResult
    public func itemDidMove(from source: ItemPath, to destination: ItemPath) -> [PresenterRecord] {
        presenters.withLock { all in
            var moved: [PresenterRecord] = []
            for key in Array(all.keys) {
                guard let path = all[key]!.path.replacingPrefix(source, with: destination) else { continue }
                all[key]!.path = path
                moved.append(all[key]!)
            }
            return moved.sorted { $0.key < $1.key }
        }
    }

    /// Returns false if there is no such presenter.
    @discardableResult
    public func setUnresponsive(_ key: PresenterKey, _ unresponsive: Bool = true) -> Bool {
        presenters.withLock { all in
            guard all[key] != nil else { return false }
            all[key]!.isUnresponsive = unresponsive
            return true
        }
    }

    public func unresponsivePresenters() -> [PresenterRecord] {
        all().filter(\.isUnresponsive)
    }

    // MARK: - Internals

    /// Matching presenters ordered by path, then key, so plans are deterministic.
    private func select(_ matches: (ItemPath) -> Bool) -> [PresenterRecord] {
        presenters.withLock { all in
            all.values.filter { matches($0.path) }
        }.sorted { ($0.path, $0.key) < ($1.path, $1.key) }
    }

    /// Presenters of each path, in the order of `paths`.
    private func presenters(ofEach paths: [ItemPath]) -> [PresenterRecord] {
        let wanted = Set(paths)
        let found = select { wanted.contains($0) }
        return paths.flatMap { path in found.filter { $0.path == path } }
    }
}
