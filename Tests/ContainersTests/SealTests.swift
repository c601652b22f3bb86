import Foundation
import XCTest
@testable import Containers

final class SealTests: XCTestCase {
    func testInstallSealsAnIntactBundle() throws {
        let box = try Sandbox(self)
        try box.install()
        let report = try Seal.verify(store: box.store, id: box.id)
        XCTAssertEqual(report.findings, [])
        XCTAssertTrue(report.isIntact)
        XCTAssertEqual(report.itemsChecked, 10)
        XCTAssertTrue(report.allowsReading("Frameworks/Engine.dylib"))

        var keyInfo = stat()
        XCTAssertEqual(stat(box.store.sealingKeyPath, &keyInfo), 0)
        XCTAssertEqual(keyInfo.st_mode & 0o777, 0o600)
        let manifest = try JSONDecoder.store.decode(SealManifest.self, from: Data(contentsOf: URL(fileURLWithPath: box.store.sealManifestPath(box.id))))
        XCTAssertEqual(manifest.items["Resources/Current"]?.target, "en.lproj")
        XCTAssertEqual(manifest.items["Frameworks/Engine.dylib"]?.size, 3 << 20)
        XCTAssertEqual(manifest.items["Resources/en.lproj"]?.kind, .directory)
        XCTAssertEqual(manifest.items["Notes"]?.mode, 0o755)
    }

    func testVerifyCatchesChangedAddedAndRemovedFiles() throws {
        let box = try Sandbox(self)
        try box.install()
        // Change one byte in the middle of the big file, keeping its size.
        let fd = open(box.bundle + "/Frameworks/Engine.dylib", O_WRONLY)
        XCTAssertEqual(pwrite(fd, "X", 1, 1 << 20), 1)
        close(fd)
        try box.write("Resources/Images/extra.png", "new", under: box.bundle)
        XCTAssertEqual(unlink(box.bundle + "/Resources/en.lproj/Localizable.strings"), 0)
        XCTAssertEqual(unlink(box.bundle + "/Resources/Current"), 0)
        XCTAssertEqual(symlink("/etc/passwd", box.bundle + "/Resources/Current"), 0)
        XCTAssertEqual(chmod(box.bundle + "/Info.plist", 0o666), 0)

        for depth in [Seal.Depth.full, .quick] {
            let report = try Seal.verify(store: box.store, id: box.id, depth: depth)
            XCTAssertEqual(report.findings, [
                SealFinding(path: "Frameworks/Engine.dylib", problem: .modified("contents changed")),
                SealFinding(path: "Info.plist", problem: .modified("mode changed from 644 to 666")),
                SealFinding(path: "Resources/Current", problem: .modified("symlink target changed from en.lproj to /etc/passwd")),
                SealFinding(path: "Resources/Images/extra.png", problem: .added),
                SealFinding(path: "Resources/en.lproj/Localizable.strings", problem: .removed),
            ], "depth \(depth)")
            XCTAssertFalse(report.isUntrusted)
            XCTAssertEqual(report.mismatchedPaths, ["Frameworks/Engine.dylib", "Info.plist", "Resources/Current", "Resources/Images/extra.png"])
            XCTAssertFalse(report.allowsReading("Frameworks/Engine.dylib"))
            XCTAssertTrue(report.allowsReading("Notes"))
        }
    }

    func testRemovedDirectoryIsReportedOnce() throws {
        let box = try Sandbox(self)
        try box.install()
        try FileTree.remove(box.bundle + "/Resources")
        try box.write("Resources", "now a file", under: box.bundle)
        let report = try Seal.check(store: box.store, id: box.id)
        XCTAssertEqual(report.findings, [SealFinding(path: "Resources", problem: .modified("was a directory, is now a file"))])
    }

