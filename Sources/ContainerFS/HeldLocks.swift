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
    }

    /// The locks of the mount at `mountPoint` (the last one there), whose device
    /// /proc/self/mountinfo tells; nil if it does not.
    init?(ofMountAt mountPoint: String) {
        guard let file = fopen("/proc/self/mountinfo", "r") else { return nil }
        defer { fclose(file) }
        // Spaces and other bytes are escaped as octal there.
        let escaped = mountPoint.replacingOccurrences(of: "\\", with: "\\134").replacingOccurrences(of: " ", with: "\\040")
            .replacingOccurrences(of: "\t", with: "\\011").replacingOccurrences(of: "\n", with: "\\012")
        var found: (UInt32, UInt32)?
        var line: UnsafeMutablePointer<CChar>?
        var capacity = 0
        defer { free(line) }
        while getline(&line, &capacity, file) > 0, let line {
            let fields = String(cString: line).split(separator: " ")
            guard fields.count > 4, fields[4] == escaped else { continue }
            let numbers = fields[2].split(separator: ":").compactMap { UInt32($0) }
            if numbers.count == 2 { found = (numbers[0], numbers[1]) }
        }
        guard let found else { return nil }
        self.init(major: found.0, minor: found.1)
    }

    /// Whether /proc/locks lists a lock (held or waited for) on the mount's inode `inode`.
    func held(on inode: UInt64) -> Bool {
        guard let file = fopen("/proc/locks", "r") else { return false }
        defer { fclose(file) }
        var text: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let count = fread(&buffer, 1, buffer.count, file)
            if count <= 0 { break }
            text += buffer[..<count]
        }
        return lists(inode, in: text)
    }

    /// Whether `locks`, the text of /proc/locks, lists a lock on the mount's inode `inode`.
    func lists(_ inode: UInt64, in locks: String) -> Bool {
        lists(inode, in: Array(locks.utf8))
    }

    /// `lists` on the bytes read, searched as they are: a writer's open of an open file asks, and
    /// the listing holds every lock on the machine. Each lock's `DEVICE:INODE` stands between spaces.
    private func lists(_ inode: UInt64, in locks: [UInt8]) -> Bool {
        locks.firstRange(of: Array(" \(device):\(inode) ".utf8)) != nil
    }
}
