/// What a reader made of a byte stream.
public struct StreamOutcome: Equatable, Sendable {
    public var messages: [ControlMessage] = []
    public var errors: [ControlCodecError] = []
    /// What `finish()` said of the bytes left at the end, if they made no whole frame.
    public var finished: ControlCodecError?
    /// False if the reader ever answered without consuming anything: it would loop forever.
    public var madeProgress = true
}

extension FrameReader {
    /// Decodes `bytes` as a socket delivers them, in pieces of the given sizes, draining the reader
    /// after each piece. An oversized frame loses the framing: the reader stays broken after it.
    public static func decode(_ bytes: [UInt8], inPieces pieces: [Int]) -> StreamOutcome {
        var reader = FrameReader()
        var outcome = StreamOutcome()
        var offset = 0
        var broken = false
        for piece in pieces {
            reader.append(bytes[offset..<offset + piece])
            offset += piece
            while !broken {
                let before = reader.bufferedByteCount
                do {
                    guard let message = try reader.next() else { break }
                    outcome.messages.append(message)
                } catch {
                    outcome.errors.append(error)
                    if case .oversized = error { broken = true }
                }
                if !broken, reader.bufferedByteCount >= before {
                    outcome.madeProgress = false
                    return outcome
                }
            }
        }
        do { try reader.finish() } catch { outcome.finished = error }
        return outcome
    }
}
