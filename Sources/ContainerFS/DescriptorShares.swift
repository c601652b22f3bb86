import Glibc
import Coordination

/// How many of the daemon's descriptors each user's lookups hold (docs/policy.md, "Descriptors are shared out").
/// A directory the kernel knows costs the daemon a descriptor until the kernel forgets it; with
/// other users let in (allow_other), one of them must not be able to take them all. A user other
/// than root and the daemon's own may hold half of the limit, and such users together all but an
/// eighth, which stays for root, the daemon's user and open files.
struct DescriptorShares: Sendable {
    let limit: Int
    private(set) var held: [uid_t: Int] = [:]
    private(set) var heldByUsers = 0

    init(limit: Int) {
        self.limit = limit
    }

    /// The daemon's current descriptor limit; nil if it cannot be read.
    static var currentLimit: Int? {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return nil }
        return Int(clamping: limit.rlim_cur)
    }

    var perUser: Int { limit / 2 }
    var forUsers: Int { limit - limit / 8 }

    /// Whether descriptors taken for `uid` count against a share at all.
    static func isCounted(_ uid: uid_t) -> Bool { uid != 0 && uid != daemonUser }
    private static let daemonUser = geteuid()

    /// Counts one more descriptor for `uid`; false, counting nothing, past its share.
    mutating func take(_ uid: uid_t) -> Bool {
        guard DescriptorShares.isCounted(uid) else { return true }
        let mine = held[uid, default: 0]
        guard mine < perUser, heldByUsers < forUsers else { return false }
        held[uid] = mine + 1
        heldByUsers += 1
        return true
    }

    /// Gives back one descriptor `take` counted for `uid`.
    mutating func give(_ uid: uid_t) {
        guard let mine = held[uid] else { return }
        held[uid] = mine > 1 ? mine - 1 : nil
        heldByUsers -= 1
    }
}

/// One descriptor counted against a user's share, given back when what holds it (a handle, a
/// directory's node) lets it go.
final class DescriptorCharge: Sendable {
    private let uid: uid_t
    private let shares: Locked<DescriptorShares>?

    /// For users whose descriptors are not counted (root, the daemon's own).
    static let uncounted = DescriptorCharge(uid: 0, shares: nil)

    /// Counts one descriptor for `uid` in `shares`; nil past its share.
    static func take(_ uid: uid_t, from shares: Locked<DescriptorShares>) -> DescriptorCharge? {
        guard DescriptorShares.isCounted(uid) else { return uncounted }
        return shares.withLock { $0.take(uid) } ? DescriptorCharge(uid: uid, shares: shares) : nil
    }

    private init(uid: uid_t, shares: Locked<DescriptorShares>?) {
        self.uid = uid
        self.shares = shares
    }

    deinit {
        shares?.withLock { $0.give(uid) }
    }
}
