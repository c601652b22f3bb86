import FUSELowLevel
import Glibc

/// One version of a backing file, as far as the kernel's page cache needs to tell versions apart.
struct FileVersion: Equatable {
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
}

/// What the kernel's page cache of a regular file holds, and who reads through it. The kernel keeps
/// one page cache and one size per inode, but atomic replace lets each reader keep the version it
/// opened: so only readers of one version, while nothing else is written, read through the cache.
/// Guarded by the node's stripe lock, with its write session.
struct PageCache {
    /// The version whose pages the kernel may hold; nil when it may hold pages of an older one.
    var version: FileVersion?
    /// Open read handles of `version` reading through the cache (atomically replaced files only).
    var readers = 0
    /// Whether a write session started, or a new version was published, while those readers were
    /// open. Until they close, new readers bypass the cache and attributes are not cached.
    var readersOutdated = false
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

extension ContainerFileSystem {
    /// How a handle open on `descriptor` uses the page cache. Readers of an atomically replaced file
    /// (`versioned`) share it while they read one version and no write session runs; files written
    /// in place always use it. Pages are kept when the file has not changed since they were read.
    func cacheUse(of node: Node, descriptor: Int32, versioned: Bool) -> CacheUse {
        var attributes = stat()
        guard fstat(descriptor, &attributes) == 0 else { return versioned ? .bypass : .refill }
        let version = FileVersion(attributes)
        return node.withFileState { session, cache in
            if versioned {
                guard session == nil, !cache.readersOutdated, cache.readers == 0 || cache.version == version else {
                    return .bypass
                }
                cache.readers += 1
            }
            defer { cache.version = version }
            return cache.version == version ? .keep : .refill
        }
    }

    /// A reader counted by `cacheUse` closed.
    func cachedReaderClosed(_ node: Node) {
        node.withFileState { _, cache in
            cache.readers -= 1
            if cache.readers == 0 { cache.readersOutdated = false }
        }
    }

    /// A publish replaced the file: the kernel drops its pages and attributes. Readers of the
    /// previous version then read it again through their own handles.
    func didPublish(_ node: Node) {
        node.withFileState { _, cache in
            cache.version = nil
            if cache.readers > 0 { cache.readersOutdated = true }
        }
        kernel?.invalidateInode(nodes.inodeNumber(of: node), offset: 0, length: 0)
    }

    /// A write session ended without publishing: the size the kernel last heard was the shadow's.
    func didDiscard(_ node: Node) {
        kernel?.invalidateInode(nodes.inodeNumber(of: node), offset: -1, length: 0)
    }

    /// How long the kernel may trust a file's attributes. Not at all while cached readers share the
    /// inode with a writer or a newer version: each of their reads past the size the kernel knows
    /// then asks again, with its handle, and gets its own version's size.
    func attributeTimeout(of node: Node) -> Double {
        guard node.isRegularFile, !node.zone.writesInPlaceByDefault else { return timeouts.attributes }
        return node.withFileState { _, cache in cache.readersOutdated } ? 0 : timeouts.attributes
    }

    /// The attributes seen through an open handle: a reader's are those of the version it reads.
    func attributes(seenThrough handle: OpenFile) -> (stat, Int32) {
        guard !handle.writesThroughSession, handle.descriptor >= 0 else { return currentAttributes(of: handle.node) }
        return Backing.attributes(of: handle.descriptor)
    }
}
