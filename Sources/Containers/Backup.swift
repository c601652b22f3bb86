import Foundation

/// What a backup or restore carried.
public struct BackupSummary: Sendable, Equatable {
    public var files = 0
    public var directories = 0
    public var symlinks = 0
    /// Bytes of file data.
    public var bytes: UInt64 = 0
    /// Container-relative paths left out because they were marked excluded from backup.
    public var excluded: [String] = []
    /// Container-relative paths left out because they are sockets, pipes or devices.
    public var skipped: [String] = []
}

/// Backs up and restores a container's Documents and Library, like an iOS device backup of an app.
///
/// Left out: `tmp`, `Library/Caches`, the bundle (reinstall restores it), and every item with the
/// extended attribute `user.containerfs.exclude-from-backup` (the role of NSURLIsExcludedFromBackupKey;
/// a directory's mark leaves out everything inside). Modes, access and modification times and
/// `user.*` extended attributes are kept; owners are not (the restoring user owns what it restores).
public enum Backup {
    /// The extended attribute that leaves an item out of backups. Any value but `0`, `false` or
    /// `no` counts: `setfattr -n user.containerfs.exclude-from-backup -v 1 FILE`.
    public static let excludeAttribute = "user.containerfs.exclude-from-backup"

    /// The container's parts a backup holds.
    static let includedTops = ["Documents", "Library"]

    // MARK: - Backing up

    /// Writes the backup of `id` to `archivePath`, replacing it only once the new archive is complete.
    @discardableResult
    public static func create(store: Store, id: AppID, archive archivePath: String,
                              progress: ProgressListener? = nil) throws -> BackupSummary {
        _ = try store.record(id)
        // A crash's records are settled first: the backup holds versions, never what a cut left.
        try ShadowDirectory.recoverLeft(in: store)
        let container = try DirectoryHandle(path: store.containerPath(id))
        let destination = Store.absolute(archivePath)
        // An archive inside the store would end up in backups of itself, or be swept by cleanups.
        guard !(destination + "/").hasPrefix(store.root + "/") else {
            throw ContainerError("\(archivePath) is inside the store \(store.root); write the backup somewhere outside it.")
        }
        let partial = destination + ".partial-" + scratchName("backup")
        // Backups hold private data: only the owner reads them.
        let fd = Glibc.open(partial, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw ContainerError("\(archivePath): cannot create the archive (\(String(cString: strerror(errno)))). Choose a writable place for it.")
        }
        var finished = false
        defer {
            close(fd)
            if !finished { unlink(partial) }
        }

        if let progress {
            var total: Int64 = 0
            for top in includedTops {
                if let directory = try DirectoryHandle.ifPresent(in: container, top) { total += try FileTree.totalFileBytes(directory) }
            }
            progress.begin("Backing up \(id)", totalUnits: total)
        }
        defer { progress?.end() }

        let writer = ArchiveWriter(fd: fd, path: partial)
        var summary = BackupSummary()
        for top in includedTops {
            guard let directory = try DirectoryHandle.ifPresent(in: container, top), let info = try container.status(of: top) else { continue }
            try writer.write(header(.directory, top, info, xattrs: try userXattrs(directory.fd, path: directory.path)))
            summary.directories += 1
            try FileTree.walk(directory, prefix: top) { entry in
                try archive(entry, to: writer, summary: &summary, progress: progress)
            }
        }
        try writer.finish()
        guard rename(partial, destination) == 0 else { throw posixError("rename", destination) }
        finished = true
        return summary
    }

