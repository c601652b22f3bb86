@testable import ContainerFS
import Coordination
import Dispatch
import Foundation
import Glibc
import Synchronization
import XCTest

/// `RenameCommits` without a mount: when a sync first commits the filesystem (btrfs), and when not,
/// and that renames and syncs take turns (`Turns`).
final class RenameCommitsTests: XCTestCase {
    private final class Commits: Sendable {
        let count = Atomic<Int>(0)
        let failure = Atomic<Int32>(0)
        func commit() -> Int32 {
            count.add(1, ordering: .relaxed)
            return failure.load(ordering: .relaxed)
        }
    }

    func testASyncCommitsOnlyWhenRenamesWereMadeSinceTheLastCommit() {
        let commits = Commits()
        let renames = RenameCommits(needed: true) { commits.commit() }
        XCTAssertEqual(renames.syncing { 0 }, 0)
        XCTAssertEqual(commits.count.load(ordering: .relaxed), 0, "nothing renamed: nothing to commit")
        renames.renaming { }
        renames.renaming { }
        XCTAssertEqual(renames.syncing { 0 }, 0)
        XCTAssertEqual(commits.count.load(ordering: .relaxed), 1, "one commit carries every rename so far")
        XCTAssertEqual(renames.syncing { 0 }, 0)
        XCTAssertEqual(commits.count.load(ordering: .relaxed), 1, "the next sync has nothing new to commit")
        renames.renaming { }
        XCTAssertEqual(renames.syncing { 0 }, 0)
        XCTAssertEqual(commits.count.load(ordering: .relaxed), 2)
    }

    func testAFailedCommitIsTheSyncsErrorAndIsTriedAgain() {
        let commits = Commits()
        let renames = RenameCommits(needed: true) { commits.commit() }
        renames.renaming { }
        commits.failure.store(EIO, ordering: .relaxed)
        XCTAssertEqual(renames.syncing { 0 }, EIO)
        commits.failure.store(0, ordering: .relaxed)
        XCTAssertEqual(renames.syncing { 0 }, 0)
        XCTAssertEqual(commits.count.load(ordering: .relaxed), 2, "the renames are still uncommitted after a failure")
        XCTAssertEqual(renames.syncing { 0 }, 0)
        XCTAssertEqual(commits.count.load(ordering: .relaxed), 2)
    }

    func testWhereWrittenDataOrdersRenamesNothingIsCommitted() {
        let commits = Commits()
        let renames = RenameCommits(needed: false) { commits.commit() }
        renames.renaming { }
        XCTAssertEqual(renames.syncing { 0 }, 0)
        XCTAssertEqual(commits.count.load(ordering: .relaxed), 0)
    }

    func testConcurrentSyncsShareCommits() {
        let commits = Commits()
        let renames = RenameCommits(needed: true) {
            usleep(2000)
            return commits.commit()
        }
        renames.renaming { }
        DispatchQueue.concurrentPerform(iterations: 16) { _ in XCTAssertEqual(renames.syncing { 0 }, 0) }
        XCTAssertEqual(commits.count.load(ordering: .relaxed), 1, "syncs that waited for a commit found their renames in it")
    }

    /// Runs `held` on a thread of its own, which calls the closure it is given once inside its
    /// turn and stays there until released; meanwhile `other` on another thread. Whether `other`
    /// had finished before the release (it must not), and whether it finished after.
    private func whileInside(_ held: @escaping @Sendable (_ inside: () -> Void) -> Void,
                             run other: @escaping @Sendable () -> Void) -> (during: Bool, after: Bool) {
        let entered = DispatchSemaphore(value: 0), release = DispatchSemaphore(value: 0)
        let finished = Atomic<Bool>(false)
        let done = DispatchGroup()
        DispatchQueue.global().async(group: done) {
            held {
                entered.signal()
                release.wait()
            }
        }
        entered.wait()
        DispatchQueue.global().async(group: done) {
            other()
            finished.store(true, ordering: .relaxed)
        }
        usleep(50_000)
        let during = finished.load(ordering: .relaxed)
        release.signal()
        done.wait()
        return (during, finished.load(ordering: .relaxed))
    }

