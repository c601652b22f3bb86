@testable import Coordination
import Dispatch
#if canImport(Glibc)
import Glibc
#endif
import XCTest

final class ArbiterTests: XCTestCase {
    private var scheduler: ManualScheduler!
    private var arbiter: Arbiter!

    override func setUp() {
        scheduler = ManualScheduler()
        arbiter = Arbiter(scheduler: scheduler)
    }

    /// Requests one access under its own purpose (unless one is given).
    @discardableResult
    private func ask(_ accesses: ItemAccess..., owner: OwnerID = alice, purpose: String? = nil,
                     timeout: Duration? = nil) -> (ticket: AccessTicket, outcome: Outcome) {
        let outcome = Outcome()
        let ticket = arbiter.request(accesses, owner: owner, purpose: PurposeID(purpose ?? UUIDish.next()),
                                     timeout: timeout, completion: outcome.completion)
        return (ticket, outcome)
    }

    func testReadsShare() {
        let first = ask(.read(path("D/a")))
        let second = ask(.read(path("D/a")), owner: bob)
        XCTAssertTrue(first.outcome.isGranted)
        XCTAssertTrue(second.outcome.isGranted)
    }

    func testWriteExcludesReadsAndWritesUntilReleased() {
        let writer = ask(.write(path("D/a")))
        let reader = ask(.read(path("D/a")), owner: bob)
        let otherWriter = ask(.write(path("D/a")), owner: carol)
        XCTAssertTrue(writer.outcome.isGranted)
        XCTAssertTrue(reader.outcome.isPending)
        XCTAssertTrue(otherWriter.outcome.isPending)

        arbiter.release(writer.outcome.grant!)
        XCTAssertTrue(reader.outcome.isGranted)
        XCTAssertTrue(otherWriter.outcome.isPending, "the second writer waits for the reader")
        arbiter.release(reader.outcome.grant!)
        XCTAssertTrue(otherWriter.outcome.isGranted)
        XCTAssertEqual([writer, reader, otherWriter].map(\.outcome.callCount), [1, 1, 1])
    }

    func testWriteWaitsForActiveReaders() {
        let reader = ask(.read(path("D/a")))
        let writer = ask(.write(path("D/a")), owner: bob)
        XCTAssertTrue(writer.outcome.isPending)
        arbiter.release(reader.ticket)
        XCTAssertTrue(writer.outcome.isGranted)
    }

    func testWaitingWriterIsNotOvertakenByLaterReaders() {
        let firstReader = ask(.read(path("D/a")))
        let writer = ask(.write(path("D/a")), owner: bob)
        let lateReader = ask(.read(path("D/a")), owner: carol)
        XCTAssertTrue(lateReader.outcome.isPending, "a reader may not jump a waiting writer")

        arbiter.release(firstReader.ticket)
        XCTAssertTrue(writer.outcome.isGranted)
        XCTAssertTrue(lateReader.outcome.isPending)
        arbiter.release(writer.ticket)
        XCTAssertTrue(lateReader.outcome.isGranted)
    }

    func testGrantsFollowArrivalOrderAmongConflictingWaiters() {
        let order = EventLog<Int>()
        let holder = ask(.write(path("D/a")))
        let arbiter = self.arbiter!
        for index in 1...5 {
            arbiter.request([.write(path("D/a"))], owner: bob, purpose: PurposeID("p\(index)")) { result in
                guard case .success(let grant) = result else { return XCTFail("not granted") }
                order.append(index)
                arbiter.release(grant)  // re-entering from the completion must not deadlock
            }
        }
        XCTAssertEqual(order.all, [])
        arbiter.release(holder.ticket)
        XCTAssertEqual(order.all, [1, 2, 3, 4, 5])
    }

    func testUnrelatedRequestsPassAWaitingQueue() {
        let holder = ask(.write(path("D/a")))
        let waiter = ask(.write(path("D/a")), owner: bob)
        let elsewhere = ask(.write(path("D/b")), owner: carol)
        XCTAssertTrue(holder.outcome.isGranted)
        XCTAssertTrue(waiter.outcome.isPending)
        XCTAssertTrue(elsewhere.outcome.isGranted)
    }