    /// Archives one entry; answers whether to descend into it.
    private static func archive(_ entry: FileTree.Entry, to writer: ArchiveWriter, summary: inout BackupSummary,
                                progress: ProgressListener?) throws -> Bool {
        if entry.path == ContainerLayout.caches { return false }
        switch entry.kind {
        case .directory:
            guard let directory = try DirectoryHandle.ifPresent(in: entry.parent, entry.name) else { return false }
            let xattrs = try userXattrs(directory.fd, path: directory.path)
            if isExcluded(xattrs) { summary.excluded.append(entry.path); return false }
            try writer.write(header(.directory, entry.path, entry.info, xattrs: xattrs))
            summary.directories += 1
            return true
        case .file:
            let fd = try entry.parent.openFile(entry.name)
            defer { close(fd) }
            var info = stat()
            guard fstat(fd, &info) == 0 else { throw posixError("stat", entry.fullPath) }
            let xattrs = try userXattrs(fd, path: entry.fullPath)
            if isExcluded(xattrs) { summary.excluded.append(entry.path); return false }
            try writer.write(header(.file, entry.path, info, xattrs: xattrs))
            try writer.writeData(from: fd, size: UInt64(info.st_size), sourcePath: entry.fullPath, progress: progress)
            summary.files += 1
            summary.bytes += UInt64(info.st_size)
        case .symlink:
            // Linux allows no user.* attributes on symlinks, so they cannot be marked excluded.
            try writer.write(header(.symlink, entry.path, entry.info, xattrs: []))
            try writer.writeTarget(try entry.parent.readLink(entry.name))
            summary.symlinks += 1
        case .other:
            summary.skipped.append(entry.path)
        }
        return false
    }

    private static func header(_ tag: BackupArchive.Tag, _ path: String, _ info: stat,
                               xattrs: [(name: String, value: [UInt8])]) -> BackupArchive.Header {
        BackupArchive.Header(tag: tag, path: path, mode: UInt32(info.st_mode & 0o7777),
                             atime: info.st_atim, mtime: info.st_mtim, xattrs: xattrs)
    }

    /// The `user.*` extended attributes of an open item, sorted by name.
    static func userXattrs(_ fd: Int32, path: String) throws -> [(name: String, value: [UInt8])] {
        guard let names = LinuxCalls.xattrNames(fd) else { throw posixError("listxattr", path) }
        return try names.filter { $0.hasPrefix("user.") }.sorted().compactMap { name in
            guard let value = LinuxCalls.xattr(fd, name) else {
                if errno == ENODATA { return nil } // removed meanwhile
                throw posixError("getxattr \(name)", path)
            }
            return (name, value)
        }
    }

    static func isExcluded(_ xattrs: [(name: String, value: [UInt8])]) -> Bool {
        guard let mark = xattrs.first(where: { $0.name == excludeAttribute }) else { return false }
        let text = String(decoding: mark.value, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines).lowercased()
        return !["0", "false", "no"].contains(text)
    }

    // MARK: - Restoring

    /// Replaces the Documents and Library of `id` with those in `archivePath`.
    ///
    /// The archive is unpacked into the store's work directory and checked in full (paths, symlinks,
    /// checksum) before the container is touched; then each of Documents and Library is swapped in
    /// with one rename. Archives with absolute paths, `..`, paths outside Documents and Library, or
    /// symlinks that lead out of the container are refused. tmp is emptied and Library/Caches starts empty.
    ///
    /// Restoring over a mounted app is the caller's to refuse: `mountCheck` throws to refuse.
    @discardableResult
    public static func restore(store: Store, id: AppID, archive archivePath: String, progress: ProgressListener? = nil,
                               mountCheck: (Store, AppID) throws -> Void = { _, _ in }) throws -> BackupSummary {
        _ = try store.record(id)
        try mountCheck(store, id)
        let source = Store.absolute(archivePath)
        let fd = Glibc.open(source, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            throw ContainerError("\(archivePath): cannot open the archive (\(String(cString: strerror(errno)))). Give the path of a backup made by `containerfs backup`.")
        }
        defer { close(fd) }
        var archiveInfo = stat()
        guard fstat(fd, &archiveInfo) == 0 else { throw posixError("fstat", archivePath) }
        progress?.begin("Restoring \(id)", totalUnits: Int64(archiveInfo.st_size))
        defer { progress?.end() }

        let work = try DirectoryHandle(path: store.workPath)
        let stagingName = scratchName("restore-\(id.rawValue)")
        guard mkdirat(work.fd, stagingName, 0o700) == 0 else { throw posixError("mkdir", work.path + "/" + stagingName) }
        defer { try? FileTree.removeEntry(stagingName, in: work) }
        let staging = try DirectoryHandle(in: work, stagingName)

        let unpacker = Unpacker(root: staging, reader: try ArchiveReader(fd: fd, path: source, progress: progress))
        try unpacker.unpackAll()
        try unpacker.completeLayout()
        try unpacker.applyDirectoryMetadata()
        try unpacker.checkSymlinks(container: store.containerPath(id))

        // On disk before it takes the container's place, so that no journal commit makes a swap
        // durable before the files it brings; and durable when the restore says it is done.
        try store.syncToDisk()
        let container = try DirectoryHandle(path: store.containerPath(id))
        for top in includedTops { try swap(top, from: staging, into: container) }
        try Lifecycle.emptyTmp(store: store, id: id)
        try? FileTree.removeEntry(stagingName, in: work)
        try store.syncToDisk()
        return unpacker.summary
    }

