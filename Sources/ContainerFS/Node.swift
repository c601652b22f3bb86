import Containers
import Coordination
import FUSELowLevel
import Glibc
import Synchronization

/// Identifies a backing file: the table holds one node per backing inode, as passthrough_ll does.
struct BackingKey: Hashable {
    let device: UInt64
    let inode: UInt64

    init(_ attributes: stat) {
        device = UInt64(attributes.st_dev)
        inode = UInt64(attributes.st_ino)
    }

    init(device: UInt64, inode: UInt64) {
        self.device = device
        self.inode = inode
    }
}

/// A file or directory the kernel knows, with an `O_PATH` descriptor on its backing item.
/// Its address is the inode number the kernel uses for it.
final class Node {
    /// Stays the same number for the node's life; a publish points it at the new backing file (dup3).
    let descriptor: Int32
    let fileType: mode_t
    /// The inode number `stat` shows: kept when a publish replaces the backing file.
    let exposedInode: UInt64
    /// The backing file now; guarded by the node table's lock.
    var key: BackingKey
    /// The kernel's reference count; guarded by the node table's lock.
    var lookups: UInt64 = 0
    /// Where the node sits, which decides its policy. Read on every request without the table's
    /// lock, so it is atomic; it changes only when the item moves out of the Inbox.
    private let zoneValue: Atomic<UInt8>
    var zone: Zone {
        get { Zone(rawValue: zoneValue.load(ordering: .relaxed))! }
        set { zoneValue.store(newValue.rawValue, ordering: .relaxed) }
    }
    /// The parent and name the node was last seen under; guarded by the node table's lock.
    var parent: Node?
    var name: [UInt8]
    /// The write session of a regular file written through atomic replace; reached through `withSession`.
    private var writeSession: WriteSession?
    /// The version whose pages the kernel may hold (files written in place); guarded with the session.
    private var cachedVersion: FileVersion?
    /// Session locks are shared by stripes of nodes: a lock for each of the files the kernel knows
    /// would cost more memory than the rest of the node. No code holds two sessions at once.
    private static let sessionLocks = (0..<64).map { _ in PlainMutex() }
    /// Files open on the node through the mount (a purge leaves these alone).
    let openHandles = Atomic<Int>(0)

    init(descriptor: Int32, attributes: stat, exposedInode: UInt64, zone: Zone, parent: Node?, name: [UInt8]) {
        self.descriptor = descriptor
        self.key = BackingKey(attributes)
        self.fileType = attributes.st_mode & S_IFMT
        self.exposedInode = exposedInode
        self.zoneValue = Atomic(zone.rawValue)
        self.parent = parent
        self.name = name
    }

    deinit { close(descriptor) }

    /// Runs `body` with the node's write session, under its stripe's lock.
    func withSession<R>(_ body: (inout WriteSession?) -> R) -> R {
        Node.sessionLocks[stripe].withLock { body(&writeSession) }
    }

    /// Runs `body` with the version whose pages the kernel may hold, under the stripe's lock.
    func withCachedVersion<R>(_ body: (inout FileVersion?) -> R) -> R {
        Node.sessionLocks[stripe].withLock { body(&cachedVersion) }
    }

    private var stripe: Int {
        Int(truncatingIfNeeded: UInt(bitPattern: Unmanaged.passUnretained(self).toOpaque()) >> 6) & 63
    }

    var isDirectory: Bool { fileType == S_IFDIR }
    var isSymlink: Bool { fileType == S_IFLNK }
    var isRegularFile: Bool { fileType == S_IFREG }

    /// Whether `ancestor` is this node or one of the directories above it, as last seen.
    func isWithin(_ ancestor: Node) -> Bool {
        var current: Node? = self
        while let node = current {
            if node === ancestor { return true }
            current = node.parent
        }
        return false
    }
}

/// Every node the kernel holds a reference to, found by backing inode; forgotten as the kernel forgets.
final class NodeTable {
    let root: Node

    private struct State {
        var nodes: [BackingKey: Node] = [:]
        /// Inode numbers that survive a publish: the new backing file shows the old number.
        var aliases: [BackingKey: UInt64] = [:]
        /// Numbers still shown by aliased files, which a new backing file must not show too.
        var retired: Set<UInt64> = []
        var nextAlias: UInt64 = 1 << 48

        mutating func exposedInode(for key: BackingKey) -> UInt64 {
            if let alias = aliases[key] { return alias }
            guard retired.contains(key.inode) else { return key.inode }
            nextAlias += 1
            aliases[key] = nextAlias
            return nextAlias
        }
    }

    private let state = Locked(State())

    init(root: Node) {
        self.root = root
        root.lookups = 1
    }

    @inline(__always)
    func node(_ inode: InodeNumber) -> Node {
        inode == rootInode ? root : Unmanaged<Node>.fromOpaque(UnsafeRawPointer(bitPattern: UInt(inode))!).takeUnretainedValue()
    }

    @inline(__always)
    func inodeNumber(of node: Node) -> InodeNumber {
        node === root ? rootInode : InodeNumber(UInt(bitPattern: Unmanaged.passUnretained(node).toOpaque()))
    }

