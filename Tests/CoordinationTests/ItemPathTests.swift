import Coordination
import XCTest

final class ItemPathTests: XCTestCase {
    func testParsingIgnoresRedundantSlashesAndRejectsDotNames() {
        XCTAssertEqual(path("/a//b/c/").components.map(\.description), ["a", "b", "c"])
        XCTAssertEqual(ItemPath(""), .root)
        XCTAssertNil(ItemPath("a/../b"))
        XCTAssertNil(ItemPath("a/./b"))
        XCTAssertNil(ItemPath(bytes: [0x61, 0x00, 0x62]))
        XCTAssertNil(PathComponent("a/b"))
        XCTAssertNil(PathComponent(""))
    }

    func testNonUTF8NamesKeepEveryByte() throws {
        let latin1 = try XCTUnwrap(PathComponent(bytes: [0x63, 0x61, 0x66, 0xE9]))  // "café" in Latin-1
        let utf8 = try XCTUnwrap(PathComponent("café"))
        XCTAssertNil(latin1.string)
        XCTAssertNotEqual(latin1, utf8)
        let item = path("Documents").appending(latin1)
        XCTAssertEqual(item.bytes, Array("Documents/caf".utf8) + [0xE9])
        XCTAssertEqual(ItemPath(bytes: item.bytes), item)
        XCTAssertEqual(item.description, "Documents/caf\\xE9")
        XCTAssertNotEqual(Set([item, path("Documents/café")]).count, 1)
    }

    func testAncestryIsByComponentNotByStringPrefix() {
        XCTAssertTrue(path("a/b").isAncestor(of: path("a/b/c")))
        XCTAssertTrue(ItemPath.root.isAncestor(of: path("a")))
        XCTAssertFalse(path("a/b").isAncestor(of: path("a/b")))
        XCTAssertFalse(path("a/b").isAncestor(of: path("a/bc")))
        XCTAssertFalse(path("a/b/c").isAncestor(of: path("a/b")))
        XCTAssertTrue(path("a/b").isEqualOrAncestor(of: path("a/b")))
    }

    func testParentLastComponentAndAncestors() {
        let item = path("a/b/c")
        XCTAssertEqual(item.parent, path("a/b"))
        XCTAssertEqual(item.lastComponent, PathComponent("c"))
        XCTAssertNil(ItemPath.root.parent)
        XCTAssertNil(ItemPath.root.lastComponent)
        XCTAssertEqual(item.ancestors, [path("a/b"), path("a"), .root])
        XCTAssertEqual(path("a").appending(PathComponent("b")!), path("a/b"))
        XCTAssertEqual(path("a").appending(path("b/c")), item)
    }

    func testReplacingPrefixReRootsOnlyItemsAtOrBelow() {
        XCTAssertEqual(path("a/b/c").replacingPrefix(path("a"), with: path("x/y")), path("x/y/b/c"))
        XCTAssertEqual(path("a").replacingPrefix(path("a"), with: path("z")), path("z"))
        XCTAssertNil(path("ab/c").replacingPrefix(path("a"), with: path("z")))
        XCTAssertNil(path("a").replacingPrefix(path("a/b"), with: path("z")))
        XCTAssertEqual(path("a/b").replacingPrefix(.root, with: path("m")), path("m/a/b"))
    }

    func testPathExtensionAndPackageRule() {
        XCTAssertEqual(PathComponent("Notes.app")?.pathExtension, Array("app".utf8))
        XCTAssertNil(PathComponent(".config")?.pathExtension)
        XCTAssertNil(PathComponent("trailing.")?.pathExtension)
        XCTAssertNil(PathComponent("plain")?.pathExtension)
        for name in ["Notes.app", ".config", "trailing.", "plain", "a.b.c", "..x", "x.."] {
            XCTAssertEqual(PathComponent(name)?.hasPathExtension, PathComponent(name)?.pathExtension != nil, name)
        }
        let rule = PackageRule.anyExtension
        XCTAssertEqual(rule.enclosingPackage(of: path("D/Doc.pages/Data/x"), isDirectory: false), path("D/Doc.pages"))
        XCTAssertEqual(rule.enclosingPackage(of: path("D/Doc.pages"), isDirectory: true), path("D/Doc.pages"))
        XCTAssertNil(rule.enclosingPackage(of: path("D/report.pdf"), isDirectory: false))
        XCTAssertEqual(rule.enclosingPackage(of: path("A.app/Frameworks/B.framework/x"), isDirectory: false),
                       path("A.app"), "the outermost package is the whole")
        XCTAssertEqual(rule.packagesAbove(path("A.app/Frameworks/B.framework/x")),
                       [path("A.app/Frameworks/B.framework"), path("A.app")])
    }

    func testContainerRootsOfAWholeStoreMountAreNeverPackages() {
        let rule = PackageRule.anyExtension.fixing(depth: 1)
        XCTAssertNil(rule.enclosingPackage(of: path("org.test.app/Documents/x.txt"), isDirectory: false),
                     "an app ID's extension does not make its container a package")
        XCTAssertNil(rule.enclosingPackage(of: path("org.test.app"), isDirectory: true))
        XCTAssertEqual(rule.enclosingPackage(of: path("org.test.app/Documents/Doc.pages/x"), isDirectory: false),
                       path("org.test.app/Documents/Doc.pages"))
        XCTAssertEqual(rule.packagesAbove(path("org.test.app/Documents/Doc.pages/x")),
                       [path("org.test.app/Documents/Doc.pages")])
        XCTAssertEqual(PackageRule.anyExtension.enclosingPackage(of: path("org.test.app/x"), isDirectory: false),
                       path("org.test.app"), "without the fixed depth the name alone decides")
    }
}
