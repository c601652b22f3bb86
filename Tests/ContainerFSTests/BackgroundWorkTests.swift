@testable import ContainerFS
import Coordination
import Dispatch
import Glibc
import XCTest

/// Work no request waits for runs on threads that do not preempt a request's (SCHED_BATCH).
final class BackgroundWorkTests: XCTestCase {
    /// SCHED_BATCH (linux/sched.h), which Glibc's module does not bring.
    private let batch: Int32 = 3

    func testBackgroundWorkRunsAsBatchAndLeavesOrdinaryWorkAlone() {
        let queue = DispatchQueue(label: "background-work-test", qos: .utility)
        let policies = Locked<[Int32]>([])
        let done = DispatchGroup()
        done.enter()
        queue.asyncInBackground {
            policies.withLock { $0.append(sched_getscheduler(0)) }
            done.leave()
        }
        done.enter()
        queue.asyncInBackground(after: .milliseconds(10)) {
            policies.withLock { $0.append(sched_getscheduler(0)) }
            done.leave()
        }
        XCTAssertEqual(done.wait(timeout: .now() + 10), .success)
        XCTAssertEqual(policies.withLock { $0 }, [batch, batch])
        XCTAssertEqual(sched_getscheduler(0), SCHED_OTHER, "the thread that queued it is as it was")
        // Work of another QoS runs on threads of its own, left as they were.
        let ordinary = Locked<[Int32]>([])
        let ordinaryDone = DispatchGroup()
        for _ in 0..<8 {
            DispatchQueue(label: "ordinary-work-test").async(group: ordinaryDone) {
                ordinary.withLock { $0.append(sched_getscheduler(0)) }
            }
        }
        XCTAssertEqual(ordinaryDone.wait(timeout: .now() + 10), .success)
        XCTAssertEqual(ordinary.withLock { $0 }, Array(repeating: SCHED_OTHER, count: 8))
    }
}
