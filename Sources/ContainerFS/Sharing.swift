import Glibc

/// How the handles open on a regular file's node reach the file, and whether programs share it
/// live (docs/atomic-replace.md, "Sharing a file live"). One value per node, guarded by the node's
/// session lock and changed only through the transitions below, which return what the caller must
/// then do (`Effect`), as `Arbiter`'s do. Tested without a mount (`SharingTests`).
///
/// The kernel keeps one page cache, one size and one passthrough backing file per inode (per node),
/// which decides the rules: passthrough only while every handle has it; a writer never shares a
/// node with readers of another version; readers of a live file share the writers' page cache.
struct Sharing: Equatable {
    /// What an open asks of the file.
    enum Opening: Equatable {
        /// Reads an atomically replaced file, keeping the version it opened.
        case versionedReader
        /// Reads a file written in place (tmp, Caches, hard-linked, opted-out or live files).
        case inPlaceReader
        /// Writes a file written in place for another reason than this open.
        case inPlaceWriter
        /// Writes without truncating, for reading and writing or appending (`opensLive`): the
        /// file is live while such a writer has it open.
        case liveWriter

        var writes: Bool { self == .inPlaceWriter || self == .liveWriter }
    }

    /// What the caller does after a transition, once it holds no lock.
    enum Effect: Equatable {
        case none
        /// Leave the node to its passthrough readers (`NodeTable.detach`); the open answers ESTALE.
        case detach
        /// Register the descriptor for passthrough, then call `registered` (or `open` again with
        /// `mayRegister` false if the kernel refused).
        case register
        /// The writer the file's nodes awaited (after a `detach`) has come (`NodeTable.writerArrived`).
        case writerArrived(OpenPath)
        /// The handle reaches the file this way.
        case open(OpenPath)
        /// The last passthrough reader closed: unregister the backing id.
        case unregister(Int32)
    }

    /// Open handles, by how the kernel reaches the file.
    private(set) var shared: Int32 = 0
    /// Of `shared`: writers that made the file live.
    private(set) var liveWriters: Int32 = 0
    private(set) var pageCacheReaders: Int32 = 0
    private(set) var directReaders: Int32 = 0
    /// Handles through passthrough: readers, and writers that came while readers had it.
    private(set) var passthroughReaders: Int32 = 0
    private(set) var backingID: Int32 = 0
    /// Whether the kernel's backing file is open for writing, so that writers can pass through too.
    private(set) var backingWritable = false
    /// Notices to the kernel (`didPublish`, `didDiscard`) decided but not yet sent. No reader enters
    /// the page cache meanwhile: a notice bumps the kernel's attribute version, which makes it drop
    /// the size a reader's first read asked for and keep the session's.
    private(set) var pendingNotices: Int32 = 0
    /// Until when (uptime in nanoseconds) the node awaits the writer that left its previous node to
    /// cached readers: readers bypass the cache meanwhile, so that the writer's retried open finds
    /// none. 0 when not awaiting.
    private(set) var awaitsWriterUntil: UInt64 = 0

    /// Whether an open with these flags shares the file live: it writes without truncating, for
    /// reading and writing (databases, shared mappings, counters under a lock) or for appending (logs).
    @inline(__always)
    static func opensLive(_ flags: Int32) -> Bool {
        flags & O_TRUNC == 0 && (flags & O_ACCMODE == O_RDWR || flags & O_APPEND != 0)
    }

    /// Whether the file is live: writes go straight to it and every open shares them.
    var isLive: Bool { liveWriters > 0 }

    /// Whether a live writer reaches the file through passthrough: its shared mappings change the
    /// backing file's times and size where the kernel does not see it, so attributes are asked
    /// for afresh while it is open.
    var attributesMoveUnseen: Bool { liveWriters > 0 && passthroughReaders > 0 }

    /// Handles reading a version through the kernel (its page cache, or passthrough), which a writer
    /// of atomic replace must leave the node to.
    var cachedReaders: Int32 { pageCacheReaders + passthroughReaders + shared }

    /// Whether a writer through a shadow leaves the node to its readers (`NodeTable.detach`): they
    /// read a version through the kernel, and no write session runs (a writer joins a running
    /// one, which made its way when it began). Only then can a rewrite take the locks on the node
    /// from their holders (docs/atomic-replace.md, "Files under locks").
    func shadowWriterLeaves(sessionRunning: Bool) -> Bool { !sessionRunning && cachedReaders > 0 }

    /// Whether any handle but a write session's writers has the file open.
    var hasOpenHandles: Bool { otherOpens + passthroughReaders > 0 }

    /// The handles that are not passthrough: the kernel refuses passthrough while one is open.
    private var otherOpens: Int32 { shared + pageCacheReaders + directReaders }

    // MARK: Transitions

