import CLinux
import Coordination
import FUSELowLevel
import Glibc
import Synchronization

/// Keeps a rename from becoming durable before the renamed file's data, where the store's
/// filesystem would let it (docs/atomic-replace.md, "btrfs").
///
/// btrfs makes files durable one at a time through its log tree: anyone's fsync of a directory
/// (or of a new file, which logs its directory) logs the directory's entries, a rename into it
/// among them, but not the renamed file's data, and a cut then leaves the name on an empty file.
/// Every publish is such a rename. So where written data does not order renames
/// (`Backing.writtenDataOrdersRenames`), renames and syncs take turns: a rename is counted before
/// any sync can start, a sync first commits the whole filesystem (`syncfs`, which carries data and
/// names in order) if renames were made since the last commit, and no rename is made while a sync
/// runs (it could log it). Closes pay nothing unless a sync runs; the first sync after them pays
/// one commit.
final class RenameCommits: Sendable {
    /// Whether renames need a commit before a sync: false on ext4 and XFS.
    let needed: Bool
    /// Commits the store's filesystem: 0 or the errno.
    private let commit: @Sendable () -> Int32
    private let made = Atomic<UInt64>(0)
    /// How many of `made` a commit carried. Its lock also makes concurrent syncs share a commit.
    private let committed = Locked<UInt64>(0)
    private let turns = Turns()

    /// `directory`: an open directory on the store's filesystem.
    convenience init(directory: Int32, needed: Bool) {
        self.init(needed: needed) { clinux_syncfs(directory) == 0 ? 0 : errno }
    }

    init(needed: Bool, commit: @escaping @Sendable () -> Int32) {
        self.needed = needed
        self.commit = commit
    }

    /// Makes a rename (or a link) into a container that is not synced: `body`, while no sync
    /// runs. It must not sync, nor wait for a sync.
    func renaming<Result>(_ body: () -> Result) -> Result {
        guard needed else { return body() }
        turns.enter(.renames)
        let result = body()
        let error = errno
        // Counted before the turn ends: the next sync finds it.
        made.add(1, ordering: .releasing)
        turns.leave()
        errno = error
        return result
    }

    /// Syncs something on the store's filesystem: `body`, after a commit of the renames made
    /// since the last one, while no rename is made. Returns the commit's errno, or `body`'s
    /// answer. `body` must not make a rename through `renaming`, nor sync through `syncing`.
    func syncing(_ body: () -> Int32) -> Int32 {
        guard needed else { return body() }
        turns.enter(.syncs)
        defer { turns.leave() }
        let error = commitRenames(always: false)
        return error == 0 ? body() : error
    }

    /// Within `syncing`: commits the filesystem now, for a change of names its `body` made that a
    /// sync of its directory may leave out (a durable publish's swap from the shadow directory: the
    /// power-loss harness found one lost on btrfs). 0 or the errno.
    func commitWithin() -> Int32 { commitRenames(always: true) }

    /// Commits the filesystem if renames were made since the last commit (or `always`), and
    /// counts them carried. Concurrent callers share a commit. 0 or the errno.
    private func commitRenames(always: Bool) -> Int32 {
        let target = made.load(ordering: .acquiring)
        return committed.withLock { committed -> Int32 in
            guard always || committed < target else { return 0 }
            let error = commit()
            if error == 0 { committed = max(committed, target) }
            return error
        }
    }
}

/// Two kinds of work that exclude each other, each shared within its kind: callers queue in
/// batches of one kind, a batch runs once the one before it is done, and a caller joins the last
/// batch if it is of its kind. Neither kind waits forever while the other keeps coming.
final class Turns: @unchecked Sendable {
    enum Kind { case renames, syncs }
    private struct Batch {
        let kind: Kind
        let id: UInt64
        var members: Int
    }
    /// The first batch runs; the others wait. Guarded by `mutex`.
    private var batches: [Batch] = []
    private var nextID: UInt64 = 0
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let changed = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)

    init() {
        pthread_mutex_init(mutex, nil)
        pthread_cond_init(changed, nil)
    }

    deinit {
        pthread_cond_destroy(changed)
        pthread_mutex_destroy(mutex)
        changed.deallocate()
        mutex.deallocate()
    }

    /// Returns once the caller's batch of `kind` runs. Not reentrant: a caller that enters twice
    /// may wait for itself.
    func enter(_ kind: Kind) {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        let id: UInt64
        if let last = batches.indices.last, batches[last].kind == kind {
            batches[last].members += 1
            id = batches[last].id
        } else {
            id = nextID
            nextID += 1
            batches.append(Batch(kind: kind, id: id, members: 1))
        }
        if batches[0].id != id { RequestThreads.willWait() }
        while batches[0].id != id { pthread_cond_wait(changed, mutex) }
    }

    /// The caller's work of the running batch is done.
    func leave() {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        batches[0].members -= 1
        if batches[0].members == 0 {
            batches.removeFirst()
            pthread_cond_broadcast(changed)
        }
    }

    /// Batches queued or running, first the running one: for tests.
    var queued: [(kind: Kind, members: Int)] {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return batches.map { ($0.kind, $0.members) }
    }
}
