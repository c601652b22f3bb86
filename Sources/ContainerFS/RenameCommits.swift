import CLinux
import Glibc
import Synchronization

/// Keeps a rename from becoming durable before the renamed file's data, where the store's
/// filesystem would let it (docs/atomic-replace.md, "btrfs").
///
/// btrfs makes files durable one at a time through its log tree: anyone's fsync of a directory
/// (or of a new file, which logs its directory) logs the directory's entries, a rename into it
/// among them, but not the renamed file's data, and a cut then leaves the name on an empty file.
/// Every publish is such a rename. So where written data does not order renames
/// (`Backing.writtenDataOrdersRenames`), the renames made since the last commit are counted, and a
/// sync first commits the whole filesystem (`syncfs`), which carries data and names in order.
/// Closes pay nothing; the first sync after them pays one commit.
final class RenameCommits: Sendable {
    /// Whether renames need a commit before a sync: false on ext4 and XFS.
    let needed: Bool
    /// Commits the store's filesystem: 0 or the errno.
    private let commit: @Sendable () -> Int32
    private let made = Atomic<UInt64>(0)
    /// How many of `made` a commit carried. Its lock also makes concurrent syncs share a commit.
    private let committed = Mutex<UInt64>(0)

    /// `directory`: an open directory on the store's filesystem.
    convenience init(directory: Int32, needed: Bool) {
        self.init(needed: needed) { clinux_syncfs(directory) == 0 ? 0 : errno }
    }

    init(needed: Bool, commit: @escaping @Sendable () -> Int32) {
        self.needed = needed
        self.commit = commit
    }

    /// A rename (or link) into a container was made, and is not synced.
    func renamed() {
        if needed { made.add(1, ordering: .releasing) }
    }

    /// Before a sync of anything on the store's filesystem: commits the renames made since the
    /// last commit. Returns 0 or the errno of the commit, which the sync's caller gets.
    func beforeSync() -> Int32 {
        guard needed else { return 0 }
        // A rename counted here returned before the commit starts, so the commit carries it.
        let target = made.load(ordering: .acquiring)
        return committed.withLock { committed in
            guard committed < target else { return 0 }
            let error = commit()
            guard error == 0 else { return error }
            committed = max(committed, target)
            return 0
        }
    }
}
