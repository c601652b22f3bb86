import Containers
import Foundation
import Glibc
import XCTest

/// A daemon killed in the middle of heavy writes loses nothing that was published and tears
/// nothing (container-semantics.md, section 4).
final class CrashTests: MountedTestCase {
    func testKillingTheDaemonDuringWritesLeavesEveryFileOldOrNew() throws {
        let files = 40
        sh("for i in $(seq 1 \(files)); do echo old-$i > Documents/f$i; done")
        // Writers rewrite every file with a large new version, over and over, until the daemon dies.
        // Rewrites in place and by editor-style rename, with creations and deletions around them.
        let writer = """
        import os, sys
        n = \(files)
        pid = os.getpid()
        while True:
            for i in range(1, n + 1):
                try:
                    content = ''.join(f'new-{i}-' + 'x' * 1000 + '\\n' for _ in range(64))
                    if i % 2:
                        with open(f'Documents/f{i}', 'w') as f:
                            f.write(content)
                    else:
                        with open(f'Documents/.f{i}.{pid}', 'w') as f:
                            f.write(content)
                        os.rename(f'Documents/.f{i}.{pid}', f'Documents/f{i}')
                    with open(f'Documents/scratch-{pid}-{i}', 'w') as f:
                        f.write('scratch')
                    os.unlink(f'Documents/scratch-{pid}-{i}')
                except OSError:
                    sys.exit(0)
        """
        let writers = (0..<2).map { _ -> Process in
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
            process.arguments = ["-c", writer]
            process.currentDirectoryURL = URL(fileURLWithPath: home)
            process.standardError = FileHandle.nullDevice
            try? process.run()
            return process
        }
        usleep(800_000)
        let deadDaemon = mounted.daemonPID!
        mounted.crashDaemon()
        for process in writers {
            let deadline = Date().addingTimeInterval(10)
            while process.isRunning && Date() < deadline { usleep(20_000) }
            if process.isRunning { process.terminate() }
        }
        try mounted.remount()

        let complete = (1...files).map { "new-\($0)-" + String(repeating: "x", count: 1000) + "\n" }
        var rewritten = 0
        for index in 1...files {
            let content = try String(contentsOfFile: home + "/Documents/f\(index)", encoding: .utf8)
            if content == "old-\(index)\n" { continue }
            XCTAssertEqual(content, String(repeating: complete[index - 1], count: 64), "Documents/f\(index) is torn")
            rewritten += 1
        }
        XCTAssertGreaterThan(rewritten, 0, "the writers had published something before the crash")
        XCTAssertFalse(FileManager.default.fileExists(atPath: mounted.store.workPath + "/shadows/\(deadDaemon)"),
                       "the dead daemon's shadows are removed at the next mount")
        XCTAssertFalse(FileManager.default.fileExists(atPath: "/run/containerfs/\(deadDaemon).sock"),
                       "and so is its control socket")
        let check = Shell.run("\(Shell.quote(MountedStore.executable)) check \(Shell.quote(mounted.store.root))")
        XCTAssertEqual(check.status, 0, "the store passes its own check: \(check.output)")
        print("crash test: \(files) files checked, \(rewritten) new, \(files - rewritten) old, 0 torn; store consistent")
    }
}
