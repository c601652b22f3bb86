import Foundation
import Glibc
import XCTest

/// Readers of atomically replaced files keep their version whatever the kernel hears about the
/// file meanwhile (docs/atomic-replace.md); files written in place keep their cached
/// pages while they do not change.
final class PageCacheTests: MountedTestCase {
    /// Python that counts the pages of a file the kernel holds (mincore on a mapping).
    private let residentPages = """
    def resident(path):
        libc = ctypes.CDLL(None, use_errno=True)
        with open(path, 'rb') as f:
            size = os.fstat(f.fileno()).st_size
            m = mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            pages = (size + 4095) // 4096
            vec = (ctypes.c_ubyte * pages)()
            start = ctypes.c_char.from_buffer(m)
            libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
            assert libc.mincore(ctypes.addressof(start), size, vec) == 0, ctypes.get_errno()
            del start
            count = sum(b & 1 for b in vec)
            m.close()
            return count
    """

    func testAReaderKeepsItsVersionThroughAWholeWriteSession() throws { try onBothReadPaths(checkAReaderKeepsItsVersionThroughAWholeWriteSession) }
    func testACachedReaderKeepsItsVersionWhenTruncatedByName() throws { try onBothReadPaths(checkACachedReaderKeepsItsVersionWhenTruncatedByName) }
    func testReadersAfterAPublishSeeTheNewVersionNotTheOldPages() throws { try onBothReadPaths(checkReadersAfterAPublishSeeTheNewVersionNotTheOldPages) }
    func testRewritesWhileReadersReadInPiecesNeitherFailNorCutReadsShort() throws { try onBothReadPaths(checkRewritesWhileReadersReadInPiecesNeitherFailNorCutReadsShort) }

    private func checkAReaderKeepsItsVersionThroughAWholeWriteSession() {
        // Made in the store, so that no write session of the mount is still ending.
        XCTAssertTrue(FileManager.default.createFile(atPath: mounted.backing() + "/Documents/v",
                                                     contents: Data((0..<16384).flatMap { _ in (0...255).map { UInt8($0) } })))
        syscall("""
        import subprocess
        old = bytes(range(256)) * 16384
        reader = open('Documents/v', 'rb', buffering=0)
        got = bytearray()
        def read(count):
            chunk = reader.read(count)
            assert len(chunk) == min(count, len(old) - len(got)), ('cut short at', len(got), len(chunk))
            got.extend(chunk)
        read(100000)
        writer = open('Documents/v', 'wb')
        read(100000)
        writer.write(b'new' * 10)
        writer.flush()
        os.stat('Documents/v')  # the kernel hears the shadow's size
        read(1000000)
        writer.write(b'x' * 5000000)
        writer.flush()
        subprocess.run(['stat', 'Documents/v'], capture_output=True)
        read(1000000)
        writer.close()
        subprocess.run(['stat', 'Documents/v'], capture_output=True)
        read(1 << 30)
        assert reader.read(1 << 20) == b''
        assert got == old
        reader.close()
        assert open('Documents/v', 'rb').read() == b'new' * 10 + b'x' * 5000000
        """, errno: 0)
    }

    func testDocumentsReadersKeepCachedPagesWhileTheFileIsUnchanged() throws {
        try remountWithoutPassthrough()
        XCTAssertTrue(FileManager.default.createFile(atPath: mounted.backing() + "/Documents/c", contents: Data(repeating: 65, count: 1_000_000)))
        sh("cat Documents/c > /dev/null")
        syscall(residentPages + """

        assert resident('Documents/c') > 200
        """, errno: 0)
    }

    private func checkACachedReaderKeepsItsVersionWhenTruncatedByName() {
        XCTAssertTrue(FileManager.default.createFile(atPath: mounted.backing() + "/Documents/t", contents: Data(repeating: 66, count: 300_000)))
        syscall("""
        reader = open('Documents/t', 'rb', buffering=0)
        first = reader.read(1000)
        os.truncate('Documents/t', 10)  # retried by the kernel on a node of its own
        assert os.stat('Documents/t').st_size == 10
        rest = reader.read(1 << 20)
        assert first + rest == b'B' * 300000, len(first + rest)
        assert os.fstat(reader.fileno()).st_size == 300000
        reader.close()
        assert open('Documents/t', 'rb').read() == b'B' * 10
        """, errno: 0)
    }

