@testable import ContainerFS
import Glibc
import XCTest

/// A node's sharing state driven directly, without a mount (docs/atomic-replace.md, "What readers
/// see" and "Sharing a file live").
final class SharingTests: XCTestCase {
    private var sharing = Sharing()

    private func open(_ opening: Sharing.Opening, session: Bool = false, now: UInt64 = 0,
                      passthrough id: Int32? = nil, writable: Bool = true) -> OpenPath? {
        var effect = sharing.open(opening, session: session, now: now, mayRegister: id != nil)
        if effect == .register { effect = sharing.registered(id!, writable: writable, by: opening) }
        // As Node.openHandle: a registration given back opens as if passthrough were not offered.
        if case .unregister = effect { effect = sharing.open(opening, session: session, now: now, mayRegister: false) }
        switch effect {
        case .open(let path), .writerArrived(let path): return path
        default: return nil
        }
    }

    func testOnlyReadWriteAndAppendingOpensWithoutTruncationShareTheFileLive() {
        XCTAssertTrue(Sharing.opensLive(O_RDWR))
        XCTAssertTrue(Sharing.opensLive(O_RDWR | O_CREAT))
        XCTAssertTrue(Sharing.opensLive(O_WRONLY | O_APPEND | O_CREAT))
        XCTAssertFalse(Sharing.opensLive(O_RDWR | O_TRUNC), "a rewrite")
        XCTAssertFalse(Sharing.opensLive(O_WRONLY | O_CREAT | O_TRUNC), "the shell's >")
        XCTAssertFalse(Sharing.opensLive(O_WRONLY), "a write-only patch is published whole")
        XCTAssertFalse(Sharing.opensLive(O_RDONLY))
    }

    func testTheFirstReaderAloneGetsPassthroughAndLaterReadersFollow() {
        XCTAssertEqual(open(.versionedReader, passthrough: 7), .passthrough(backingID: 7))
        XCTAssertEqual(open(.versionedReader), .passthrough(backingID: 7))
        XCTAssertEqual(sharing.close(.passthrough(backingID: 7)), .none)
        XCTAssertEqual(sharing.close(.passthrough(backingID: 7)), .unregister(7), "the last one unregisters")
        XCTAssertEqual(sharing, Sharing())
    }

    func testAWriterInPlaceAloneGoesThroughPassthroughAndReadersJoinIt() {
        XCTAssertEqual(open(.liveWriter, passthrough: 9), .passthroughLive(backingID: 9))
        XCTAssertTrue(sharing.isLive)
        XCTAssertEqual(open(.versionedReader), .passthrough(backingID: 9))
        XCTAssertEqual(sharing.close(.passthroughLive(backingID: 9)), .none)
        XCTAssertFalse(sharing.isLive)
        XCTAssertEqual(sharing.close(.passthrough(backingID: 9)), .unregister(9))
        XCTAssertEqual(sharing, Sharing())
        XCTAssertEqual(open(.inPlaceWriter, passthrough: 9), .passthrough(backingID: 9))
    }

    func testALiveWriterThroughPassthroughMakesItsAttributesBeAskedAfresh() {
        XCTAssertEqual(open(.liveWriter, passthrough: 9), .passthroughLive(backingID: 9))
        XCTAssertTrue(sharing.attributesMoveUnseen, "its mappings change the backing file unseen")
        XCTAssertEqual(sharing.close(.passthroughLive(backingID: 9)), .unregister(9))
        XCTAssertFalse(sharing.attributesMoveUnseen)
        XCTAssertEqual(open(.liveWriter), .live, "through the page cache the kernel sees its writes")
        XCTAssertFalse(sharing.attributesMoveUnseen)
    }

    func testAWriterWhoseBackingFileCannotBeWrittenDoesNotPassThrough() {
        XCTAssertEqual(open(.inPlaceWriter, passthrough: 9, writable: false), .shared)
        XCTAssertEqual(open(.liveWriter, passthrough: 9, writable: false), .live)
    }

    func testReadersBypassTheCacheWhileAWriterIsAround() {
        XCTAssertEqual(open(.versionedReader, session: true, passthrough: 7), .direct)
        XCTAssertEqual(open(.versionedReader), .direct, "a direct reader's mappings keep later readers direct")
        sharing.noticeDecided()
        XCTAssertEqual(sharing.close(.direct), .none)
        XCTAssertEqual(sharing.close(.direct), .none)
        XCTAssertEqual(open(.versionedReader, passthrough: 7), .direct, "a notice is pending")
        sharing.noticeSent()
        _ = sharing.close(.direct)
        XCTAssertEqual(open(.versionedReader), .pageCache)
    }

    func testALiveWriterJoinsPassthroughReadersThroughAWritableBackingFile() {
        XCTAssertEqual(open(.versionedReader, passthrough: 3), .passthrough(backingID: 3))
        XCTAssertEqual(sharing.admit(.liveWriter, passesThrough: true), .none)
        XCTAssertEqual(open(.liveWriter), .passthroughLive(backingID: 3))
        XCTAssertTrue(sharing.isLive)
        XCTAssertEqual(sharing.close(.passthroughLive(backingID: 3)), .none)
        XCTAssertFalse(sharing.isLive)
        XCTAssertEqual(sharing.close(.passthrough(backingID: 3)), .unregister(3))
    }

