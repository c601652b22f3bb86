import CLinux
import Containers
import Coordination
import FUSELowLevel
import Glibc

// Making, removing and renaming names: each one coordinated, and checked against policy first.
extension ContainerFileSystem {
    /// The checks every operation that makes a name shares: a valid name, in a place that allows it.
    private func creationError(in parent: Node, name: FileName) -> Int32 {
        let error = nameError(name)
        return error != 0 ? error : Policy.create(in: parent.zone)
    }

    /// Makes a name with `make` inside a coordinated creation, gives the new item of type `type` to
    /// the caller (not a hard link's existing one: `type` nil) with the permissions of `mode`, and
    /// answers with its entry.
    private func makeItem(_ request: FuseRequest, parent: InodeNumber, name: FileName, type: mode_t?,
                          mode: mode_t = 0, _ make: @escaping @Sendable (Node, UnsafePointer<CChar>) -> Int32) {
        let parentNode = nodes.node(parent)
        let denied = creationError(in: parentNode, name: name)
        guard denied == 0 else { return request.reply(error: denied) }
        let owned = OwnedName(name)
        let caller = request.caller
        coordination.perform(.create(nodes.itemPath(of: parentNode, appending: owned.bytes)), isDirectory: type == S_IFDIR,
                             caller: caller) { access in
            owned.withPointer { pointer in
                let name = FileName(pointer)
                var error = Backing.check(make(parentNode, pointer))
                if error == 0, let type {
                    error = self.settleMadeItem(pointer, of: type, mode: mode, in: parentNode, by: caller)
                }
                access.end(tookEffect: error == 0)
                guard error == 0 else { return request.reply(error: error) }
                self.replyEntry(request, parent: parentNode, name: name, lookingUp: false)
            }
        }
    }

    /// Gives the item just made as `name` to the caller, with the permissions of `mode` that the
    /// daemon's umask took, if it is still the one the daemon made: of `type`, the daemon's, empty
    /// and linked once (a name someone else replaced meanwhile is left alone). An item that cannot
    /// be settled is removed again, and the creation fails.
    private func settleMadeItem(_ name: UnsafePointer<CChar>, of type: mode_t, mode: mode_t, in parent: Node,
                                by caller: Caller) -> Int32 {
        let adopting = daemonIsRoot && (caller.uid != 0 || caller.gid != 0)
        guard adopting || mode & 0o777 & Backing.creationMask != 0 else { return 0 }
        let descriptor = Backing.openPath(name, in: parent.descriptor)
        guard descriptor >= 0 else { return errno }
        defer { close(descriptor) }
        let (attributes, error) = Backing.attributes(of: descriptor)
        guard error == 0 else { return error }
        // (A new directory has two links, or one on filesystems such as btrfs.)
        guard attributes.st_mode & S_IFMT == type, attributes.st_uid == geteuid(),
              type == S_IFDIR ? attributes.st_nlink <= 2 : attributes.st_nlink == 1,
              type == S_IFDIR || type == S_IFLNK || attributes.st_size == 0 else { return EEXIST }
        var settled = adopting ? adoptOwnership(of: descriptor, in: parent, by: caller) : 0
        if settled == 0 { settled = Backing.restorePermissions(descriptor, requested: mode) }
        if settled != 0, unlinkat(parent.descriptor, name, type == S_IFDIR ? AT_REMOVEDIR : 0) != 0 {
            return errno
        }
        return settled
    }

    public func mknod(_ request: FuseRequest, parent: InodeNumber, name: FileName, mode: mode_t, device: dev_t) {
        // Device nodes have no place in an app container.
        let type = mode & S_IFMT
        guard type == S_IFREG || type == S_IFIFO || type == S_IFSOCK else { return request.reply(error: EPERM) }
        makeItem(request, parent: parent, name: name, type: type, mode: mode) { mknodat($0.descriptor, $1, mode, 0) }
    }

    public func mkdir(_ request: FuseRequest, parent: InodeNumber, name: FileName, mode: mode_t) {
        makeItem(request, parent: parent, name: name, type: S_IFDIR, mode: mode) { mkdirat($0.descriptor, $1, mode) }
    }

    public func symlink(_ request: FuseRequest, target: UnsafePointer<CChar>, parent: InodeNumber, name: FileName) {
        let ownedTarget = OwnedName(FileName(target))
        makeItem(request, parent: parent, name: name, type: S_IFLNK) { parent, name in
            ownedTarget.withPointer { symlinkat($0, parent.descriptor, name) }
        }
    }

