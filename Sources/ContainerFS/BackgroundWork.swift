import CLinux
import Dispatch

extension DispatchQueue {
    /// Runs `work`, which no request waits for (spares, records, versions), on a thread that does
    /// not preempt the thread that woke it (SCHED_BATCH, at the same share of the CPU). Woken as an
    /// ordinary thread, such work took the CPU of the request that queued it before the request
    /// answered: a tenth of an editor's saves waited 0.3-0.8 ms for a spare being made
    /// (docs/atomic-replace.md, "Shadows are made ahead"). The queue's QoS must be `.utility`:
    /// libdispatch's threads serve one QoS, and those of `.utility` then run nothing else.
    func asyncInBackground(_ work: @escaping @Sendable () -> Void) {
        async(execute: DispatchQueue.batched(work))
    }

    /// `asyncInBackground` after `delay`.
    func asyncInBackground(after delay: DispatchTimeInterval, _ work: @escaping @Sendable () -> Void) {
        asyncAfter(deadline: .now() + delay, execute: DispatchQueue.batched(work))
    }

    private static func batched(_ work: @escaping @Sendable () -> Void) -> @Sendable () -> Void {
        {
            // A hint: a thread the kernel refuses it stays as it was.
            _ = clinux_become_batch()
            work()
        }
    }
}
