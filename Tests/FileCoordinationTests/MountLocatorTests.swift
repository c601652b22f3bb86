import Coordination
@testable import FileCoordination
import XCTest

/// No mount exists in these tests: the extended attributes are faked.
final class MountLocatorTests: XCTestCase {
    /// Items of a fake mount at /mnt/store, with its socket at /run/cfs/store.sock.
    private let locator = MountLocator { path, name in
        let items: [String: [UInt8]] = [
            "/mnt/store": [],
            "/mnt/store/com.example.notes": Array("com.example.notes".utf8),
            "/mnt/store/com.example.notes/Documents": Array("com.example.notes/Documents".utf8),
            "/mnt/store/com.example.notes/Documents/caf\u{E9}": Array("com.example.notes/Documents/caf".utf8) + [0xE9],
            "/mnt/store/link-to-notes": Array("com.example.notes".utf8),
            // A bind mount of the app's container, as a second mount of it makes.
            "/home/me/notes": Array("com.example.notes".utf8),
            "/home/me/notes/Documents": Array("com.example.notes/Documents".utf8),
        ]
        let ordinary: Set<String> = ["/", "/mnt", "/home", "/home/me", "/home/me/notes.txt"]
        if let relative = items[path] {
            switch name {
            case MountLocator.socketAttribute: return .value(Array("/run/cfs/store.sock".utf8))
            case MountLocator.pathAttribute: return .value(relative)
            default: return .absent
            }
        }
        return ordinary.contains(path) ? .absent : .noSuchItem
    }

    func testAnExistingItemIsAskedDirectly() throws {
        let location = try XCTUnwrap(locator.locate(URL(fileURLWithPath: "/mnt/store/com.example.notes/Documents")))
        XCTAssertEqual(location.socketPath, "/run/cfs/store.sock")
        XCTAssertEqual(location.itemPath, ItemPath("com.example.notes/Documents"))
        XCTAssertEqual(location.mountRoot, "/mnt/store")
    }

    func testTheMountRootHasAnEmptyPath() throws {
        let location = try XCTUnwrap(locator.locate(path: "/mnt/store"))
        XCTAssertEqual(location.itemPath, .root)
        XCTAssertEqual(location.mountRoot, "/mnt/store")
    }

    func testAMissingItemIsFoundThroughItsParents() throws {
        let location = try XCTUnwrap(locator.locate(URL(fileURLWithPath: "/mnt/store/com.example.notes/Documents/new/deeper.txt")))
        XCTAssertEqual(location.itemPath, ItemPath("com.example.notes/Documents/new/deeper.txt"))
        XCTAssertEqual(location.mountRoot, "/mnt/store")
    }

    func testPathsAreNormalisedFirst() throws {
        let location = try XCTUnwrap(locator.locate(URL(fileURLWithPath: "/mnt/store/com.example.notes/./Documents/../Documents/a")))
        XCTAssertEqual(location.itemPath, ItemPath("com.example.notes/Documents/a"))
    }

    func testNonUTF8NamesSurvive() throws {
        let location = try XCTUnwrap(locator.locate(path: "/mnt/store/com.example.notes/Documents/caf\u{E9}"))
        XCTAssertEqual(location.itemPath.components.last?.bytes, Array("caf".utf8) + [0xE9])
    }

    func testAnItemReachedThroughASymlinkHasNoDerivableRoot() throws {
        let location = try XCTUnwrap(locator.locate(path: "/mnt/store/link-to-notes"))
        XCTAssertEqual(location.itemPath, ItemPath("com.example.notes"))
        XCTAssertNil(location.mountRoot)
    }

