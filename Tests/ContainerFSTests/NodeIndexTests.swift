@testable import ContainerFS
import Glibc
import XCTest

/// The node table's index, on the store's device and off it.
final class NodeIndexTests: XCTestCase {
    private func node(device: UInt64, inode: UInt64) -> Node {
        Node.unplaced(mode: S_IFREG | 0o644, device: device, inode: inode)
    }

    /// A file of a filesystem mounted inside the store may have the inode number of one of the
    /// store's own: each keeps its node.
    func testTheSameInodeNumberOnTwoDevicesIsTwoFiles() {
        var index = NodeIndex(device: 7)
        let own = node(device: 7, inode: 5), other = node(device: 9, inode: 5)
        let ownKey = BackingKey(device: 7, inode: 5), otherKey = BackingKey(device: 9, inode: 5)
        XCTAssertNil(index.updateValue(own, forKey: ownKey))
        XCTAssertNil(index.updateValue(other, forKey: otherKey))
        XCTAssertEqual(index.count, 2)
        XCTAssertTrue(index[ownKey] === own)
        XCTAssertTrue(index[otherKey] === other)
        XCTAssertNil(index[BackingKey(device: 8, inode: 5)])

        let rebuilt = index.rebuilt()
        XCTAssertTrue(rebuilt[ownKey] === own && rebuilt[otherKey] === other)
        XCTAssertEqual(Set(rebuilt.all.map(ObjectIdentifier.init)), [ObjectIdentifier(own), ObjectIdentifier(other)])

        let replacement = node(device: 9, inode: 5)
        XCTAssertTrue(index.updateValue(replacement, forKey: otherKey) === other)
        index[ownKey] = nil
        XCTAssertNil(index[ownKey])
        XCTAssertTrue(index[otherKey] === replacement)
        XCTAssertEqual(index.count, 1)
    }

    /// The store's numbers go to shards by their low bits, keyed by the rest where it fits 32 bits,
    /// or to the wide dictionary: numbers that share the low bits, or a key, stay apart, and the
    /// count follows every insert, replacement and removal.
    func testNumbersThatShareAShardOrAKeyStayApart() {
        var index = NodeIndex(device: 7)
        let numbers: [UInt64] = [5, 5 + 256, 5 + (1 << 40), UInt64(UInt32.max) << 8 | 5,
                                 (UInt64(UInt32.max) + 2) << 8 | 5, .max, 0]
        var nodes: [UInt64: Node] = [:]
        for number in numbers {
            let made = node(device: 7, inode: number)
            nodes[number] = made
            XCTAssertNil(index.updateValue(made, forKey: BackingKey(device: 7, inode: number)))
        }
        XCTAssertEqual(index.count, numbers.count)
        for number in numbers {
            XCTAssertTrue(index[BackingKey(device: 7, inode: number)] === nodes[number], "inode \(number)")
        }
        XCTAssertNil(index[BackingKey(device: 7, inode: 6)])
        XCTAssertNil(index[BackingKey(device: 7, inode: 5 + 512)])

        // Replacing keeps the count; removing an absent key changes nothing.
        let replacement = node(device: 7, inode: 5 + 256)
        XCTAssertTrue(index.updateValue(replacement, forKey: BackingKey(device: 7, inode: 5 + 256)) === nodes[5 + 256])
        index[BackingKey(device: 7, inode: 6)] = nil
        XCTAssertEqual(index.count, numbers.count)

        for number in numbers { index[BackingKey(device: 7, inode: number)] = nil }
        XCTAssertEqual(index.count, 0)
        XCTAssertTrue(index.all.isEmpty)
        XCTAssertTrue(index.rebuilt().all.isEmpty)
    }
}

extension Node {
    /// A node of no table, with no parent or name, for tests that drive nodes directly.
    static func unplaced(mode: mode_t, device: UInt64 = 0, inode: UInt64 = 1) -> Node {
        var attributes = stat()
        attributes.st_dev = UInt(device)
        attributes.st_ino = UInt(inode)
        attributes.st_mode = mode
        return Node(descriptor: -1, attributes: attributes, exposedInode: inode, zone: .documents, parent: nil, name: .empty)
    }
}
