import Dispatch

// Timers that never block a thread, and a place to run completions that became due on some other
// caller's thread. Injected so tests can run both deterministically.

public protocol TimerHandle: Sendable {
    func cancel()
}

public protocol Scheduler: Sendable {
    /// Runs `action` once after `delay` on some thread, unless the returned handle is cancelled.
    func schedule(after delay: Duration, _ action: @escaping @Sendable () -> Void) -> any TimerHandle

    /// Runs `action` soon, on some thread. Used for completions that became due on a thread that
    /// is busy with something else (a release, a reply from a socket): running them there would
    /// nest one operation inside another, without bound.
    func execute(_ action: @escaping @Sendable () -> Void)
}

/// The production scheduler: `DispatchQueue.asyncAfter` on a queue of its own. Not a global queue:
/// callers that wait for a grant often block the global queue's few threads (one per core), and a
/// grant queued behind them would wait until the pool grows. A queue of its own gets a thread of
/// its own (libdispatch's overcommit).
public struct DispatchScheduler: Scheduler {
    @usableFromInline static let shared = DispatchQueue(label: "containerfs.coordination.scheduler", attributes: .concurrent)
    private let queue: DispatchQueue

    public init(queue: DispatchQueue = DispatchScheduler.shared) {
        self.queue = queue
    }

    public func schedule(after delay: Duration, _ action: @escaping @Sendable () -> Void) -> any TimerHandle {
        let item = DispatchWorkItem(block: action)
        queue.asyncAfter(deadline: .now() + delay.dispatchInterval, execute: item)
        return DispatchTimerHandle(item: item)
    }

    public func execute(_ action: @escaping @Sendable () -> Void) {
        queue.async(execute: action)
    }
}

private struct DispatchTimerHandle: TimerHandle, @unchecked Sendable {
    let item: DispatchWorkItem
    func cancel() { item.cancel() }
}

extension Duration {
    var dispatchInterval: DispatchTimeInterval {
        let (seconds, attoseconds) = components
        let nanoseconds = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        guard !nanoseconds.overflow, seconds >= 0 else { return seconds < 0 ? .nanoseconds(0) : .never }
        let total = nanoseconds.partialValue.addingReportingOverflow(attoseconds / 1_000_000_000)
        return total.overflow ? .never : .nanoseconds(Int(total.partialValue))
    }
}
