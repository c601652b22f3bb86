/// An installed app's identifier, such as `com.example.notes`, or an app group's, such as
/// `group.com.example.shared`: the name of its container.
public struct AppID: Hashable, Sendable, CustomStringConvertible, Comparable {
    public let rawValue: String

    /// Accepts reverse-DNS style identifiers: letters, digits, `.`, `-` and `_`, not starting with a dot.
    public init?(_ rawValue: String) {
        guard !rawValue.isEmpty, rawValue.utf8.count <= 255, rawValue.first != ".",
              rawValue.utf8.allSatisfy(AppID.isAllowed) else { return nil }
        self.rawValue = rawValue
    }

    private static func isAllowed(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
             UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "."), UInt8(ascii: "-"), UInt8(ascii: "_"):
            return true
        default:
            return false
        }
    }

    /// App groups' identifiers start with this, as on Apple's systems; apps' may not.
    public static let groupPrefix = "group."

    /// Whether this names an app group's shared container (docs/island.md), not an app.
    public var isGroup: Bool { rawValue.hasPrefix(AppID.groupPrefix) && rawValue.utf8.count > AppID.groupPrefix.utf8.count }

    public var description: String { rawValue }
    public static func < (lhs: AppID, rhs: AppID) -> Bool { lhs.rawValue < rhs.rawValue }
}