    public func link(_ request: FuseRequest, inode: InodeNumber, newParent: InodeNumber, newName: FileName) {
        let node = nodes.node(inode)
        let denied = Policy.link(node.zone, into: nodes.node(newParent).zone)
        guard denied == 0 else { return request.reply(error: denied) }
        endFreshSession(of: node)
        // A new name for an item that exists: its owner stays.
        makeItem(request, parent: newParent, name: newName, type: nil) { parent, name in
            // The new name must not be durable before the data of an unsynced publish.
            let waited = self.shadows.unsynced.waitForWrite(of: node.currentKey)
            guard waited == 0 else {
                errno = waited
                return -1
            }
            let result = self.shadows.renameCommits.renaming {
                node.withProcPath { linkat(AT_FDCWD, $0, parent.descriptor, name, AT_SYMLINK_FOLLOW) }
            }
            // An unnamed file's node is not the one the answer names, so the kernel would keep
            // its count of links at 0.
            if result == 0 { self.kernel?.invalidateInode(self.nodes.inodeNumber(of: node), offset: -1, length: 0) }
            return result
        }
    }

    public func unlink(_ request: FuseRequest, parent: InodeNumber, name: FileName) {
        remove(request, parent: parent, name: name, flags: 0)
    }

    public func rmdir(_ request: FuseRequest, parent: InodeNumber, name: FileName) {
        remove(request, parent: parent, name: name, flags: AT_REMOVEDIR)
    }

    private func remove(_ request: FuseRequest, parent: InodeNumber, name: FileName, flags: Int32) {
        let parentNode = nodes.node(parent)
        var denied = nameError(name)
        if denied == 0 { denied = Policy.remove(parentNode.zone.child(named: name.bytes)) }
        guard denied == 0 else { return request.reply(error: denied) }
        let owned = OwnedName(name)
        coordination.perform(.delete(nodes.itemPath(of: parentNode, appending: owned.bytes)), isDirectory: flags != 0,
                             caller: request.caller) { access in
            let error = owned.withPointer { name in
                if flags == 0 { self.keepReachable(name, in: parentNode) }
                return Backing.check(unlinkat(parentNode.descriptor, name, flags))
            }
            access.end(tookEffect: error == 0)
            request.reply(error: error)
        }
    }

    public func rename(_ request: FuseRequest, parent: InodeNumber, name: FileName,
                       newParent: InodeNumber, newName: FileName, flags: UInt32) {
        let from = nodes.node(parent)
        let to = nodes.node(newParent)
        guard flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE) == 0 else { return request.reply(error: EINVAL) }
        var denied = nameError(name)
        if denied == 0 { denied = nameError(newName) }
        var source = stat(), destination = stat()
        guard fstatat(from.descriptor, name.pointer, &source, AT_SYMLINK_NOFOLLOW) == 0 else { return request.reply(error: errno) }
        let replacing = flags & RENAME_NOREPLACE == 0
            && fstatat(to.descriptor, newName.pointer, &destination, AT_SYMLINK_NOFOLLOW) == 0
        if denied == 0 { denied = renameDenial(from: from, name: name, to: to, newName: newName, flags: flags, replacing: replacing) }
        guard denied == 0 else { return request.reply(error: denied) }

