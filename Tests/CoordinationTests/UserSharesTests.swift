@testable import Coordination
import XCTest

final class UserSharesTests: XCTestCase {
    private let limits = UserLimits(clientsPerUser: 2, slotsKeptForRoot: 2, presentersPerUser: 3, bufferedBytesPerUser: 100)
    private let stranger: uid_t = 4242

    func testAUserGetsNoMoreThanTheirClientsAndRootKeepsItsSlots() {
        var shares = UserShares()
        XCTAssertNil(shares.admit(stranger, connected: 0, maxClients: 10, limits: limits))
        XCTAssertNil(shares.admit(stranger, connected: 1, maxClients: 10, limits: limits))
        XCTAssertNotNil(shares.admit(stranger, connected: 2, maxClients: 10, limits: limits), "the user's limit")
        XCTAssertNil(shares.admit(4343, connected: 2, maxClients: 10, limits: limits), "another user is not held up")
        XCTAssertNotNil(shares.admit(4444, connected: 8, maxClients: 10, limits: limits), "the last slots are root's")
        XCTAssertNil(shares.admit(0, connected: 8, maxClients: 10, limits: limits))
        XCTAssertNotNil(shares.admit(0, connected: 10, maxClients: 10, limits: limits), "nobody past the total")
        shares.left(stranger, presenters: 0)
        XCTAssertNil(shares.admit(stranger, connected: 2, maxClients: 10, limits: limits), "a slot freed is the user's again")
    }

    func testPresentersAndBufferedBytesAreCountedAcrossTheUsersClients() {
        var shares = UserShares()
        XCTAssertNil(shares.admit(stranger, connected: 0, maxClients: 10, limits: limits))
        XCTAssertTrue((0..<3).allSatisfy { _ in shares.addPresenter(stranger, limits: limits) })
        XCTAssertFalse(shares.addPresenter(stranger, limits: limits))
        XCTAssertTrue(shares.addPresenter(0, limits: limits) && shares.addPresenter(0, limits: limits)
                      && shares.addPresenter(0, limits: limits) && shares.addPresenter(0, limits: limits),
                      "root is never refused")
        shares.removePresenter(stranger)
        XCTAssertTrue(shares.addPresenter(stranger, limits: limits))
        XCTAssertEqual(shares.buffered(stranger, change: 60), 60)
        XCTAssertEqual(shares.buffered(stranger, change: 60), 120)
        XCTAssertEqual(shares.buffered(stranger, change: -120), 0)
        shares.left(stranger, presenters: 3)
        XCTAssertTrue((0..<3).allSatisfy { _ in shares.addPresenter(stranger, limits: limits) }, "a closed client's presenters are freed")
    }
}