    func testMultiItemRequestIsAllOrNothing() {
        let holder = ask(.write(path("D/src")))
        let rename = ask(.write(path("D/src"), options: .forMoving), .write(path("D/dst"), options: .forReplacing),
                         owner: bob)
        XCTAssertTrue(rename.outcome.isPending)
        XCTAssertFalse(arbiter.status().contains { $0.state == .active && $0.path == path("D/dst") },
                       "a waiting request holds none of its items")
        // The destination is free, but FIFO keeps a newcomer behind the rename that wants it.
        let dstWriter = ask(.write(path("D/dst")), owner: carol)
        XCTAssertTrue(dstWriter.outcome.isPending)

        arbiter.release(holder.ticket)
        XCTAssertTrue(rename.outcome.isGranted)
        XCTAssertEqual(rename.outcome.grant?.accesses.count, 2)
        XCTAssertTrue(dstWriter.outcome.isPending)
        arbiter.release(rename.ticket)
        XCTAssertTrue(dstWriter.outcome.isGranted)
    }

    func testCrossedMultiItemRequestsCannotDeadlock() {
        let reader = ask(.read(path("D/a")), .read(path("D/b")))
        let first = ask(.write(path("D/a")), .write(path("D/b")), owner: bob)
        let second = ask(.write(path("D/b")), .write(path("D/a")), owner: carol)
        arbiter.release(reader.ticket)
        XCTAssertTrue(first.outcome.isGranted)
        XCTAssertTrue(second.outcome.isPending)
        arbiter.release(first.ticket)
        XCTAssertTrue(second.outcome.isGranted)
    }

    func testPackagesLockAsAWhole() {
        let writer = ask(.write(path("Documents/Talk.key/Data/slide1.png")))
        let siblingRead = ask(.read(path("Documents/Talk.key/Index.zip")), owner: bob)
        let packageRead = ask(.read(path("Documents/Talk.key"), isDirectory: true), owner: carol)
        let outsideRead = ask(.read(path("Documents/notes.txt")), owner: carol)
        XCTAssertTrue(writer.outcome.isGranted)
        XCTAssertTrue(siblingRead.outcome.isPending, "any item in a package is the package")
        XCTAssertTrue(packageRead.outcome.isPending)
        XCTAssertTrue(outsideRead.outcome.isGranted)
        arbiter.release(writer.ticket)
        XCTAssertTrue(siblingRead.outcome.isGranted)
        XCTAssertTrue(packageRead.outcome.isGranted)
    }

    func testPlainWriteInsideAnOrdinaryDirectoryLocksOnlyThatItem() {
        let writer = ask(.write(path("Documents/folder/x")))
        let siblingRead = ask(.read(path("Documents/folder/y")), owner: bob)
        let dirRead = ask(.read(path("Documents/folder"), isDirectory: true), owner: carol)
        let dirWrite = ask(.write(path("Documents/folder"), isDirectory: true), owner: carol)
        let sameItem = ask(.read(path("Documents/folder/x")), owner: bob)
        XCTAssertTrue(writer.outcome.isGranted && siblingRead.outcome.isGranted && dirRead.outcome.isGranted)
        XCTAssertTrue(dirWrite.outcome.isPending, "waits for the directory's reader, not for the items inside")
        XCTAssertTrue(sameItem.outcome.isPending)
        arbiter.release(dirRead.ticket)
        XCTAssertTrue(dirWrite.outcome.isGranted, "a plain write of a directory leaves its items alone")
    }

