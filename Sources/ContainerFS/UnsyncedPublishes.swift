import CLinux
import Containers
import Coordination
import FUSELowLevel
import Dispatch
import struct Foundation.Date
import Glibc
import Synchronization

/// The files with a link of the daemon's in its shadow directory (a new file's mark, or the record
/// of a version published without waiting for its data), and those whose link went without a sync
/// since: until a sync makes that removal durable, a cut could bring the link back, and with it a
/// record that a later change in place no longer matches (docs/atomic-replace.md, "Closes without
/// a sync"); and a count of links read just before the removal still holds it. One value;
/// `UnsyncedPublishes` holds it behind a lock and carries out what it says.
struct MarkTable {
    enum Mark: Equatable {
        /// A link in the shadow directory: it is not the user's, and `stat` does not count it.
        case linked
        /// The link went (the `sequence`th removal) and no sync made that durable yet.
        case unlinked(sequence: UInt64)
    }

    private(set) var marks: [BackingKey: Mark] = [:]
    /// How many removals were made: each has its number.
    private(set) var removals: UInt64 = 0

    mutating func linked(_ key: BackingKey) {
        marks[key] = .linked
    }

    /// The link went without a sync.
    mutating func unlinked(_ key: BackingKey) {
        removals += 1
        marks[key] = .unlinked(sequence: removals)
    }

    /// A sync made every removal up to the `sequence`th durable.
    mutating func settled(through sequence: UInt64) {
        marks = marks.filter { _, mark in
            if case .unlinked(let removal) = mark { return removal > sequence }
            return true
        }
    }

    func hasLink(_ key: BackingKey) -> Bool { marks[key] == .linked }

    /// Whether a change of the file in place must wait for a sync first.
    func isUnsettled(_ key: BackingKey) -> Bool {
        if case .unlinked? = marks[key] { return true }
        return false
    }

}

/// A version published without waiting for its data: what is left to do once the data is written.
final class UnsyncedPublish: Sendable {
    let key: BackingKey
    /// Its size: the bytes the next mount reads to check it, if a cut comes first.
    let size: off_t
    /// When it was published, and so its previous version replaced (`VersionKeeper.keep`).
    let published = Date()
    let publishedMoment = DispatchTime.now().uptimeNanoseconds

    /// What the shadow directory holds of it: its record's name, NUL-terminated; the previous
    /// version's name there, when it has one (nil for a new file); and where that version is kept,
    /// when versions are kept.
    struct Names {
        var record: [CChar]
        var previous: [CChar]?
        var versionPlace: VersionKeeper.Place?
    }

    /// The version, open (owned until its data is written); the outcome of that write, 0 or an
    /// errno; whether what follows it is done; and its names (a rename may give it a previous version).
    private let state: Locked<(file: Int32, written: Int32?, done: Bool, names: Names)>

    /// `synced`: the publish's own sync made its data and record durable; the file is closed here.
    init(key: BackingKey, size: off_t, file: Int32, record: [CChar], previous: [CChar]?, versionPlace: VersionKeeper.Place?,
         synced: Bool = false) {
        self.key = key
        self.size = size
        if synced { close(file) }
        state = Locked((synced ? -1 : file, synced ? 0 : nil, false, Names(record: record, previous: previous, versionPlace: versionPlace)))
    }

    /// The outcome of its data's write, 0 or an errno; nil while the data is not written.
    var written: Int32? { state.withLock { $0.written } }
    var isWritten: Bool { written != nil }

    /// A new file's mark that could not go when its session ended (the file is its empty published
    /// version): removed like a record, with no data to wait for.
    init(markOf key: BackingKey, named mark: [CChar]) {
        self.key = key
        size = 0
        state = Locked((-1, 0, false, Names(record: mark, previous: nil)))
    }

    /// Its data is written: a sync of the whole filesystem, begun after the publish, returned.
    func dataWritten() {
        writing.withLock {
            state.withLock { state in
                guard state.written == nil else { return }
                state.written = 0
                close(state.file)
                state.file = -1
            }
        }
    }

