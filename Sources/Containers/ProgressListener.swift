import Foundation

/// Hears how far a long piece of work (install, verify, backup, restore) has got.
public protocol ProgressListener: AnyObject {
    /// A new phase begins: `totalUnits` of work (bytes, usually), 0 when unknown.
    func begin(_ phase: String, totalUnits: Int64)
    func advance(by units: Int64)
    /// The phase is over (done or failed).
    func end()
}

/// A one-line bar on standard error, redrawn in place with `\r`; silent when standard error is
/// not a terminal, so logs and pipes get no control characters.
public final class TerminalProgressBar: ProgressListener {
    private let isTerminal: Bool
    private var phase = ""
    private var total: Int64 = 0
    private var done: Int64 = 0
    private var lastDraw: Int64 = 0
    private var drawn = false

    public init(fileDescriptor: Int32 = 2) {
        isTerminal = isatty(fileDescriptor) == 1
    }

    public func begin(_ phase: String, totalUnits: Int64) {
        self.phase = phase
        total = max(totalUnits, 0)
        done = 0
        lastDraw = 0
        draw(force: true)
    }

    public func advance(by units: Int64) {
        done += units
        draw(force: false)
    }

    public func end() {
        guard isTerminal, drawn else { return }
        done = max(done, total)
        draw(force: true)
        FileHandle.standardError.write(Data("\n".utf8))
        drawn = false
    }

    /// Redraws at most ten times a second: a terminal is slower than hashing.
    private func draw(force: Bool) {
        guard isTerminal else { return }
        let now = DispatchTime.now().uptimeNanoseconds
        guard force || Int64(now) - lastDraw >= 100_000_000 else { return }
        lastDraw = Int64(now)
        drawn = true
        FileHandle.standardError.write(Data(("\r" + TerminalProgressBar.line(phase: phase, done: done, total: total, width: terminalWidth()) + "\u{1B}[K").utf8))
    }

    /// The bar's text, such as `Sealing Notes.app [#########-----------]  45%  12.3 MiB of 27.0 MiB`.
    static func line(phase: String, done: Int64, total: Int64, width: Int) -> String {
        let amount = total > 0 ? "\(ByteCount.describe(done)) of \(ByteCount.describe(total))" : ByteCount.describe(done)
        guard total > 0 else { return String((phase + "  " + amount).prefix(width - 1)) }
        let fraction = min(Double(done) / Double(total), 1)
        let percent = String(Int(fraction * 100)).leftPadded(to: 3) + "%"
        let barWidth = max(10, min(40, width - phase.count - amount.count - 12))
        let filled = Int(fraction * Double(barWidth))
        let bar = "[" + String(repeating: "#", count: filled) + String(repeating: "-", count: barWidth - filled) + "]"
        return String("\(phase) \(bar) \(percent)  \(amount)".prefix(width - 1))
    }

    private func terminalWidth() -> Int {
        var size = winsize()
        if ioctl(2, UInt(TIOCGWINSZ), &size) == 0, size.ws_col > 20 { return Int(size.ws_col) }
        return 80
    }
}

/// Byte amounts as people read and write them.
public enum ByteCount {
    /// `1536` → `1.5 KiB`.
    public static func describe(_ bytes: Int64) -> String {
        let units = ["B", "KiB", "MiB", "GiB", "TiB"]
        var value = Double(bytes)
        var unit = 0
        while value >= 1024, unit < units.count - 1 { value /= 1024; unit += 1 }
        return unit == 0 ? "\(bytes) B" : String(format: "%.1f", value) + " " + units[unit]
    }

    /// Parses `4096`, `500K`, `2M`, `1.5G` or `1T` (binary multiples), as a command line takes them.
    public static func parse(_ text: String) -> UInt64? {
        let trimmed = text.trimmingCharacters(in: .whitespaces).uppercased()
        let multipliers: [Character: Double] = ["K": 0x1p10, "M": 0x1p20, "G": 0x1p30, "T": 0x1p40]
        var number = Substring(trimmed)
        if number.hasSuffix("IB") { number = number.dropLast(2) } else if number.hasSuffix("B") { number = number.dropLast() }
        var multiplier = 1.0
        if let last = number.last, let scale = multipliers[last] { multiplier = scale; number = number.dropLast() }
        guard let value = Double(number), value >= 0, value.isFinite else { return nil }
        let bytes = value * multiplier
        guard bytes < 1.8e19 else { return nil }
        return UInt64(bytes)
    }
}

extension String {
    func leftPadded(to width: Int) -> String {
        count >= width ? self : String(repeating: " ", count: width - count) + self
    }
}
