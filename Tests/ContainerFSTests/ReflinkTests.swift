import Foundation
import XCTest

/// A store on XFS, which reflinks: a rewrite's shadow is a reflink of the file, so the version it
/// replaces and the new one share their unchanged blocks (docs/atomic-replace.md, "Write sessions").
final class ReflinkTests: LoopImageTestCase {
    override var makeFileSystem: String { "mkfs.xfs -q -f" }
    /// Files from 64 KiB on are large: where the store could not reflink them, their write-only
    /// changes would be logged and applied in place, which keeps no version.
    override var mountArguments: [String] { ["-o", "large_file=65536"] }

    func testEveryRewriteOfALargeFileSharesItsUnchangedBlocksWithTheVersionItReplaced() throws {
        sh("head -c 1048576 /dev/urandom > Documents/data.bin")
        let backing = mounted.backing() + "/Documents/data.bin"
        for round in 1...2 {
            // Write-only, so a rewrite (dd with seek= opens to read and write: shared live).
            syscall("f = os.open('Documents/data.bin', os.O_WRONLY); os.pwrite(f, b'x', \(round * 5000)); os.close(f)", errno: 0)
            let extents = Shell.run("sync && filefrag -v \(Shell.quote(backing))")
            XCTAssertEqual(extents.status, 0, extents.error)
            XCTAssertTrue(extents.output.contains("shared"), "rewrite \(round) shares no block with the version it replaced:\n\(extents.output)")
        }
        XCTAssertEqual(sh("od -An -c -j 10000 -N 1 Documents/data.bin").trimmingCharacters(in: .whitespacesAndNewlines), "x")
    }
}
