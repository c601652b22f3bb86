import FUSELowLevel
import Glibc
import Synchronization

/// One version of a backing file, as far as the kernel's page cache needs to tell versions apart.
/// A class, so that a node that never needs one pays a pointer for it, not 64 bytes.
final class FileVersion: Equatable {
    let key: BackingKey
    let size: Int
    let modified: Int
    let modifiedNanoseconds: Int
    let changed: Int
    let changedNanoseconds: Int

    init(_ attributes: stat) {
        key = BackingKey(attributes)
        size = Int(attributes.st_size)
        modified = attributes.st_mtim.tv_sec
        modifiedNanoseconds = attributes.st_mtim.tv_nsec
        changed = attributes.st_ctim.tv_sec
        changedNanoseconds = attributes.st_ctim.tv_nsec
    }

    static func == (left: FileVersion, right: FileVersion) -> Bool {
        (left.key, left.size, left.modified, left.modifiedNanoseconds, left.changed, left.changedNanoseconds)
            == (right.key, right.size, right.modified, right.modifiedNanoseconds, right.changed, right.changedNanoseconds)
    }
}

/// How an open file uses the kernel's page cache.
enum CacheUse {
    /// Direct I/O: every read and write reaches the daemon.
    case bypass
    /// Through the cache, which the kernel empties at the open.
    case refill
    /// Through the cache, whose pages still match the file (`keep_cache`).
    case keep
}

/// How the kernel reaches the file of a handle that is not a write session's (`Node.openHandle`).
enum OpenPath: Equatable {
    /// Direct I/O: a reader of an atomically replaced file, while a writer is around, reads its
    /// own descriptor through the daemon.
    case direct
    /// Through the page cache, for a reader of an atomically replaced file (a cached reader).
    case pageCache
    /// Through the page cache, for a file written in place: shared as on a disk.
    case shared
    /// As `shared`, for a writer whose open made the file live (`Sharing.opensLive`).
    case live
    /// As `passthrough`, for a writer whose open made the file live.
    case passthroughLive(backingID: Int32)
    /// The kernel reads the version registered as `backingID` itself (FUSE passthrough).
    case passthrough(backingID: Int32)
}

/// Versions the kernel reads itself, without requests (FUSE passthrough, Linux 6.9 and later),
/// registered while readers have them open. Registering needs a kernel that agreed to passthrough
/// at INIT and CAP_SYS_ADMIN; the first refusal turns it off for the mount, and readers then use
/// the page cache.
final class PassthroughFiles {
    private weak var registry: BackingFileRegistry?
    private let enabled = Atomic<Bool>(true)
    private let refused: (Int32) -> Void
    private let notClosed: (Int32, Int32) -> Void

    /// `refused` hears the errno of the refusal that turned passthrough off; `notClosed` a backing
    /// id the kernel would not forget, and the errno.
    init(registry: BackingFileRegistry, refused: @escaping (Int32) -> Void,
         notClosed: @escaping (Int32, Int32) -> Void) {
        self.registry = registry
        self.refused = refused
        self.notClosed = notClosed
    }

    /// The backing id of the file open on `descriptor`, or nil if the kernel will not read it itself.
    /// With `writable`, the kernel is given the file open for writing too, so that writers in place
    /// can join the readers (`Sharing`): false in the answer if it could not be opened so.
    func register(_ descriptor: Int32, writable: Bool) -> (id: Int32, writable: Bool)? {
        guard enabled.load(ordering: .relaxed), let registry else { return nil }
        // The kernel holds the backing file itself: the descriptor opened for it can go at once.
        let reopens = writable && !Self.servesEveryWriter(descriptor)
        let writer = reopens ? Backing.withProcPath(descriptor) { open($0, O_RDWR | O_CLOEXEC) } : -1
        defer { if writer >= 0 { close(writer) } }
        let id = registry.openBacking(writer >= 0 ? writer : descriptor)
        if id > 0 { return (id, writable && (!reopens || writer >= 0)) }
        // Short of descriptors or memory: this reader only. Other refusals do not pass.
        if ![EMFILE, ENFILE, ENOMEM].contains(-id), enabled.exchange(false, ordering: .relaxed) { refused(-id) }
        return nil
    }

    func unregister(_ id: Int32) {
        guard let error = registry?.closeBacking(id), error != 0 else { return }
        notClosed(id, error)
    }

    /// Whether the kernel can make every passthrough writer's writes through `descriptor` itself:
    /// it is open to read and write, and not to append, sync or bypass the cache, flags a kernel
    /// may take from the backing file for all of them.
    static func servesEveryWriter(_ descriptor: Int32) -> Bool {
        let flags = fcntl(descriptor, F_GETFL)
        return flags >= 0 && flags & O_ACCMODE == O_RDWR && flags & (O_APPEND | O_DSYNC | O_DIRECT) == 0
    }
}

// The kernel keeps one page cache and one size per inode, which a writer's O_TRUNC, writes and
// stat calls move. Atomic replace lets each reader keep the version it opened while a writer fills
// a shadow, so a reader of an atomically replaced file reads through the cache only while no write
// session runs on its node, and a writer that comes meanwhile leaves the node (the kernel's inode)
// to those readers and works on a node of its own (`yieldsToCachedReaders`). Readers during a
// session bypass the cache. Files written in place share the cache as on any disk. Either keeps
// its pages across opens while the file is unchanged.
extension ContainerFileSystem {
    /// How a handle open on `descriptor` uses the page cache, when it may: it keeps the pages the
    /// kernel holds if the file has not changed since they were read.
    func cacheUse(of node: Node, descriptor: Int32) -> CacheUse {
        var attributes = stat()
        guard fstat(descriptor, &attributes) == 0 else { return .refill }
        let version = FileVersion(attributes)
        return node.withCachedVersion { cached in
            defer { cached = version }
            return cached == version ? .keep : .refill
        }
    }

    /// A publish replaced the file: the kernel drops its pages and attributes. A new file published
    /// in place is the file the kernel knows, its size the writer's and no page of it cached but
    /// by the writer's own mappings, which are its content: nothing to drop.
    func didPublish(_ node: Node, inPlace: Bool) {
        node.withCachedVersion { $0 = nil }
        guard !inPlace else { return }
        kernel?.invalidateInode(nodes.inodeNumber(of: node), offset: 0, length: 0)
        node.noticeSent()
    }

    /// A write session ended without publishing: the size the kernel last heard was the shadow's.
    func didDiscard(_ node: Node) {
        kernel?.invalidateInode(nodes.inodeNumber(of: node), offset: -1, length: 0)
        node.noticeSent()
    }

    /// The attributes seen through an open handle: a reader's are those of the version it reads,
    /// so that its `SEEK_END` finds that version's end.
    func attributes(seenThrough handle: OpenFile) -> (stat, Int32) {
        guard !handle.writesThroughSession, handle.descriptor >= 0 else { return currentAttributes(of: handle.node) }
        return Backing.attributes(of: handle.descriptor)
    }
}