    private func checkReadersAfterAPublishSeeTheNewVersionNotTheOldPages() {
        XCTAssertTrue(FileManager.default.createFile(atPath: mounted.backing() + "/Documents/p", contents: Data(repeating: 67, count: 200_000)))
        syscall("""
        old = open('Documents/p', 'rb')
        assert old.read(4096) == b'C' * 4096
        for round in range(20):
            with open('Documents/p', 'wb') as writer:
                writer.write(bytes([68 + round % 20]) * (100000 + round))
            with open('Documents/p', 'rb') as reader:
                assert reader.read() == bytes([68 + round % 20]) * (100000 + round), round
        assert old.read() == b'C' * (200000 - 4096)
        old.close()
        with open('Documents/p', 'rb') as reader:
            assert reader.read() == bytes([68 + 19]) * 100019
        """, errno: 0)
    }

    private func checkRewritesWhileReadersReadInPiecesNeitherFailNorCutReadsShort() {
        // stress.py's ops 11 and 12 in brief: every writer's open must get through the readers'
        // node (ESTALE, retried by the kernel), and no reader may see a size that is not its version's.
        syscall("""
        import multiprocessing, random, time
        path = 'Documents/rewritten'
        def body(n): return b'%d:' % n + b'w' * n
        open(path, 'wb').write(body(1000))
        def reader(seed, failures):
            rng = random.Random(seed)
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                with open(path, 'rb', buffering=0) as f:
                    content = bytearray()
                    while chunk := f.read(rng.choice((4096, 65536))):
                        content += chunk
                        if rng.random() < 0.3: os.stat(path)
                header, _, rest = bytes(content).partition(b':')
                if int(header) != len(rest): failures.put('cut at %d of %s' % (len(rest), header))
        def writer(failures):
            rng = random.Random(7)
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                try:
                    with open(path, 'wb') as f: f.write(body(rng.randrange(1, 300000)))
                except OSError as error:
                    failures.put('writer: %s' % error)
        failures = multiprocessing.Queue()
        workers = [multiprocessing.Process(target=reader, args=(n, failures)) for n in range(3)]
        workers.append(multiprocessing.Process(target=writer, args=(failures,)))
        for w in workers: w.start()
        for w in workers: w.join()
        assert all(w.exitcode == 0 for w in workers), [w.exitcode for w in workers]
        found = []
        while not failures.empty(): found.append(failures.get())
        assert not found, found[:5]
        """, errno: 0)
    }

    func testAppendsLandAtTheEndWhileAnOlderReaderSeeksToItsEnd() {
        // tail -f on a log while a program appends to it: an appender shares the file live, so the
        // reader's seek to its end finds each append, as on a local disk, and appends stay at the end.
        XCTAssertTrue(FileManager.default.createFile(atPath: mounted.backing() + "/Documents/log", contents: Data("line 1\n".utf8)))
        syscall("""
        reader = os.open('Documents/log', os.O_RDONLY)
        writer = open('Documents/log', 'ab', buffering=0)
        for number in range(2, 6):
            writer.write(b'line %d\\n' % number)
            assert os.lseek(reader, 0, os.SEEK_END) == 7 * number
        writer.close()
        os.close(reader)
        assert open('Documents/log', 'rb').read() == b''.join(b'line %d\\n' % n for n in range(1, 6))
        """, errno: 0)
    }

    func testAChangeBehindTheDaemonsBackIsNotServedFromTheCache() throws {
        sh("printf 'AAAA' > tmp/behind && cat tmp/behind")
        // Same inode and size: only the modification time tells.
        let descriptor = Glibc.open(mounted.backing() + "/tmp/behind", O_WRONLY)
        XCTAssertGreaterThanOrEqual(descriptor, 0)
        var times = [timespec(tv_sec: 1_000_000, tv_nsec: 0), timespec(tv_sec: 1_000_000, tv_nsec: 0)]
        XCTAssertEqual(pwrite(descriptor, "BBBB", 4, 0), 4)
        XCTAssertEqual(futimens(descriptor, &times), 0)
        close(descriptor)
        XCTAssertEqual(sh("cat tmp/behind"), "BBBB")
    }

    func testTmpKeepsItsCachedPagesToo() {
        // Made in the store: a write through the mount leaves the kernel its own modification time,
        // and its next look at the file's attributes drops the pages when it differs.
        XCTAssertTrue(FileManager.default.createFile(atPath: mounted.backing() + "/tmp/c", contents: Data(repeating: 65, count: 1_000_000)))
        sh("cat tmp/c > /dev/null")
        syscall(residentPages + """

        assert resident('tmp/c') > 200
        """, errno: 0)
    }
}
