import Containers
import Coordination
import Dispatch
import Glibc

/// Deliveries put files into Inboxes behind the daemon's back (they are the only way in). An
/// inotify watch on each Inbox turns them into coordinated creations, so the Inbox's presenters
/// hear "subitem did appear".
final class InboxWatch: @unchecked Sendable {
    private let descriptor: Int32
    private let source: DispatchSourceRead
    private var inboxes: [Int32: ItemPath] = [:]

    /// `apps` pairs each app with its Inbox's path from the mount root.
    init?(store: Store, apps: [(AppID, ItemPath)], coordination: MountCoordination) {
        descriptor = inotify_init1(Int32(IN_CLOEXEC | IN_NONBLOCK))
        guard descriptor >= 0 else { return nil }
        for (app, inbox) in apps {
            let watch = inotify_add_watch(descriptor, store.inboxPath(app), UInt32(IN_CREATE | IN_MOVED_TO | IN_ONLYDIR))
            if watch >= 0 { inboxes[watch] = inbox }
        }
        source = DispatchSource.makeReadSource(fileDescriptor: descriptor, queue: DispatchQueue(label: "containerfs.inbox-watch"))
        let inboxes = self.inboxes
        let descriptor = self.descriptor
        source.setEventHandler {
            for (watch, name) in InboxWatch.readEvents(descriptor) {
                guard let inbox = inboxes[watch], let component = PathComponent(bytes: name) else { continue }
                coordination.announce(.create(inbox.appending(component)))
            }
        }
        source.setCancelHandler { close(descriptor) }
        source.resume()
    }

    deinit { source.cancel() }

    /// Drains the pending events: (watch, name) pairs.
    private static func readEvents(_ descriptor: Int32) -> [(Int32, [UInt8])] {
        var events: [(Int32, [UInt8])] = []
        var buffer = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let count = read(descriptor, &buffer, buffer.count)
            guard count > 0 else { return events }
            var offset = 0
            buffer.withUnsafeBytes { raw in
                while offset + MemoryLayout<inotify_event>.size <= count {
                    let event = raw.loadUnaligned(fromByteOffset: offset, as: inotify_event.self)
                    let nameStart = offset + MemoryLayout<inotify_event>.size
                    let name = raw[nameStart..<(nameStart + Int(event.len))].prefix { $0 != 0 }
                    if !name.isEmpty { events.append((event.wd, Array(name))) }
                    offset = nameStart + Int(event.len)
                }
            }
        }
    }
}

extension MountCoordination {
    /// Announces to presenters a change made outside the mount, as a coordinated operation of its own.
    func announce(_ operation: CoordinatedOperation) {
        engine.begin(operation, owner: .ordinaryPrograms, purpose: MountCoordination.ordinaryPurpose,
                     initiator: Initiator(owner: .ordinaryPrograms), timeout: waitLimit) { result in
            if case .success(let session) = result { session.end(tookEffect: true) }
        }
    }
}