    func testDeletingMovingAndReplacingADirectoryReachInside() {
        for options in [WritingOptions.forDeleting, .forMoving, .forReplacing] {
            setUp()
            let deep = ask(.read(path("Documents/folder/sub/file")))
            let dirWrite = ask(.write(path("Documents/folder"), isDirectory: true, options: options), owner: bob)
            XCTAssertTrue(dirWrite.outcome.isPending, "\(options) waits for readers inside")
            let later = ask(.read(path("Documents/folder/other")), owner: carol)
            arbiter.release(deep.ticket)
            XCTAssertTrue(dirWrite.outcome.isGranted)
            XCTAssertTrue(later.outcome.isPending, "\(options) blocks items inside")
            let outside = ask(.read(path("Documents/folder2/x")), owner: carol)
            XCTAssertTrue(outside.outcome.isGranted, "no string-prefix confusion")
        }
        setUp()
        let merging = ask(.write(path("Documents/folder"), isDirectory: true, options: .forMerging))
        let inside = ask(.read(path("Documents/folder/x")), owner: bob)
        XCTAssertTrue(merging.outcome.isGranted)
        XCTAssertTrue(inside.outcome.isGranted, "merging does not reach inside")
    }

    func testCustomPackagePredicate() {
        arbiter = Arbiter(packageRule: PackageRule { $0.pathExtension == Array("pages".utf8) }, scheduler: scheduler)
        let inPages = ask(.write(path("D/a.pages/x")))
        XCTAssertTrue(ask(.read(path("D/a.pages/y")), owner: bob).outcome.isPending)
        let inApp = ask(.write(path("D/b.app/x")), owner: carol)
        XCTAssertTrue(ask(.read(path("D/b.app/y")), owner: bob).outcome.isGranted, ".app is not a package here")
        XCTAssertTrue(inPages.outcome.isGranted && inApp.outcome.isGranted)
    }

    func testSamePurposeNeverBlocks() {
        let write = ask(.write(path("D/a")), owner: alice, purpose: "editor")
        let nestedWrite = ask(.write(path("D/a")), owner: alice, purpose: "editor")
        let nestedDelete = ask(.write(path("D"), isDirectory: true, options: .forDeleting), owner: alice, purpose: "editor")
        XCTAssertTrue(write.outcome.isGranted && nestedWrite.outcome.isGranted && nestedDelete.outcome.isGranted)
        let otherPurposeSameOwner = ask(.read(path("D/a")), owner: alice, purpose: "indexer")
        XCTAssertTrue(otherPurposeSameOwner.outcome.isPending, "purpose, not owner, decides")
    }

    func testSamePurposeMayPassItsOwnWaitingRequest() {
        let holder = ask(.write(path("D/b")), owner: bob)
        let waiting = ask(.write(path("D/a")), .write(path("D/b")), purpose: "p")
        let samePurpose = ask(.read(path("D/a")), purpose: "p")
        let otherPurpose = ask(.read(path("D/a")), owner: carol)
        XCTAssertTrue(waiting.outcome.isPending)
        XCTAssertTrue(samePurpose.outcome.isGranted, "never queued behind its own purpose")
        XCTAssertTrue(otherPurpose.outcome.isPending, "but others keep FIFO order")
        arbiter.release(holder.ticket)
        XCTAssertTrue(waiting.outcome.isGranted)
    }

    func testPurposesOnlyCountWithinOneOwner() {
        let mine = ask(.write(path("D/a")), owner: alice, purpose: "default")
        let theirs = ask(.write(path("D/a")), owner: bob, purpose: "default")
        XCTAssertTrue(mine.outcome.isGranted)
        XCTAssertTrue(theirs.outcome.isPending, "another client cannot borrow a purpose")
    }

    func testClientIOInsideItsOwnCoordinatedWritePassesTheQueue() {
        let coordinated = ask(.write(path("D/folder"), isDirectory: true, options: .forReplacing), owner: alice)
        let other = ask(.read(path("D/folder/x")), owner: bob)
        XCTAssertTrue(other.outcome.isPending)

        let io = Outcome()
        arbiter.request([.write(path("D/folder/x"))], owner: alice, purpose: PurposeID("fuse-1"),
                        joinsOwnersAccesses: true, completion: io.completion)
        XCTAssertTrue(io.isGranted, "covered by the owner's grant: no deadlock behind bob")

        let plain = ask(.write(path("D/folder/x")), owner: alice)
        XCTAssertTrue(plain.outcome.isPending, "without the flag it queues like anyone")
        arbiter.release(coordinated.ticket)
        XCTAssertTrue(other.outcome.isPending, "the I/O access still holds the item")
    }