    /// Starts the writes of the data without waiting, so that a batch's writes go out together.
    func startWriting() {
        state.withLock { state in
            if state.written == nil { clinux_start_writing_data(state.file) }
        }
    }

    /// Runs `body` with the names of a new file whose data is not written yet, holding off the
    /// background meanwhile: it may give the file a previous version (the file a rename puts it
    /// over: `Shadows.renameUnwritten`). Nil if the data was written, or the file has a previous
    /// version already.
    func withNamesIfUnwritten<R>(_ body: (inout Names) -> R) -> R? {
        state.withLock { state in
            guard state.written == nil, state.names.previous == nil else { return nil }
            return body(&state.names)
        }
    }

    /// Held while the data is written, which `state`'s lock is not: a rename may change the names
    /// meanwhile (`withNamesIfUnwritten`).
    private let writing = PlainMutex()

    /// Waits for the data (once, whoever asks first), then does `afterwards` with it written, until
    /// it succeeds: the record it removes must not outlive a change in place. Returns 0, the errno
    /// of the data's write (for good: the record then brings the previous version back at the
    /// next mount), or that of `afterwards` (tried again by the next call).
    func finish(_ afterwards: (Names) -> Int32) -> Int32 {
        writing.withLock {
            let file = state.withLock { $0.written == nil ? $0.file : -1 }
            if file >= 0 {
                let written = clinux_write_data_and_wait(file) == 0 ? 0 : errno
                state.withLock { state in
                    state.written = written
                    close(state.file)
                    state.file = -1
                }
            }
            return state.withLock { state in
                if state.done { return 0 }
                if let error = state.written, error != 0 { return error }
                let error = afterwards(state.names)
                state.done = error == 0
                return error
            }
        }
    }
}

/// A committed log's retirement (`Shadows.publishLog`), done once: on the background queue, or
/// first by whoever must wait for it. A failure leaves it to be tried again by the next wait.
final class LogRetirement: Sendable {
    private let work: Locked<(@Sendable () -> Int32)?>

    init(_ work: @escaping @Sendable () -> Int32) {
        self.work = Locked(work)
    }

    /// Does the work unless it was done: 0, or its errno.
    func run() -> Int32 {
        work.withLock { work in
            guard let body = work else { return 0 }
            let error = body()
            if error == 0 { work = nil }
            return error
        }
    }
}

/// Versions published at a close without waiting for their data (docs/atomic-replace.md, "Closes
/// without a sync"): the daemon's background queue writes their data, in batches, and then
/// removes their records and their previous versions; the marks of new files (`MarkTable`); and
/// the retirements of committed logs.
final class UnsyncedPublishes: @unchecked Sendable {
    private let directory: Int32
    /// Its own: a batch waits for the disk, which the spares made ahead on the shadows' queue should not.
    private let queue = DispatchQueue(label: "containerfs.shadows.unsynced", qos: .utility)
    private let renameCommits: RenameCommits
    private let versions: VersionKeeper?
    private let table = Locked(MarkTable())
    /// The versions waiting for their data, by file; those the background has not begun, in order;
    /// and the bytes of all that wait.
    private let waiting = Locked<(jobs: [BackingKey: UnsyncedPublish], queued: [UnsyncedPublish], bytes: off_t, settleScheduled: Bool)>(([:], [], 0, false))
    /// Committed logs whose files are changed but not yet synced, by file (at most one each), and
    /// the files of those no thread has begun (`startRetirements`), in order.
    private let retiring = Locked<(byFile: [BackingKey: LogRetirement], unstarted: [BackingKey])>(([:], []))
    /// Beyond this many, a publish retires its log itself: each holds two descriptors.
    static let retiringLimit = 64
    /// Set when a background write or removal failed (a disk failing): closes then wait for their
    /// data again, so that their writers hear of the next failure.
    private let failed = Atomic<Bool>(false)
    /// Beyond this many versions waiting for their data, a close waits for its own: each holds a
    /// descriptor, out of the daemon's own eighth of them (`DescriptorShares`), so a thirty-second
    /// of its limit, from 16 to 4,096.
    let limit = min(4096, max(16, (DescriptorShares.currentLimit ?? 0) / 32))
    /// A batch gathers for up to this long after its first version (a second), or until it holds
    /// half the limit or half of `recordedBytes`: then one sync of the filesystem writes it all.
    private let gathering: DispatchTimeInterval
    /// A smaller batch is written file by file: a sync of the filesystem commits its journal and
    /// flushes the disk's cache, and writes whatever else waits there.
    static let syncedTogether = 8
    /// Larger files wait for their data at their close: their record would cost a read of all of
    /// it. Unless their writes checksummed them as they came (`WriteSession.written`): then only the
    /// next mount after a cut would read them, and what waits so is kept within `recordedBytes`.
    static let largestRecorded: off_t = 1 << 20
    static let recordedBytes: off_t = 256 << 20

