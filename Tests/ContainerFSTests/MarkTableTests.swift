@testable import ContainerFS
import XCTest

/// `MarkTable` without a mount: which files have a link of the daemon's (not counted by `stat`),
/// and which must wait for a sync before a change in place.
final class MarkTableTests: XCTestCase {
    private let a = BackingKey(device: 1, inode: 10)
    private let b = BackingKey(device: 1, inode: 11)
    private let c = BackingKey(device: 1, inode: 12)

    func testALinkIsHiddenUntilItGoesAndUnsettledUntilASyncCarriesItsRemoval() {
        var table = MarkTable()
        table.linked(a)
        XCTAssertTrue(table.hasLink(a))
        XCTAssertFalse(table.isUnsettled(a), "a link that is still there needs no sync before a change")
        table.unlinked(a)
        XCTAssertFalse(table.hasLink(a))
        XCTAssertTrue(table.isUnsettled(a), "a cut could bring the removed link back")
        table.settled(through: table.removals)
        XCTAssertFalse(table.isUnsettled(a))
        XCTAssertTrue(table.marks.isEmpty, "nothing is kept of a settled removal")
    }

    func testASyncSettlesOnlyTheRemovalsMadeBeforeIt() {
        var table = MarkTable()
        table.linked(a)
        table.linked(b)
        table.linked(c)
        table.unlinked(a)
        let through = table.removals
        table.unlinked(b)  // after the sync began: it may not carry it
        table.settled(through: through)
        XCTAssertFalse(table.isUnsettled(a))
        XCTAssertTrue(table.isUnsettled(b))
        XCTAssertTrue(table.hasLink(c), "links still there are not a sync's business")
    }

    func testAFileMarkedAgainAfterARemovalHasItsLinkAgain() {
        var table = MarkTable()
        table.linked(b)
        table.unlinked(b)
        table.linked(b)  // a new record of the same file, as a later publish makes
        XCTAssertTrue(table.hasLink(b))
        XCTAssertFalse(table.isUnsettled(b))
        table.settled(through: table.removals)
        XCTAssertTrue(table.hasLink(b), "a sync does not take a link that is there")
    }
}
