import CFuse
import CLinux
import Dispatch
import Containers
import Coordination
import FUSELowLevel
import Glibc
import Synchronization

/// A file's writes between the first open for writing and the last close, made to a shadow copy
/// and published by renaming the shadow over the file (docs/atomic-replace.md).
/// Guarded by its node's `session` lock.
final class WriteSession {
    /// The shadow, open for reading and writing; -1 between a publish and the next write.
    var shadow: Int32 = -1 { didSet { written = WrittenPrefix() } }
    /// What the session's writes put at the start of the shadow, while nothing else changed it
    /// since it became the shadow: a record then needs no read of the file (`Shadows.place`). Nil
    /// once anything else changed the shadow (a truncation, an allocation, a log's write).
    private(set) var written: WrittenPrefix? = WrittenPrefix()
    var shadowName: [CChar] = []
    /// The shadow's name without its NUL: a log's, which its commit's digest covers (`DeltaLog`).
    var logName: some Sequence<UInt8> { shadowName.lazy.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) } }
    /// Open write handles sharing the session.
    var writers = 0
    /// Whether the shadow holds writes not yet published.
    var dirty = false { didSet { if dirty { kernelMayHoldWriters = true } } }
    /// Whether the kernel may hold attributes of the writers' view (a size their writes or
    /// truncation gave it, a shadow's times, a new file's change time from before its mark goes)
    /// that no notice has dropped since: a session that ends without publishing them tells the
    /// kernel (`ContainerFileSystem.release`).
    var kernelMayHoldWriters = false
    /// The error of a write that failed (a full disk): the shadow is then never published, and
    /// the writer's close reports it. The previous version stays.
    var failure: Int32 = 0
    /// The coordinated write, held until the first publish (presenters then hear "did change").
    var access: CoordinatedAccess?
    /// Whether `access` is the file's creation, which took effect even if nothing is written:
    /// presenters hear "did appear" once the first content is there to read.
    var announcesCreation = false
    /// The last write's lock owner (the writing process's file table), whose close publishes
    /// (closes by others, such as a forked child dropping an inherited descriptor, do not), and its
    /// thread, who the version it replaces is kept for (`VersionKeeper.Place`: a lock owner is a
    /// file table's address, which the next process may get).
    var lastWriter: (owner: UInt64, thread: pid_t)?
    /// The thread that truncated the file through its descriptor (`ftruncate`, with no write): its
    /// close publishes too, as a writer's does (`truncate -s` then `stat` or `du`). 0: none.
    var truncater: pid_t = 0
    /// Whether `shadow` is the file itself, which this session created: its published version is
    /// the empty file, and nobody else has opened it. Writing it in place spares a shadow inode and
    /// the deletion of the empty one. `shadowName` is then a second link to the file in the shadow
    /// directory, so that a daemon that dies leaves it empty (`ShadowDirectory.remove`).
    var fresh = false
    /// The file a fresh session writes, whose mark `shadowName` is (`UnsyncedPublishes`).
    var markKey: BackingKey?
    /// Who writes: they see their writes in `stat`, others the published version.
    var writerProcesses = WriterProcesses()
    /// A large file's rewrite kept as a redo log instead of a copy (`Shadows.logThreshold`):
    /// `shadow` is then the log, and this the rest of its state.
    var log: LoggedRewrite?

    /// Whether the writers' view differs from the published version: a shadow holds what they
    /// wrote (a fresh session's file is the published version itself).
    var hidesWrites: Bool { shadow >= 0 && !fresh }

    /// How a publish now would put the writes in place.
    var publishes: ContainerFileSystem.Published { fresh ? .inPlace : .replaced }

    /// Writes `data` to the shadow at `offset`: the bytes written, or -errno. A write where the
    /// written prefix ends carries its checksum on (the data is at hand); any other ends it.
    func write(_ data: UnsafeMutablePointer<fuse_bufvec>, at offset: off_t) -> Int {
        let before = written
        written = nil
        // Before the copy, which moves the vector past what it copied.
        let memory = cfuse_buf_memory(data)
        let count = cfuse_write_buf_to_fd(data, shadow, offset)
        if count >= 0, let before, before.end == offset, let memory {
            written = WrittenPrefix(end: offset + off_t(count), checksum: clinux_crc32c(before.checksum, memory, count))
        }
        return count
    }

    /// Runs `body` with the shadow, which it changes other than by a write (a truncation, an
    /// allocation): what the writes put there is no longer all the shadow holds.
    func changeShadow<R>(_ body: (Int32) -> R) -> R {
        written = nil
        return body(shadow)
    }

    /// Whether the writes made all of the shadow, whose size `fstat` said is `size` bytes.
    func covers(_ size: off_t) -> Bool { written?.end == size }

    /// The record of the shadow, whose size `fstat` said is `size` bytes: from the checksum of
    /// its writes where they made all of it, else read from the file (`PublishRecord.of`).
    func record(size: off_t) -> (PublishRecord?, Int32) {
        if covers(size), let written { return (PublishRecord(size: UInt64(size), checksum: written.checksum), 0) }
        return PublishRecord.of(shadow, size: UInt64(size))
    }
}

/// The bytes `0..<end` of a shadow, all put there by writes, in order, and their CRC-32C.
struct WrittenPrefix {
    var end: off_t = 0
    var checksum: UInt32 = 0
}

/// What a write session keeps of a rewrite logged in a `DeltaLog`.
struct LoggedRewrite {
    /// The file itself, open for writing: the log is applied to it.
    let original: Int32
    /// Where the next record goes.
    var end: off_t = 0
    /// The file's size as the writer sees it.
    var size: off_t
}

/// A logged rewrite published: the file, its log and the log's link to it, and how far its
/// publish went (`Shadows.finish`).
final class PublishedLog: Sendable {
    enum Step { case commit, apply, retire, done }
    let file: Int32
    let log: Int32
    let logName: [CChar]
    let target: [CChar]
    let key: BackingKey
    let records: [DeltaLog.Record]
    let step: Locked<Step>

    init(file: Int32, log: Int32, logName: [CChar], target: [CChar], key: BackingKey, records: [DeltaLog.Record], committed: Bool) {
        (self.file, self.log, self.logName, self.target, self.key, self.records) = (file, log, logName, target, key, records)
        step = Locked(committed ? .apply : .commit)
    }
}

/// Makes, publishes and discards shadows in the daemon's own directory in the store's work space.
final class Shadows: @unchecked Sendable {
    /// An open directory on the store's filesystem (renames into the containers stay atomic).
    let directory: Int32
    private let counter = Atomic<UInt64>(0)

    /// Unlinks the previous versions that publishes swap out. Freeing an inode and its blocks is the
    /// dearest step of a publish (a rename over the file did it, in the writer's close), and no one
    /// waits for it.
    private let remover = DispatchQueue(label: "containerfs.shadows.remover", qos: .utility)

    /// Empty files made ahead on `remover`'s queue: allocating an inode is the next dearest step,
    /// which a writer's open then does not wait for. Two pools: `shadow-N` for shadows (and the
    /// removed versions reused), and, once files are created, `fresh-N` for new files, whose name
    /// is already the mark a new file needs (`adoptFresh`): a create renames nothing in the shadow
    /// directory (a rename there was a seventh of a create's time on a journaled ext4).
    private let spares = Locked<SparePools>(SparePools())
    private static let sparesKept = 4

