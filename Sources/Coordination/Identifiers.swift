// Small typed identifiers, so an owner can never be passed where a purpose is expected.

/// An identifier that is its raw value, and is encoded as that value alone.
public protocol RawIdentifier: Hashable, Sendable, Codable {
    associatedtype RawValue: Hashable & Sendable & Codable
    var rawValue: RawValue { get }
    init(_ rawValue: RawValue)
}

extension RawIdentifier {
    public init(from decoder: Decoder) throws {
        self.init(try decoder.singleValueContainer().decode(RawValue.self))
    }

    public func encode(to encoder: Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(rawValue)
    }
}

extension RawIdentifier where Self: Comparable, RawValue: Comparable {
    public static func < (lhs: Self, rhs: Self) -> Bool { lhs.rawValue < rhs.rawValue }
}

/// A client of the coordination layer: one control-socket connection, or a synthetic owner the
/// filesystem makes for an ordinary program's operation.
public struct OwnerID: RawIdentifier, Comparable, CustomStringConvertible {
    public let rawValue: UInt64
    public init(_ rawValue: UInt64) { self.rawValue = rawValue }
    public var description: String { "owner#\(rawValue)" }

    /// The owner the filesystem uses for operations of programs that are not clients of the
    /// control socket. Client connections are numbered from 1.
    public static let ordinaryPrograms = OwnerID(0)

}

/// Foundation's purpose identifier: accesses of one owner made under the same purpose (one
/// coordinator, or one presenter and the coordinators made for it) never block each other.
public struct PurposeID: RawIdentifier, Comparable, CustomStringConvertible {
    public let rawValue: String
    public init(_ rawValue: String) { self.rawValue = rawValue }
    public var description: String { rawValue }

}

/// Names one request to the arbiter, from the moment it is made until it is released.
public struct AccessTicket: RawIdentifier, CustomStringConvertible {
    public let rawValue: UInt64
    public init(_ rawValue: UInt64) { self.rawValue = rawValue }
    public var description: String { "access#\(rawValue)" }

}

/// Names one presenter message, so that its reply finds it.
public struct MessageID: RawIdentifier, CustomStringConvertible {
    public let rawValue: UInt64
    public init(_ rawValue: UInt64) { self.rawValue = rawValue }
    public var description: String { "message#\(rawValue)" }
}