    /// Before opening a descriptor: a writer in place shares the node with passthrough readers only
    /// through a backing file open for writing (the kernel allows one per inode), if its answer can
    /// pass through (`passesThrough`).
    func admit(_ opening: Opening, passesThrough: Bool) -> Effect {
        opening.writes && passthroughReaders > 0 && !(backingWritable && passesThrough) ? .detach : .none
    }

    /// A descriptor was opened: counts the handle and says how it reaches the file. `session`:
    /// whether a write session runs on the node. `.register` asks the caller to try passthrough.
    mutating func open(_ opening: Opening, session: Bool, now: UInt64, mayRegister: Bool) -> Effect {
        if opening.writes, awaitsWriterUntil != 0 {
            awaitsWriterUntil = 0
            count(opening)
            return .writerArrived(opening == .liveWriter ? .live : .shared)
        }
        if passthroughReaders > 0 {
            passthroughReaders += 1
            guard opening == .liveWriter else { return .open(.passthrough(backingID: backingID)) }
            liveWriters += 1
            return .open(.passthroughLive(backingID: backingID))
        }
        // Asked before `awaitsWriter` forgets an expired wait, as a caller asks it before opening.
        let register = registers(writes: opening.writes, session: session, now: now, mayRegister: mayRegister)
        let writerAround = session || pendingNotices > 0 || awaitsWriter(now: now)
        return register ? .register : .open(count(opening, writerAround: writerAround))
    }

    /// Whether `open` answers `.register` for an opening that writes or not: asked first, under
    /// the same lock, by a caller that opens its descriptor as registering needs it. The first open
    /// of a file nobody else has open passes through, writers in place too: the kernel then reads
    /// and writes the backing file itself (docs/atomic-replace.md).
    func registers(writes: Bool, session: Bool, now: UInt64, mayRegister: Bool) -> Bool {
        guard mayRegister, !(writes && awaitsWriterUntil != 0), passthroughReaders == 0, otherOpens == 0 else { return false }
        return !session && pendingNotices == 0 && !(awaitsWriterUntil != 0 && now < awaitsWriterUntil)
    }

    /// The kernel agreed to reach the file itself: the handle is the first through passthrough. A
    /// writer needs the backing file open for writing; without it the id goes back (`.unregister`).
    mutating func registered(_ id: Int32, writable: Bool, by opening: Opening) -> Effect {
        if opening.writes, !writable { return .unregister(id) }
        backingID = id
        backingWritable = writable
        passthroughReaders = 1
        guard opening == .liveWriter else { return .open(.passthrough(backingID: id)) }
        liveWriters = 1
        return .open(.passthroughLive(backingID: id))
    }

    @discardableResult
    private mutating func count(_ opening: Opening, writerAround: Bool = true) -> OpenPath {
        switch opening {
        case .liveWriter:
            liveWriters += 1
            shared += 1
            return .live
        case .inPlaceWriter, .inPlaceReader:
            shared += 1
            return .shared
        case .versionedReader where isLive:
            shared += 1
            return .shared
        case .versionedReader where writerAround || directReaders > 0:
            // A direct reader's private mappings fill the page cache with its version: later
            // readers read through the daemon too while it is open.
            directReaders += 1
            return .direct
        case .versionedReader:
            pageCacheReaders += 1
            return .pageCache
        }
    }

    /// A handle `open` counted has closed.
    mutating func close(_ path: OpenPath) -> Effect {
        switch path {
        case .direct: directReaders -= 1
        case .shared: shared -= 1
        case .live:
            shared -= 1
            liveWriters -= 1
        case .pageCache: pageCacheReaders -= 1
        case .passthrough, .passthroughLive:
            if case .passthroughLive = path { liveWriters -= 1 }
            passthroughReaders -= 1
            if passthroughReaders == 0 {
                defer { backingID = 0; backingWritable = false }
                return .unregister(backingID)
            }
        }
        return .none
    }

    /// A publish or a discarded session decided a notice to the kernel.
    mutating func noticeDecided() { pendingNotices += 1 }

    mutating func noticeSent() { pendingNotices -= 1 }

    /// The node was made for a file whose previous node a writer left to cached readers.
    mutating func awaitWriter(until deadline: UInt64) { awaitsWriterUntil = deadline }

    /// A writer of atomic replace joined a session: an awaited writer has come. True if one was awaited.
    mutating func writerJoined() -> Bool {
        defer { awaitsWriterUntil = 0 }
        return awaitsWriterUntil != 0
    }

    /// Whether a writer is awaited; forgets an expectation that has expired.
    private mutating func awaitsWriter(now: UInt64) -> Bool {
        guard awaitsWriterUntil != 0 else { return false }
        guard now >= awaitsWriterUntil else { return true }
        awaitsWriterUntil = 0
        return false
    }
}