    /// Removes (or recycles: `Shadows.recycle`) a previous version no one keeps; set before use.
    var removePrevious: @Sendable ([CChar]) -> Void = { _ in }

    init(directory: Int32, renameCommits: RenameCommits, versions: VersionKeeper?, gathering: DispatchTimeInterval = .seconds(1)) {
        self.directory = directory
        self.gathering = gathering
        self.renameCommits = renameCommits
        self.versions = versions
    }

    /// Whether a background write or sync failed (a disk failing): closes then wait for their
    /// syncs again, so that their writers hear of the next failure.
    var hasFailed: Bool { failed.load(ordering: .relaxed) }

    /// Notes a background write or sync that failed, whose work is nonetheless done (a logged
    /// change dropped when its commit could not be synced).
    func noteFailure() { failed.store(true, ordering: .relaxed) }

    /// Whether a close may publish a file of `size` bytes without waiting for its data, `checksummed`
    /// if its record needs no read of it.
    func mayRecord(size: off_t, checksummed: Bool) -> Bool {
        guard !hasFailed, size <= UnsyncedPublishes.largestRecorded || checksummed else { return false }
        return waiting.withLock { waiting in
            waiting.jobs.count < limit
                && (size <= UnsyncedPublishes.largestRecorded || waiting.bytes + size <= UnsyncedPublishes.recordedBytes)
        }
    }

    /// The version of the file `key` names that waits for its data, if one does.
    func pending(_ key: BackingKey) -> UnsyncedPublish? { waiting.withLock { $0.jobs[key] } }

    // MARK: Marks

    func linked(_ key: BackingKey) { table.withLock { $0.linked(key) } }

    /// A mark or record was removed without a sync (or a failed link undone). Kept as removed,
    /// not forgotten: a count of links read before the removal may still hold it.
    func unlinked(_ key: BackingKey) {
        table.withLock { $0.unlinked(key) }
        scheduleSettle()
    }
    func hasLink(_ key: BackingKey) -> Bool { table.withLock { $0.hasLink(key) } }

    /// Removes a link to the file `key` names with `unlink` (0 or an errno), then syncs the
    /// directory: settled, the removal needs no later sync. Returns 0 or the errno.
    func unlinkDurably(_ key: BackingKey, _ unlink: () -> Int32) -> Int32 {
        let error = unlink()
        guard error == 0 else { return error }
        let through = table.withLock { table in
            table.unlinked(key)
            return table.removals
        }
        guard fsync(directory) == 0 else { return errno }
        table.withLock { $0.settled(through: through) }
        return 0
    }
    func mark(of key: BackingKey) -> MarkTable.Mark? { table.withLock { $0.marks[key] } }

    // MARK: Versions waiting for their data

    /// Takes over `publish` (its descriptor included): its data is written in the background. Its
    /// record is counted already (`linked`, before the link was made).
    func add(_ publish: UnsyncedPublish) {
        let (first, full) = waiting.withLock { waiting -> (Bool, Bool) in
            waiting.jobs[publish.key] = publish
            waiting.queued.append(publish)
            let before = waiting.bytes
            waiting.bytes += publish.size
            let half = UnsyncedPublishes.recordedBytes / 2
            return (waiting.queued.count == 1, waiting.queued.count == limit / 2 || before < half && waiting.bytes >= half)
        }
        // Gathered: a loop of closes costs one sync of the filesystem a batch, where a write and a
        // wait for each file cost the background more than the closes themselves.
        if first { queue.asyncInBackground(after: gathering) { self.drain() } }
        if full { queue.asyncInBackground { self.drain() } }
    }

