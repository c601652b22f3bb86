import Dispatch

// Timers that never block a thread. Injected so tests can fire them deterministically.

public protocol TimerHandle: Sendable {
    func cancel()
}

public protocol Scheduler: Sendable {
    /// Runs `action` once after `delay` on some thread, unless the returned handle is cancelled.
    func schedule(after delay: Duration, _ action: @escaping @Sendable () -> Void) -> any TimerHandle
}

/// The production scheduler: `DispatchQueue.asyncAfter` on a global queue.
public struct DispatchScheduler: Scheduler {
    private let queue: DispatchQueue

    public init(queue: DispatchQueue = .global()) {
        self.queue = queue
    }

    public func schedule(after delay: Duration, _ action: @escaping @Sendable () -> Void) -> any TimerHandle {
        let item = DispatchWorkItem(block: action)
        queue.asyncAfter(deadline: .now() + delay.dispatchInterval, execute: item)
        return DispatchTimerHandle(item: item)
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
