/// The node table's index: one node per backing file. A node per item the kernel knows adds up
/// (`find` over 100,000 files), so the index is kept small:
/// - Nearly every file of a store is on the store's own filesystem, whose nodes are indexed by
///   inode number alone; those of any other device (a filesystem mounted inside the store) by their
///   whole key.
/// - The store's are spread over `shardCount` dictionaries by the number's low bits, each keyed by
///   the rest of it in 32 bits where it fits (ext4's numbers always do): 12 bytes a slot, against
///   16 for a 64-bit key. A dictionary grows by doubling, its old and new storage both held while it
///   copies; one large one briefly held half as much again as it keeps (the benchmark's peak after
///   listing 100,000 files), a shard only a small part of it.
struct NodeIndex {
    /// The store's filesystem.
    let device: UInt64
    static let shardCount = 256
    private var shards = [[UInt32: Node]](repeating: [:], count: NodeIndex.shardCount)
    /// The store's files whose number does not fit a shard's 32-bit key.
    private var wide: [UInt64: Node] = [:]
    private var elsewhere: [BackingKey: Node] = [:]
    /// The nodes indexed, kept as they come and go (the table reads it at every new node).
    private(set) var count = 0

    init(device: UInt64) {
        self.device = device
    }

    /// The shard and key of an inode number of the store's filesystem, or nil for `wide`.
    @inline(__always)
    private static func slot(_ inode: UInt64) -> (shard: Int, key: UInt32)? {
        let rest = inode >> 8
        guard rest <= UInt64(UInt32.max) else { return nil }
        return (Int(truncatingIfNeeded: inode & UInt64(shardCount - 1)), UInt32(truncatingIfNeeded: rest))
    }

    subscript(key: BackingKey) -> Node? {
        get {
            guard key.device == device else { return elsewhere[key] }
            guard let slot = Self.slot(key.inode) else { return wide[key.inode] }
            return shards[slot.shard][slot.key]
        }
        set {
            if let newValue {
                _ = updateValue(newValue, forKey: key)
            } else {
                removeValue(forKey: key)
            }
        }
    }

    /// Indexes `node` under `key`; the node it replaces, if any.
    mutating func updateValue(_ node: Node, forKey key: BackingKey) -> Node? {
        let previous: Node?
        if key.device != device {
            previous = elsewhere.updateValue(node, forKey: key)
        } else if let slot = Self.slot(key.inode) {
            previous = shards[slot.shard].updateValue(node, forKey: slot.key)
        } else {
            previous = wide.updateValue(node, forKey: key.inode)
        }
        if previous == nil { count += 1 }
        return previous
    }

    private mutating func removeValue(forKey key: BackingKey) {
        let removed: Node?
        if key.device != device {
            removed = elsewhere.removeValue(forKey: key)
        } else if let slot = Self.slot(key.inode) {
            removed = shards[slot.shard].removeValue(forKey: slot.key)
        } else {
            removed = wide.removeValue(forKey: key.inode)
        }
        if removed != nil { count -= 1 }
    }

    /// Every node indexed.
    var all: [Node] {
        var nodes: [Node] = []
        nodes.reserveCapacity(count)
        for shard in shards { nodes.append(contentsOf: shard.values) }
        nodes.append(contentsOf: wide.values)
        nodes.append(contentsOf: elsewhere.values)
        return nodes
    }

    /// The same index at its present size (a dictionary never shrinks by itself).
    func rebuilt() -> NodeIndex {
        var index = NodeIndex(device: device)
        index.shards = shards.map { Dictionary(uniqueKeysWithValues: $0.map { ($0.key, $0.value) }) }
        index.wide = Dictionary(uniqueKeysWithValues: wide.map { ($0.key, $0.value) })
        index.elsewhere = Dictionary(uniqueKeysWithValues: elsewhere.map { ($0.key, $0.value) })
        index.count = count
        return index
    }
}
