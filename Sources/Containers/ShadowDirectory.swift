import Foundation

/// A daemon's shadow directory, STORE/work/shadows/PID (docs/atomic-replace.md).
public enum ShadowDirectory {
    /// Names of second links to files that the daemon created and was writing in place: their
    /// published version is the empty file. (An empty spare made ahead for a new file has such a
    /// name too, and one link: emptied, it is removed like the rest.)
    public static let freshPrefix = "fresh-"

    /// The names (daemon process ids) of the shadow directories in `store` whose daemons are gone:
    /// not among the mounts that hold their records' locks (a process id alone may be reused).
    /// Throws if the directory holding them, or the running daemons' records, cannot be read: what
    /// they hold must not be skipped, nor a running daemon's work taken for a dead one's.
    public static func left(in store: Store) throws -> [String] {
        // Listed before the records are read: a daemon records itself before it makes its
        // directory, so one that starts in between is counted live, not taken for a dead one.
        let names = try store.workDirectory("shadows")?.names() ?? []
        let live = Set(try MountRegistry.active(in: store).map(\.pid))
        return names.filter { name in pid_t(name).map { !live.contains($0) } ?? false }
    }

    /// Recovers what daemons that are gone left in `store` (`remove`), before something reads the
    /// containers without a mount: until then a file published without waiting for its data may
    /// read as what a power cut left of it.
    public static func recoverLeft(in store: Store) throws {
        let leftovers = try left(in: store)
        guard !leftovers.isEmpty, let shadows = try store.workDirectory("shadows") else { return }
        for name in leftovers { try remove(name, in: shadows) }
    }

    /// Removes the shadow directory `name` of a daemon that is gone from `shadows` (STORE/work/shadows,
    /// open: the store's owner owns it, so what is in it is reached from there one real directory
    /// at a time, never through a link planted there; an entry that is not a directory is no
    /// daemon's, and is removed). Its shadows are unpublished writes;
    /// the files it was writing in place since creating them are emptied back to their published
    /// version. Versions it published without waiting for their data stay where they read as their
    /// records say, and otherwise go back to their previous version (`PublishRecord`). Committed
    /// logs of large files' rewrites are applied first (`DeltaLog`). A directory holding a log that
    /// cannot be applied, or a file that cannot be put back, stays (its marks are what says what to
    /// do), and the error says why.
    public static func remove(_ name: String, in shadows: DirectoryHandle) throws {
        guard let attributes = try shadows.status(of: name) else { return }
        guard EntryKind(attributes) == .directory else { return try FileTree.removeEntry(name, in: shadows) }
        let directory = try DirectoryHandle(in: shadows, name)
        let recovery = DeltaLog.recover(in: directory.fd)
        guard recovery == 0 else { throw UnappliedLog(code: recovery) }
        // Each record's or mark's file, and the version a record puts back where it does not match.
        var files: [(name: String, record: PublishRecord?, previous: String?)] = []
        // A directory that cannot be listed is not taken for empty: its removal would drop the
        // records that say what to put back.
        for name in try directory.names() {
            if name.hasPrefix(PublishRecord.replacedPrefix),
               let (previous, record) = PublishRecord.parse(String(name.dropFirst(PublishRecord.replacedPrefix.count))) {
                files.append((name, record, previous))
            } else if name.hasPrefix(freshPrefix) {
                files.append((name, PublishRecord.parse(name)?.record, nil))
            }
        }
        // A version published without its data can be the previous version of the next one, also
        // published without its data (an unsynced rewrite, then a synced one whose sync the cut
        // interrupted): it is put back first, or the next one would copy what the cut left of it.
        let inode = { (name: String) throws -> ino_t? in
            var attributes = stat()
            guard fstatat(directory.fd, name, &attributes, AT_SYMLINK_NOFOLLOW) == 0 else {
                guard errno == ENOENT else { throw error(errno) }
                return nil
            }
            return attributes.st_ino
        }
        var byInode: [ino_t: Int] = [:]
        for (index, file) in files.enumerated() {
            if let inode = try inode(file.name) { byInode[inode] = index }
        }
        let firstPutBack = try files.map { file in try file.previous.flatMap(inode).flatMap { byInode[$0] } }
        for index in restoreOrder(firstPutBack) {
            let error = restore(files[index].name, in: directory.fd, unless: files[index].record, from: files[index].previous)
            guard error == 0 else { throw Self.error(error) }
        }
        try FileTree.removeEntry(name, in: shadows)
    }

    /// What `remove` throws when the committed logs of large files' rewrites cannot be applied
    /// (`DeltaLog.recover`): until they are, those files may be incomplete. `code` is the errno.
    public struct UnappliedLog: Error, CustomStringConvertible {
        public let code: Int32
        public var description: String { String(cString: strerror(code)) }
    }

    /// The error `code` (an errno) names.
    private static func error(_ code: Int32) -> POSIXError { POSIXError(POSIXErrorCode(rawValue: code) ?? .EIO) }

    /// The indices of `firstPutBack` in an order where each comes after the one it names (the
    /// record whose file is its previous version); one that names itself, or a cycle, names none.
    static func restoreOrder(_ firstPutBack: [Int?]) -> [Int] {
        var order: [Int] = [], placed = [Bool](repeating: false, count: firstPutBack.count)
        for start in firstPutBack.indices {
            var chain: [Int] = []
            var next: Int? = start
            while let index = next, !placed[index], !chain.contains(index) {
                chain.append(index)
                next = firstPutBack[index]
            }
            for index in chain.reversed() {
                placed[index] = true
                order.append(index)
            }
        }
        return order
    }

    /// Puts the file linked as `name` in `directory` back to its previous version, unless it reads
    /// as `record` says: the content of the file `previous` there, or empty without one (a new
    /// file). A previous version that is the file itself was never replaced. Returns 0 or the errno.
    static func restore(_ name: String, in directory: Int32, unless record: PublishRecord?, from previous: String?) -> Int32 {
        let file = openat(directory, name, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard file >= 0 else { return errno == ENOENT ? 0 : errno }
        defer { close(file) }
        if let record, record.matches(file) { return 0 }
        guard let previous else { return ftruncate(file, 0) == 0 ? 0 : errno }
        let source = openat(directory, previous, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        // Without its previous version the record has nothing to put back.
        guard source >= 0 else { return errno == ENOENT ? 0 : errno }
        defer { close(source) }
        var fileAttributes = stat(), sourceAttributes = stat()
        guard fstat(file, &fileAttributes) == 0, fstat(source, &sourceAttributes) == 0 else { return errno }
        if fileAttributes.st_ino == sourceAttributes.st_ino { return 0 }
        guard ftruncate(file, 0) == 0 else { return errno }
        let error = FileData.copy(from: source, at: 0, to: file, at: 0, length: sourceAttributes.st_size, ifSourceEnds: 0)
        guard error == 0 else { return error }
        let times = [sourceAttributes.st_atim, sourceAttributes.st_mtim]
        // Durable before the record goes with the directory.
        guard futimens(file, times) == 0, fsync(file) == 0 else { return errno }
        return 0
    }
}