    /// Puts `staging/top` in place of `container/top`, leaving the old one in staging to be removed.
    private static func swap(_ top: String, from staging: DirectoryHandle, into container: DirectoryHandle) throws {
        if LinuxCalls.renameat2(staging.fd, top, container.fd, top, LinuxCalls.renameExchange) == 0 { return }
        guard errno == EINVAL || errno == ENOSYS || errno == ENOENT else { throw posixError("rename", container.path + "/" + top) }
        let old = "old-" + top
        guard renameat(container.fd, top, staging.fd, old) == 0 || errno == ENOENT,
              renameat(staging.fd, top, container.fd, top) == 0 else {
            throw posixError("rename", container.path + "/" + top)
        }
    }
}

/// Unpacks an archive's records into a staging directory, never following a symlink.
private final class Unpacker {
    let root: DirectoryHandle
    let reader: ArchiveReader
    var summary = BackupSummary()
    /// Directory metadata is applied last, deepest first, so read-only directories can be filled.
    private var directories: [(components: [String], header: BackupArchive.Header)] = []
    private var symlinks: [[String]] = []
    private var cachedParent: (path: [String], handle: DirectoryHandle)?

    init(root: DirectoryHandle, reader: ArchiveReader) {
        self.root = root
        self.reader = reader
    }

    func unpackAll() throws {
        var records: UInt64 = 0
        while let header = try reader.next(recordsSoFar: records) {
            records += 1
            let components = try validated(header.path)
            let parent = try parentDirectory(of: components, path: header.path)
            let name = components.last!
            switch header.tag {
            case .directory:
                guard mkdirat(parent.fd, name, 0o700) == 0 else { throw refusal(header.path, errno) }
                let directory = try DirectoryHandle(in: parent, name)
                try withExtendedLifetime(directory) { try setXattrs(header, on: directory.fd) }
                directories.append((components, header))
                summary.directories += 1
            case .file:
                try unpackFile(header, name: name, in: parent)
            case .symlink:
                let target = try reader.target()
                guard !target.hasPrefix("/"), !target.isEmpty else {
                    throw reader.refused("the symlink \(header.path) points to the absolute path \(target), outside the container")
                }
                guard symlinkat(target, parent.fd, name) == 0 else { throw refusal(header.path, errno) }
                var times = [header.atime, header.mtime]
                _ = utimensat(parent.fd, name, &times, AT_SYMLINK_NOFOLLOW)
                symlinks.append(components)
                summary.symlinks += 1
            case .end:
                throw reader.damaged("a misplaced end record")
            }
        }
    }

    /// Sets the modes and times of the unpacked directories, deepest first (after `completeLayout`,
    /// which would otherwise change their times).
    func applyDirectoryMetadata() throws {
        for (components, header) in directories.reversed() {
            let directory = try root.descend(components.joined(separator: "/"))
            var times = [header.atime, header.mtime]
            guard fchmod(directory.fd, mode_t(header.mode & 0o7777)) == 0, futimens(directory.fd, &times) == 0 else {
                throw posixError("set metadata", directory.path)
            }
        }
    }

    private func unpackFile(_ header: BackupArchive.Header, name: String, in parent: DirectoryHandle) throws {
        let size = try reader.size()
        let fd = openat(parent.fd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw refusal(header.path, errno) }
        defer { close(fd) }
        let path = parent.path + "/" + name
        try reader.copyData(size, to: fd, destinationPath: path)
        try setXattrs(header, on: fd)
        var times = [header.atime, header.mtime]
        guard fchmod(fd, mode_t(header.mode & 0o7777)) == 0, futimens(fd, &times) == 0, fsync(fd) == 0 else {
            throw posixError("set metadata", path)
        }
        summary.files += 1
        summary.bytes += size
    }

