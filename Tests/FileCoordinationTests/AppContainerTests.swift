import FileCoordination
import Foundation
import XCTest

/// `AppContainer` reads what `containerfs run` sets, as Foundation's directories do on Apple's systems.
final class AppContainerTests: XCTestCase {
    func testDirectoriesAndGroupContainersFollowTheEnvironment() throws {
        let groups = FileManager.default.temporaryDirectory.appendingPathComponent("groups-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: groups.appendingPathComponent("group.com.example.shared"), withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: groups) }
        let app = AppContainer(environment: ["HOME": "/var/mobile/Containers/Data/Application/com.example.notes",
                                             "TMPDIR": "/var/mobile/Containers/Data/Application/com.example.notes/tmp",
                                             AppContainer.appIDVariable: "com.example.notes",
                                             AppContainer.groupContainersVariable: groups.path])
        XCTAssertEqual(app.appID, "com.example.notes")
        XCTAssertEqual(app.applicationSupport.path, "/var/mobile/Containers/Data/Application/com.example.notes/Library/Application Support")
        XCTAssertEqual(app.containerURL(forSecurityApplicationGroupIdentifier: "group.com.example.shared")?.path,
                       groups.path + "/group.com.example.shared")
        // A group the app is not in, and names that would lead elsewhere, give nil as on Apple's systems.
        for identifier in ["group.com.example.other", "", ".", "..", "../groups"] {
            XCTAssertNil(app.containerURL(forSecurityApplicationGroupIdentifier: identifier), identifier)
        }
        XCTAssertNil(AppContainer(environment: ["HOME": "/home/u"]).containerURL(forSecurityApplicationGroupIdentifier: "group.com.example.shared"))
    }
}
