import Coordination
import XCTest

final class NotificationPlanTests: XCTestCase {
    private let registry = PresenterRegistry()
    private let itemPresenter = PresenterKey(owner: bob, purpose: PurposeID("item"))
    private let folderPresenter = PresenterKey(owner: bob, purpose: PurposeID("folder"))
    private let rootPresenter = PresenterKey(owner: carol, purpose: PurposeID("root"))
    private let packagePresenter = PresenterKey(owner: carol, purpose: PurposeID("package"))
    private let initiatorPresenter = PresenterKey(owner: alice, purpose: PurposeID("mine"))

    override func setUp() {
        registry.add(itemPresenter, path: path("Documents/folder/note.txt"))
        registry.add(folderPresenter, path: path("Documents/folder"))
        registry.add(rootPresenter, path: path("Documents"))
        registry.add(initiatorPresenter, path: path("Documents/folder/note.txt"))
    }

    private func plan(_ operation: CoordinatedOperation, initiator: Initiator = Initiator(owner: alice))
        -> (before: [String], after: [String]) {
        let plan = NotificationPlan(for: operation, initiator: initiator, registry: registry)
        func render(_ deliveries: [PresenterDelivery]) -> [String] {
            deliveries.map { delivery in
                var text = "\(delivery.presenter.purpose): \(delivery.message.name)"
                switch delivery.message {
                case .accommodatePresentedSubitemDeletion(let at), .presentedSubitemDidChange(let at),
                     .presentedSubitemDidAppear(let at):
                    text += " \(at)"
                case .presentedItemDidMove(let to): text += " \(to)"
                case .presentedSubitemDidMove(let from, let to): text += " \(from) -> \(to)"
                default: break
                }
                return text
            }
        }
        return (render(plan.before), render(plan.after))
    }

    func testAKeptVersionIsToldToTheItemAndItsDirectoriesEveryoneIncluded() {
        let deliveries = NotificationPlan.versionAdded(at: path("Documents/folder/note.txt"), version: "v-1", registry: registry)
        XCTAssertEqual(deliveries.map { "\($0.presenter.purpose): \($0.message.name)" }, [
            "mine: presentedItemDidGainVersion", "item: presentedItemDidGainVersion",
            "folder: presentedSubitemDidGainVersion", "root: presentedSubitemDidGainVersion",
        ])
        XCTAssertEqual(deliveries.last?.message, .presentedSubitemDidGainVersion(at: path("Documents/folder/note.txt"), version: "v-1"))
        XCTAssertEqual(NotificationPlan.versionAdded(at: path("Elsewhere/x"), version: "v-1", registry: registry), [])
    }

    func testFoundationsAtomicWriteIsHeardAsWhatItBecomes() {
        let temporary = path("Documents/folder/.dat.nosync5A3C.Qx81yz")
        for operation in [CoordinatedOperation.create(temporary), .write(temporary), .metadataChange(temporary), .delete(temporary)] {
            XCTAssertEqual(plan(operation).before + plan(operation).after, [], "\(operation)")
        }
        XCTAssertEqual(plan(.saveByReplacing(temporary: temporary, original: path("Documents/folder/note.txt"))).after, [
            "item: presentedItemDidChange",
            "folder: presentedSubitemDidChange Documents/folder/note.txt",
            "root: presentedSubitemDidChange Documents/folder/note.txt",
            "item: reacquirePresentedItem",
        ])
        // Written to a new name: it appears there.
        XCTAssertEqual(plan(.move(from: temporary, to: path("Documents/folder/new.txt"), replacesDestination: false)).after, [
            "folder: presentedSubitemDidAppear Documents/folder/new.txt",
            "root: presentedSubitemDidAppear Documents/folder/new.txt",
        ])
        // Only Foundation's own name: a file the user calls so is an ordinary one.
        XCTAssertEqual(plan(.create(path("Documents/folder/.dat.nosync"))).after.count, 2)
    }

    func testReadAsksToRelinquishThenSaveAndReacquiresAtTheEnd() {
        let read = plan(.read(path("Documents/folder/note.txt")))
        XCTAssertEqual(read.before, ["item: relinquishPresentedItemToReader", "item: savePresentedItemChanges"])
        XCTAssertEqual(read.after, ["item: reacquirePresentedItem"])
        XCTAssertEqual(plan(.read(path("Documents/folder/note.txt"), options: .withoutChanges)).before,
                       ["item: relinquishPresentedItemToReader"])
    }

    func testReadInsideAPackageReachesThePackagePresenters() {
        registry.add(packagePresenter, path: path("Documents/Talk.key"))
        let read = plan(.read(path("Documents/Talk.key/Data/slide.png")))
        XCTAssertEqual(read.before, ["package: relinquishPresentedItemToReader", "package: savePresentedItemChanges"])
        XCTAssertEqual(read.after, ["package: reacquirePresentedItem"])
    }

