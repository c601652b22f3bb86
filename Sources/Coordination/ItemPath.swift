// Paths relative to the mount root, kept as raw bytes: Linux names need not be UTF-8, and a
// coordination layer that normalised or lossily decoded them would lock the wrong item.

/// One name in a path: any bytes except `/` and NUL, not empty, not `.` or `..`.
public struct PathComponent: Hashable, Sendable, Comparable, CustomStringConvertible {
    public let bytes: [UInt8]

    /// Returns nil for bytes that cannot be a single directory entry name.
    public init?(bytes: [UInt8]) {
        guard !bytes.isEmpty, !bytes.contains(0x2F), !bytes.contains(0),
              bytes != [0x2E], bytes != [0x2E, 0x2E]
        else { return nil }
        self.bytes = bytes
    }

    public init?(_ string: String) {
        self.init(bytes: Array(string.utf8))
    }

    /// The name as a string, or nil when the bytes are not valid UTF-8.
    public var string: String? { validatedUTF8(bytes) }

    /// The extension after the last dot, excluding a leading dot (`.hidden` has none).
    public var pathExtension: [UInt8]? {
        guard let dot = extensionDot else { return nil }
        return Array(bytes[(dot + 1)...])
    }

    /// Whether the name has an extension (`pathExtension` is not nil), told without copying it:
    /// the package rule asks this of every directory above every coordinated item.
    public var hasPathExtension: Bool { extensionDot != nil }

    private var extensionDot: Int? {
        guard let dot = bytes.lastIndex(of: 0x2E), dot > 0, dot < bytes.count - 1 else { return nil }
        return dot
    }

    /// Readable form: UTF-8 as is, other bytes as `\xNN`, so logs never lose information.
    public var description: String {
        if let string { return string }
        var text = ""
        for byte in bytes {
            if byte < 0x80, byte >= 0x20 { text.unicodeScalars.append(Unicode.Scalar(byte)) }
            else { text += "\\x" + hexDigits(byte) }
        }
        return text
    }

    public static func < (lhs: PathComponent, rhs: PathComponent) -> Bool {
        lhs.bytes.lexicographicallyPrecedes(rhs.bytes)
    }
}

/// Whether `bytes` are valid UTF-8. ASCII (most names) is told without `String(validating:as:)`,
/// whose generic type look-ups cost more than the rest of a notice's encoding or decoding.
func isValidUTF8(_ bytes: [UInt8]) -> Bool {
    bytes.allSatisfy { $0 < 0x80 } || String(validating: bytes, as: UTF8.self) != nil
}

/// `String(validating:as:)`, through `isValidUTF8`.
func validatedUTF8(_ bytes: [UInt8]) -> String? {
    isValidUTF8(bytes) ? String(decoding: bytes, as: UTF8.self) : nil
}

private func hexDigits(_ byte: UInt8) -> String {
    let digits = Array("0123456789ABCDEF")
    return String([digits[Int(byte >> 4)], digits[Int(byte & 0xF)]])
}

/// A path below the mount root. The root itself has no components.
public struct ItemPath: Hashable, Sendable, Comparable, CustomStringConvertible {
    public let components: [PathComponent]

    public static let root = ItemPath(components: [])

    public init(components: [PathComponent]) {
        self.components = components
    }

    /// Parses `a/b/c` (leading, trailing and repeated slashes are ignored).
    /// Returns nil if any component is `.`, `..` or holds a NUL.
    public init?(bytes: [UInt8]) {
        var parts: [PathComponent] = []
        for slice in bytes.split(separator: 0x2F, omittingEmptySubsequences: true) {
            guard let component = PathComponent(bytes: Array(slice)) else { return nil }
            parts.append(component)
        }
        self.components = parts
    }

    public init?(_ string: String) {
        self.init(bytes: Array(string.utf8))
    }

    public var isRoot: Bool { components.isEmpty }
    public var depth: Int { components.count }
    public var lastComponent: PathComponent? { components.last }

    /// The enclosing directory; nil for the root.
    public var parent: ItemPath? {
        isRoot ? nil : ItemPath(components: Array(components.dropLast()))
    }

    /// Every enclosing directory, nearest first, ending with the root.
    public var ancestors: [ItemPath] {
        (0..<components.count).reversed().map { ItemPath(components: Array(components[..<$0])) }
    }

    public func appending(_ component: PathComponent) -> ItemPath {
        ItemPath(components: components + [component])
    }

    public func appending(_ path: ItemPath) -> ItemPath {
        ItemPath(components: components + path.components)
    }

    /// True if `other` lies strictly below this path (a path is not its own ancestor).
    public func isAncestor(of other: ItemPath) -> Bool {
        other.components.count > components.count && other.components.starts(with: components)
    }

    /// True if `other` is this path or lies below it.
    public func isEqualOrAncestor(of other: ItemPath) -> Bool {
        other.components.starts(with: components)
    }

    /// Re-roots a path after `prefix` was renamed to `replacement`: `a/b/c` with `a` → `x/y`
    /// gives `x/y/b/c`. Returns nil if this path is not at or below `prefix`.
    public func replacingPrefix(_ prefix: ItemPath, with replacement: ItemPath) -> ItemPath? {
        guard prefix.isEqualOrAncestor(of: self) else { return nil }
        return ItemPath(components: replacement.components + components.dropFirst(prefix.components.count))
    }

    /// The path as bytes joined by `/`, without a leading slash (empty for the root).
    public var bytes: [UInt8] {
        var result: [UInt8] = []
        for (index, component) in components.enumerated() {
            if index > 0 { result.append(0x2F) }
            result.append(contentsOf: component.bytes)
        }
        return result
    }

    public var description: String {
        isRoot ? "." : components.map(\.description).joined(separator: "/")
    }

    public static func < (lhs: ItemPath, rhs: ItemPath) -> Bool {
        lhs.components.lexicographicallyPrecedes(rhs.components)
    }
}