    func testAWriterDetachesPassthroughReadersOfAReadOnlyBackingFile() {
        _ = open(.versionedReader, passthrough: 3, writable: false)
        XCTAssertEqual(sharing.admit(.liveWriter, passesThrough: true), .detach)
        XCTAssertEqual(sharing.admit(.inPlaceWriter, passesThrough: true), .detach)
        XCTAssertEqual(sharing.admit(.versionedReader, passesThrough: true), .none)
    }

    func testAWriterWhoseAnswerCannotPassThroughDetachesPassthroughReaders() {
        _ = open(.versionedReader, passthrough: 3)
        XCTAssertEqual(sharing.admit(.liveWriter, passesThrough: false), .detach)
    }

    /// Only readers make a rewrite through a shadow leave the node (and only then are the locks on
    /// it looked for): a writer's close still in flight when the next rewrite opens is no reader.
    func testAShadowWriterLeavesTheNodeOnlyToReadersAndOnlyWithoutASession() {
        XCTAssertFalse(sharing.shadowWriterLeaves(sessionRunning: false), "nobody has it open")
        XCTAssertEqual(open(.versionedReader, passthrough: 4), .passthrough(backingID: 4))
        XCTAssertTrue(sharing.shadowWriterLeaves(sessionRunning: false))
        XCTAssertFalse(sharing.shadowWriterLeaves(sessionRunning: true), "a writer joins the running session")
        _ = sharing.close(.passthrough(backingID: 4))
        XCTAssertEqual(open(.versionedReader, session: true), .direct, "a reader beside a session reads through the daemon")
        XCTAssertFalse(sharing.shadowWriterLeaves(sessionRunning: false), "a direct reader holds no pages")
        XCTAssertEqual(sharing.close(.direct), .none)
        XCTAssertEqual(open(.versionedReader), .pageCache)
        XCTAssertTrue(sharing.shadowWriterLeaves(sessionRunning: false), "a reader of the page cache holds its version")
    }

    func testWhileLiveEveryReaderSharesTheWritersPageCache() {
        XCTAssertEqual(open(.liveWriter), .live)
        XCTAssertEqual(open(.versionedReader, passthrough: 9), .shared, "no passthrough beside a writer, no version of its own")
        XCTAssertEqual(open(.inPlaceReader), .shared)
        XCTAssertEqual(sharing.cachedReaders, 3, "a rewrite after the writers close leaves the node to them")
        _ = sharing.close(.live)
        XCTAssertFalse(sharing.isLive)
        XCTAssertEqual(open(.versionedReader), .pageCache, "no one writes: readers share the file's pages")
    }

    func testAnAwaitedWriterArrivesAndReadersBypassTheCacheUntilThen() {
        sharing.awaitWriter(until: 100)
        XCTAssertEqual(open(.versionedReader, now: 50, passthrough: 1), .direct)
        XCTAssertEqual(sharing.open(.liveWriter, session: false, now: 60, mayRegister: false), .writerArrived(.live))
        XCTAssertEqual(sharing.awaitsWriterUntil, 0)
    }

    func testAnExpiredWaitForAWriterIsForgotten() {
        sharing.awaitWriter(until: 100)
        XCTAssertEqual(open(.versionedReader, now: 150), .pageCache)
        XCTAssertEqual(sharing.awaitsWriterUntil, 0)
    }

    func testAWriterJoiningASessionEndsTheWait() {
        sharing.awaitWriter(until: 100)
        XCTAssertTrue(sharing.writerJoined())
        XCTAssertFalse(sharing.writerJoined())
    }

    /// `Node.openHandle` asks `registers` before it opens a descriptor, to open it as registering
    /// needs: only the first open of a file nobody has open, with no writer around, registers, and
    /// `open` then answers so too.
    func testRegistersAnswersAsOpenDoes() {
        var states: [(String, Sharing)] = [("fresh", Sharing())]
        func state(_ name: String, _ change: (inout Sharing) -> Void) {
            var made = Sharing()
            change(&made)
            states.append((name, made))
        }
        state("a page-cache reader") { _ = $0.open(.versionedReader, session: false, now: 0, mayRegister: false) }
        state("a passthrough reader") { _ = $0.registered(5, writable: true, by: .versionedReader) }
        state("a live writer") { _ = $0.open(.liveWriter, session: false, now: 0, mayRegister: false) }
        state("a notice pending") { $0.noticeDecided() }
        state("a writer awaited until 100") { $0.awaitWriter(until: 100) }
        let openings: [Sharing.Opening] = [.versionedReader, .inPlaceReader, .inPlaceWriter, .liveWriter]
        for (name, before) in states {
            for opening in openings {
                for session in [false, true] {
                    for now: UInt64 in [50, 150] {
                        for mayRegister in [false, true] {
                            // An awaited writer arrives even after the wait ran out; a reader then registers.
                            let awaited = name.hasPrefix("a writer awaited") && (opening.writes || now < 100)
                            let expected = mayRegister && !session && (name == "fresh" || name.hasPrefix("a writer awaited") && !awaited)
                            var after = before
                            let asked = "\(name), \(opening), session \(session), at \(now), may register \(mayRegister)"
                            XCTAssertEqual(before.registers(writes: opening.writes, session: session, now: now, mayRegister: mayRegister),
                                           expected, asked)
                            XCTAssertEqual(after.open(opening, session: session, now: now, mayRegister: mayRegister) == .register,
                                           expected, asked)
                        }
                    }
                }
            }
        }
    }
}