    func testWriteRelinquishesThenReportsChangeToItemAndEnclosingDirectories() {
        let write = plan(.write(path("Documents/folder/note.txt")))
        XCTAssertEqual(write.before, ["item: relinquishPresentedItemToWriter"])
        XCTAssertEqual(write.after, [
            "item: presentedItemDidChange",
            "folder: presentedSubitemDidChange Documents/folder/note.txt",
            "root: presentedSubitemDidChange Documents/folder/note.txt",
            "item: reacquirePresentedItem",
        ])
    }

    func testCreateReportsAppearanceToEnclosingDirectories() {
        let create = plan(.create(path("Documents/folder/new.txt")))
        XCTAssertEqual(create.before, [])
        XCTAssertEqual(create.after, [
            "folder: presentedSubitemDidAppear Documents/folder/new.txt",
            "root: presentedSubitemDidAppear Documents/folder/new.txt",
        ])
    }

    func testDeleteOfADirectoryReachesEverythingInsideAndAbove() {
        let delete = plan(.delete(path("Documents/folder")))
        XCTAssertEqual(delete.before, [
            "folder: accommodatePresentedItemDeletion",
            "item: accommodatePresentedItemDeletion",
            "root: accommodatePresentedSubitemDeletion Documents/folder",
        ])
        XCTAssertEqual(delete.after, [])
    }

    func testMoveReportsNewPathsToTheSubtreeAndSubitemMovesAboveBothEnds() {
        registry.add(PresenterKey(owner: carol, purpose: PurposeID("dest")), path: path("Archive/folder"))
        registry.add(PresenterKey(owner: carol, purpose: PurposeID("archive")), path: path("Archive"))
        let move = plan(.move(from: path("Documents/folder"), to: path("Archive/folder"), replacesDestination: true))
        XCTAssertEqual(move.before, [
            "dest: accommodatePresentedItemDeletion",
            "folder: relinquishPresentedItemToWriter",
            "item: relinquishPresentedItemToWriter",
        ])
        XCTAssertEqual(move.after, [
            "folder: presentedItemDidMove Archive/folder",
            "item: presentedItemDidMove Archive/folder/note.txt",
            "root: presentedSubitemDidMove Documents/folder -> Archive/folder",
            "archive: presentedSubitemDidMove Documents/folder -> Archive/folder",
            "folder: reacquirePresentedItem",
            "item: reacquirePresentedItem",
        ])
    }

    func testMoveWithinOneDirectoryTellsItOnce() {
        let move = plan(.move(from: path("Documents/folder/note.txt"), to: path("Documents/folder/renamed.txt"),
                              replacesDestination: false))
        XCTAssertEqual(move.after.filter { $0.contains("Subitem") }, [
            "folder: presentedSubitemDidMove Documents/folder/note.txt -> Documents/folder/renamed.txt",
            "root: presentedSubitemDidMove Documents/folder/note.txt -> Documents/folder/renamed.txt",
        ])
    }

    func testSaveByReplacingIsAChangeNotADeletion() {
        let save = plan(.saveByReplacing(temporary: path("Documents/folder/.note.txt.swp"),
                                         original: path("Documents/folder/note.txt")))
        let write = plan(.write(path("Documents/folder/note.txt")))
        XCTAssertEqual(save.before, write.before)
        XCTAssertEqual(save.after, write.after)
        XCTAssertFalse((save.before + save.after).contains { $0.contains("Deletion") })
    }

    func testMetadataChangeOnlyReportsItemDidChange() {
        let chmod = plan(.metadataChange(path("Documents/folder/note.txt")))
        XCTAssertEqual(chmod.before, [])
        XCTAssertEqual(chmod.after, ["item: presentedItemDidChange"])
    }

    func testInitiatorHearsNothingByOwnerOrByPurpose() {
        let byOwner = plan(.write(path("Documents/folder/note.txt")), initiator: Initiator(owner: bob))
        XCTAssertFalse((byOwner.before + byOwner.after).contains { $0.hasPrefix("item") || $0.hasPrefix("folder") })
        XCTAssertTrue(byOwner.before.contains("mine: relinquishPresentedItemToWriter"))

        let byPurpose = plan(.write(path("Documents/folder/note.txt")), initiator: Initiator(purpose: PurposeID("item")))
        XCTAssertFalse((byPurpose.before + byPurpose.after).contains { $0.hasPrefix("item") })
        XCTAssertTrue(byPurpose.after.contains("folder: presentedSubitemDidChange Documents/folder/note.txt"))
    }
}