    typealias Spare = (descriptor: Int32, name: [CChar])
    enum SpareKind {
        case shadow, fresh
        var prefix: StaticString { self == .shadow ? "shadow-" : "fresh-" }
    }
    struct SparePools {
        var shadow: [Spare] = []
        var fresh: [Spare] = []
        subscript(kind: SpareKind) -> [Spare] {
            get { kind == .shadow ? shadow : fresh }
            set { if kind == .shadow { shadow = newValue } else { fresh = newValue } }
        }
    }

    /// Removes a previous version that a publish swapped into the shadows' directory. A failure
    /// (the disk failing) leaves it there, and the next mount clears the directory, which holds
    /// nobody's data any more: nothing to report to anyone.
    static func removePrevious(_ name: [CChar], in directory: Int32) {
        unlinkat(directory, name, 0)
    }

    /// Where the version a publish of `session` swaps out is kept, if versions are: by its last writer.
    private func versionPlace(of node: Node, in nodes: NodeTable, by session: WriteSession) -> VersionKeeper.Place? {
        versions?.place(of: node, in: nodes).map { VersionKeeper.Place(path: $0, writer: session.lastWriter?.thread ?? 0) }
    }

    /// Removes a previous version no one keeps, or makes it a spare (`recycle`).
    private func removeOrReuse(_ name: [CChar]) {
        if !recycle(name, in: directory) { Shadows.removePrevious(name, in: directory) }
    }

    /// Where previous versions go instead of being removed; nil keeps none.
    let versions: VersionKeeper?

    /// Whether a file's fsync makes the changes of its links durable (`Backing.fileSyncCarriesNames`).
    let fileSyncCarriesNames: Bool
    /// Renames into the containers not yet committed, where a sync could make them durable before
    /// their files' data (btrfs).
    let renameCommits: RenameCommits
    /// Versions published without waiting for their data, and new files' marks.
    let unsynced: UnsyncedPublishes
    /// Whether the store's filesystem swaps two names (RENAME_EXCHANGE): a publish that keeps the
    /// previous version until the data is written needs it.
    let canExchange: Bool
    /// Whether closes without a sync publish with a record, not waiting for the data: where the
    /// filesystem's journal commits names in order (ext4, XFS). On btrfs anyone's sync of a
    /// directory logs a swap into it without the record made before it in the shadow directory,
    /// nor the new version's data: a cut then left an empty file (the power-loss harness, once in
    /// 42 cuts), so there a close waits for its data before the swap, as it did.
    private var recordsPublishes: Bool { !renameCommits.needed }