    func testQuickCheckTrustsUntouchedInodesButFullCheckRehashes() throws {
        let box = try Sandbox(self)
        try box.install()
        // Forge the seal's hash for one file, as if the store's key had signed it: only a full check rehashes.
        var manifest = try JSONDecoder.store.decode(SealManifest.self, from: Data(contentsOf: URL(fileURLWithPath: box.store.sealManifestPath(box.id))))
        manifest.items["Notes"]?.sha256 = String(repeating: "0", count: 64)
        let bytes = try JSONEncoder.store.encode(manifest)
        try bytes.write(to: URL(fileURLWithPath: box.store.sealManifestPath(box.id)))
        let signature = try SealingKey.loadOrCreate(in: box.store).signature(for: bytes)
        try signature.base64EncodedString().write(toFile: box.store.sealSignaturePath(box.id), atomically: true, encoding: .utf8)

        XCTAssertTrue(try Seal.check(store: box.store, id: box.id).isIntact)
        XCTAssertEqual(try Seal.verify(store: box.store, id: box.id).mismatchedPaths, ["Notes"])
    }

    func testEditedManifestFailsItsSignature() throws {
        let box = try Sandbox(self)
        try box.install()
        let path = box.store.sealManifestPath(box.id)
        let text = try String(contentsOfFile: path, encoding: .utf8).replacingOccurrences(of: "\"mode\" : 493", with: "\"mode\" : 511")
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        let report = try Seal.verify(store: box.store, id: box.id)
        XCTAssertTrue(report.isUntrusted)
        XCTAssertFalse(report.allowsReading("Info.plist"))
        guard case .signatureInvalid = report.findings.first?.problem else { return XCTFail("\(report.findings)") }
        // The unsigned manifest still explains what differs.
        XCTAssertTrue(report.findings.contains(SealFinding(path: "Notes", problem: .modified("mode changed from 777 to 755"))))
    }

    func testMissingManifestAndMissingBundle() throws {
        let box = try Sandbox(self)
        try box.install()
        try FileTree.remove(box.bundle)
        XCTAssertEqual(try Seal.verify(store: box.store, id: box.id).findings, [SealFinding(path: "", problem: .bundleMissing)])
        XCTAssertEqual(unlink(box.store.sealManifestPath(box.id)), 0)
        let report = try Seal.verify(store: box.store, id: box.id)
        XCTAssertTrue(report.isUntrusted)
        guard case .manifestMissing = report.findings.first?.problem else { return XCTFail("\(report.findings)") }
    }

    func testReinstallReseals() throws {
        let box = try Sandbox(self)
        let source = try box.makeBundle()
        try Installer.install(bundle: source, into: box.store, id: box.id)
        try box.write("Notes", "#!/bin/sh\necho v2\n", under: source, mode: 0o755)
        try Installer.install(bundle: source, into: box.store, id: box.id)
        XCTAssertTrue(try Seal.verify(store: box.store, id: box.id).isIntact)
        XCTAssertEqual(box.read(box.bundle + "/Notes"), "#!/bin/sh\necho v2\n")
    }
}

final class ProgressTests: XCTestCase {
    final class Recorder: ProgressListener {
        var phases: [(String, Int64)] = []
        var advanced: Int64 = 0
        var ended = 0
        func begin(_ phase: String, totalUnits: Int64) { phases.append((phase, totalUnits)) }
        func advance(by units: Int64) { advanced += units }
        func end() { ended += 1 }
    }

    func testSealAndVerifyReportProgressAndStillSeeEveryFile() throws {
        let box = try Sandbox(self)
        let recorder = Recorder()
        try Installer.install(bundle: box.makeBundle(), into: box.store, id: box.id, progress: recorder)
        let report = try Seal.verify(store: box.store, id: box.id, progress: recorder)
        XCTAssertTrue(report.isIntact, "\(report.findings)")
        XCTAssertEqual(report.itemsChecked, 10)
        XCTAssertEqual(recorder.phases.map(\.0), ["Sealing Notes.app", "Verifying Notes.app"])
        let total = recorder.phases[0].1
        XCTAssertGreaterThan(total, 3 << 20)
        XCTAssertEqual(recorder.advanced, 2 * total)
        XCTAssertEqual(recorder.ended, 2)
    }

    func testBarText() {
        XCTAssertEqual(TerminalProgressBar.line(phase: "Sealing", done: 512, total: 1024, width: 80),
                       "Sealing [####################--------------------]  50%  512 B of 1.0 KiB")
        XCTAssertEqual(ByteCount.parse("2G"), 2 << 30)
        XCTAssertEqual(ByteCount.parse("1.5k"), 1536)
        XCTAssertEqual(ByteCount.parse("500MiB"), 500 << 20)
        XCTAssertNil(ByteCount.parse("ten"))
    }
}
