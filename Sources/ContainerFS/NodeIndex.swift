/// The node table's index: one node per backing file. Nearly every file of a store is on the
/// store's own filesystem, whose nodes are indexed by inode number alone (16 bytes a slot, against
/// 24 with the device); those of any other device (a filesystem mounted inside the store) by
/// their whole key. A node per item the kernel knows adds up: `find` over 100,000 files.
struct NodeIndex {
    /// The store's filesystem.
    let device: UInt64
    private var onDevice: [UInt64: Node] = [:]
    private var elsewhere: [BackingKey: Node] = [:]

    init(device: UInt64) {
        self.device = device
    }

    subscript(key: BackingKey) -> Node? {
        get { key.device == device ? onDevice[key.inode] : elsewhere[key] }
        set {
            if key.device == device {
                onDevice[key.inode] = newValue
            } else {
                elsewhere[key] = newValue
            }
        }
    }

    /// Indexes `node` under `key`; the node it replaces, if any.
    mutating func updateValue(_ node: Node, forKey key: BackingKey) -> Node? {
        key.device == device ? onDevice.updateValue(node, forKey: key.inode) : elsewhere.updateValue(node, forKey: key)
    }

    var count: Int { onDevice.count + elsewhere.count }

    /// Every node indexed.
    var all: [Node] { Array(onDevice.values) + Array(elsewhere.values) }

    /// The same index at its present size (a dictionary never shrinks by itself).
    func rebuilt() -> NodeIndex {
        var index = NodeIndex(device: device)
        index.onDevice = Dictionary(uniqueKeysWithValues: onDevice.map { ($0.key, $0.value) })
        index.elsewhere = Dictionary(uniqueKeysWithValues: elsewhere.map { ($0.key, $0.value) })
        return index
    }
}