    func testAnEditorsSaveInsideItsOwnWriteWaitsOnlyForHolders() {
        // Inside its coordinated write of the note, a client renames a temporary file over it (an
        // atomic save): half of that is the client's already, and bob's queued write waits for it.
        let coordinated = ask(.write(path("D/note.txt"), options: .forReplacing), owner: alice)
        let other = ask(.write(path("D/note.txt"), options: .forReplacing), owner: bob)
        XCTAssertTrue(other.outcome.isPending)
        let save = Outcome()
        arbiter.request([.write(path("D/.note.txt.saving"), options: .forMoving), .write(path("D/note.txt"), options: .forReplacing)],
                        owner: alice, purpose: PurposeID("fuse-4"), joinsOwnersAccesses: true, completion: save.completion)
        XCTAssertTrue(save.isGranted, "queued behind bob it would wait for bob, who waits for alice")
        arbiter.release(save.grant!)
        arbiter.release(coordinated.ticket)
        XCTAssertTrue(other.outcome.isGranted)

        // A part held by someone else still waits for them.
        let held = ask(.read(path("D/.other")), owner: bob)
        let mine = ask(.write(path("D/note2.txt"), options: .forReplacing), owner: alice)
        let blocked = Outcome()
        arbiter.request([.write(path("D/.other"), options: .forMoving), .write(path("D/note2.txt"), options: .forReplacing)],
                        owner: alice, purpose: PurposeID("fuse-5"), joinsOwnersAccesses: true, completion: blocked.completion)
        XCTAssertTrue(blocked.isPending)
        arbiter.release(held.ticket)
        XCTAssertTrue(blocked.isGranted)
        XCTAssertTrue(mine.outcome.isGranted)
    }

    func testUncoveredClientIOQueuesButNeverWaitsForItsOwner() {
        let ownRead = ask(.read(path("D/a")), owner: alice)
        let io = Outcome()
        arbiter.request([.write(path("D/a"))], owner: alice, purpose: PurposeID("fuse-2"),
                        joinsOwnersAccesses: true, completion: io.completion)
        XCTAssertTrue(io.isGranted, "does not wait for the owner's own read")
        arbiter.release(io.grant!)

        let bobReads = ask(.read(path("D/a")), owner: bob)
        let io2 = Outcome()
        arbiter.request([.write(path("D/a"))], owner: alice, purpose: PurposeID("fuse-3"),
                        joinsOwnersAccesses: true, completion: io2.completion)
        XCTAssertTrue(io2.isPending, "a read does not cover a write, and bob's read is in the way")
        arbiter.release(bobReads.ticket)
        XCTAssertTrue(io2.isGranted)
        XCTAssertTrue(ownRead.outcome.isGranted)
    }

    func testTimeoutFailsTheWaiterAndUnblocksThoseBehindIt() {
        let reader = ask(.read(path("D/a")))
        let writer = ask(.write(path("D/a")), owner: bob, timeout: .seconds(1))
        let lateReader = ask(.read(path("D/a")), owner: carol)
        XCTAssertTrue(lateReader.outcome.isPending)
        scheduler.advance(by: .milliseconds(900))
        XCTAssertTrue(writer.outcome.isPending)
        scheduler.advance(by: .milliseconds(200))
        XCTAssertEqual(writer.outcome.error, .timedOut)
        XCTAssertTrue(lateReader.outcome.isGranted, "only the timed-out writer stood in the way")
        XCTAssertTrue(reader.outcome.isGranted)
        XCTAssertFalse(arbiter.status().contains { $0.ticket == writer.ticket })
    }

