import Containers
import Coordination
import Glibc

// What the control server asks of the filesystem: who may present or coordinate an item, and
// which write sessions run.
extension ContainerFileSystem {
    /// Whether a client's user may read (or write) the item at `path`, as through the mount: every
    /// directory on the way searchable, then the mode bits of the item, or of its nearest existing
    /// directory for an item not made yet, and policy.
    public func mayAccess(_ peer: PeerCredentials, _ path: ItemPath, write: Bool) -> Bool {
        // An app's presenters and coordinators reach only its own container.
        if let islands, islands.active.load(ordering: .acquiring) {
            let container = rootAppName ?? path.components.first?.bytes
            guard admits(islands.identity(of: peer.processID), to: container) else { return false }
        }
        var directory = nodes.root.descriptor
        var opened: [Int32] = []
        defer { opened.forEach { close($0) } }
        var zone = nodes.root.zone
        var attributes = stat()
        var groups: [gid_t]?
        let permits = { (attributes: stat, mask: Int32) in
            Permissions.permits(attributes, uid: peer.userID, gid: peer.groupID, groups: {
                if groups == nil { groups = Permissions.supplementaryGroups(of: peer.processID) }
                return groups ?? []
            }, mask: mask)
        }
        guard fstatat(directory, "", &attributes, AT_EMPTY_PATH) == 0 else { return false }
        for component in path.components {
            guard permits(attributes, X_OK) else { return false }
            let next = Backing.withCName(component.bytes) { openat(directory, $0, O_PATH | O_NOFOLLOW | O_CLOEXEC) }
            // Only an item not made yet is judged by its nearest directory: one that could not be
            // opened (no descriptor left) says nothing of what lies below it.
            guard next >= 0 else {
                if errno == ENOENT { break }
                return false
            }
            opened.append(next)
            directory = next
            zone = zone.child(named: component.bytes.withUnsafeBytes { String(decoding: $0, as: UTF8.self) })
            guard fstatat(next, "", &attributes, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) == 0 else { return false }
        }
        if write, Policy.write(zone) != 0, Policy.create(in: zone) != 0 { return false }
        return permits(attributes, write ? W_OK : R_OK)
    }

    /// The write sessions running now, for `containerfs status`.
    public func writeSessionStatuses() -> [WriteSessionStatus] {
        nodes.all().compactMap { node in
            guard node.isRegularFile else { return nil }
            let shadowBytes: UInt64?? = node.withSession { session in
                guard let session else { return nil }
                var attributes = stat()
                return .some(session.shadow >= 0 && fstat(session.shadow, &attributes) == 0 ? UInt64(attributes.st_size) : nil)
            }
            guard let bytes = shadowBytes else { return nil }
            return WriteSessionStatus(path: nodes.itemPath(of: node), shadowBytes: bytes, inPlace: false)
        }
    }
}
