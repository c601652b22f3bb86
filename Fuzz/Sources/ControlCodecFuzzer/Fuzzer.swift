import Coordination

// libFuzzer entry point. Build with `-sanitize=fuzzer,address -parse-as-library` (see README.md).
//
// The properties checked on every input, beyond "does not crash":
// - `ControlCodec.decode(frame:)` returns a message or throws a `ControlCodecError` (typed throws).
// - A decoded message re-encodes, and the re-encoded frame decodes to the same message.
// - A `FrameReader` fed the input, whole or in pieces, never crashes and always makes progress;
//   when the input is exactly one valid frame it yields that same message and nothing else.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = Array(UnsafeBufferPointer(start: data, count: size))

    var single: ControlMessage?
    var singleError: ControlCodecError?
    do {
        let message = try ControlCodec.decode(frame: bytes)
        single = message
        let again: ControlMessage
        do {
            again = try ControlCodec.decode(frame: try ControlCodec.encode(message))
        } catch {
            fatalError("a decoded message does not survive re-encoding: \(error) for \(message)")
        }
        guard again == message else { fatalError("round trip changed \(message) into \(again)") }
    } catch {
        singleError = error
    }

    // The stream reader, whole and in pieces whose sizes come from the input itself.
    let whole = FrameReader.decode(bytes, inPieces: [bytes.count])
    var seed = UInt64(truncatingIfNeeded: size) &* 0x9E37_79B9_7F4A_7C15
    for byte in bytes.prefix(16) { seed = (seed ^ UInt64(byte)) &* 0x100_0000_01B3 }
    var pieces: [Int] = []
    var remaining = bytes.count
    while remaining > 0 {
        seed = seed &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
        let piece = min(remaining, Int(seed >> 60) + 1)  // 1...16 bytes
        pieces.append(piece)
        remaining -= piece
    }
    let split = FrameReader.decode(bytes, inPieces: pieces)
    guard whole.madeProgress, split.madeProgress else { fatalError("the reader made no progress") }
    guard whole == split else { fatalError("the reader's result depends on how the bytes arrive: \(whole) vs \(split)") }

    if let single {
        guard whole.messages == [single], whole.errors.isEmpty, whole.finished == nil else {
            fatalError("decode(frame:) gave \(single) but the reader gave \(whole)")
        }
    }
    if case .oversized? = singleError {
        guard case .oversized? = whole.errors.first else { fatalError("oversized frame but reader gave \(whole)") }
    }
    return 0
}

// SwiftPM links every executable target with `--defsym main=<Target>_main`, which would hide
// libFuzzer's own main(). So this target supplies that symbol and hands over to libFuzzer's driver.
@_silgen_name("LLVMFuzzerRunDriver")
func LLVMFuzzerRunDriver(
    _ argc: UnsafeMutablePointer<CInt>,
    _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
    _ callback: @convention(c) (UnsafePointer<UInt8>, Int) -> CInt
) -> CInt

@_cdecl("ControlCodecFuzzer_main")
public func fuzzerMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    var argc = argc
    var argv = argv
    return LLVMFuzzerRunDriver(&argc, &argv, fuzz)
}