    /// Through a bind mount of a directory of the daemon's tree, the view pairs the two roots,
    /// and the local path of any item it shows follows; the daemon's own root is not there.
    func testABindMountOfADirectoryIsAView() throws {
        let location = try XCTUnwrap(locator.locate(path: "/home/me/notes/Documents/new.txt"))
        XCTAssertEqual(location.itemPath, ItemPath("com.example.notes/Documents/new.txt"))
        XCTAssertNil(location.mountRoot)
        let view = try XCTUnwrap(location.view)
        XCTAssertEqual(view, MountView(localRoot: "/home/me/notes", daemonRoot: try XCTUnwrap(ItemPath("com.example.notes"))))
        XCTAssertEqual(view.url(for: try XCTUnwrap(ItemPath("com.example.notes/Documents/Inbox/a b")))?.path, "/home/me/notes/Documents/Inbox/a b")
        XCTAssertEqual(view.url(for: try XCTUnwrap(ItemPath("com.example.notes")))?.path, "/home/me/notes")
        XCTAssertNil(view.url(for: try XCTUnwrap(ItemPath("com.example.photos/Documents"))), "not in this view")
        XCTAssertEqual(try XCTUnwrap(locator.locate(path: "/mnt/store/com.example.notes")).view,
                       MountView(localRoot: "/mnt/store", daemonRoot: .root))
    }

    /// The kernel says which directory is a mount's root, where the names alone cannot tell it: a
    /// bind mount of an app at a directory named as the app.
    func testTheNearestMountRootAboveAPathIsItsView() throws {
        let app = try XCTUnwrap(ItemPath("com.example.notes"))
        let roots: Set<String> = ["/", "/srv/com.example.notes", "/mnt/store"]
        let isRoot = { (path: String) -> Bool? in roots.contains(path) }
        let view = try XCTUnwrap(MountLocator.view(of: "/srv/com.example.notes/Documents/a",
                                                   itemPath: try XCTUnwrap(ItemPath("com.example.notes/Documents/a")), isMountRoot: isRoot))
        XCTAssertEqual(view, MountView(localRoot: "/srv/com.example.notes", daemonRoot: app))
        XCTAssertNil(view.url(for: try XCTUnwrap(ItemPath("com.example.photos/Documents"))), "another app is not in this view")
        XCTAssertEqual(MountLocator.view(of: "/srv/com.example.notes", itemPath: app, isMountRoot: isRoot), view)
        XCTAssertNil(MountLocator.view(of: "/srv/com.example.notes/x", itemPath: try XCTUnwrap(ItemPath("y")), isMountRoot: isRoot),
                     "the names below the mount's root are not the item's")
        XCTAssertEqual(MountLocator.view(of: "/mnt/store/com.example.notes", itemPath: app, isMountRoot: isRoot),
                       MountView(localRoot: "/mnt/store", daemonRoot: .root))
        XCTAssertNil(MountLocator.view(of: "/mnt/store/com.example.notes", itemPath: app, isMountRoot: { _ in nil }),
                     "a kernel that does not tell")
    }

    func testOutsideAMountThereIsNoLocation() {
        XCTAssertNil(locator.locate(path: "/home/me/notes.txt"))
        XCTAssertNil(locator.locate(path: "/home/me/missing/file"))
        XCTAssertNil(locator.locate(path: "/nowhere/at/all"))
    }

    func testAFIFOIsLocatedThroughItsDirectory() throws {
        let directory = makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        let fifo = directory.appendingPathComponent("pipe")
        XCTAssertEqual(mkfifo(fifo.path, 0o600), 0)
        let dir = directory.path
        let locator = MountLocator { path, name in
            if path == dir {
                return .value(Array((name == MountLocator.socketAttribute ? "/run/s" : "Documents").utf8))
            }
            return path.hasPrefix(dir) ? .absent : .noSuchItem
        }
        XCTAssertEqual(locator.locate(path: fifo.path)?.itemPath, ItemPath("Documents/pipe"))
        XCTAssertNil(locator.locate(path: dir + "/plain-but-absent"), "a missing item reads as absent here: no walk")
    }

    func testTheRealReaderSaysAbsentOnAnOrdinaryFile() throws {
        let directory = makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(at: directory) }
        XCTAssertNil(MountLocator().locate(directory))
        XCTAssertNil(MountLocator().locate(directory.appendingPathComponent("not-yet")))
        let reading = MountLocator.getxattrReader(directory.path, MountLocator.socketAttribute)
        XCTAssertEqual(reading, .absent)
        XCTAssertEqual(MountLocator.getxattrReader(directory.path + "/missing", MountLocator.pathAttribute), .noSuchItem)
    }
}
