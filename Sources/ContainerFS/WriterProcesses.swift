import Glibc

/// The processes writing a file through its write session, told by the threads the kernel names in
/// their requests. A `stat` shows them their writes, and everyone else the published version,
/// which is what everyone else reads (docs/atomic-replace.md, "What readers see"). Guarded with the
/// session; looking a thread up in /proc is done once a session for each thread that asks.
struct WriterProcesses {
    /// Threads known to be the writers', and the writers' processes.
    private var threads: [pid_t] = []
    private var processes: [pid_t] = []
    /// Threads known not to be.
    private var others: [pid_t] = []
    /// What each list keeps: a session has a writer or a few, and a few others look at it; past
    /// that the oldest are forgotten (and asked about again).
    private static let kept = 16

    /// `thread` opened the file for writing, or wrote or truncated it through the session.
    mutating func add(_ thread: pid_t) {
        guard thread > 0, !threads.contains(thread) else { return }
        WriterProcesses.keep(thread, in: &threads)
        others.removeAll { $0 == thread }
        if let process = ProcessState.threadGroup(of: thread), !processes.contains(process) {
            WriterProcesses.keep(process, in: &processes)
        }
    }

    /// Whether `thread` is one of a writing process's threads (one that holds the process's
    /// descriptors, though it may not have written yet). False for 0, which names no thread.
    mutating func includes(_ thread: pid_t) -> Bool {
        guard thread > 0 else { return false }
        if threads.contains(thread) { return true }
        if others.contains(thread) { return false }
        let isWriter = ProcessState.threadGroup(of: thread).map(processes.contains) ?? false
        if isWriter { WriterProcesses.keep(thread, in: &threads) } else { WriterProcesses.keep(thread, in: &others) }
        return isWriter
    }

    private static func keep(_ id: pid_t, in list: inout [pid_t]) {
        if list.count >= kept { list.removeFirst() }
        list.append(id)
    }
}
