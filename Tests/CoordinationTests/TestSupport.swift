@testable import Coordination
import XCTest

/// A scheduler whose time moves only when a test says so.
final class ManualScheduler: Scheduler {
    private struct Timer {
        let id: Int
        let deadline: Duration
        let action: @Sendable () -> Void
    }

    private let state = Locked<(now: Duration, nextID: Int, timers: [Timer], cancelled: Set<Int>)>((.zero, 0, [], []))

    func schedule(after delay: Duration, _ action: @escaping @Sendable () -> Void) -> any TimerHandle {
        let id = state.withLock { state -> Int in
            state.nextID += 1
            state.timers.append(Timer(id: state.nextID, deadline: state.now + delay, action: action))
            return state.nextID
        }
        return Handle(scheduler: self, id: id)
    }

    /// Fires, in deadline order, every timer due by the new time.
    func advance(by interval: Duration) {
        let due = state.withLock { state -> [Timer] in
            state.now += interval
            let due = state.timers.filter { $0.deadline <= state.now && !state.cancelled.contains($0.id) }
            state.timers.removeAll { $0.deadline <= state.now || state.cancelled.contains($0.id) }
            return due.sorted { $0.deadline < $1.deadline }
        }
        for timer in due { timer.action() }
    }

    /// Runs at once: tests see every completion before the call that caused it returns.
    func execute(_ action: @escaping @Sendable () -> Void) {
        action()
    }

    var liveTimerCount: Int {
        state.withLock { state in state.timers.filter { !state.cancelled.contains($0.id) }.count }
    }

    private func cancel(_ id: Int) {
        state.withLock { _ = $0.cancelled.insert(id) }
    }

    private struct Handle: TimerHandle {
        let scheduler: ManualScheduler
        let id: Int
        func cancel() { scheduler.cancel(id) }
    }
}

/// Thread-safe list of events, for asserting order.
final class EventLog<Event: Sendable>: Sendable {
    private let events = Locked<[Event]>([])
    func append(_ event: Event) { events.withLock { $0.append(event) } }
    var all: [Event] { events.withLock { $0 } }
}

/// Captures what an arbiter completion was called with, and how often.
final class Outcome: Sendable {
    private let results = Locked<[Result<AccessGrant, CoordinationError>]>([])

    var completion: Arbiter.Completion {
        { result in self.results.withLock { $0.append(result) } }
    }

    var callCount: Int { results.withLock { $0.count } }

    var grant: AccessGrant? {
        results.withLock { results in
            guard case .success(let grant)? = results.first else { return nil }
            return grant
        }
    }

    var error: CoordinationError? {
        results.withLock { results in
            guard case .failure(let error)? = results.first else { return nil }
            return error
        }
    }

    var isGranted: Bool { grant != nil }
    var isPending: Bool { callCount == 0 }
}

func path(_ text: String, file: StaticString = #filePath, line: UInt = #line) -> ItemPath {
    guard let path = ItemPath(text) else {
        XCTFail("bad test path \(text)", file: file, line: line)
        return .root
    }
    return path
}

let alice = OwnerID(1)
let bob = OwnerID(2)
let carol = OwnerID(3)

/// The registry's answers around an item, one part at a time.
extension PresenterRegistry {
    func directoriesAbove(_ path: ItemPath) -> [PresenterRecord] { around(path).above.flatMap { $0 } }
    func packagesAbove(_ path: ItemPath) -> [PresenterRecord] { around(path).packagesAbove }
    func inside(_ path: ItemPath) -> [PresenterRecord] { around(path).inside }
}