    /// Tries a swap of two files made for it in `directory`.
    private static func canExchange(in directory: Int32) -> Bool {
        let names: [[CChar]] = ["exchange-probe-1", "exchange-probe-2"].map { Array($0.utf8CString) }
        for name in names {
            let made = openat(directory, name, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
            guard made >= 0 else { return false }
            close(made)
        }
        defer { for name in names { unlinkat(directory, name, 0) } }
        return clinux_renameat2(directory, names[0], directory, names[1], UInt32(RENAME_EXCHANGE)) == 0
    }

    init(directory: Int32, logThreshold: off_t, versions: VersionKeeper? = nil) {
        self.directory = directory
        self.logThreshold = logThreshold
        self.versions = versions
        fileSyncCarriesNames = Backing.fileSyncCarriesNames(onFileSystemOf: directory)
        renameCommits = RenameCommits(directory: directory,
                                      needed: !Backing.writtenDataOrdersRenames(onFileSystemOf: directory))
        unsynced = UnsyncedPublishes(directory: directory, renameCommits: renameCommits, versions: versions)
        canExchange = Shadows.canExchange(in: directory)
        storeIsExt4 = clinux_fs_type(directory) == 0xEF53
        unsynced.removePrevious = { [weak self] name in self?.removeOrReuse(name) }
        // A write lease (`publishLog`) that an open breaks signals its owner with SIGIO, whose
        // default is to end the process: the daemon needs no signal, the open waits for the lease.
        signal(SIGIO, SIG_IGN)
    }

    /// Waits for the removals queued so far and removes the spares (at unmount: a later mount would
    /// remove them too).
    func finishRemovals() {
        unsynced.finishAll()
        versions?.finish()
        remover.sync {}
        for spare in spares.withLock({ spares in defer { spares = SparePools() }; return spares.shadow + spares.fresh }) {
            close(spare.descriptor)
            unlinkat(directory, spare.name, 0)
        }
    }

    /// A new, empty shadow file, open for reading and writing: a spare if there is one.
    private func makeShadow() -> Spare? {
        takeSpare(.shadow) ?? createSpare(.shadow)
    }

    /// A spare of `kind`, if there is one, its times set to now as a new file's would be.
    private func takeSpare(_ kind: SpareKind) -> Spare? {
        let (spare, left) = spares.withLock { spares in (spares[kind].popLast(), spares[kind].count) }
        if left < Shadows.sparesKept / 2 { remover.asyncInBackground { self.makeSpares(kind) } }
        guard let spare else { return nil }
        if futimens(spare.descriptor, nil) == 0 { return spare }
        close(spare.descriptor)
        unlinkat(directory, spare.name, 0)
        return nil
    }

    /// Creates `name` in `parent` from a spare, with `mode`: the spare, made ahead, is linked there,
    /// open for reading and writing, and its name in the shadow directory goes to `spareName`
    /// (`adoptFresh` makes it the new file's mark). -1 with errno set on failure: EEXIST when the
    /// name is taken, EAGAIN when there is no spare.
    func createFromSpare(_ name: UnsafePointer<CChar>, in parent: Int32, mode: mode_t, spareName: inout [CChar]) -> Int32 {
        guard let spare = takeSpare(.fresh) ?? takeSpare(.shadow) else {
            errno = EAGAIN
            return -1
        }
        // In a set-group-ID directory a new file takes the directory's group, as openat would give it.
        var directoryAttributes = stat()
        guard fstat(parent, &directoryAttributes) == 0,
              directoryAttributes.st_mode & S_ISGID == 0 || fchown(spare.descriptor, uid_t.max, directoryAttributes.st_gid) == 0,
              fchmod(spare.descriptor, mode & 0o7777) == 0,   // the caller's umask is applied already
              linkat(directory, spare.name, parent, name, 0) == 0 else {
            // Its mode or group may have changed: not a spare any more.
            let error = errno
            close(spare.descriptor)
            unlinkat(directory, spare.name, 0)
            errno = error
            return -1
        }
        spareName = spare.name
        return spare.descriptor
    }

    /// Removes a spare's second link, when `adoptFresh` does not take it. Once the new file's key is
    /// known (and the link counted out of its links), the link goes as a mark does (`removeMark`):
    /// a fresh spare's name is one.
    func dropSpareLink(_ spareName: [CChar], of key: BackingKey? = nil) {
        guard !spareName.isEmpty else { return }
        guard let key else {
            unlinkat(directory, spareName, 0)
            return
        }
        removeMark(spareName, of: key)
    }

    /// Removes `name`, the mark of the new file `key`. One that cannot go would have the next
    /// mount empty the file whatever is written to it since: it is removed before any change in
    /// place (`UnsyncedPublishes.waitForData`), or that change fails. Gone, the removal is not
    /// durable until a sync: a change in place waits for one (`UnsyncedPublishes.settle`).
    private func removeMark(_ name: [CChar], of key: BackingKey) {
        if unlinkat(directory, name, 0) == 0 || errno == ENOENT {
            unsynced.unlinked(key)
        } else {
            unsynced.add(UnsyncedPublish(markOf: key, named: name))
        }
    }

    private func createSpare(_ kind: SpareKind) -> Spare? {
        var name = nextName(kind.prefix)
        // Made unnamed, then linked: ext4 holds the directory's lock while it allocates an inode
        // (without a journal, a scan of the inodes freed in the last 30 seconds), and every new
        // file's and publish's rename in this directory waited for the spares made meanwhile.
        var shadow = openat(directory, ".", O_RDWR | O_TMPFILE | O_CLOEXEC, 0o600)
        if shadow >= 0 {
            guard Backing.withProcPath(shadow, { linkat(AT_FDCWD, $0, directory, name, AT_SYMLINK_FOLLOW) }) == 0 else {
                close(shadow)
                return nil
            }
        } else {
            // A filesystem without unnamed files.
            shadow = openat(directory, &name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600)
            guard shadow >= 0 else { return nil }
        }
        newFileFlags.withLock { if $0 == nil { $0 = InodeFlags(of: shadow) } }
        return (shadow, name)
    }

    /// The inode flags and project of a file made in the shadow directory: a recycled file must
    /// have them too.
    private let newFileFlags = Locked<InodeFlags?>(nil)

    /// Whether the daemon still serves `key`'s file (a node, a node left to its readers, an inode
    /// number kept for it): set when the node table exists.
    var inUse: @Sendable (BackingKey) -> Bool = { _ in true }

    /// Makes `name` in `directory`, a file the daemon would now remove (a previous version, or a
    /// version the limits let go: docs/versions.md), a spare, emptied, unless the pool is full: the
    /// next shadow or new file then reuses its inode. Freeing an inode and allocating another was
    /// the dearest part of a rewrite on ext4 without a journal (each allocation scans the inodes
    /// freed in the last 30 seconds). False when the file may not be reused: the caller removes it.
    ///
    /// Nobody may have it open or reach it: a write lease (refused while any other descriptor is
    /// open on it, a mapping's included) holds back opens until it is in the shadow directory, the
    /// daemon serves no node of it, and it has one link. Nothing of its file may carry over to
    /// another: it has no extended attributes (ACLs, capabilities, labels), and the flags and project
    /// of a new file; its owner and mode become a new spare's.
    func recycle(_ name: UnsafePointer<CChar>, in directory: Int32) -> Bool {
        // Up to twice the spares made ahead: a version is reused whenever the pool is not full of them.
        guard spares.withLock({ $0.shadow.count }) < 2 * Shadows.sparesKept, let newFileFlags = newFileFlags.withLock({ $0 }) else {
            return false
        }
        let file = openat(directory, name, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard file >= 0 else { return false }
        var attributes = stat()
        guard fstat(file, &attributes) == 0, attributes.st_mode & S_IFMT == S_IFREG, attributes.st_nlink == 1,
              !inUse(BackingKey(attributes)), !unsynced.isRetiring(BackingKey(attributes)), clinux_flistxattr(file, nil, 0) == 0,
              InodeFlags(of: file) == newFileFlags, clinux_set_lease(file, 1) == 0 else {
            close(file)
            return false
        }
        let spareName = nextName("shadow-")
        // Linked, then unlinked: a rename between two directories would contend with every publish's.
        var moved = linkat(directory, name, self.directory, spareName, 0) == 0
        if moved, unlinkat(directory, name, 0) != 0 {
            unlinkat(self.directory, spareName, 0)
            moved = false
        }
        // Out of reach now (the shadow directory is the daemon's): opens held back by the lease go on,
        // and find no file by that name.
        let released = clinux_set_lease(file, 0) == 0
        guard moved else {
            close(file)
            return false
        }
        guard released, ftruncate(file, 0) == 0, fchown(file, Shadows.daemonUser, Shadows.daemonGroup) == 0,
              fchmod(file, 0o600) == 0 else {
            // Not a spare: removed, as the file would have been.
            close(file)
            unlinkat(self.directory, spareName, 0)
            return true
        }
        spares.withLock { $0.shadow.append((file, spareName)) }
        return true
    }

    private func makeSpares(_ kind: SpareKind) {
        while spares.withLock({ $0[kind].count }) < Shadows.sparesKept, let spare = createSpare(kind) {
            spares.withLock { $0[kind].append(spare) }
        }
    }

    /// A new name in the shadow directory: `prefix` and a number, NUL-terminated.
    private func nextName(_ prefix: StaticString) -> [CChar] {
        var number = counter.wrappingAdd(1, ordering: .relaxed).newValue
        var digits: [CChar] = []
        repeat {
            digits.append(CChar(48 + number % 10))
            number /= 10
        } while number > 0
        var name = UnsafeRawBufferPointer(start: prefix.utf8Start, count: prefix.utf8CodeUnitCount)
            .map { CChar(bitPattern: $0) }
        name += digits.reversed()
        name.append(0)
        return name
    }

    /// Makes `file` (`key`), a file just created empty and opened for reading and writing, the
    /// fresh shadow of `session`. Its mark is a second link in the shadow directory: `spareName`
    /// itself for a fresh spare, renamed for a shadow spare, or a new link.
    func adoptFresh(_ session: WriteSession, file: Int32, key: BackingKey, spareName: [CChar]) -> Int32 {
        let isMark = spareName.starts(with: ShadowDirectory.freshPrefix.utf8.map { CChar(bitPattern: $0) })
        let name = isMark ? spareName : nextName("fresh-")
        let marked = isMark ? 0
            : spareName.isEmpty ? Backing.withProcPath(file) { linkat(AT_FDCWD, $0, directory, name, AT_SYMLINK_FOLLOW) }
            : renameat(directory, spareName, directory, name)
        guard marked == 0 else { return errno }
        session.shadow = file
        session.shadowName = name
        session.fresh = true
        session.markKey = key
        // The mark is a link: its removal, if nothing is published, moves the file's change time.
        session.kernelMayHoldWriters = true
        unsynced.linked(key)
        return 0
    }

    /// Files this large are rewritten through a redo log (`DeltaLog`) where the filesystem cannot
    /// reflink them: a copy of the whole file would cost far more than the few changes a program
    /// that opens one without truncating it makes (docs/atomic-replace.md, "Large files").
    let logThreshold: off_t

    /// Gives `session` a shadow of `node`'s published file: empty when `truncated`, else a copy
    /// (a reflink where the filesystem has them). The shadow keeps the file's mode, owner and xattrs.
    /// With `mayLog`, a large file that cannot be reflinked gets a redo log instead of a copy.
    func prepare(_ session: WriteSession, of node: Node, truncated: Bool, mayLog: Bool = false) -> Int32 {
        guard session.shadow < 0 else { return 0 }
        guard let made = makeShadow() else { return errno }
        session.kernelMayHoldWriters = true
        let shadow = made.descriptor
        var name = made.name
        var (error, logged) = fill(shadow, from: node, copyingData: !truncated, mayLog: mayLog)
        if error == 0, logged != nil {
            let logName = nextName("delta-")
            if renameat(directory, name, directory, logName) == 0 {
                name = logName
            } else {
                error = errno
                if let original = logged?.original { close(original) }
                logged = nil
            }
        }
        guard error == 0 else {
            close(shadow)
            unlinkat(directory, name, 0)
            return error
        }
        session.shadow = shadow
        session.shadowName = name
        session.log = logged
        return 0
    }

    /// Fills `shadow` with the file's data and attributes. With `mayLog`, a large file that cannot
    /// be reflinked is left alone: the answer then holds the file open for writing, and `shadow`,
    /// still empty, is to be its log.
    private func fill(_ shadow: Int32, from node: Node, copyingData: Bool, mayLog: Bool = false) -> (Int32, LoggedRewrite?) {
        var logged: LoggedRewrite?
        // An empty shadow needs only the file's attributes, which its O_PATH descriptor gives.
        let error = node.withItem { descriptor, attributes -> Int32 in
            if copyingData, attributes.st_size > 0 {
                let (error, log) = fillData(shadow, from: descriptor, size: attributes.st_size,
                                            allocated: off_t(attributes.st_blocks) * 512, mayLog: mayLog)
                if error != 0 { return error }
                // The log changes the file itself: the shadow stays unused.
                if let log {
                    logged = log
                    return 0
                }
            }
            // The shadow is the daemon's; as root, it takes the file's owner. Before the mode: a
            // chown clears set-user-ID and set-group-ID, root's too.
            if Shadows.daemonIsRoot, attributes.st_uid != 0 || attributes.st_gid != Shadows.daemonGroup,
               fchown(shadow, attributes.st_uid, attributes.st_gid) != 0 { return errno }
            if fchmod(shadow, attributes.st_mode & 0o7777) != 0 { return errno }
            return Backing.withProcPath(descriptor) { copyExtendedAttributes(from: $0, to: shadow) }
        }
        return (error < 0 ? errno : error, logged)
    }

    /// Gives the shadow the space the file `original` reserves past its end (`fallocate
    /// --keep-size`, which logs and databases write into): its preallocated extents there, looked
    /// for only when it holds more blocks than its data fills. Only on ext4, where nothing but
    /// fallocate leaves them (XFS's speculative preallocation, reserved again, would last). False
    /// where the store cannot reserve it (full): the data is whole without it.
    @discardableResult
    private func reserveBeyondEnd(_ shadow: Int32, from original: Int32, size: off_t, allocated: off_t) -> Bool {
        let filled = (size + 4095) / 4096 * 4096
        guard allocated > filled, storeIsExt4 else { return true }
        let end = clinux_unwritten_end(original, Int64(filled))
        guard end > filled else { return end >= 0 }
        return clinux_fallocate(shadow, 1 /* FALLOC_FL_KEEP_SIZE */, filled, off_t(end) - filled) == 0
    }

    /// Whether the store is on ext2, ext3 or ext4 (`reserveBeyondEnd`).
    private let storeIsExt4: Bool

    /// Gives `shadow` the data of the file open (`O_PATH`) as `descriptor`, `size` bytes in
    /// `allocated` bytes of blocks: a reflink where the store has them, else a copy, or with
    /// `mayLog` for a large file a log instead.
    private func fillData(_ shadow: Int32, from descriptor: Int32, size: off_t, allocated: off_t,
                          mayLog: Bool) -> (Int32, LoggedRewrite?) {
        let large = mayLog && size >= logThreshold
        // Once the store has said it cannot reflink, that stands: a large file is logged at once.
        let mayClone = reflinks.load(ordering: .relaxed)
        if large, !mayClone, let logged = loggedRewrite(of: descriptor, size: size) { return (0, logged) }
        // Read without moving its access time: an open for writing is no read (O_NOATIME needs the
        // file's owner or CAP_FOWNER; without them the read moves it, as the store's filesystem says).
        var original = Backing.withProcPath(descriptor) { open($0, O_RDONLY | O_CLOEXEC | clinux_O_NOATIME) }
        if original < 0, errno == EPERM { original = Backing.withProcPath(descriptor) { open($0, O_RDONLY | O_CLOEXEC) } }
        guard original >= 0 else { return (errno, nil) }
        defer { close(original) }
        var cloned = false
        if mayClone {
            cloned = clinux_ficlone(shadow, original) == 0
            if !cloned, errno == EOPNOTSUPP { reflinks.store(false, ordering: .relaxed) }
            if !cloned, large, let logged = loggedRewrite(of: descriptor, size: size) { return (0, logged) }
        }
        let error = cloned ? 0 : copyData(from: original, to: shadow, size: Int(size))
        if error == 0 { reserveBeyondEnd(shadow, from: original, size: size, allocated: allocated) }
        return (error, nil)
    }

    /// A log for a rewrite of the file open (`O_PATH`) as `descriptor`; nil if the daemon cannot
    /// open it for writing (it gets a copy, as any other).
    private func loggedRewrite(of descriptor: Int32, size: off_t) -> LoggedRewrite? {
        let writable = Backing.withProcPath(descriptor) { open($0, O_WRONLY | O_CLOEXEC) }
        return writable >= 0 ? LoggedRewrite(original: writable, size: size) : nil
    }

    /// Whether the store's filesystem may reflink: false once it said it cannot.
    private let reflinks = Atomic<Bool>(true)

    private static let daemonIsRoot = geteuid() == 0
    private static let daemonUser = geteuid()
    private static let daemonGroup = getegid()

    /// Copies the data of a file of `size` bytes, extent by extent, so that its holes stay holes
    /// (a 4 KiB write into a sparse 2 GiB file must not allocate 2 GiB).
    private func copyData(from source: Int32, to destination: Int32, size: Int) -> Int32 {
        var offset = 0
        while offset < size {
            let data = lseek(source, off_t(offset), SEEK_DATA)
            if data < 0 {
                if errno == ENXIO { break }   // only a hole is left
                if errno == EINVAL { return copyRange(from: source, to: destination, start: offset, end: size) }
                return errno
            }
            let hole = lseek(source, data, SEEK_HOLE)
            guard hole >= 0 else { return errno }
            let error = copyRange(from: source, to: destination, start: Int(data), end: min(Int(hole), size))
            if error != 0 { return error }
            offset = Int(hole)
        }
        // A hole at the end has no extent to copy.
        return ftruncate(destination, off_t(size)) == 0 ? 0 : errno
    }

    /// Copies the file's bytes from `start` to `end` to the same place in the shadow. A file that
    /// shrank meanwhile is copied as far as it goes.
    private func copyRange(from source: Int32, to destination: Int32, start: Int, end: Int) -> Int32 {
        FileData.copy(from: source, at: off_t(start), to: destination, at: off_t(start), length: off_t(end - start), ifSourceEnds: 0)
    }

    /// Copies every extended attribute of the item at `source` (a path) to `destination`.
    private func copyExtendedAttributes(from source: UnsafePointer<CChar>, to destination: Int32) -> Int32 {
        let size = clinux_listxattr(source, nil, 0)
        guard size > 0 else { return size < 0 && errno != ENOTSUP ? errno : 0 }
        var names = [CChar](repeating: 0, count: size)
        let listed = clinux_listxattr(source, &names, size)
        guard listed >= 0 else { return errno }
        var value = [UInt8](repeating: 0, count: 65536)
        var start = 0
        while start < listed {
            let error = names.withUnsafeBufferPointer { buffer -> Int32 in
                let name = buffer.baseAddress! + start
                let length = clinux_getxattr(source, name, &value, value.count)
                guard length >= 0 else { return errno }
                return clinux_fsetxattr(destination, name, value, length, 0) == 0 ? 0 : errno
            }
            if error != 0 { return error }
            start += strlen(names.withUnsafeBufferPointer { $0.baseAddress! + start }) + 1
        }
        return 0
    }

    /// Renames the shadow over the file, so that every later open sees all of it at once. The node
    /// keeps its exposed inode number; its backing file becomes the shadow.
    /// When the file was deleted or replaced meanwhile, the writes go where an unlinked file's go.
    func publish(_ session: WriteSession, of node: Node, in nodes: NodeTable, durably: Bool) -> Int32 {
        guard session.shadow >= 0 else { return 0 }
        defer { discard(session) }
        guard session.failure == 0 else { return session.failure }
        guard session.dirty else { return 0 }
        session.dirty = false
        if let log = session.log {
            // One log of a file at a time: a cut would find two, and apply them in any order.
            if let key = Backing.key(of: log.original) {
                let error = unsynced.waitForData(of: key)
                guard error == 0 else { return error }
            }
            // Applied in place only when no one else has the file open, through this node or one
            // left to its readers: they keep their version. A write lease holds back other opens
            // of the file meanwhile, and is refused while someone has it open for writing.
            if !nodes.othersHaveOpen(node) {
                let (leased, refusal) = takeWriteLease(log.original)
                // Where leases are not to be had (turned off, or a file of another owner), the
                // daemon's own count decides.
                if leased || (refusal != EAGAIN && refusal != EBUSY) {
                    return renameCommits.syncing { publishLog(session, leased: leased, durably: durably) }
                }
            }
            let error = convertLog(session, of: node)
            if error != 0 { return error }
        }
        // A sync could make an earlier rename durable without its file's data, or one made
        // meanwhile (btrfs: `RenameCommits`).
        guard durably else { return place(session, of: node, in: nodes, durably: false) }
        return renameCommits.syncing { place(session, of: node, in: nodes, durably: true) }
    }

    /// A write lease on `file`, or the errno of its refusal. Refused while anyone has the file open,
    /// it is asked again meanwhile (`ContainerFileSystem.whileReleasesArrive`): a reader's release
    /// closes its descriptor after the node has counted its handle out (`rsync --inplace` closes
    /// its reader just before its writer), and a refusal costs a copy of the whole file.
    private func takeWriteLease(_ file: Int32) -> (leased: Bool, refusal: Int32) {
        var refusal: Int32 = 0
        let leased = ContainerFileSystem.whileReleasesArrive {
            if clinux_set_lease(file, 1) == 0 { return true }
            refusal = errno
            return refusal == EAGAIN || refusal == EBUSY ? false : nil
        }
        return (leased, leased ? 0 : refusal)
    }

    /// Puts a session's shadow in place (`publish`), with a sync of everything when `durably`.
    private func place(_ session: WriteSession, of node: Node, in nodes: NodeTable, durably: Bool) -> Int32 {
        // A publish that is not synced still never leaves an empty or torn file to a power cut.
        // Small files are published at once, with a record of their size and checksum that a cut
        // leaves with them and that keeps their previous version until the background has written
        // their data. Larger ones have their data written first, and their blocks become the
        // file's (ext4 and XFS convert them when the writes end), so that the journal commit that
        // makes the publish durable (anyone's next sync) finds them (docs/atomic-replace.md,
        // "Closes without a sync").
        // A sync, or a wait for the data, holds up no other request (io_uring's queues).
        if durably { RequestThreads.willWait() }
        guard let (key, size) = Backing.identity(of: session.shadow) else { return errno }
        // A durable publish has a record too where it spares syncs: a new file's where the file's
        // sync carries none of its names (ext4 without a journal; `syncFresh`), a rewrite's where it
        // carries them all (a journal; `syncSwapped`).
        let recordSparesSyncs = session.fresh ? !fileSyncCarriesNames : fileSyncCarriesNames
        let records = recordsPublishes && unsynced.mayRecord(size: size, checksummed: session.covers(size))
            && (session.fresh || canExchange) && (!durably || recordSparesSyncs)
        var record: [CChar] = []
        if records {
            let (made, error) = session.record(size: size)
            guard let made else { return error }
            record = made.name(after: session.fresh ? session.shadowName : Shadows.replacedPrefix + session.shadowName)
        } else if !durably {
            RequestThreads.willWait()
            if clinux_write_data_and_wait(session.shadow) != 0 { return errno }
        }
        if session.fresh {
            // The file is in place already: without its mark, it is published. A mark left behind
            // would make the next mount empty the file; a record, unless the file reads as it says.
            if records {
                guard renameat(directory, session.shadowName, directory, record) == 0 else { return errno }
                let error = durably ? syncFresh(session.shadow, of: node, in: nodes) : 0
                // Synced, the file needs no previous version: a rename over another keeps none for it.
                unsynced.add(UnsyncedPublish(key: key, size: size, file: session.shadow, record: record, previous: nil, versionPlace: nil,
                                             synced: durably && error == 0))
                session.shadow = -1
                session.shadowName = []
                return error
            }
            if durably, !fileSyncCarriesNames { return syncFreshUnrecorded(session, of: node, in: nodes, key: key) }
            // Without the data, the mark's removal must not be logged by a sync meanwhile (btrfs).
            let removed = durably ? unlinkat(directory, session.shadowName, 0)
                : renameCommits.renaming { unlinkat(directory, session.shadowName, 0) }
            guard removed == 0 || errno == ENOENT else { return errno }
            session.shadowName = []
            unsynced.unlinked(key)
            guard durably else { return 0 }
            guard fsync(session.shadow) == 0 else {
                let error = errno
                return session.changeShadow { emptied($0, afterSyncFailedWith: error) }
            }
            // The mark was a link to the file, and so is its name (linked in at its creation): the
            // file's sync commits the changes of its links.
            return 0
        }
        if durably, !records, fsync(session.shadow) != 0 { return errno }
        // The record is a second link to the shadow, made before the swap: a cut that keeps the
        // swap keeps the record too. It is counted before it is made: a reader would otherwise
        // take the file for a hard-linked one.
        if records {
            unsynced.linked(key)
            guard linkat(directory, session.shadowName, directory, record, 0) == 0 else {
                let error = errno
                unsynced.unlinked(key)
                return error
            }
        }
        let parent: Node, exchanged: Bool
        let placement = durably ? moveIntoPlace(session.shadowName, key, of: node, in: nodes, mustExchange: records)
            : renameCommits.renaming { moveIntoPlace(session.shadowName, key, of: node, in: nodes, mustExchange: records) }
        switch placement {
        case .moved(let directory, let swapped): (parent, exchanged) = (directory, swapped)
        case .gone:
            if records { dropRecord(record, of: key) }
            return 0
        case .failed(let error):
            if records { dropRecord(record, of: key) }
            return error
        }
        if records {
            if durably {
                let error = syncSwapped(session, record: record, of: key, size: size, node: node, in: nodes)
                guard error == 0 else { return error }
            }
            // The shadow's name now leads to the previous version, kept until the data is written.
            unsynced.add(UnsyncedPublish(key: key, size: size, file: session.shadow, record: record, previous: session.shadowName,
                                         versionPlace: versionPlace(of: node, in: nodes, by: session), synced: durably))
            session.shadow = -1
        } else if exchanged {
            // The shadow's name now leads to the previous version: kept as a version, or removed.
            let name = session.shadowName
            if let versions, let place = versionPlace(of: node, in: nodes, by: session) {
                versions.keep(name, in: directory, at: place)
            } else {
                remover.asyncInBackground { self.removeOrReuse(name) }
            }
        }
        session.shadowName = []
        // The rename is durable once the directory is: fsync promised the file's new content. Where
        // written data does not order names (btrfs), the directory's sync may leave out a swap with
        // a file of another directory: the whole filesystem is committed instead.
        guard durably, !records else { return 0 }
        return renameCommits.needed ? renameCommits.commitWithin() : Backing.syncDirectory(parent.descriptor)
    }

    /// A rewrite's fsync after its swap (`place`), where the file's sync commits its data, its
    /// record and the swap together (one journal commit, where a sync before the swap and the
    /// directory's after cost two). A cut before it ends finds the record, and the next mount puts
    /// the previous version back unless the file reads as the record says. A sync that fails puts
    /// the previous version back (the session's shadow name leads to it) where the disk still takes
    /// the swap; otherwise the record stays for the next mount. Returns 0 or the errno.
    private func syncSwapped(_ session: WriteSession, record: [CChar], of key: BackingKey, size: off_t, node: Node,
                             in nodes: NodeTable) -> Int32 {
        guard fsync(session.shadow) != 0 else { return 0 }
        let error = errno
        var previous = stat()
        if fstatat(directory, session.shadowName, &previous, AT_SYMLINK_NOFOLLOW) == 0,
           case .moved = moveIntoPlace(session.shadowName, BackingKey(previous), of: node, in: nodes, mustExchange: true) {
            // The shadow's name leads to the new version again, which the session discards.
            dropRecord(record, of: key)
            return error
        }
        unsynced.add(UnsyncedPublish(key: key, size: size, file: session.shadow, record: record, previous: session.shadowName, versionPlace: nil))
        session.shadow = -1
        session.shadowName = []
        return error
    }

    /// A new file's fsync after its mark became a record: the file, the record's directory and the
    /// name's are synced together (one cache flush where three in a row cost three). A cut meanwhile
    /// leaves the file whole, or empty where its data did not reach the disk with the record, as
    /// the next mount checks it against the record. Returns 0 or the errno.
    private func syncFresh(_ file: Int32, of node: Node, in nodes: NodeTable) -> Int32 {
        let parent = nodes.place(of: node).map { Backing.openDirectory($0.parent.descriptor) }
        if parent == -1 { return errno }
        defer { if let parent { close(parent) } }
        let errors = Backing.syncTogether([file, directory] + (parent.map { [$0] } ?? []))
        if errors[0] != 0 { return emptied(file, afterSyncFailedWith: errors[0]) }
        return errors.first { $0 != 0 } ?? 0
    }

    /// A new file whose sync failed goes back to its previous version, as a rewrite does: the
    /// empty one (docs/atomic-replace.md, "A disk that fails"). Returns `error`, or the errno of
    /// the truncation.
    private func emptied(_ file: Int32, afterSyncFailedWith error: Int32) -> Int32 {
        ftruncate(file, 0) == 0 ? error : errno
    }

    /// A new file's fsync without a record, where the file's sync carries none of its names (ext4
    /// without a journal): nothing orders the mark's removal after the data there, so the file is
    /// synced first, then the mark goes, and the mark's directory and the name's are synced
    /// together. A cut before the mark's removal is durable leaves the mark, and the next mount
    /// empties the file, as if the fsync had not begun. Returns 0 or the errno.
    private func syncFreshUnrecorded(_ session: WriteSession, of node: Node, in nodes: NodeTable, key: BackingKey) -> Int32 {
        // A failure leaves the previous version, the empty file: the session's discard empties it
        // and removes its mark (docs/atomic-replace.md, "A disk that fails").
        guard fsync(session.shadow) == 0 else { return errno }
        guard unlinkat(directory, session.shadowName, 0) == 0 || errno == ENOENT else { return errno }
        session.shadowName = []
        unsynced.unlinked(key)
        let parent = nodes.place(of: node).map { Backing.openDirectory($0.parent.descriptor) }
        if parent == -1 { return errno }
        defer { if let parent { close(parent) } }
        return Backing.syncTogether([directory] + (parent.map { [$0] } ?? [])).first { $0 != 0 } ?? 0
    }

    /// Renames the file `key`, a new file published without waiting for its data, over `name` in
    /// `parent` with `rename` (0 or an errno), where a cut must not leave the rename without the
    /// data: the file renamed over becomes its previous version, linked into the shadow directory,
    /// and its record is renamed to say so, before the rename (the journal commits them in order;
    /// records exist only where it does, `recordsPublishes`). A cut that keeps the rename but not
    /// the data then puts that file's content back, as a rewrite's record does, and nobody waits
    /// for the disk; afterwards the background keeps it as a version at `versionPlace`, or reuses
    /// it (docs/atomic-replace.md, "Closes without a sync"). Nil when `key` is no such file (its
    /// data is written, or it has a previous version) or a step before the rename failed: the
    /// caller waits for its data and renames.
    func renameUnwritten(_ key: BackingKey, over name: UnsafePointer<CChar>, in parent: Int32, versionPlace: VersionKeeper.Place?,
                         rename: () -> Int32) -> Int32? {
        guard let publish = unsynced.pending(key) else { return nil }
        return publish.withNamesIfUnwritten { names -> Int32? in
            // Named as a rewrite's record is (`place`): `record-PREVIOUS.SIZE.CRC`.
            guard let (_, made) = PublishRecord.parse(String(decoding: names.record.dropLast().map(UInt8.init(bitPattern:)), as: UTF8.self)) else {
                return nil
            }
            let previous = nextName("shadow-")
            let record = made.name(after: Shadows.replacedPrefix + previous)
            guard linkat(parent, name, directory, previous, 0) == 0 else { return nil }
            // A link that stays is removed with the record, once the data is written.
            func dropPrevious() { if unlinkat(directory, previous, 0) != 0 { names.previous = previous } }
            guard renameat(directory, names.record, directory, record) == 0 else {
                dropPrevious()
                return nil
            }
            let error = rename()
            if error != 0, renameat(directory, record, directory, names.record) == 0 {
                // Not replaced: the file keeps its name, and its link here goes.
                dropPrevious()
                return error
            }
            names.record = record
            names.previous = previous
            // Kept as a version only once it was replaced.
            names.versionPlace = error == 0 ? versionPlace : nil
            return error
        } ?? nil
    }

    /// Removes the record of a shadow that was not published after all.
    private func dropRecord(_ record: [CChar], of key: BackingKey) {
        unlinkat(directory, record, 0)
        unsynced.unlinked(key)
    }

    /// The start of a record's name for a version that replaced another (`PublishRecord`).
    private static let replacedPrefix: [CChar] = PublishRecord.replacedPrefix.utf8.map { CChar(bitPattern: $0) }

    /// Where `moveIntoPlace` left the shadow.
    private enum Placement {
        /// In the file's place, in `parent`; `exchanged`: the previous version has the shadow's name.
        case moved(parent: Node, exchanged: Bool)
        /// The name no longer leads to the node's file (deleted or replaced meanwhile).
        case gone
        /// A system call failed: the file is as it was.
        case failed(Int32)
    }

    /// Puts the session's shadow in place of the file `node` shows, and points the node at it. The
    /// two swap places (the previous version then has the shadow's name) unless the filesystem
    /// cannot swap and `mustExchange` is false: then the shadow is renamed over the file.
    private func moveIntoPlace(_ shadowName: [CChar], _ key: BackingKey, of node: Node, in nodes: NodeTable,
                               mustExchange: Bool) -> Placement {
        guard let (parent, name) = nodes.place(of: node) else { return .gone }
        return name.withCString { cName -> Placement in
            var current = stat()
            guard fstatat(parent.descriptor, cName, &current, AT_SYMLINK_NOFOLLOW) == 0 else {
                return errno == ENOENT ? .gone : .failed(errno)
            }
            guard BackingKey(current) == node.key else { return .gone }
            let previous = nodes.republish(node, as: key)
            var result = clinux_renameat2(directory, shadowName, parent.descriptor, cName, UInt32(RENAME_EXCHANGE))
            var exchanged = true
            if result != 0, errno == EINVAL, !mustExchange {
                result = clinux_renameat2(directory, shadowName, parent.descriptor, cName, 0)
                exchanged = false
            }
            guard result == 0 else {
                let error = errno
                nodes.abandonRepublish(node, previous: previous)
                return error == ENOENT ? .gone : .failed(error)
            }
            nodes.finishRepublish(node, previous: previous)
            return .moved(parent: parent, exchanged: exchanged)
        }
    }

    /// Someone else opens a file that `session` writes in place since creating it: its name gets
    /// the empty file back, and what was written so far goes on as an ordinary shadow. (If the name
    /// no longer leads to the file, the session stays as it is.) True when the name leads to the
    /// empty copy now: the attributes the kernel holds are the writer's.
    func endFresh(_ session: WriteSession, of node: Node, in nodes: NodeTable) -> Bool {
        guard session.fresh else { return false }
        // Nothing written: the file is its published version; the next write makes a shadow.
        guard session.dirty else {
            discard(session)
            return false
        }
        // An empty copy of the file (mode, owner, attributes) swaps places with it.
        let empty = WriteSession()
        guard prepare(empty, of: node, truncated: true) == 0 else { return false }
        guard let emptyKey = Backing.key(of: empty.shadow),
              case .moved = moveIntoPlace(empty.shadowName, emptyKey, of: node, in: nodes, mustExchange: true) else {
            discard(empty)
            return false
        }
        // The copy's former name leads to what was written; the mark is a link too many. One that
        // cannot go would have the next mount empty the file once it is published: nothing of the
        // session is (its close reports the error), and the mark leads to a discarded shadow.
        if unlinkat(directory, session.shadowName, 0) == 0 || errno == ENOENT {
            if let key = session.markKey { unsynced.unlinked(key) }
        } else {
            fail(session, with: errno)
        }
        session.shadowName = empty.shadowName
        session.fresh = false
        session.markKey = nil
        close(empty.shadow)
        return true
    }

    /// Closes the shadow and removes it if it was not published. A fresh file goes back to its
    /// published version, empty. A failed write's error goes with it: it spoiled that shadow only (a
    /// truncating open that discards it starts a version its own close publishes).
    func discard(_ session: WriteSession) {
        if session.fresh, !session.shadowName.isEmpty {
            // Linux's ftruncate sets the times even when the size stays: an empty file keeps the
            // times set on it (`touch -d`, `tar -x`, `cp -p`). If it cannot be emptied, its mark
            // stays, and the next mount empties it.
            var attributes = stat()
            let emptied = fstat(session.shadow, &attributes) == 0
                && (attributes.st_size == 0 || ftruncate(session.shadow, 0) == 0)
            if !emptied { session.shadowName = [] }
        }
        if session.shadow >= 0 { close(session.shadow) }
        if !session.shadowName.isEmpty {
            // Emptied, a new file is its published version: its mark says nothing more.
            if session.fresh, let key = session.markKey {
                removeMark(session.shadowName, of: key)
            } else {
                unlinkat(directory, session.shadowName, 0)
            }
        }
        if let log = session.log { close(log.original) }
        session.log = nil
        session.shadow = -1
        session.shadowName = []
        session.dirty = false
        session.failure = 0
        session.fresh = false
        session.markKey = nil
    }

    // MARK: Rewrites of large files, through a redo log

    /// Appends a write of `data` at `offset` to the session's log. Returns the bytes written, or -errno.
    func logWrite(_ session: WriteSession, _ data: UnsafeMutablePointer<fuse_bufvec>, at offset: off_t) -> Int {
        guard let log = session.log else { return -Int(EBADF) }
        // The data first: a header never names data that is not there.
        let written = session.changeShadow { cfuse_write_buf_to_fd(data, $0, log.end + off_t(DeltaLog.headerSize)) }
        guard written >= 0 else { return written }
        let error = DeltaLog.writeHeader(session.shadow, at: log.end, kind: .write, offset: offset, length: off_t(written))
        guard error == 0 else { return -Int(error) }
        session.log?.end += off_t(DeltaLog.headerSize + written)
        session.log?.size = max(log.size, offset + off_t(written))
        prefetchPartialPages(of: log.original, from: offset, to: offset + off_t(written), size: log.size)
        return written
    }

    /// Starts reading the file's pages that a write to `start..<end` covers in part, which the
    /// publish's apply must read before it can change them: the reads then overlap the commit's
    /// sync instead of following it. Pages past the file's `size` have nothing to read.
    private func prefetchPartialPages(of file: Int32, from start: off_t, to end: off_t, size: off_t) {
        let page = Shadows.pageSize
        let first = start / page * page, last = (end - 1) / page * page
        if start != first, first < size { posix_fadvise(file, first, page, POSIX_FADV_WILLNEED) }
        if end % page != 0, last != first || start == first, last < size { posix_fadvise(file, last, page, POSIX_FADV_WILLNEED) }
    }

    private static let pageSize = off_t(sysconf(Int32(_SC_PAGESIZE)))

    /// Appends a truncation (or extension) to `size` to the session's log.
    func logTruncate(_ session: WriteSession, to size: off_t) -> Int32 {
        guard var log = session.log else { return EBADF }
        let error = DeltaLog.appendTruncate(session.shadow, end: &log.end, size: size)
        if error == 0 {
            log.size = size
            session.log = log
        }
        return error
    }

    /// Turns a logged rewrite into an ordinary one: a copy of the file (a reflink where possible)
    /// with the log applied becomes the shadow. For what the log cannot serve: reads through a
    /// writer, a publish while others have the file open.
    func convertLog(_ session: WriteSession, of node: Node) -> Int32 {
        guard let log = session.log else { return 0 }
        guard let (copy, name) = makeShadow() else { return errno }
        var (error, _) = fill(copy, from: node, copyingData: true)
        if error == 0 {
            let (records, _, readError) = DeltaLog.records(of: session.shadow, named: session.logName)
            error = readError != 0 ? readError : DeltaLog.apply(records, of: session.shadow, to: copy)
        }
        guard error == 0 else {
            close(copy)
            unlinkat(directory, name, 0)
            return error
        }
        close(log.original)
        close(session.shadow)
        unlinkat(directory, session.shadowName, 0)
        session.log = nil
        session.shadow = copy
        session.shadowName = name
        return 0
    }

    /// Publishes a logged rewrite (docs/atomic-replace.md, "Large files"): commits the log (with a
    /// link to the file beside it) and applies it to the file; the file's sync and the log's
    /// retirement follow in the background, before any change of the file in place
    /// (`UnsyncedPublishes.waitForData`). Durable once committed: a cut before the retirement
    /// ends finds the log, which the next mount applies again. A close's change that keeps the
    /// file's size, under a lease, leaves the commit's sync and the apply to the background too
    /// (`publishLater`). `leased`: the caller took a write lease on the file, which this gives back.
    private func publishLog(_ session: WriteSession, leased: Bool, durably: Bool) -> Int32 {
        guard let log = session.log else { return 0 }
        RequestThreads.willWait()
        // On a failure the lease goes with the file, which the publish's `discard` closes.
        guard let key = Backing.key(of: log.original) else { return errno }
        let (records, _, readError) = DeltaLog.records(of: session.shadow, named: session.logName)
        guard readError == 0 else { return readError }
        let later = leased && !durably && !renameCommits.needed && !unsynced.hasFailed && DeltaLog.keepsSize(records, of: log.original)
        // Blocks first: a full disk refuses the change before it is committed, never halfway.
        var error = DeltaLog.reserve(records, in: log.original)
        guard error == 0 else { return error }
        let target: [CChar] = session.shadowName.dropLast() + DeltaLog.targetSuffix.utf8.map { CChar(bitPattern: $0) } + [0]
        // Counted before it is made: `stat` does not show it (`MarkTable`).
        unsynced.linked(key)
        guard Backing.withProcPath(log.original, { linkat(AT_FDCWD, $0, directory, target, AT_SYMLINK_FOLLOW) }) == 0 else {
            let error = errno
            unsynced.unlinked(key)
            return error
        }
        var end = log.end
        error = DeltaLog.commit(session.shadow, named: session.logName, end: &end) { later ? 0 : self.syncLog($0) }
        guard error == 0 else {
            dropTarget(target, of: key)
            return error
        }
        let (file, logFile, logName) = (log.original, session.shadow, session.shadowName)
        let published = PublishedLog(file: file, log: logFile, logName: logName, target: target, key: key, records: records,
                                     committed: !later)
        if later {
            if publishLater(published) {
                session.log = nil
                session.shadow = -1
                session.shadowName = []
                return 0
            }
            error = syncLog(logFile)
            guard error == 0 else {
                dropTarget(target, of: key)
                return error
            }
        }
        // Committed: the change is the file's now. An apply that fails (the disk failing), or a
        // lease that cannot be given back, is tried again by the retirement, which any read or
        // change of the file in place waits for: left to the next mount, the log applied again
        // would overwrite what they wrote meanwhile. The writer hears the error.
        error = published.step.withLock { applyStep(published, &$0) }
        let retirement = LogRetirement { [self] in finish(published) }
        // Where renames must be committed before a sync (btrfs), the retirement's syncs stay in
        // this publish's turn (`RenameCommits`); one that fails waits all the same.
        if renameCommits.needed || !unsynced.retireLater(retirement, of: key) {
            let retired = retirement.run()
            if retired == 0 {
                error = 0
            } else if unsynced.retireLater(retirement, of: key, beyondLimit: true) {
                error = retired
            } else {
                session.shadowName = []
                return retired
            }
        }
        // The retirement holds the file and the log now, or closed the one and drops the other.
        session.log = nil
        session.shadow = -1
        session.shadowName = []
        return error
    }

    /// Syncs a log for its commit: with the shadow directory where a file's sync does not make
    /// the log's names durable (a log whose names are durable without its commit is dropped, a
    /// commit without its names is never found).
    private func syncLog(_ log: Int32) -> Int32 {
        fileSyncCarriesNames ? Backing.check(fsync(log)) : Backing.syncTogether([log, directory]).first { $0 != 0 } ?? 0
    }

    /// Leaves a close's logged change, committed but not synced, to the background: the commit's
    /// sync, the apply, the retirement. The file keeps its size, and its lease holds back every
    /// open of it until the change is applied; its times are set now, as the change's writes
    /// would have set them. False when that cannot be: the caller goes on.
    private func publishLater(_ published: PublishedLog) -> Bool {
        var times = [timespec(tv_sec: 0, tv_nsec: Int(UTIME_OMIT)), timespec(tv_sec: 0, tv_nsec: Int(UTIME_NOW))]
        guard futimens(published.file, &times) == 0 else { return false }
        return unsynced.retireLater(LogRetirement { [self] in finish(published) }, of: published.key)
    }

    /// Takes a published log on from where it is, once each step: the commit's sync (a failure
    /// drops the change: the file keeps its previous version, as a local disk's cache may lose
    /// what a failing disk does not take), the apply (giving the lease back), the retirement.
    /// Returns 0 or the errno of the step that failed, which the next call tries again. A dropped
    /// change is work done, whoever runs it: an open waiting for it reads the previous version,
    /// and the failure is noted for the closes after it.
    private func finish(_ published: PublishedLog) -> Int32 {
        published.step.withLock { step in
            if step == .commit {
                guard syncLog(published.log) == 0 else {
                    dropTarget(published.target, of: published.key)
                    // Its close gives the lease back.
                    close(published.file)
                    drop(published)
                    step = .done
                    unsynced.noteFailure()
                    return 0
                }
                step = .apply
            }
            if step == .apply {
                let error = applyStep(published, &step)
                guard error == 0 else { return error }
            }
            if step == .retire {
                let error = retire(published.log, applying: published.records, to: published.file, key: published.key,
                                   target: published.target)
                guard error == 0 else { return error }
                close(published.file)
                drop(published)
                step = .done
            }
            return 0
        }
    }

    /// Applies a committed log to its file and gives its lease back, even when the apply failed:
    /// opens that waited for the lease go on (and see the change whole when it was applied). The
    /// step moves on to the retirement once both are done; otherwise the next try does them again.
    /// EAGAIN from the lease: none was held (leases off, or given back by an earlier try).
    private func applyStep(_ published: PublishedLog, _ step: inout PublishedLog.Step) -> Int32 {
        let error = apply(published.records, of: published.log, to: published.file)
        let released = clinux_set_lease(published.file, 0) == 0 || errno == EAGAIN ? 0 : errno
        guard error == 0 else { return error }
        guard released == 0 else { return released }
        step = .retire
        return 0
    }

    /// Applies a committed log to its file, once more if that fails (the disk failing).
    private func apply(_ records: [DeltaLog.Record], of log: Int32, to file: Int32) -> Int32 {
        let error = DeltaLog.apply(records, of: log, to: file)
        return error == 0 ? 0 : DeltaLog.apply(records, of: log, to: file)
    }

    /// Removes the link of a log that was not committed to its file: it is never applied.
    private func dropTarget(_ target: [CChar], of key: BackingKey) {
        unlinkat(directory, target, 0)
        unsynced.unlinked(key)
    }

    /// Removes a log no longer needed (or makes it a spare), in the background: freeing its
    /// blocks costs a sixth of a cold change.
    private func drop(_ published: PublishedLog) {
        remover.asyncInBackground {
            close(published.log)
            self.removeOrReuse(published.logName)
        }
    }

    /// A log's retirement, once it was applied to `file`: the file's sync (the log applied once
    /// more if it fails), then the removal of the log's link to it, durably: a log without it is
    /// never applied again (`DeltaLog.recover`). Synced even where a file's sync carries names: a
    /// live writer's later fdatasync of the file commits none of them, and a cut would then apply
    /// this log again over what it wrote. Returns 0 or the errno; the log stays on a failure.
    private func retire(_ log: Int32, applying records: [DeltaLog.Record], to file: Int32, key: BackingKey,
                        target: [CChar]) -> Int32 {
        var error = Backing.check(fsync(file))
        if error != 0 {
            error = DeltaLog.apply(records, of: log, to: file)
            if error == 0 { error = Backing.check(fsync(file)) }
        }
        guard error == 0 else { return error }
        return unsynced.unlinkDurably(key) { unlinkat(directory, target, 0) == 0 || errno == ENOENT ? 0 : errno }
    }

    /// Marks the session failed, so that nothing of it is published.
    func fail(_ session: WriteSession, with error: Int32) {
        session.failure = error
        session.dirty = false
    }
}

/// An inode's flags, extended flags and project (`clinux_inode_flags`).
struct InodeFlags: Equatable {
    let flags: UInt32
    let extended: UInt32
    let project: UInt32

    init?(of file: Int32) {
        var flags: UInt32 = 0, extended: UInt32 = 0, project: UInt32 = 0
        guard clinux_inode_flags(file, &flags, &extended, &project) == 0 else { return nil }
        (self.flags, self.extended, self.project) = (flags, extended, project)
    }
}
