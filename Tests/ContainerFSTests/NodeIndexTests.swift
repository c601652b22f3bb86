@testable import ContainerFS
import Glibc
import XCTest

/// The node table's index, on the store's device and off it.
final class NodeIndexTests: XCTestCase {
    private func node(device: UInt64, inode: UInt64) -> Node {
        var attributes = stat()
        attributes.st_dev = UInt(device)
        attributes.st_ino = UInt(inode)
        attributes.st_mode = S_IFREG | 0o644
        return Node(descriptor: -1, attributes: attributes, exposedInode: inode, zone: .documents, parent: nil, name: .empty)
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
}
