import Crypto
import Foundation
import XCTest
@testable import Containers

final class BackupTests: XCTestCase {
    /// Everything about a tree that a restore must bring back, keyed by relative path.
    private func snapshot(_ root: String) throws -> [String: String] {
        var result: [String: String] = [:]
        try FileTree.walk(DirectoryHandle(path: root)) { entry in
            var line = "\(entry.kind) mode \(String(entry.info.st_mode & 0o7777, radix: 8))"
            switch entry.kind {
            case .file:
                let fd = try entry.parent.openFile(entry.name)
                defer { close(fd) }
                let digest = try FileHasher().sha256(fd: fd, path: entry.fullPath, progress: nil)
                line += " mtime \(entry.info.st_mtim.nanoseconds) sha \(digest.hex)"
                line += " xattrs \(try Backup.userXattrs(fd, path: entry.fullPath).map { "\($0.name)=\(String(decoding: $0.value, as: UTF8.self))" })"
            case .directory:
                let directory = try DirectoryHandle(in: entry.parent, entry.name)
                line += " mtime \(entry.info.st_mtim.nanoseconds)"
                line += " xattrs \(try Backup.userXattrs(directory.fd, path: entry.fullPath).map { "\($0.name)=\(String(decoding: $0.value, as: UTF8.self))" })"
            case .symlink:
                line += " -> \(try entry.parent.readLink(entry.name))"
            case .other:
                break
            }
            result[entry.path] = line
            return true
        }
        return result
    }

    /// A container with data worth keeping, things to leave out, and odd modes.
    private func fillContainer(_ box: Sandbox) throws {
        let c = box.container
        try box.write("Documents/notes/today.txt", "buy milk", under: c, mode: 0o640)
        try box.write("Documents/notes/archive/2025.txt", "old notes", under: c, mode: 0o600)
        try box.setXattr(c + "/Documents/notes/today.txt", "user.color", "blue")
        try box.setXattr(c + "/Documents/notes", "user.sort", "by-date")
        var big = [UInt8](repeating: 7, count: 2 << 20)
        big[12345] = 1
        try Data(big).write(to: URL(fileURLWithPath: c + "/Documents/photo.raw"))
        try box.write("Documents/tool.sh", "#!/bin/sh\n", under: c, mode: 0o755)
        XCTAssertEqual(symlink("notes/today.txt", c + "/Documents/latest"), 0)
        XCTAssertEqual(chmod(c + "/Documents/notes/archive", 0o555), 0)
        try box.write("Documents/Inbox/handed.pdf", "pdf", under: c, mode: 0o444)
        try box.write("Library/Preferences/com.example.notes.plist", "<plist/>", under: c)
        try box.setXattr(c + "/Library/Preferences/com.example.notes.plist", "user.containerfs.in-place", "1")
        try box.write("Library/Application Support/db.sqlite", "rows", under: c)
        // Left out: marked files and folders, caches and tmp.
        try box.write("Documents/movie.mov", "huge", under: c)
        try box.setXattr(c + "/Documents/movie.mov", Backup.excludeAttribute, "1")
        try box.write("Library/Application Support/Downloads/a.bin", "re-downloadable", under: c)
        try box.setXattr(c + "/Library/Application Support/Downloads", Backup.excludeAttribute, "true")
        try box.write("Documents/kept.txt", "unmarked by 0", under: c)
        try box.setXattr(c + "/Documents/kept.txt", Backup.excludeAttribute, "0")
        try box.write("Library/Caches/thumb.jpg", "cache", under: c)
        try box.write("tmp/scratch", "tmp", under: c)
        // Fix directory times last: writing inside a directory changes its mtime.
        var times = [timespec(tv_sec: 1_700_000_000, tv_nsec: 5), timespec(tv_sec: 1_700_000_000, tv_nsec: 5)]
        XCTAssertEqual(utimensat(AT_FDCWD, c + "/Documents/notes", &times, 0), 0)
    }

