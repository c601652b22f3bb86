import Foundation
import XCTest
@testable import Containers

final class StoreCheckTests: XCTestCase {
    func testFindsAndRepairsWhatIsSafeToRepair() throws {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("check-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: root) }
        let bundle = root.appendingPathComponent("Check.app")
        try FileManager.default.createDirectory(at: bundle, withIntermediateDirectories: true)
        try "<plist/>".write(to: bundle.appendingPathComponent("Info.plist"), atomically: false, encoding: .utf8)
        let store = try Store.openOrCreate(root.appendingPathComponent("store").path)
        let id = AppID("com.example.check")!
        try Installer.install(bundle: bundle.path, into: store, id: id)
        XCTAssertEqual(StoreCheck.problems(in: store).map(\.description), [])

        try FileManager.default.removeItem(atPath: store.containerPath(id) + "/Library/Caches")
        try FileManager.default.createDirectory(atPath: store.workPath + "/install-com.example.check-999999-12345",
                                                withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: store.workPath + "/shadows/999999", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: store.containersPath + "/com.example.orphan", withIntermediateDirectories: true)
        let problems = StoreCheck.problems(in: store)
        XCTAssertEqual(problems.count, 4, problems.map(\.description).joined(separator: "\n"))
        XCTAssertEqual(problems.filter { $0.repair == nil }.count, 1, "an orphaned container may hold data: a person decides")

        for problem in problems { try problem.repair?() }
        XCTAssertEqual(StoreCheck.problems(in: store).map(\.description),
                       ["containers/com.example.orphan: a container without an app record (a failed install or uninstall); reinstall the app, or remove the container after saving what you need from it."])
        XCTAssertTrue(FileManager.default.fileExists(atPath: store.containerPath(id) + "/Library/Caches"))
    }

    func testScratchNamesTellTheirProcess() {
        XCTAssertEqual(StoreCheck.scratchOwner("install-com.example.a-1234-987654"), 1234)
        XCTAssertEqual(StoreCheck.scratchOwner("deliver-77-1"), 77)
        XCTAssertNil(StoreCheck.scratchOwner("mounts"))
        XCTAssertNil(StoreCheck.scratchOwner("demo-bundles"))
    }
}