        let oldName = OwnedName(name), newOwned = OwnedName(newName)
        let sourceKey = BackingKey(source), destinationKey = replacing ? BackingKey(destination) : nil
        // An editor's save (a new file renamed over the old one) is a change of the old one, not a deletion.
        let savesOver = replacing && flags & RENAME_EXCHANGE == 0
            && source.st_mode & S_IFMT == S_IFREG && destination.st_mode & S_IFMT == S_IFREG
        // What such a save replaces is kept as a version, unless it is empty, or has another name
        // (a hard link: it stays that file, and a version is never written) (docs/versions.md).
        let replacesOneLink = savesOver && links(destination) == 1
        let keepsReplaced = replacesOneLink && destination.st_size > 0
        let movesDirectory = source.st_mode & S_IFMT == S_IFDIR
            || flags & RENAME_EXCHANGE != 0 && destination.st_mode & S_IFMT == S_IFDIR
        func operation() -> CoordinatedOperation {
            let sourcePath = nodes.itemPath(of: from, appending: oldName.bytes)
            let destinationPath = nodes.itemPath(of: to, appending: newOwned.bytes)
            return savesOver
                ? .saveByReplacing(temporary: sourcePath, original: destinationPath)
                : .move(from: sourcePath, to: destinationPath, replacesDestination: replacing)
        }
        coordination.perform(operation(), isDirectory: source.st_mode & S_IFMT == S_IFDIR, caller: request.caller) { access in
            var version: (kept: VersionKeeper.Kept, place: ItemPath)?
            let error = oldName.withPointer { oldPointer in
                newOwned.withPointer { newPointer in
                    let rename = {
                        self.shadows.renameCommits.renaming {
                            Backing.check(clinux_renameat2(from.descriptor, oldPointer, to.descriptor, newPointer, flags))
                        }
                    }
                    let unsynced = self.shadows.unsynced
                    let exchanges = flags & RENAME_EXCHANGE != 0, replacesFile = replacing && !exchanges
                    // As ext4 writes a file renamed over another first: the rename must not be
                    // durable before the data of an unsynced publish (and a data write that failed
                    // is heard, the name unchanged).
                    var waited = replacesFile ? unsynced.waitForRetirement(of: sourceKey) : unsynced.waitForWrite(of: sourceKey)
                    if waited == 0, exchanges, let destinationKey {
                        waited = unsynced.waitForWrite(of: destinationKey)
                    }
                    guard waited == 0 else { return waited }
                    if replacesFile { self.keepReachable(newPointer, in: to) }
                    // The file a save replaces is its previous version.
                    let place = keepsReplaced ? self.shadows.versions?.place(ofName: Array(newOwned.bytes), in: to, nodes: self.nodes)
                        .map { VersionKeeper.Place(path: $0, writer: request.caller.pid) } : nil
                    // A new file not yet written takes it as its record's previous version instead of
                    // waiting; so too a document whose own record waits (the previous save by rename):
                    // the next mount puts the older back first (`ShadowDirectory.restoreOrder`).
                    if replacesOneLink, let destinationKey, destinationKey != sourceKey,
                       let renamed = self.shadows.renameUnwritten(sourceKey, over: newPointer, in: to.descriptor, versionPlace: place,
                                                                  rename: rename) {
                        return renamed
                    }
                    if replacesFile {
                        waited = unsynced.waitForWrite(of: sourceKey)
                        guard waited == 0 else { return waited }
                    }
                    if let place, let versions = self.shadows.versions {
                        version = versions.keepReplaced(newPointer, in: to.descriptor, at: place).map { ($0, place.path) }
                    }
                    return rename()
                }
            }
            if let version, let versions = self.shadows.versions {
                error == 0 ? versions.replaced(version.kept, of: version.place) : versions.notReplaced(version.kept, of: version.place)
            }
            access.end(tookEffect: error == 0)
            guard error == 0 else { return request.reply(error: error) }
            // Before the answer, while the kernel keeps lookups of these names waiting.
            var changed = newOwned.withPointer { self.noteMoved(name: FileName($0), in: to, from: from, oldName: oldName.bytes) }
            if flags & RENAME_EXCHANGE != 0 {
                changed += oldName.withPointer { self.noteMoved(name: FileName($0), in: from, from: to, oldName: newOwned.bytes) }
            }
            // What is above a moved directory's items changed, and with it whether they write in
            // place (an answer asked meanwhile followed the old place); a moved file asks again
            // alone (`NodeTable.didMove`).
            if movesDirectory { self.inPlaceGeneration.add(1, ordering: .releasing) }
            request.replySuccess()
            for node in changed {
                self.kernel?.invalidateInode(self.nodes.inodeNumber(of: node), offset: -1, length: 0)
            }
        }
    }

    private func renameDenial(from: Node, name: FileName, to: Node, newName: FileName, flags: UInt32,
                              replacing: Bool) -> Int32 {
        let source = from.zone.child(named: name.bytes)
        let destination = to.zone.child(named: newName.bytes)
        if flags & RENAME_EXCHANGE != 0 {
            return Policy.exchange(source, in: from.zone, with: destination, in: to.zone)
        }
        return Policy.rename(source, to: destination, in: to.zone, replacing: replacing)
    }

    /// Before `name` in `parent` goes, gives its node (if the kernel knows it) a descriptor of its
    /// own: an item a client holds open still answers, as on a local disk, until the kernel forgets it.
    private func keepReachable(_ name: UnsafePointer<CChar>, in parent: Node) {
        let descriptor = Backing.openPath(name, in: parent.descriptor)
        guard descriptor >= 0 else { return }
        let (attributes, error) = Backing.attributes(of: descriptor)
        if error == 0, let node = nodes.existing(BackingKey(attributes), at: parent, name: name), node.pin(descriptor) { return }
        close(descriptor)
    }

    /// Keeps the node of a renamed item in step with its new place. Returns the nodes whose zone
    /// changed (out of the Inbox): the kernel's cached attributes showed the old zone's mode bits.
    private func noteMoved(name: FileName, in parent: Node, from oldParent: Node, oldName: ArraySlice<UInt8>) -> [Node] {
        var attributes = stat()
        guard fstatat(parent.descriptor, name.pointer, &attributes, AT_SYMLINK_NOFOLLOW) == 0 else { return [] }
        return nodes.didMove(BackingKey(attributes), from: oldParent, oldName: oldName, to: parent, name: name,
                             zone: parent.zone.child(named: name.bytes))
    }
}
