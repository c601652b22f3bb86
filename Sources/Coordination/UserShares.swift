#if canImport(Glibc)
import Glibc
#else
import Musl
#endif

/// What all the control-socket clients of one user may hold together. The daemon serves every
/// user as root; without these, one user's connections, presenters or half-sent frames could
/// crowd out everyone else's (docs/control-protocol.md, "Limits").
public struct UserLimits: Sendable, Equatable {
    /// Connections one user may have open.
    public var clientsPerUser: Int
    /// Of the server's client slots, how many only root and the daemon's own user may take.
    public var slotsKeptForRoot: Int
    /// Presenters of all of one user's clients together.
    public var presentersPerUser: Int
    /// Bytes of frames that one user's clients have begun and not finished, together.
    public var bufferedBytesPerUser: Int

    public init(clientsPerUser: Int = 64, slotsKeptForRoot: Int = 32, presentersPerUser: Int = 10_000,
                bufferedBytesPerUser: Int = 4 << 20) {
        self.clientsPerUser = clientsPerUser
        self.slotsKeptForRoot = slotsKeptForRoot
        self.presentersPerUser = presentersPerUser
        self.bufferedBytesPerUser = bufferedBytesPerUser
    }
}

/// Each user's use of the control socket. Root and the daemon's own user are counted but never
/// refused: they are who keeps the mount running.
struct UserShares {
    private struct Share {
        var clients = 0
        var presenters = 0
        var bufferedBytes = 0
        var isEmpty: Bool { clients == 0 && presenters == 0 && bufferedBytes == 0 }
    }

    private var shares: [uid_t: Share] = [:]

    static func isPrivileged(_ uid: uid_t) -> Bool { uid == 0 || uid == getuid() }

    /// Takes a client slot for `uid`, or says why not.
    mutating func admit(_ uid: uid_t, connected: Int, maxClients: Int, limits: UserLimits) -> String? {
        let privileged = Self.isPrivileged(uid)
        guard connected < maxClients - (privileged ? 0 : min(limits.slotsKeptForRoot, maxClients / 2)) else {
            return "too many clients (\(connected)); try again when some have closed"
        }
        guard privileged || shares[uid, default: Share()].clients < limits.clientsPerUser else {
            return "user \(uid) has \(limits.clientsPerUser) clients already, the most one user may have"
        }
        shares[uid, default: Share()].clients += 1
        return nil
    }

    /// A client of `uid` closed, with `presenters` presenters still registered.
    mutating func left(_ uid: uid_t, presenters: Int) {
        update(uid) { share in
            share.clients -= 1
            share.presenters -= presenters
        }
    }

    /// Counts one more presenter for `uid`, unless that is over the limit.
    mutating func addPresenter(_ uid: uid_t, limits: UserLimits) -> Bool {
        guard Self.isPrivileged(uid) || shares[uid, default: Share()].presenters < limits.presentersPerUser else {
            return false
        }
        shares[uid, default: Share()].presenters += 1
        return true
    }

    mutating func removePresenter(_ uid: uid_t) {
        update(uid) { $0.presenters -= 1 }
    }

    /// Adds `change` to the user's unfinished-frame bytes; returns the new total.
    @discardableResult
    mutating func buffered(_ uid: uid_t, change: Int) -> Int {
        var total = 0
        update(uid) { share in
            share.bufferedBytes += change
            total = share.bufferedBytes
        }
        return total
    }

    private mutating func update(_ uid: uid_t, _ change: (inout Share) -> Void) {
        change(&shares[uid, default: Share()])
        if shares[uid]?.isEmpty == true { shares[uid] = nil }
    }
}