    /// Waits for the data of the version `key` names, if it waits for it: before a rename or a
    /// link of it, whose commit must not come before the data (as ext4 flushes a file renamed
    /// over another). And for the retirement of a log applied to it: before a change in place,
    /// which a cut would otherwise find overwritten by the log applied again. Returns 0 or the errno.
    func waitForData(of key: BackingKey) -> Int32 {
        waitForData(of: key, keepingWrittenRecord: false)
    }

    /// Waits for the data of the version `key` names, as `waitForData`, but leaves a written
    /// version's record to the background: a rename or a link of the file needs its data on the
    /// disk first, where a change in place needs the record gone too. Returns 0 or the errno.
    func waitForWrite(of key: BackingKey) -> Int32 {
        waitForData(of: key, keepingWrittenRecord: true)
    }

    private func waitForData(of key: BackingKey, keepingWrittenRecord: Bool) -> Int32 {
        let error = waitForRetirement(of: key)
        guard error == 0 else { return error }
        guard let publish = waiting.withLock({ $0.jobs[key] }) else { return 0 }
        if keepingWrittenRecord, let written = publish.written { return written }
        RequestThreads.willWait()
        return finish(publish)
    }

    // MARK: Logs waiting for their retirement

    /// Takes over the retirement of a log applied to the file `key` names: done by the request
    /// that published it, once it has answered (`startRetirements`), or first by a `waitForData`
    /// of the file. False when too many wait (unless `beyondLimit`: one that failed must not be
    /// forgotten) or one of the file's does: the caller retires it itself.
    func retireLater(_ retirement: LogRetirement, of key: BackingKey, beyondLimit: Bool = false) -> Bool {
        retiring.withLock { retiring -> Bool in
            guard beyondLimit || retiring.byFile.count < UnsyncedPublishes.retiringLimit, retiring.byFile[key] == nil else { return false }
            retiring.byFile[key] = retirement
            retiring.unstarted.append(key)
            return true
        }
    }

    /// Does the retirements taken since on the calling thread: a request's, after its answer,
    /// which then wakes no other thread (nor makes one: an idle queue's thread is gone after
    /// seconds). Every request that publishes calls it.
    func startRetirements() {
        // One a waiter finished meanwhile is gone from `byFile`.
        while let (key, retirement) = retiring.withLock({ retiring -> (BackingKey, LogRetirement?)? in
            guard !retiring.unstarted.isEmpty else { return nil }
            let key = retiring.unstarted.removeFirst()
            return (key, retiring.byFile[key])
        }) {
            if let retirement { retire(retirement, of: key) }
        }
    }

    /// Waits for the retirement of a log applied to the file `key` names, if one is pending:
    /// before an open that reads the file. Returns 0 or the errno.
    func waitForRetirement(of key: BackingKey) -> Int32 {
        guard let retirement = retiring.withLock({ $0.byFile[key] }) else { return 0 }
        RequestThreads.willWait()
        return retire(retirement, of: key)
    }

    /// Whether the file `key` names has a log waiting for its retirement (its inode must not be
    /// reused: the log's link to it would apply the log to another file after a cut).
    func isRetiring(_ key: BackingKey) -> Bool { retiring.withLock { $0.byFile[key] != nil } }

    @discardableResult
    private func retire(_ retirement: LogRetirement, of key: BackingKey) -> Int32 {
        let error = retirement.run()
        if error == 0 {
            retiring.withLock { if $0.byFile[key] === retirement { $0.byFile[key] = nil } }
        } else {
            // Left for the next wait, and the unmount or the next mount applies the log again.
            noteFailure()
        }
        return error
    }

