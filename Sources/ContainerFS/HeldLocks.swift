import CLinux
import Containers
import Foundation
import Glibc

/// Which of the mount's files someone holds a lock on. The kernel keeps the mount's POSIX, OFD and
/// BSD locks itself (docs/policy.md), on its inode of the file, and lists them in /proc/locks
/// (`PID MAJOR:MINOR:INODE`, the device in hex). Programs that coordinate through locks get a
/// local disk's behaviour (docs/atomic-replace.md, "Files under locks").
struct HeldLocks: Sendable {
    /// The mount's device as /proc/locks writes it: "00:2b".
    let device: String

    init(major: UInt32, minor: UInt32) {
        func hex(_ value: UInt32) -> String {
            let digits = String(value, radix: 16)
            return digits.count < 2 ? "0" + digits : digits
        }
        device = hex(major) + ":" + hex(minor)
        needlePrefix = Array(" \(device):".utf8)
    }

    /// " DEVICE:", which an inode's digits and a space follow in its locks' lines (at most 19 bytes).
    private let needlePrefix: [UInt8]

    /// The locks of the mount at `mountPoint` (the last one there), whose device
    /// /proc/self/mountinfo tells; nil if it does not.
    init?(ofMountAt mountPoint: String) {
        let numbers = MountTable.device(at: mountPoint)?.split(separator: ":").compactMap { UInt32($0) }
        guard let numbers, numbers.count == 2 else { return nil }
        self.init(major: numbers[0], minor: numbers[1])
    }

    /// Whether /proc/locks lists a lock (held or waited for) on the mount's inode `inode`.
    func held(on inode: UInt64) -> Bool {
        let file = Glibc.open("/proc/locks", O_RDONLY | O_CLOEXEC)
        guard file >= 0 else { return false }
        defer { close(file) }
        return lists(inode) { Glibc.read(file, $0, $1) }
    }

    /// Whether `locks`, the text of /proc/locks, lists a lock on the mount's inode `inode`, read
    /// `piece` bytes at a time.
    func lists(_ inode: UInt64, in locks: String, piece: Int = .max, chunk: Int = 16384) -> Bool {
        let bytes = Array(locks.utf8)
        var offset = 0
        return lists(inode, chunk: chunk) { destination, count in
            let taken = min(count, piece, bytes.count - offset)
            bytes.withUnsafeBytes { destination.copyMemory(from: $0.baseAddress! + offset, byteCount: taken) }
            offset += taken
            return taken
        }
    }

    /// Whether the text `read` gives (as read(2) does: a count, 0 at its end, -1 with errno set)
    /// lists a lock on the mount's inode `inode`. Searched as it comes, in `chunk` bytes of the
    /// stack: a writer's open of an open file asks, and the listing holds every lock on the machine.
    func lists(_ inode: UInt64, chunk: Int = 16384, reading read: (UnsafeMutableRawPointer, Int) -> Int) -> Bool {
        // The prefix, 20 digits at most and a space.
        let needleSpace = 48
        return withUnsafeTemporaryAllocation(of: UInt8.self, capacity: needleSpace + chunk) { memory in
            // Each lock's `DEVICE:INODE` stands between spaces: " DEVICE:INODE ".
            let needle = memory.baseAddress!
            needlePrefix.withUnsafeBufferPointer { needle.update(from: $0.baseAddress!, count: $0.count) }
            var length = needlePrefix.count
            let digits = length
            var rest = inode
            repeat {
                needle[length] = UInt8(ascii: "0") + UInt8(rest % 10)
                rest /= 10
                length += 1
            } while rest > 0
            var reversed = UnsafeMutableBufferPointer(rebasing: memory[digits..<length])
            reversed.reverse()
            needle[length] = UInt8(ascii: " ")
            length += 1
            let text = needle + needleSpace
            // The end of each piece read stays for the next: a lock's line may straddle them.
            var kept = 0
            while true {
                let count = read(text + kept, chunk - kept)
                if count < 0, errno == EINTR { continue }
                guard count > 0 else { return false }
                let filled = kept + count
                if clinux_contains(text, filled, needle, length) != 0 { return true }
                kept = min(length - 1, filled)
                memmove(text, text + filled - kept, kept)
            }
        }
    }
}