    func testARenameMadeWhileASyncRunsWaitsForItAndIsCommittedByTheNextSync() {
        let commits = Commits()
        let renames = RenameCommits(needed: true) { commits.commit() }
        let renamed = whileInside({ inside in
            XCTAssertEqual(renames.syncing {
                inside()
                return 0
            }, 0)
        }, run: { renames.renaming { } })
        XCTAssertFalse(renamed.during, "a rename while a sync runs could be logged by it without its data")
        XCTAssertTrue(renamed.after)
        XCTAssertEqual(commits.count.load(ordering: .relaxed), 0, "nothing was renamed before the sync")
        XCTAssertEqual(renames.syncing { 0 }, 0)
        XCTAssertEqual(commits.count.load(ordering: .relaxed), 1, "the next sync commits the rename first")
    }

    func testASyncWaitsForARenameInProgressAndCommitsIt() {
        let commits = Commits()
        let renames = RenameCommits(needed: true) { commits.commit() }
        let synced = whileInside({ inside in renames.renaming { inside() } }, run: {
            XCTAssertEqual(renames.syncing {
                XCTAssertEqual(commits.count.load(ordering: .relaxed), 1, "the commit came first, after the rename")
                return 0
            }, 0)
        })
        XCTAssertFalse(synced.during, "the rename was not counted yet: the sync would not commit it")
        XCTAssertTrue(synced.after)
    }

    func testRenamesAndSyncsTakeTurnsAndNeitherWaitsForever() {
        let turns = Turns()
        turns.enter(.renames)
        let queued = DispatchGroup()
        let entered = Locked<[Turns.Kind]>([])
        func start(_ kind: Turns.Kind) {
            let before = turns.queued.map(\.members).reduce(0, +)
            queued.enter()
            // A thread each: blocked callers would hold up the dispatch pool's.
            Thread {
                turns.enter(kind)
                entered.withLock { $0.append(kind) }
                turns.leave()
                queued.leave()
            }.start()
            // Queued in this order.
            for _ in 0..<10_000 where turns.queued.map(\.members).reduce(0, +) == before { usleep(1000) }
        }
        start(.syncs)
        start(.renames)   // behind the sync, though renames run: they would keep it out forever
        start(.syncs)     // a turn of its own: the renames queued between go first
        XCTAssertEqual(turns.queued.map(\.kind), [.renames, .syncs, .renames, .syncs])
        XCTAssertEqual(turns.queued.map(\.members), [1, 1, 1, 1])
        start(.renames)
        XCTAssertEqual(turns.queued.map(\.members), [1, 1, 1, 1, 1])
        start(.renames)
        XCTAssertEqual(turns.queued.map(\.members), [1, 1, 1, 1, 2], "a caller joins the last batch of its kind")
        XCTAssertEqual(entered.withLock { $0 }, [], "nothing runs beside the running rename")
        turns.leave()
        queued.wait()
        XCTAssertEqual(entered.withLock { $0 }, [.syncs, .renames, .syncs, .renames, .renames])
        XCTAssertTrue(turns.queued.isEmpty)
    }

    func testSyncsShareATurn() {
        let turns = Turns()
        turns.enter(.syncs)
        let (other, left) = (DispatchSemaphore(value: 0), DispatchSemaphore(value: 0))
        DispatchQueue.global().async {
            turns.enter(.syncs)
            other.signal()
            turns.leave()
            left.signal()
        }
        XCTAssertEqual(other.wait(timeout: .now() + 10), .success, "a second sync runs beside the first")
        turns.leave()
        // The other's leave may come after this one's.
        XCTAssertEqual(left.wait(timeout: .now() + 10), .success)
        XCTAssertTrue(turns.queued.isEmpty)
    }
}