    /// Counts one more kernel reference to the backing item behind `descriptor`, adding a node for
    /// it if it has none (then the node owns the descriptor; otherwise it is closed).
    func remember(descriptor: Int32, attributes: stat, zone: Zone, parent: Node, name: FileName) -> Node {
        let key = BackingKey(attributes)
        if key == root.key {
            close(descriptor)
            return root
        }
        return state.withLock { state in
            if let existing = state.nodes[key] {
                close(descriptor)
                existing.lookups += 1
                if existing.parent !== parent { existing.parent = parent }
                if existing.zone != zone { existing.zone = zone }
                if !existing.name.elementsEqual(name.bytes) { existing.name = name.copy }
                return existing
            }
            let node = Node(descriptor: descriptor, attributes: attributes, exposedInode: state.exposedInode(for: key),
                            zone: zone, parent: parent, name: name.copy)
            node.lookups = 1
            // The kernel's references keep the node alive, whatever the index says later.
            _ = Unmanaged.passRetained(node)
            state.nodes[key] = node
            return node
        }
    }

    func forget(_ inode: InodeNumber, count: UInt64) {
        let node = node(inode)
        guard node !== root else { return }
        state.withLock { state in
            guard node.lookups > 0 else { return }
            node.lookups -= min(count, node.lookups)
            guard node.lookups == 0 else { return }
            if state.nodes[node.key] === node { state.nodes[node.key] = nil }
            Unmanaged.passUnretained(node).release()
        }
    }

    func existing(_ key: BackingKey) -> Node? {
        state.withLock { $0.nodes[key] }
    }

    /// The inode number a listing shows for a backing inode.
    func exposedInode(device: UInt64, inode: UInt64) -> UInt64 {
        state.withLock { $0.exposedInode(for: BackingKey(device: device, inode: inode)) }
    }

    /// Records that `node` is about to be backed by the file with `attributes` (a publish renames
    /// it in). Done before the rename, so that a lookup racing with it finds this node.
    /// Returns the previous key, for `abandonRepublish` if the rename fails.
    func republish(_ node: Node, as attributes: stat) -> BackingKey {
        let key = BackingKey(attributes)
        return state.withLock { state in
            let previous = node.key
            if state.nodes[previous] === node { state.nodes[previous] = nil }
            state.aliases[previous] = nil
            node.key = key
            if state.nodes[key] == nil { state.nodes[key] = node }
            if key.inode != node.exposedInode {
                state.aliases[key] = node.exposedInode
                state.retired.insert(node.exposedInode)
            } else {
                // The filesystem gave the new file the item's own number back: no alias needed.
                state.retired.remove(node.exposedInode)
            }
            return previous
        }
    }

    /// Undoes `republish` when the rename did not happen.
    func abandonRepublish(_ node: Node, previous: BackingKey) {
        state.withLock { state in
            if state.nodes[node.key] === node { state.nodes[node.key] = nil }
            state.aliases[node.key] = nil
            node.key = previous
            if state.nodes[previous] == nil { state.nodes[previous] = node }
        }
    }

    /// Records a rename, and returns the nodes whose zone changed. When the zone of a directory
    /// changes (moved out of the Inbox), the zones of the nodes below it change too.
    func didMove(_ key: BackingKey, to parent: Node, name: FileName, zone: Zone) -> [Node] {
        state.withLock { state in
            guard let moved = state.nodes[key] else { return [] }
            let oldZone = moved.zone
            moved.parent = parent
            moved.name = name.copy
            moved.zone = zone
            guard oldZone != zone else { return [] }
            // Renames move items only between zones whose items' children share the zone (data, tmp items).
            guard moved.isDirectory, zone.isInheritedByChildren else { return [moved] }
            let below = state.nodes.values.filter { $0.isWithin(moved) }
            for node in below { node.zone = zone }
            return below
        }
    }

    /// Runs `body` with the names from the top of `node`'s zone down to `node`, and the name of
    /// the container it is in (nil when the root is the container), as last seen.
    func withPlace<R>(of node: Node, _ body: ([[UInt8]], [UInt8]?) -> R) -> R {
        state.withLock { _ in
            var names: [[UInt8]] = []
            var current = node
            while current.zone == node.zone, let parent = current.parent {
                names.append(current.name)
                current = parent
            }
            let container = current.zone == .containerRoot && current !== root ? current.name : nil
            return body(names.reversed(), container)
        }
    }

    /// The parent and name `node` was last seen under (nil for the root).
    func place(of node: Node) -> (parent: Node, name: [UInt8])? {
        state.withLock { _ in node.parent.map { ($0, node.name) } }
    }

    /// The node and the directories above it, nearest first, as last seen.
    func lineage(of node: Node) -> [Node] {
        state.withLock { _ in
            var chain = [node]
            while let parent = chain.last!.parent { chain.append(parent) }
            return chain
        }
    }

    /// The item's path from the mount root, as coordination and presenters name it.
    func itemPath(of node: Node) -> ItemPath {
        state.withLock { _ in
            var components: [PathComponent] = []
            var current = node
            while let parent = current.parent {
                if let component = PathComponent(bytes: current.name) { components.append(component) }
                current = parent
            }
            return ItemPath(components: components.reversed())
        }
    }

    func itemPath<Name: Sequence<UInt8>>(of parent: Node, appending name: Name) -> ItemPath {
        let base = itemPath(of: parent)
        guard let component = PathComponent(bytes: Array(name)) else { return base }
        return base.appending(component)
    }

    /// Every node in the index now.
    func all() -> [Node] { state.withLock { Array($0.nodes.values) } }
}
