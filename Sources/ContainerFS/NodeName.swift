/// A node's name as last seen. Most names fit in 16 bytes, kept in the node itself, padded with
/// NULs (no name holds one); longer ones take an array. There is a node per file the kernel knows,
/// so the allocation spared counts (with the node's fields packed after it, 347 bytes a file
/// listed became 299: the README's memory rows).
struct NodeName: Equatable, Sendable {
    private enum Storage: Equatable {
        case inline(UInt64, UInt64)
        case heap([UInt8])
    }

    private let storage: Storage

    static let empty = NodeName(EmptyCollection<UInt8>())

    init<Bytes: Collection<UInt8>>(_ bytes: Bytes) {
        guard bytes.count <= 16 else {
            storage = .heap(Array(bytes))
            return
        }
        var words: (UInt64, UInt64) = (0, 0)
        withUnsafeMutableBytes(of: &words) { buffer in
            for (index, byte) in bytes.enumerated() { buffer[index] = byte }
        }
        storage = .inline(words.0, words.1)
    }

    /// Runs `body` with the name's bytes (no NUL at the end).
    func withUnsafeBytes<R>(_ body: (UnsafeRawBufferPointer) -> R) -> R {
        switch storage {
        case .heap(let bytes):
            return bytes.withUnsafeBytes(body)
        case .inline(let first, let second):
            return Swift.withUnsafeBytes(of: (first, second)) { buffer in
                body(UnsafeRawBufferPointer(rebasing: buffer.prefix { $0 != 0 }))
            }
        }
    }

    /// Runs `body` with the name as a NUL-terminated C string, for the `*at()` calls.
    func withCString<R>(_ body: (UnsafePointer<CChar>) -> R) -> R {
        withUnsafeBytes { Backing.withCName($0, body) }
    }

    var bytes: [UInt8] { withUnsafeBytes { Array($0) } }

    func elementsEqual<Other: Sequence<UInt8>>(_ other: Other) -> Bool {
        withUnsafeBytes { $0.elementsEqual(other) }
    }
}
