import Foundation
import Glibc
import XCTest

/// Readers of atomically replaced files read their version through FUSE passthrough where the
/// kernel (6.9 and later) and the daemon's privileges allow: the kernel reads the file itself. The
/// kernel fails any open of an inode in passthrough that is not one too, and refuses passthrough
/// while another open caches, so these tests mix the kinds of open.
final class PassthroughTests: MountedTestCase {
    /// Whether this kernel and user can have passthrough at all; the tests that need it skip, saying
    /// why, where they cannot.
    private func requirePassthrough() throws {
        guard geteuid() == 0 else { throw XCTSkip("passthrough needs a daemon with CAP_SYS_ADMIN; these tests run as uid \(geteuid())") }
        var name = utsname()
        uname(&name)
        let release = withUnsafeBytes(of: &name.release) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        let parts = release.split(whereSeparator: { !$0.isNumber }).prefix(2).compactMap { Int($0) }
        guard parts.count == 2, (parts[0], parts[1]) >= (6, 9) else {
            throw XCTSkip("FUSE passthrough needs Linux 6.9 or later; this is \(release)")
        }
    }

    func testAReaderReadsItsVersionWhileTheDaemonIsStopped() throws {
        try requirePassthrough()
        let (finishedAlone, status) = try readWhileTheDaemonIsStopped(waiting: 8)
        XCTAssertTrue(finishedAlone, "the read waited for the stopped daemon")
        XCTAssertEqual(status, 0, "3: it read wrong bytes")
    }

    func testNoPassthroughReadsThroughTheDaemon() throws {
        try remountWithoutPassthrough()
        let (finishedAlone, status) = try readWhileTheDaemonIsStopped(waiting: 2)
        XCTAssertFalse(finishedAlone, "-o no_passthrough: the read should have needed the daemon")
        XCTAssertEqual(status, 0, "3: it read wrong bytes")
    }

    /// A reader opens a new file, then reads it whole while the daemon is stopped (SIGSTOP) for at
    /// most `seconds`. Whether it finished meanwhile, and its exit status once the daemon went on.
    private func readWhileTheDaemonIsStopped(waiting seconds: Double) throws -> (finishedAlone: Bool, status: Int32) {
        let expected = "/tmp/\(ProcessInfo.processInfo.processIdentifier).expected"
        sh("head -c 3000000 /dev/urandom > Documents/big && cp Documents/big \(expected)")
        defer { unlink(expected) }
        let daemon = mounted.daemonPID!
        let script = """
        import os, sys, time
        f = os.open('Documents/big', os.O_RDONLY)
        print('open', flush=True)
        sys.stdin.readline()
        got = bytearray()
        while chunk := os.read(f, 1 << 16): got += chunk
        sys.exit(0 if bytes(got) == open('\(expected)', 'rb').read() else 3)
        """
        let reader = Process()
        reader.executableURL = URL(fileURLWithPath: "/usr/bin/timeout")
        reader.arguments = ["30", "python3", "-c", script]
        reader.currentDirectoryURL = URL(fileURLWithPath: home)
        let input = Pipe(), output = Pipe()
        reader.standardInput = input
        reader.standardOutput = output
        try reader.run()
        XCTAssertTrue(String(decoding: output.fileHandleForReading.availableData, as: UTF8.self).hasPrefix("open"))
        kill(daemon, SIGSTOP)
        input.fileHandleForWriting.write(Data("go\n".utf8))
        let deadline = Date(timeIntervalSinceNow: seconds)
        while reader.isRunning && Date() < deadline { usleep(20_000) }
        let finishedAlone = !reader.isRunning
        kill(daemon, SIGCONT)
        reader.waitUntilExit()
        return (finishedAlone, reader.terminationStatus)
    }

    /// A program that makes a file and writes it in place (a database made for reading and writing
    /// in Documents, any new file in tmp) writes through passthrough from its first write: the
    /// daemon writes none of the bytes (its written-bytes count stays far below them), and what is
    /// read back, through the mount and a second handle, is what was written.
    func testAFileMadeToBeWrittenInPlaceIsWrittenThroughPassthrough() throws {
        try requirePassthrough()
        let daemon = mounted.daemonPID!
        func daemonWrittenBytes() -> Int {
            let io = (try? String(contentsOfFile: "/proc/\(daemon)/io", encoding: .utf8)) ?? ""
            return io.split(separator: "\n").first { $0.hasPrefix("wchar:") }.flatMap { Int($0.dropFirst(6).trimmingCharacters(in: .whitespaces)) } ?? -1
        }
        for (path, flags) in [("Documents/made.db", "os.O_RDWR"), ("tmp/made.bin", "os.O_WRONLY")] {
            let before = daemonWrittenBytes()
            syscall("""
            data = os.urandom(1 << 16) * 64
            f = os.open('\(path)', os.O_CREAT | \(flags), 0o644)
            for offset in range(0, len(data), 1 << 16): os.pwrite(f, data[offset:offset + (1 << 16)], offset)
            os.fsync(f)
            other = os.open('\(path)', os.O_RDONLY)
            if os.pread(other, len(data), 0) != data: raise OSError(errno.EIO, 'read back differs')
            os.close(other)
            os.close(f)
            if open('\(path)', 'rb').read() != data: raise OSError(errno.EIO, 'differs after close')
            """, errno: 0)
            let written = daemonWrittenBytes() - before
            XCTAssertGreaterThanOrEqual(before, 0, "no /proc/PID/io")
            XCTAssertLessThan(written, 1 << 20, "\(path): the daemon wrote \(written) bytes of the 4 MiB itself")
        }
    }

    func testReadersOfEveryKindMixWithoutErrors() throws { try onBothReadPaths(checkReadersOfEveryKindMix) }

    private func checkReadersOfEveryKindMix() {
        // A reader during a write session reads through the daemon, and so do readers after it while
        // it is open: its private mapping fills the page cache with its version. Once it has closed,
        // readers read through passthrough (or the page cache) again.
        sh("printf one > Documents/m")
        syscall("""
        writer = open('Documents/m', 'w')
        writer.write('two')
        during = open('Documents/m', 'rb')
        writer.close()
        after = [open('Documents/m', 'rb') for _ in range(3)]
        assert during.read() == b'one' and all(r.read() == b'two' for r in after)
        mapped = mmap.mmap(during.fileno(), 3, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
        assert mapped[:] == b'one'
        later = open('Documents/m', 'rb')
        assert later.read() == b'two'
        for r in after + [later]: r.close()
        mapped.close(); during.close()
        alone = [open('Documents/m', 'rb') for _ in range(2)]
        assert all(r.read() == b'two' for r in alone)
        with open('Documents/m', 'w') as rewrite: rewrite.write('three')
        assert all(r.seek(0) == 0 and r.read() == b'two' for r in alone)
        assert open('Documents/m', 'rb').read() == b'three'
        """, errno: 0)
    }

    func testAWriterInPlaceGetsPastReadersOfTheVersion() {
        // Hard-linked while a reader has the file open, the file is now written in place; the
        // writer must not share the kernel's inode with the reader's passthrough.
        sh("printf before > Documents/h")
        syscall("""
        reader = open('Documents/h', 'rb', buffering=0)
        assert reader.read(3) == b'bef'
        os.link('Documents/h', 'Documents/h2')
        with open('Documents/h', 'r+b') as writer: writer.write(b'AFTER!')
        assert open('Documents/h2', 'rb').read() == b'AFTER!'
        reader.close()
        """, errno: 0)
    }
}