    func testGrantBeforeTimeoutCancelsTheTimer() {
        let holder = ask(.write(path("D/a")))
        let waiter = ask(.write(path("D/a")), owner: bob, timeout: .seconds(1))
        XCTAssertEqual(scheduler.liveTimerCount, 1)
        arbiter.release(holder.ticket)
        XCTAssertEqual(scheduler.liveTimerCount, 0)
        scheduler.advance(by: .seconds(5))
        XCTAssertEqual(waiter.outcome.callCount, 1)
        XCTAssertTrue(waiter.outcome.isGranted)
        XCTAssertEqual(arbiter.status().filter { $0.state == .active }.map(\.ticket), [waiter.ticket])
    }

    func testImmediateGrantSchedulesNoTimer() {
        ask(.write(path("D/a")), timeout: .seconds(1))
        XCTAssertEqual(scheduler.liveTimerCount, 0)
    }

    func testRealTimerTimesOut() {
        let realArbiter = Arbiter()
        let done = expectation(description: "timed out")
        realArbiter.request([.write(path("a"))], owner: alice, purpose: PurposeID("1")) { _ in }
        realArbiter.request([.write(path("a"))], owner: bob, purpose: PurposeID("2"), timeout: .milliseconds(50)) {
            if case .failure(.timedOut) = $0 { done.fulfill() }
        }
        wait(for: [done], timeout: 5)
    }

    func testCancelWaitingAndCancelGranted() {
        let holder = ask(.write(path("D/a")))
        let waiter = ask(.write(path("D/a")), owner: bob, timeout: .seconds(1))
        let behind = ask(.write(path("D/a")), owner: carol)
        arbiter.cancel(waiter.ticket)
        XCTAssertEqual(waiter.outcome.error, .cancelled)
        arbiter.cancel(waiter.ticket)
        scheduler.advance(by: .seconds(2))
        XCTAssertEqual(waiter.outcome.callCount, 1, "exactly once, even after a second cancel and the timeout")
        XCTAssertTrue(behind.outcome.isPending)
        arbiter.cancel(holder.ticket)  // granted: cancel releases
        XCTAssertTrue(behind.outcome.isGranted)
        XCTAssertEqual(holder.outcome.callCount, 1)
    }

    func testDisconnectDropsEverythingOfAnOwnerAtOnce() {
        let held = ask(.write(path("D/a")), owner: alice)
        let heldToo = ask(.read(path("D/b")), owner: alice)
        let bobWaits = ask(.write(path("D/a")), .write(path("D/b")), owner: bob)
        let aliceWaits = ask(.write(path("D/a")), owner: alice, timeout: .seconds(1))
        arbiter.disconnect(alice)
        XCTAssertEqual(aliceWaits.outcome.error, .disconnected)
        XCTAssertTrue(bobWaits.outcome.isGranted)
        XCTAssertTrue(held.outcome.isGranted && heldToo.outcome.isGranted)
        XCTAssertEqual(Set(arbiter.status().map(\.owner)), [bob])
        XCTAssertEqual(scheduler.liveTimerCount, 0)
    }

    func testWaitersFollowARenamedDirectory() {
        let move = ask(.write(path("D/a"), isDirectory: true, options: .forMoving))
        let waiter = ask(.write(path("D/a/x")), owner: bob)
        XCTAssertTrue(waiter.outcome.isPending)
        arbiter.itemDidMove(from: path("D/a"), to: path("D/b"))
        arbiter.release(move.ticket)
        XCTAssertEqual(waiter.outcome.grant?.accesses.map(\.path), [path("D/b/x")])
        XCTAssertTrue(ask(.read(path("D/b/x")), owner: carol).outcome.isPending, "the lock moved with the item")
        XCTAssertTrue(ask(.read(path("D/a/x")), owner: carol).outcome.isGranted)
    }

