// Small typed identifiers, so an owner can never be passed where a purpose is expected.

/// A client of the coordination layer: one control-socket connection, or a synthetic owner the
/// filesystem makes for an ordinary program's operation.
public struct OwnerID: Hashable, Sendable, Codable, Comparable, CustomStringConvertible {
    public let rawValue: UInt64
    public init(_ rawValue: UInt64) { self.rawValue = rawValue }
    public var description: String { "owner#\(rawValue)" }

    /// The owner the filesystem uses for operations of programs that are not clients of the
    /// control socket. Client connections are numbered from 1.
    public static let ordinaryPrograms = OwnerID(0)
    public static func < (lhs: OwnerID, rhs: OwnerID) -> Bool { lhs.rawValue < rhs.rawValue }

    public init(from decoder: Decoder) throws {
        rawValue = try decoder.singleValueContainer().decode(UInt64.self)
    }
    public func encode(to encoder: Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(rawValue)
    }
}

/// Foundation's purpose identifier: accesses of one owner made under the same purpose (one
/// coordinator, or one presenter and the coordinators made for it) never block each other.
public struct PurposeID: Hashable, Sendable, Codable, Comparable, CustomStringConvertible {
    public let rawValue: String
    public init(_ rawValue: String) { self.rawValue = rawValue }
    public var description: String { rawValue }
    public static func < (lhs: PurposeID, rhs: PurposeID) -> Bool { lhs.rawValue < rhs.rawValue }

    public init(from decoder: Decoder) throws {
        rawValue = try decoder.singleValueContainer().decode(String.self)
    }
    public func encode(to encoder: Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(rawValue)
    }
}

/// Names one request to the arbiter, from the moment it is made until it is released.
public struct AccessTicket: Hashable, Sendable, Codable, CustomStringConvertible {
    public let rawValue: UInt64
    public init(_ rawValue: UInt64) { self.rawValue = rawValue }
    public var description: String { "access#\(rawValue)" }

    public init(from decoder: Decoder) throws {
        rawValue = try decoder.singleValueContainer().decode(UInt64.self)
    }
    public func encode(to encoder: Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(rawValue)
    }
}
