import Containers
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
}

/// A file or directory the kernel knows, with an `O_PATH` descriptor on its backing item.
/// Its address is the inode number the kernel uses for it.
final class Node {
    let descriptor: Int32
    let key: BackingKey
    let fileType: mode_t
    /// The kernel's reference count; guarded by the node table's lock.
    var lookups: UInt64 = 0
    /// Where the node sits, so policy and coordination know it; guarded by the node table's lock.
    var zone: Zone
    var parent: Node?
    var name: [UInt8]

    init(descriptor: Int32, attributes: stat, zone: Zone, parent: Node?, name: [UInt8]) {
        self.descriptor = descriptor
        self.key = BackingKey(attributes)
        self.fileType = attributes.st_mode & S_IFMT
        self.zone = zone
        self.parent = parent
        self.name = name
    }

    deinit { close(descriptor) }

    var isDirectory: Bool { fileType == S_IFDIR }
    var isSymlink: Bool { fileType == S_IFLNK }

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
    private let nodes = Mutex<[BackingKey: Node]>([:])

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
        return nodes.withLock { nodes in
            if let existing = nodes[key] {
                close(descriptor)
                existing.lookups += 1
                existing.parent = parent
                existing.zone = zone
                if !existing.name.elementsEqual(name.bytes) { existing.name = name.copy }
                return existing
            }
            let node = Node(descriptor: descriptor, attributes: attributes, zone: zone, parent: parent, name: name.copy)
            node.lookups = 1
            nodes[key] = node
            return node
        }
    }

    func forget(_ inode: InodeNumber, count: UInt64) {
        let node = node(inode)
        guard node !== root else { return }
        nodes.withLock { nodes in
            node.lookups -= min(count, node.lookups)
            if node.lookups == 0 { nodes[node.key] = nil }
        }
    }

    func existing(_ key: BackingKey) -> Node? {
        nodes.withLock { $0[key] }
    }

    /// Records a rename, and returns the nodes whose zone changed. When the zone of a directory
    /// changes (moved out of the Inbox), the zones of the nodes below it change too.
    func didMove(_ key: BackingKey, to parent: Node, name: FileName, zone: Zone) -> [Node] {
        nodes.withLock { nodes in
            guard let moved = nodes[key] else { return [] }
            let oldZone = moved.zone
            moved.parent = parent
            moved.name = name.copy
            moved.zone = zone
            guard oldZone != zone else { return [] }
            // Renames move items only between zones whose items' children share the zone (data, tmp items).
            guard moved.isDirectory, zone.isInheritedByChildren else { return [moved] }
            let below = nodes.values.filter { $0.isWithin(moved) }
            for node in below { node.zone = zone }
            return below
        }
    }

    /// Runs `body` with the names from the top of `node`'s zone down to `node`, and the name of
    /// the container it is in (nil when the root is the container), as last seen.
    func withPlace<R>(of node: Node, _ body: ([[UInt8]], [UInt8]?) -> R) -> R {
        nodes.withLock { _ in
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

    var count: Int { nodes.withLock { $0.count } }
}