    func testBackupAndRestoreRoundTripWithExclusions() throws {
        let box = try Sandbox(self)
        try box.install()
        try fillContainer(box)
        var expected = try snapshot(box.container).filter { !$0.key.hasPrefix(box.bundleName) && !$0.key.hasPrefix("tmp/") }
        for left in ["Documents/movie.mov", "Library/Application Support/Downloads", "Library/Application Support/Downloads/a.bin",
                     "Library/Caches/thumb.jpg"] {
            XCTAssertNotNil(expected.removeValue(forKey: left), left)
        }
        let archive = box.root + "/notes.cfsbackup"
        let made = try Backup.create(store: box.store, id: box.id, archive: archive)
        XCTAssertEqual(made.excluded, ["Documents/movie.mov", "Library/Application Support/Downloads"])
        XCTAssertEqual(made.symlinks, 1)
        XCTAssertGreaterThan(made.bytes, 2 << 20)
        var archiveInfo = stat()
        XCTAssertEqual(stat(archive, &archiveInfo), 0)
        XCTAssertEqual(archiveInfo.st_mode & 0o777, 0o600)

        // The app carries on, then the user restores.
        try FileTree.remove(box.container + "/Documents/notes")
        try box.write("Documents/photo.raw", "overwritten", under: box.container)
        try box.write("Documents/new.txt", "made after the backup", under: box.container)
        let restored = try Backup.restore(store: box.store, id: box.id, archive: archive)
        XCTAssertEqual(restored.files, made.files)

        let after = try snapshot(box.container).filter { !$0.key.hasPrefix(box.bundleName) }
        XCTAssertEqual(after.filter { $0.key != "tmp" && $0.key != "Library/Caches" }, expected.filter { $0.key != "tmp" && $0.key != "Library/Caches" })
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: box.store.cachesPath(box.id)), [])
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: box.store.tmpPath(box.id)), [])
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: box.store.workPath), [])
        XCTAssertTrue(try Seal.verify(store: box.store, id: box.id).isIntact, "the bundle is not touched")
    }

    /// An archive with the given records, written the way `Backup.create` writes them.
    private func craft(_ path: String, _ records: [(BackupArchive.Tag, String, String)]) throws {
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        defer { close(fd) }
        let writer = ArchiveWriter(fd: fd, path: path)
        let now = timespec(tv_sec: 1_700_000_000, tv_nsec: 0)
        for (tag, name, payload) in records {
            try writer.write(BackupArchive.Header(tag: tag, path: name, mode: tag == .directory ? 0o755 : 0o644,
                                                  atime: now, mtime: now, xattrs: []))
            switch tag {
            case .file:
                let data = Array(payload.utf8)
                var pipe: [Int32] = [0, 0]
                XCTAssertEqual(Glibc.pipe(&pipe), 0)
                _ = data.withUnsafeBytes { write(pipe[1], $0.baseAddress, data.count) }
                close(pipe[1])
                try writer.writeData(from: pipe[0], size: UInt64(data.count), sourcePath: "pipe", progress: nil)
                close(pipe[0])
            case .symlink: try writer.writeTarget(payload)
            default: break
            }
        }
        try writer.finish()
    }

    func testRestoreRefusesEscapesAndLeavesTheContainerAlone() throws {
        let box = try Sandbox(self)
        try box.install()
        try box.write("Documents/mine.txt", "precious", under: box.container)
        let base: [(BackupArchive.Tag, String, String)] = [(.directory, "Documents", ""), (.directory, "Documents/sub", "")]
        let evil: [String: [(BackupArchive.Tag, String, String)]] = [
            "absolute path": [(.file, "/etc/evil", "x")],
            "dot-dot": [(.file, "Documents/../../evil", "x")],
            "outside Documents and Library": [(.file, "tmp/evil", "x")],
            "caches": [(.directory, "Library", ""), (.directory, "Library/Caches", "")],
            "absolute symlink": [(.symlink, "Documents/link", "/etc/passwd")],
            "escaping symlink": [(.symlink, "Documents/link", "../../../etc/passwd")],
            "escape through another symlink": [(.symlink, "Documents/sub/up", ".."), (.symlink, "Documents/link", "sub/up/../..")],
            "write through a symlink": [(.symlink, "Documents/sub/out", "../.."), (.file, "Documents/sub/out/evil", "x")],
            "duplicate": [(.file, "Documents/a", "1"), (.file, "Documents/a", "2")],
            "fixed directory as a file": [(.file, "Documents/Inbox", "not a folder")],
            "symlink loop": [(.symlink, "Documents/a", "b"), (.symlink, "Documents/b", "a")],
        ]
        for (name, records) in evil {
            let archive = box.root + "/evil.cfsbackup"
            try craft(archive, base + records)
            XCTAssertThrowsError(try Backup.restore(store: box.store, id: box.id, archive: archive), name) { error in
                XCTAssertTrue("\(error)".contains("Nothing was restored"), "\(name): \(error)")
            }
            XCTAssertEqual(box.read(box.container + "/Documents/mine.txt"), "precious", name)
            XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: box.store.workPath), [], name)
        }
        XCTAssertFalse(FileManager.default.fileExists(atPath: box.root + "/evil"))

        // Links that stay inside are fine, including into the bundle.
        let good = box.root + "/good.cfsbackup"
        try craft(good, base + [(.symlink, "Documents/sub/up", ".."), (.symlink, "Documents/plist", "../Notes.app/Info.plist"),
                                (.symlink, "Documents/self", "sub/up/sub")])
        try Backup.restore(store: box.store, id: box.id, archive: good)
        XCTAssertNil(box.read(box.container + "/Documents/mine.txt"))
        XCTAssertNotNil(box.read(box.container + "/Documents/plist"))
    }

    func testDamagedArchivesAndMountCheckAreRefused() throws {
        let box = try Sandbox(self)
        try box.install()
        try box.write("Documents/mine.txt", "precious", under: box.container)
        let archive = box.root + "/a.cfsbackup"
        try Backup.create(store: box.store, id: box.id, archive: archive)
        var bytes = try Data(contentsOf: URL(fileURLWithPath: archive))

        let truncated = box.root + "/truncated"
        try bytes.prefix(bytes.count - 10).write(to: URL(fileURLWithPath: truncated))
        let flipped = box.root + "/flipped"
        let offset = bytes.range(of: Data("precious".utf8))!.lowerBound
        bytes[offset] ^= 0x20
        try bytes.write(to: URL(fileURLWithPath: flipped))
        let notAnArchive = box.root + "/plain"
        try box.write("plain", "hello", under: box.root)

        try box.write("Documents/mine.txt", "changed since", under: box.container)
        for path in [truncated, flipped, notAnArchive] {
            XCTAssertThrowsError(try Backup.restore(store: box.store, id: box.id, archive: path), path)
            XCTAssertEqual(box.read(box.container + "/Documents/mine.txt"), "changed since")
        }
        XCTAssertThrowsError(try Backup.create(store: box.store, id: box.id, archive: box.container + "/Documents/self.cfsbackup"))
        XCTAssertThrowsError(try Backup.restore(store: box.store, id: box.id, archive: archive, mountCheck: { _, _ in
            throw ContainerError("mounted")
        }))
        XCTAssertEqual(box.read(box.container + "/Documents/mine.txt"), "changed since")
        try Backup.restore(store: box.store, id: box.id, archive: archive)
        XCTAssertEqual(box.read(box.container + "/Documents/mine.txt"), "precious")
    }
}
