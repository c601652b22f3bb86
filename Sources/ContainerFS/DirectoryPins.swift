import Coordination
import Glibc

/// Descriptors of the store's directories behind a container's fixed places (its root, Documents,
/// Library and its fixed folders, tmp), kept once the kernel forgot their nodes. A held descriptor
/// keeps the store's entry in the kernel's directory cache, so a look-up after memory pressure
/// (or `drop_caches`) finds the container's path without reading the store's directory blocks:
/// the store lies two levels deeper than the mount shows (`containers/APP/Documents`), and each
/// level cost a read (docs/store-format.md, "Cold caches").
///
/// The mount never renames or removes these directories (`Policy`); a lifecycle command may, and
/// a pin of one removed is closed when the pins are full.
final class DirectoryPins: Sendable {
    /// The pins by directory, and how many were refused since the last look for removed ones.
    private let state = Locked<(pins: [BackingKey: Int32], refused: Int)>(([:], 0))
    let limit: Int

    /// A sixteenth of the daemon's descriptor limit, at most 1,024: eight places of 128 apps.
    init(limit: Int = DirectoryPins.defaultLimit) {
        self.limit = limit
    }

    static var defaultLimit: Int {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 0 }
        return Int(min(limit.rlim_cur / 16, 1024))
    }

    /// Keeps a descriptor of the directory open on `descriptor`, whose file is `key`, unless one is
    /// kept already or the pins are full of directories that still exist. Full pins look for
    /// removed ones at the first refusal and every 64th after (a look is an `fstat` a pin).
    func keep(_ descriptor: Int32, of key: BackingKey) {
        state.withLock { state in
            guard state.pins[key] == nil else { return }
            if state.pins.count >= limit, state.refused % 64 == 0 { dropRemoved(&state.pins) }
            guard state.pins.count < limit else {
                state.refused += 1
                return
            }
            state.refused = 0
            let copy = fcntl(descriptor, F_DUPFD_CLOEXEC, 0)
            if copy >= 0 { state.pins[key] = copy }
        }
    }

    var count: Int { state.withLock { $0.pins.count } }

    func holds(_ key: BackingKey) -> Bool { state.withLock { $0.pins[key] != nil } }

    /// Closes the pins of directories that are gone from the store.
    private func dropRemoved(_ pins: inout [BackingKey: Int32]) {
        for (key, descriptor) in pins {
            var attributes = stat()
            guard fstat(descriptor, &attributes) != 0 || attributes.st_nlink == 0 else { continue }
            close(descriptor)
            pins[key] = nil
        }
    }

    deinit {
        state.withLock { state in
            for descriptor in state.pins.values { close(descriptor) }
        }
    }
}
