import Foundation

/// Reads /proc/self/mountinfo.
public enum MountTable {
    /// One mount: its filesystem's device (`major:minor`, shared by bind mounts of it), where it
    /// shows, its type (`fuse.containerfs`) and its filesystem's options (`allow_other`, ...).
    public struct Entry: Equatable, Sendable {
        public var device: String
        /// The directory of its filesystem it shows: `/`, or deeper for a bind mount of a directory.
        public var root: String
        public var mountPoint: String
        public var type: String
        /// What was mounted: the store (STORE, or STORE:ID for an app alone) for a ContainerFS mount.
        public var source: String
        public var superOptions: [String]

        /// Where it shows `path` (a path in its filesystem, "" for the top), or nil if it does not.
        public func showing(_ path: String) -> String? {
            if root == "/" { return mountPoint + path }
            guard path == root || path.hasPrefix(root + "/") else { return nil }
            return mountPoint + path.dropFirst(root.count)
        }

        /// Where this mount, one of `mount`'s daemon (its own or a bind mount of it), shows `app`'s
        /// data container, and the store's top if it shows that; nil if it does not show the
        /// container whole.
        public func places(of app: AppID, in mount: ActiveMount) -> (container: String, store: String?)? {
            guard mount.root == nil, mount.covers(app) else { return nil }
            guard let container = showing(mount.app == nil ? "/" + app.rawValue : "") else { return nil }
            return (container, mount.app == nil ? showing("") : nil)
        }
    }

    /// The mount at `mountPoint` (the last one there, which covers any before it).
    public static func mount(at mountPoint: String) -> Entry? { entries().last { $0.mountPoint == mountPoint } }

    /// The mount that holds `path` (absolute, its links resolved): the last one at the longest
    /// mount point above it or at it.
    public static func mount(holding path: String) -> Entry? {
        entries().reduce(nil) { found, entry in
            let holds = entry.mountPoint == "/" || path == entry.mountPoint || path.hasPrefix(entry.mountPoint + "/")
            return holds && entry.mountPoint.count >= (found?.mountPoint.count ?? 0) ? entry : found
        }
    }

    /// The device of the mount at `mountPoint`, or nil if nothing is mounted there.
    public static func device(at mountPoint: String) -> String? { mount(at: mountPoint)?.device }

    /// Whether a mount of `device` is still there.
    public static func isMounted(_ device: String) -> Bool { entries().contains { $0.device == device } }

    public static func isMountPoint(_ path: String) -> Bool {
        let target = (path as NSString).standardizingPath
        return entries().contains { $0.mountPoint == target }
    }

    /// The mounts, in the order the kernel lists them (a later one at a path covers an earlier).
    public static func entries() -> [Entry] {
        guard let text = try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8) else { return [] }
        return text.split(separator: "\n").compactMap { entry(String($0)) }
    }

    /// A line: ID PARENT MAJOR:MINOR ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPEROPTIONS.
    public static func entry(_ line: String) -> Entry? {
        let fields = line.split(separator: " ", omittingEmptySubsequences: false)
        guard fields.count > 6, let separator = fields[6...].firstIndex(of: "-"), separator + 3 < fields.count else { return nil }
        return Entry(device: String(fields[2]), root: unescape(String(fields[3])), mountPoint: unescape(String(fields[4])),
                     type: String(fields[separator + 1]), source: unescape(String(fields[separator + 2])),
                     superOptions: fields[separator + 3].split(separator: ",").map(String.init))
    }

    /// Mount paths escape space, tab, newline and backslash as octal; the rest is the path's bytes.
    private static func unescape(_ field: String) -> String {
        var bytes: [UInt8] = []
        var rest = field.utf8[...]
        while let byte = rest.popFirst() {
            if byte == UInt8(ascii: "\\"), rest.count >= 3, let code = UInt8(String(decoding: rest.prefix(3), as: UTF8.self), radix: 8) {
                bytes.append(code)
                rest = rest.dropFirst(3)
            } else {
                bytes.append(byte)
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }
}
