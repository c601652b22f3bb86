import Foundation
import XCTest

/// The daemon holds descriptors on directories only: listing more files than its descriptor limit
/// works, and files it reaches by name stay reachable when renamed or unlinked through the mount.
final class DescriptorTests: MountedTestCase {
    static let limit = 256
    static let files = 1500

    override func setUpWithError() throws {
        mounted = try MountedStore(descriptorLimit: Self.limit) { store in
            let folder = store.containerPath(.init(SampleApps.notes)!) + "/Documents/many"
            try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
            for index in 0..<Self.files {
                let descriptor = open(folder + "/f\(index)", O_WRONLY | O_CREAT | O_CLOEXEC, 0o644)
                guard descriptor >= 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno)!) }
                close(descriptor)
            }
        }
    }

    private var daemonDescriptors: Int {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(mounted.daemonPID!)/fd").count) ?? -1
    }

    func testListingMoreFilesThanTheDescriptorLimit() {
        // lstat each name: the kernel keeps every inode it looked up, and the daemon a node for each.
        syscall("""
        names = os.listdir('Documents/many')
        assert len(names) == \(Self.files), len(names)
        for name in names:
            os.lstat('Documents/many/' + name)
        """, errno: 0)
        XCTAssertEqual(sh("find Documents/many -ls | wc -l").trimmingCharacters(in: .whitespacesAndNewlines),
                       "\(Self.files + 1)")
        XCTAssertLessThan(daemonDescriptors, 64)
        // Still answering new requests.
        sh("echo more > Documents/many/extra && cat Documents/many/extra")
    }

    func testTheTableShrinksWhenTheKernelForgets() throws {
        // Enough files for the node table to rebuild its index and give memory back once the
        // kernel forgets them; a file open meanwhile keeps its node, and everything still answers.
        let folder = mounted.backing() + "/Documents/more"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        for index in 0..<12_000 {
            close(open(folder + "/f\(index)", O_WRONLY | O_CREAT | O_CLOEXEC, 0o644))
        }
        syscall("""
        kept = open('Documents/many/f1', 'rb')
        for name in os.listdir('Documents/more'):
            os.lstat('Documents/more/' + name)
        os.system('sync; echo 2 > /proc/sys/vm/drop_caches')
        assert os.fstat(kept.fileno()).st_ino == os.stat('Documents/many/f1').st_ino
        assert len(os.listdir('Documents/more')) == 12000
        os.lstat('Documents/more/f11999')
        """, errno: 0)
        sh("echo after > Documents/more/new && cat Documents/more/new")
    }

    /// The daemon's descriptors on items whose last name is gone.
    private var descriptorsOnDeletedItems: Int {
        let folder = "/proc/\(mounted.daemonPID!)/fd/"
        let descriptors = (try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? []
        return descriptors.filter {
            (try? FileManager.default.destinationOfSymbolicLink(atPath: folder + $0))?.hasSuffix(" (deleted)") ?? false
        }.count
    }

    func testUnlinkedFilesLeaveNoDescriptorBehind() {
        // Each unlinked file's node holds a descriptor on it until the kernel forgets the node: more
        // files than the daemon's descriptor limit, so descriptors never closed would pile up.
        syscall("""
        kept = os.open('Documents/many/f0', os.O_RDONLY)
        for index in range(600):
            os.lstat(f'Documents/many/f{index}')
            os.unlink(f'Documents/many/f{index}')
        os.system('sync; echo 2 > /proc/sys/vm/drop_caches')
        assert os.fstat(kept).st_nlink == 0
        os.close(kept)
        """, errno: 0)
        // Closed on a background queue, a little after the kernel's forget.
        let deadline = Date() + 10
        while descriptorsOnDeletedItems > 0, Date() < deadline { usleep(20_000) }
        XCTAssertEqual(descriptorsOnDeletedItems, 0)
        XCTAssertEqual(sh("ls Documents/many | wc -l").trimmingCharacters(in: .whitespacesAndNewlines), "\(Self.files - 600)")
    }

    func testRenamedAndUnlinkedFilesStayReachable() {
        syscall("""
        fd = os.open('Documents/kept', os.O_RDWR | os.O_CREAT, 0o600)
        os.write(fd, b'12345')
        os.rename('Documents/kept', 'Documents/many/moved')
        assert os.fstat(fd).st_size == 5
        assert os.stat('Documents/many/moved').st_size == 5
        os.unlink('Documents/many/moved')
        assert os.fstat(fd).st_size == 5
        assert os.pread(fd, 5, 0) == b'12345'
        os.close(fd)
        fd = os.open('Documents/many/f3', os.O_RDONLY)
        os.unlink('Documents/many/f3')
        assert os.fstat(fd).st_nlink == 0
        os.close(fd)
        """, errno: 0)
        syscall("""
        os.link('Documents/hello.txt', 'Documents/other')
        os.stat('Documents/other')
        os.unlink('Documents/hello.txt')
        assert os.stat('Documents/other').st_nlink == 1
        assert open('Documents/other').read() == 'hello\\n'
        """, errno: 0)
        // A file written through a shadow and replaced over: the one open stays whole.
        syscall("""
        fd = os.open('Documents/many/f1', os.O_RDONLY)
        with open('Documents/new', 'w') as f: f.write('new')
        os.rename('Documents/new', 'Documents/many/f1')
        assert os.fstat(fd).st_size == 0
        assert open('Documents/many/f1').read() == 'new'
        os.close(fd)
        """, errno: 0)
        // Renamed behind the daemon's back: found again under the new name.
        let backing = mounted.backing() + "/Documents/many"
        sh("stat Documents/many/f2 >/dev/null")
        XCTAssertEqual(rename(backing + "/f2", backing + "/g2"), 0)
        sh("stat Documents/many/g2 >/dev/null")
    }
}
