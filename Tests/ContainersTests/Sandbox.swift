import Foundation
import XCTest
@testable import Containers

/// A temporary directory with a store and a sample bundle; removed when the test ends.
final class Sandbox {
    let root: String
    let store: Store
    let id = AppID("com.example.notes")!
    let bundleName = "Notes.app"

    init(_ test: XCTestCase) throws {
        root = FileManager.default.temporaryDirectory.path + "/containerfs-test-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        store = try Store.openOrCreate(root + "/store")
        let root = self.root
        test.addTeardownBlock { try? FileTree.remove(root) }
    }

    var container: String { store.containerPath(id) }
    var bundle: String { container + "/" + bundleName }

    /// A bundle with nested folders, a symlink, an executable and a large-ish file.
    func makeBundle() throws -> String {
        let bundle = root + "/src/" + bundleName
        try write("Info.plist", "<plist><dict><key>CFBundleIdentifier</key><string>\(id)</string></dict></plist>", under: bundle)
        try write("Notes", "#!/bin/sh\necho notes\n", under: bundle, mode: 0o755)
        try write("Resources/en.lproj/Localizable.strings", "\"hello\" = \"Hello\";", under: bundle)
        try write("Resources/Images/icon.png", "PNG", under: bundle)
        var big = [UInt8](repeating: 0, count: 3 << 20)
        for index in stride(from: 0, to: big.count, by: 4096) { big[index] = UInt8(truncatingIfNeeded: index >> 12) }
        try FileManager.default.createDirectory(atPath: bundle + "/Frameworks", withIntermediateDirectories: true)
        try Data(big).write(to: URL(fileURLWithPath: bundle + "/Frameworks/Engine.dylib"))
        try FileManager.default.createSymbolicLink(atPath: bundle + "/Resources/Current", withDestinationPath: "en.lproj")
        return bundle
    }

    func install() throws {
        try Installer.install(bundle: makeBundle(), into: store, id: id)
    }

    func write(_ relative: String, _ text: String, under base: String, mode: Int = 0o644) throws {
        let path = base + "/" + relative
        try FileManager.default.createDirectory(atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        try Data(text.utf8).write(to: URL(fileURLWithPath: path))
        XCTAssertEqual(chmod(path, mode_t(mode)), 0)
    }

    func read(_ path: String) -> String? {
        FileManager.default.contents(atPath: path).map { String(decoding: $0, as: UTF8.self) }
    }

    func setXattr(_ path: String, _ name: String, _ value: String) throws {
        let fd = open(path, O_RDONLY | O_NOFOLLOW)
        guard fd >= 0 else { throw posixError("open", path) }
        defer { close(fd) }
        guard LinuxCalls.setXattr(fd, name, Array(value.utf8)) == 0 else { throw posixError("setxattr", path) }
    }
}
