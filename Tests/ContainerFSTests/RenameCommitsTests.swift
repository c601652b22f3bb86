@testable import ContainerFS
import Dispatch
import Glibc
import Synchronization
import XCTest

/// `RenameCommits` without a mount: when a sync first commits the filesystem (btrfs), and when not.
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
        XCTAssertEqual(renames.beforeSync(), 0)
        XCTAssertEqual(commits.count.load(ordering: .relaxed), 0, "nothing renamed: nothing to commit")
        renames.renamed()
        renames.renamed()
        XCTAssertEqual(renames.beforeSync(), 0)
        XCTAssertEqual(commits.count.load(ordering: .relaxed), 1, "one commit carries every rename so far")
        XCTAssertEqual(renames.beforeSync(), 0)
        XCTAssertEqual(commits.count.load(ordering: .relaxed), 1, "the next sync has nothing new to commit")
        renames.renamed()
        XCTAssertEqual(renames.beforeSync(), 0)
        XCTAssertEqual(commits.count.load(ordering: .relaxed), 2)
    }

    func testAFailedCommitIsTheSyncsErrorAndIsTriedAgain() {
        let commits = Commits()
        let renames = RenameCommits(needed: true) { commits.commit() }
        renames.renamed()
        commits.failure.store(EIO, ordering: .relaxed)
        XCTAssertEqual(renames.beforeSync(), EIO)
        commits.failure.store(0, ordering: .relaxed)
        XCTAssertEqual(renames.beforeSync(), 0)
        XCTAssertEqual(commits.count.load(ordering: .relaxed), 2, "the renames are still uncommitted after a failure")
        XCTAssertEqual(renames.beforeSync(), 0)
        XCTAssertEqual(commits.count.load(ordering: .relaxed), 2)
    }

    func testWhereWrittenDataOrdersRenamesNothingIsCommitted() {
        let commits = Commits()
        let renames = RenameCommits(needed: false) { commits.commit() }
        renames.renamed()
        XCTAssertEqual(renames.beforeSync(), 0)
        XCTAssertEqual(commits.count.load(ordering: .relaxed), 0)
    }

    func testConcurrentSyncsShareCommits() {
        let commits = Commits()
        let renames = RenameCommits(needed: true) {
            usleep(2000)
            return commits.commit()
        }
        renames.renamed()
        DispatchQueue.concurrentPerform(iterations: 16) { _ in XCTAssertEqual(renames.beforeSync(), 0) }
        XCTAssertEqual(commits.count.load(ordering: .relaxed), 1, "syncs that waited for a commit found their renames in it")
    }
}
