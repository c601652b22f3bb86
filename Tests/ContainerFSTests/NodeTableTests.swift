@testable import ContainerFS
import Containers
import FUSELowLevel
import Foundation
import Glibc
import XCTest

/// The node table driven directly, without a mount: which node a lookup of a file being rewritten
/// gets (docs/atomic-replace.md, "What others see").
final class NodeTableTests: XCTestCase {
    private var directory = ""
    private var nodes: NodeTable!

    override func setUpWithError() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("nodes-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let descriptor = open(directory, O_PATH | O_DIRECTORY | O_CLOEXEC)
        XCTAssertGreaterThanOrEqual(descriptor, 0)
        var attributes = stat()
        XCTAssertEqual(fstat(descriptor, &attributes), 0)
        nodes = NodeTable(root: Node(descriptor: descriptor, attributes: attributes, exposedInode: UInt64(attributes.st_ino),
                                     zone: .documents, parent: nil, name: .empty))
    }

    override func tearDownWithError() throws {
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// Writes `content` to `name` in the directory (a new inode each time) and looks it up, as
    /// `ContainerFileSystem.lookupEntry` does.
    @discardableResult
    private func write(_ content: String, to name: String) -> stat {
        let temporary = directory + "/.new"
        XCTAssertTrue(FileManager.default.createFile(atPath: temporary, contents: Data(content.utf8)))
        XCTAssertEqual(rename(temporary, directory + "/" + name), 0)
        var attributes = stat()
        XCTAssertEqual(lstat(directory + "/" + name, &attributes), 0)
        return attributes
    }

    private func lookUp(_ name: String) -> Node? {
        var attributes = stat()
        guard lstat(directory + "/" + name, &attributes) == 0 else { return nil }
        return name.withCString { pointer in
            nodes.remember(descriptor: -1, attributes: attributes, zone: .documents, parent: nodes.root,
                           name: FileName(pointer), for: 0,
                           openPin: { Backing.openPath(pointer, in: self.nodes.root.descriptor) })
        }
    }

    /// Starts a rewrite on `node`: a session with a shadow, as `Shadows.prepare` leaves it.
    private func startRewrite(on node: Node) -> Int32 {
        let shadow = open(directory + "/.shadow", O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        XCTAssertGreaterThanOrEqual(shadow, 0)
        node.withSession { session in
            let started = WriteSession()
            started.shadow = shadow
            session = started
        }
        return shadow
    }

    private func endRewrite(on node: Node, shadow: Int32) {
        node.withSession { $0 = nil }
        close(shadow)
    }

    func testALookupDuringARewriteGetsANodeOfThePublishedVersionAndWritersJoinTheRewrite() throws {
        write("published", to: "f")
        let writer = try XCTUnwrap(lookUp("f"))
        XCTAssertNil(nodes.rewriter(of: writer))
        let shadow = startRewrite(on: writer)
        XCTAssertTrue(writer.isRewriting)

        let published = try XCTUnwrap(lookUp("f"))
        XCTAssertFalse(published === writer, "others get a node of their own")
        XCTAssertTrue(published.showsPublishedVersion)
        XCTAssertTrue(published.holdsItem, "it holds the published version")
        XCTAssertTrue(try XCTUnwrap(lookUp("f")) === published, "one such node a rewrite")
        XCTAssertEqual(published.lookups, 2)
        XCTAssertTrue(nodes.rewriter(of: published) === writer, "a writer opening it joins the rewrite")

        // The rewrite publishes: the name leads to another file, and the writer's node to it.
        let new = write("new version", to: "f")
        let previous = nodes.republish(writer, as: new)
        nodes.finishRepublish(writer, previous: previous)
        endRewrite(on: writer, shadow: shadow)
        XCTAssertNil(nodes.rewriter(of: published), "the rewrite is over")
        XCTAssertTrue(nodes.retirePublished(of: writer) === published)
        XCTAssertTrue(published.isDetached, "left to its readers")
        XCTAssertNil(nodes.retirePublished(of: writer))
        XCTAssertTrue(nodes.hasDetachedNodes(of: published.key))
        XCTAssertTrue(try XCTUnwrap(lookUp("f")) === writer, "the name leads to the writer's node again")

        nodes.forget(nodes.inodeNumber(of: published), count: 2)
        XCTAssertFalse(nodes.hasDetachedNodes(of: published.key))
    }

    func testAVersionPublishedWhileTheRewriteGoesOnGetsANodeOfItsOwn() throws {
        write("first", to: "g")
        let writer = try XCTUnwrap(lookUp("g"))
        let shadow = startRewrite(on: writer)
        let first = try XCTUnwrap(lookUp("g"))
        // An fsync publishes, and the rewrite goes on before the first version's node is retired.
        let second = write("second", to: "g")
        nodes.finishRepublish(writer, previous: nodes.republish(writer, as: second))
        let next = try XCTUnwrap(lookUp("g"))
        XCTAssertFalse(next === first, "the first version's node shows that version only")
        XCTAssertEqual(next.key, BackingKey(second))
        XCTAssertTrue(first.isDetached)
        XCTAssertTrue(nodes.rewriter(of: next) === writer)
        endRewrite(on: writer, shadow: shadow)
        XCTAssertTrue(nodes.retirePublished(of: writer) === next)
    }

    func testAForgottenNodeOfThePublishedVersionLeavesTheRewrite() throws {
        write("published", to: "h")
        let writer = try XCTUnwrap(lookUp("h"))
        let shadow = startRewrite(on: writer)
        let published = try XCTUnwrap(lookUp("h"))
        nodes.forget(nodes.inodeNumber(of: published), count: 1)
        XCTAssertNil(nodes.retirePublished(of: writer), "nothing left to retire")
        let again = try XCTUnwrap(lookUp("h"))
        XCTAssertTrue(again.showsPublishedVersion)
        XCTAssertTrue(nodes.rewriter(of: again) === writer)
        endRewrite(on: writer, shadow: shadow)
        XCTAssertFalse(writer.isRewriting)
        XCTAssertTrue(try XCTUnwrap(lookUp("h")) === writer, "no rewrite: the writer's node answers")
    }
}
