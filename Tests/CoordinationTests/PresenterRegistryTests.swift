import Coordination
import XCTest

final class PresenterRegistryTests: XCTestCase {
    private let registry = PresenterRegistry()

    private func key(_ owner: OwnerID, _ id: String) -> PresenterKey {
        PresenterKey(owner: owner, purpose: PurposeID(id))
    }

    func testLookupOfItemEnclosingDirectoriesAndPackages() {
        registry.add(key(alice, "file"), path: path("D/Doc.pages/Data/x"))
        registry.add(key(bob, "package"), path: path("D/Doc.pages"))
        registry.add(key(bob, "docs"), path: path("D"))
        registry.add(key(carol, "root"), path: .root)
        registry.add(key(carol, "sibling"), path: path("D/Doc.pages/Data/y"))

        XCTAssertEqual(registry.presenters(of: path("D/Doc.pages/Data/x")).map(\.key), [key(alice, "file")])
        XCTAssertEqual(registry.directoriesAbove(path("D/Doc.pages/Data/x")).map(\.key),
                       [key(bob, "package"), key(bob, "docs"), key(carol, "root")], "nearest first")
        XCTAssertEqual(registry.packagesAbove(path("D/Doc.pages/Data/x")).map(\.key),
                       [key(bob, "package")])
        XCTAssertEqual(registry.packagesAbove(path("D/plain/x")).map(\.key), [])
        XCTAssertEqual(registry.inside(path("D/Doc.pages")).map(\.key),
                       [key(alice, "file"), key(carol, "sibling")])
    }

    func testMoveReKeysEveryPresenterAtOrBelowOnly() {
        registry.add(key(alice, "dir"), path: path("D/a"))
        registry.add(key(alice, "deep"), path: path("D/a/x/y"))
        registry.add(key(bob, "lookalike"), path: path("D/ab"))
        registry.add(key(bob, "parent"), path: path("D"))

        let moved = registry.itemDidMove(from: path("D/a"), to: path("E/b"))
        XCTAssertEqual(moved.map(\.key), [key(alice, "deep"), key(alice, "dir")])
        XCTAssertEqual(registry.record(key(alice, "dir"))?.path, path("E/b"))
        XCTAssertEqual(registry.record(key(alice, "deep"))?.path, path("E/b/x/y"))
        XCTAssertEqual(registry.record(key(bob, "lookalike"))?.path, path("D/ab"))
        XCTAssertEqual(registry.record(key(bob, "parent"))?.path, path("D"))
        XCTAssertEqual(registry.presenters(of: path("E/b/x/y")).map(\.key), [key(alice, "deep")])
        XCTAssertEqual(registry.presenters(of: path("D/a/x/y")), [])

        // A presenter keeps following across a second rename of a directory higher up.
        registry.itemDidMove(from: path("E"), to: path("F"))
        XCTAssertEqual(registry.record(key(alice, "deep"))?.path, path("F/b/x/y"))
    }

    func testRemoveAllOfAnOwnerAndSingleRemoval() {
        registry.add(key(alice, "1"), path: path("a"))
        registry.add(key(alice, "2"), path: path("b"))
        registry.add(key(bob, "1"), path: path("a"))
        XCTAssertEqual(registry.removeAll(owner: alice).map(\.key), [key(alice, "1"), key(alice, "2")])
        XCTAssertEqual(registry.all().map(\.key), [key(bob, "1")])
        XCTAssertNotNil(registry.remove(key(bob, "1")))
        XCTAssertNil(registry.remove(key(bob, "1")))
        XCTAssertTrue(registry.all().isEmpty)
    }

    func testUnresponsiveMarking() {
        registry.add(key(alice, "p"), path: path("a"))
        XCTAssertTrue(registry.setUnresponsive(key(alice, "p")))
        XCTAssertEqual(registry.unresponsivePresenters().map(\.key), [key(alice, "p")])
        XCTAssertFalse(registry.setUnresponsive(key(bob, "missing")))
        registry.setUnresponsive(key(alice, "p"), false)
        XCTAssertEqual(registry.unresponsivePresenters(), [])
    }

    func testReRegisteringMovesThePresenter() {
        registry.add(key(alice, "p"), path: path("a"))
        registry.add(key(alice, "p"), path: path("b"))
        XCTAssertEqual(registry.all().map(\.path), [path("b")])
    }

    /// The indexed registry answers as a scan of every presenter would, through random adds,
    /// removals, moves (onto presenters too) and disconnects.
    func testTheIndexAnswersAsAScanOfEveryPresenter() {
        var generator = SystemRandomNumberGenerator()
        let names = ["a", "b", "c.pkg"]
        func randomPath() -> ItemPath {
            path((0..<Int.random(in: 0...3, using: &generator)).map { _ in names.randomElement(using: &generator)! }
                .joined(separator: "/"))
        }
        var model: [PresenterKey: ItemPath] = [:]
        let owners = [alice, bob, carol]
        for step in 0..<2_000 {
            let key = self.key(owners.randomElement(using: &generator)!, "\(Int.random(in: 0..<6, using: &generator))")
            switch Int.random(in: 0..<10, using: &generator) {
            case 0..<5:
                let where_ = randomPath()
                registry.add(key, path: where_)
                model[key] = where_
            case 5..<7:
                XCTAssertEqual(registry.remove(key)?.path, model.removeValue(forKey: key))
            case 7..<9:
                let (from, to) = (randomPath(), randomPath())
                guard !from.isEqualOrAncestor(of: to) || from == to else { continue }
                registry.itemDidMove(from: from, to: to)
                for (key, at) in model { if let moved = at.replacingPrefix(from, with: to) { model[key] = moved } }
            default:
                registry.removeAll(owner: key.owner)
                model = model.filter { $0.key.owner != key.owner }
            }
            let probe = randomPath()
            let sortedKeys = { (paths: [ItemPath]) in
                paths.flatMap { at in model.filter { $0.value == at }.map(\.key).sorted() }
            }
            XCTAssertEqual(registry.presenters(of: probe).map(\.key), sortedKeys([probe]), "step \(step)")
            XCTAssertEqual(registry.directoriesAbove(probe).map(\.key), sortedKeys(probe.ancestors),
                           "step \(step)")
            XCTAssertEqual(registry.packagesAbove(probe).map(\.key),
                           sortedKeys(probe.ancestors.filter { $0.lastComponent?.pathExtension != nil }), "step \(step)")
            XCTAssertEqual(registry.inside(probe).map(\.key),
                           model.filter { probe.isAncestor(of: $0.value) }.sorted { ($0.value, $0.key) < ($1.value, $1.key) }.map(\.key),
                           "step \(step)")
            // A plan looks further only where this says someone presents the probe, above or inside it.
            XCTAssertEqual(registry.presentsAnything(around: probe),
                           model.values.contains { $0.isEqualOrAncestor(of: probe) || probe.isAncestor(of: $0) }, "step \(step)")
            XCTAssertEqual(registry.all().count, model.count)
        }
    }
}