    /// Before a sync of the file `key` names, which a change in place may have made since: its data
    /// written, and the removal of its link in the shadow directory durable, so that no cut brings
    /// back a record the change no longer matches. Returns 0 or the errno.
    func settle(_ key: BackingKey) -> Int32 {
        let error = waitForData(of: key)
        guard error == 0 else { return error }
        guard table.withLock({ $0.isUnsettled(key) }) else { return 0 }
        return settleAll()
    }

    /// Makes every removal of a link so far durable. Returns 0 or the errno.
    func settleAll() -> Int32 {
        let through = table.withLock { $0.removals }
        let error = renameCommits.syncing { fsync(directory) == 0 ? 0 : errno }
        guard error == 0 else { return error }
        table.withLock { $0.settled(through: through) }
        return 0
    }

    /// Waits for everything queued (at unmount).
    func finishAll() {
        startRetirements()
        queue.sync { while drain() {} }
    }

    /// On `queue`: writes the data of the batch that waits, and then removes what it kept. False
    /// if none waited. What comes meanwhile is the next batch, which gathers on its own (`add`).
    @discardableResult
    private func drain() -> Bool {
        let batch = waiting.withLock { waiting -> [UnsyncedPublish] in
            defer { waiting.queued = [] }
            return waiting.queued
        }
        defer { scheduleSettle() }
        guard !batch.isEmpty else { return false }
        // A sync begun after their closes wrote their data; if it failed somewhere, each file's own
        // write says where. Those their own sync wrote (an fsync) need none.
        let unwritten = batch.filter { !$0.isWritten }
        if unwritten.count >= UnsyncedPublishes.syncedTogether, clinux_syncfs(directory) == 0 {
            for publish in unwritten { publish.dataWritten() }
        } else {
            for publish in unwritten { publish.startWriting() }
        }
        for publish in batch { finish(publish) }
        return true
    }

    /// A sync of the removals on the background queue once the table holds `settleAt` files, unless
    /// one is due already: it keeps the table small. Until then a sync of a file whose mark went
    /// pays it itself (`settle`), which is rare; a sync a second would cost a commit a second
    /// while files are written (on btrfs, of the whole filesystem).
    private func scheduleSettle() {
        let schedule = waiting.withLock { waiting -> Bool in
            guard !waiting.settleScheduled, table.withLock({ $0.marks.count }) >= UnsyncedPublishes.settleAt else { return false }
            waiting.settleScheduled = true
            return true
        }
        guard schedule else { return }
        queue.asyncInBackground {
            self.waiting.withLock { $0.settleScheduled = false }
            // As a failed write: the removals stay unsettled (a sync of such a file syncs and
            // reports), and closes wait for their data again.
            if self.settleAll() != 0 { self.noteFailure() }
        }
    }

    static let settleAt = 4096

    /// The data written: the record goes, then the previous version (kept as a version, or
    /// removed). A failure leaves the record, which the next mount checks the file against.
    @discardableResult
    private func finish(_ publish: UnsyncedPublish) -> Int32 {
        let error = publish.finish { names in
            // On btrfs the next sync must not log the removal before the data (`RenameCommits`).
            let removed = renameCommits.renaming { unlinkat(directory, names.record, 0) == 0 ? 0 : errno }
            guard removed == 0 else { return removed }
            table.withLock { $0.unlinked(publish.key) }
            waiting.withLock { $0.bytes -= publish.size }
            if let previous = names.previous {
                if let versions, let place = names.versionPlace {
                    versions.keep(previous, in: directory, at: place, replacedAt: publish.published, moment: publish.publishedMoment)
                } else {
                    removePrevious(previous)
                }
            }
            return 0
        }
        // One that failed stays, so that whoever must wait for it (a change in place, a rename, a
        // link, a sync of the file) hears of it, or tries it again.
        if error == 0 {
            waiting.withLock { waiting in
                if waiting.jobs[publish.key] === publish { waiting.jobs[publish.key] = nil }
            }
        } else {
            noteFailure()
        }
        return error
    }
}