    private func setXattrs(_ header: BackupArchive.Header, on fd: Int32) throws {
        // Only the user namespace travels; the others belong to the machine that wrote them.
        for (name, value) in header.xattrs where name.hasPrefix("user.") {
            guard LinuxCalls.setXattr(fd, name, value) == 0 else {
                throw ContainerError("\(header.path): cannot set the extended attribute \(name) (\(String(cString: strerror(errno)))). The store's filesystem must support user extended attributes.")
            }
        }
    }

    /// The path's components, or a refusal of the whole archive: no absolute paths, no `..`,
    /// nothing outside Documents and Library, nothing in Library/Caches.
    private func validated(_ path: String) throws -> [String] {
        guard !path.hasPrefix("/") else { throw reader.refused("it holds the absolute path \(path)") }
        let components = path.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
        guard !components.contains(".."), !components.contains("."), !components.contains("") else {
            throw reader.refused("it holds the path \(path), which is not a plain relative path")
        }
        guard Backup.includedTops.contains(components[0]) else {
            throw reader.refused("it holds \(path), outside Documents and Library")
        }
        if components.count >= 2 && components[0] == "Library" && components[1] == "Caches" {
            throw reader.refused("it holds \(path), inside Library/Caches")
        }
        return components
    }

    /// The directory that will hold `components`' last item, reached one real directory at a time.
    private func parentDirectory(of components: [String], path: String) throws -> DirectoryHandle {
        let parentPath = Array(components.dropLast())
        if let cached = cachedParent, cached.path == parentPath { return cached.handle }
        do {
            let handle = try root.descend(parentPath.joined(separator: "/"))
            cachedParent = (parentPath, handle)
            return handle
        } catch {
            throw reader.damaged("\(path) comes before its directory, or inside something that is not a directory")
        }
    }

    private func refusal(_ path: String, _ code: Int32) -> ContainerError {
        code == EEXIST ? reader.damaged("it holds \(path) twice") : posixError("create", path, code)
    }

    /// Creates any fixed directory of Documents and Library the archive lacked (Library/Caches always).
    func completeLayout() throws {
        for directory in ContainerLayout.directories where Backup.includedTops.contains(where: { directory.hasPrefix($0) }) {
            let components = directory.split(separator: "/").map(String.init)
            let parent = try root.descend(components.dropLast().joined(separator: "/"))
            if mkdirat(parent.fd, components.last!, 0o755) != 0 {
                guard errno == EEXIST, (try? DirectoryHandle(in: parent, components.last!)) != nil else {
                    throw reader.refused("it holds \(directory) as something other than a directory")
                }
            }
        }
    }

    /// Refuses the archive if following any of its symlinks, the way the kernel would, leaves the
    /// container. Symlinks in the restored tree are followed; the rest of the container (the
    /// bundle) is looked up in place.
    func checkSymlinks(container: String) throws {
        for link in symlinks where !staysInside(link, container: container) {
            throw reader.refused("the symlink \(link.joined(separator: "/")) leads outside the container (or loops)")
        }
    }

    private func staysInside(_ link: [String], container: String) -> Bool {
        var current = Array(link.dropLast())
        guard var pending = readLink(link, container: container).map(ContainerPath.components) else { return false }
        var hops = 1
        while !pending.isEmpty {
            let next = pending.removeFirst()
            if next == "." || next.isEmpty { continue }
            if next == ".." {
                if current.isEmpty { return false }
                current.removeLast()
                continue
            }
            current.append(next)
            guard let target = readLink(current, container: container) else { continue }
            hops += 1
            // An absolute target, or more hops than the kernel allows (a loop): refused.
            if target.hasPrefix("/") || hops > 40 { return false }
            current.removeLast()
            pending = ContainerPath.components(target) + pending
        }
        return true
    }

    /// The target if `components` names a symlink in the restored tree or the container.
    private func readLink(_ components: [String], container: String) -> String? {
        let base = Backup.includedTops.contains(components[0]) ? root.path : container
        var target = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let length = readlink(base + "/" + components.joined(separator: "/"), &target, Int(PATH_MAX))
        guard length >= 0 else { return nil }
        return String(decoding: target[..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}

private enum ContainerPath {
    static func components(_ path: String) -> [String] {
        path.split(separator: "/", omittingEmptySubsequences: true).map(String.init)
    }
}