    func testStatusShowsActiveThenWaitingWithOwnerPurposeKindAndPath() {
        let holder = ask(.write(path("D/a"), options: [.forMerging]), owner: alice, purpose: "one")
        ask(.read(path("D/a"), options: .withoutChanges), owner: bob, purpose: "two")
        let status = arbiter.status()
        XCTAssertEqual(status.map(\.state), [.active, .waiting])
        XCTAssertEqual(status.map(\.owner), [alice, bob])
        XCTAssertEqual(status.map(\.purpose), [PurposeID("one"), PurposeID("two")])
        XCTAssertEqual(status.map(\.kind), [.write(.forMerging), .read(.withoutChanges)])
        XCTAssertEqual(status.map(\.path), [path("D/a"), path("D/a")])
        XCTAssertEqual(status.first?.ticket, holder.ticket)
    }

    func testALongQueueOfWritersThatReleaseInTheirCompletionsDoesNotNest() {
        // With completions run on the releasing thread this chain would nest 1000 deep.
        let realArbiter = Arbiter()
        let holder = Outcome()
        realArbiter.request([.write(path("hot"))], owner: alice, purpose: PurposeID("first"),
                            completion: holder.completion)
        let group = DispatchGroup()
        let order = EventLog<Int>()
        for index in 0..<1000 {
            group.enter()
            realArbiter.request([.write(path("hot"))], owner: bob, purpose: PurposeID("\(index)")) { result in
                guard case .success(let grant) = result else { return XCTFail("not granted") }
                order.append(index)
                realArbiter.release(grant)
                group.leave()
            }
        }
        realArbiter.release(holder.grant!)
        XCTAssertEqual(group.wait(timeout: .now() + 30), .success)
        XCTAssertEqual(order.all, Array(0..<1000), "granted one by one, in order")
    }

    func testALaterGrantDoesNotRunOnTheReleasingThread() {
        let realArbiter = Arbiter()
        let holder = Outcome()
        realArbiter.request([.write(path("a"))], owner: alice, purpose: PurposeID("1"), completion: holder.completion)
        let releasingThread = pthread_self()
        let ranElsewhere = expectation(description: "granted on another thread")
        realArbiter.request([.write(path("a"))], owner: bob, purpose: PurposeID("2")) { _ in
            if pthread_equal(pthread_self(), releasingThread) == 0 { ranElsewhere.fulfill() }
        }
        realArbiter.release(holder.grant!)
        wait(for: [ranElsewhere], timeout: 5)
    }

    func testConcurrentWritersAreMutuallyExclusive() {
        let realArbiter = Arbiter()
        let holders = Locked<[Int]>([0, 0, 0])
        let violations = Locked(0)
        let group = DispatchGroup()
        let total = 600
        for _ in 0..<total { group.enter() }
        DispatchQueue.concurrentPerform(iterations: total) { index in
            let item = index % 3
            let reading = index % 4 == 0
            let access: ItemAccess = reading ? .read(path("D/\(item)")) : .write(path("D/\(item)"))
            realArbiter.request([access], owner: OwnerID(UInt64(index)), purpose: PurposeID("\(index)")) { result in
                guard case .success(let grant) = result else { return XCTFail("not granted") }
                // Writers count 1000 so that any overlap with a writer shows.
                let weight = reading ? 1 : 1000
                holders.withLock { counts in
                    counts[item] += weight
                    if counts[item] > 1000 && counts[item] % 1000 != 0 || counts[item] >= 2000 {
                        violations.withLock { $0 += 1 }
                    }
                }
                holders.withLock { $0[item] -= weight }
                realArbiter.release(grant)
                group.leave()
            }
        }
        XCTAssertEqual(group.wait(timeout: .now() + 20), .success)
        XCTAssertEqual(violations.withLock { $0 }, 0)
        XCTAssertTrue(realArbiter.status().isEmpty)
    }
}

/// Unique purpose strings without Foundation's UUID.
enum UUIDish {
    private static let counter = Locked(0)
    static func next() -> String { "purpose-\(counter.withLock { $0 += 1; return $0 })" }
}
