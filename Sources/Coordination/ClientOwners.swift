import Dispatch
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Which client connection a process belongs to: the connected process itself, a thread of it
/// (FUSE reports thread ids), or a descendant of it (e.g. the command that `containerfs
/// coordinate` runs inside its coordinated access). The filesystem asks on every request while a
/// client is connected, so answers found in /proc are cached for a second, and the cache is
/// dropped whenever a client connects or disconnects. If one process holds several connections,
/// the oldest one is its owner.
final class ClientOwners: Sendable {
    private struct State {
        var byPID: [pid_t: Set<OwnerID>] = [:]
        var cache: [pid_t: CacheEntry] = [:]
        /// Counts the times the cache was dropped (a client came or went).
        var generation: UInt64 = 0

        mutating func dropCache() {
            cache.removeAll()
            generation += 1
        }
    }

    private struct CacheEntry {
        let owner: OwnerID?
        /// Monotonic nanoseconds.
        let expires: UInt64
    }

    private let state = Locked(State())
    /// Reads a process's thread group and parent; /proc by default, injected by tests.
    private let processInfo: @Sendable (pid_t) -> (tgid: pid_t, ppid: pid_t)?

    init(processInfo: @escaping @Sendable (pid_t) -> (tgid: pid_t, ppid: pid_t)?) {
        self.processInfo = processInfo
    }

    func connected(_ owner: OwnerID, pid: pid_t) {
        state.withLock { state in
            state.byPID[pid, default: []].insert(owner)
            state.dropCache()
        }
    }

    func disconnected(_ owner: OwnerID, pid: pid_t) {
        state.withLock { state in
            state.byPID[pid]?.remove(owner)
            if state.byPID[pid]?.isEmpty == true { state.byPID.removeValue(forKey: pid) }
            state.dropCache()
        }
    }

    /// The owner of `pid`; nil for ordinary programs.
    func owner(of pid: pid_t) -> OwnerID? {
        let now = DispatchTime.now().uptimeNanoseconds
        enum Step { case noClients, known(OwnerID?), unknown(generation: UInt64) }
        // The answer for a process or thread: a client's, one cached, or to be found from /proc.
        let look = { (pid: pid_t) in
            self.state.withLock { state -> Step in
                guard !state.byPID.isEmpty else { return .noClients }
                if let owners = state.byPID[pid] { return .known(owners.min()) }
                if let cached = state.cache[pid], cached.expires > now { return .known(cached.owner) }
                return .unknown(generation: state.generation)
            }
        }
        // Walks up the ancestors and remembers the answer for each one it went through, so that
        // the next process a shell starts asks /proc once, not once per ancestor.
        var visited: [pid_t] = []
        var generation: UInt64 = 0
        var current = pid
        var owner: OwnerID?
        walk: for _ in 0..<64 {
            switch look(current) {
            case .noClients: return nil
            case .known(let known):
                owner = known
                break walk
            case .unknown(let seen):
                if visited.isEmpty { generation = seen }
            }
            visited.append(current)
            guard current > 1, let info = processInfo(current) else { break }
            if info.tgid != current, case .known(let known?) = look(info.tgid) {
                owner = known
                break
            }
            guard info.ppid > 0, info.ppid != current else { break }
            current = info.ppid
        }
        // Asked for every request: a cached answer takes the lock once.
        guard !visited.isEmpty else { return owner }
        state.withLock { state in
            // A client that came or went meanwhile may have changed the answer.
            guard state.generation == generation else { return }
            if state.cache.count + visited.count > 4096 { state.cache.removeAll() }
            for pid in visited { state.cache[pid] = CacheEntry(owner: owner, expires: now + 1_000_000_000) }
        }
        return owner
    }

    /// Thread group and parent of a process, from /proc/PID/status.
    static let procProcessInfo: @Sendable (pid_t) -> (tgid: pid_t, ppid: pid_t)? = { pid in
        let fd = open("/proc/\(pid)/status", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var bytes = [UInt8](repeating: 0, count: 4096)
        let count = bytes.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        guard count > 0 else { return nil }
        return bytes.withUnsafeBufferPointer { all in
            let status = UnsafeBufferPointer(rebasing: all[..<count])
            guard let tgid = ProcStatus.value(of: "Tgid:", in: status),
                  let ppid = ProcStatus.value(of: "PPid:", in: status) else { return nil }
            return (tgid, ppid)
        }
    }
}
