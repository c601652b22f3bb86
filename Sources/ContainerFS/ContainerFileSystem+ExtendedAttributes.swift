import CLinux
import Containers
import Coordination
import FUSELowLevel
import Glibc

// Extended attributes: setting and removing them is a coordinated metadata change.
extension ContainerFileSystem {
    public func setxattr(_ request: FuseRequest, inode: InodeNumber, name: UnsafePointer<CChar>,
                         value: UnsafeRawBufferPointer, flags: Int32) {
        let node = nodes.node(inode)
        let denied = Policy.changeMetadata(node.zone)
        guard denied == 0 else { return request.reply(error: denied) }
        // No race-free way to reach a symlink's own attributes; Linux allows user ones on none anyway.
        guard !Self.isUnsupported(name) else { return request.reply(error: EOPNOTSUPP) }
        guard !node.isSymlink, virtualAttribute(name, of: node) == nil else { return request.reply(error: EPERM) }
        let ownedName = OwnedName(FileName(name))
        let ownedValue = Array(value)
        changeAttributes(of: node, named: name, request) { path in
            ownedName.withPointer { clinux_setxattr(path, $0, ownedValue, ownedValue.count, flags) }
        }
    }

    /// Runs a change of extended attributes (given the item's /proc path) as a coordinated metadata change.
    private func changeAttributes(of node: Node, named name: UnsafePointer<CChar>, _ request: FuseRequest,
                                  _ change: @escaping @Sendable (UnsafePointer<CChar>) -> Int32) {
        let choosesInPlace = strcmp(name, ContainerFileSystem.inPlaceAttribute) == 0
        coordination.perform(.metadataChange(nodes.itemPath(of: node)), isDirectory: node.isDirectory,
                             caller: request.caller) { access in
            var error = Backing.check(node.withProcPath(change))
            // A shadow being written takes the change too, or its publish would undo it.
            if error == 0, node.isRegularFile {
                error = node.withSession { session in
                    guard let session, session.shadow >= 0, !session.fresh, session.log == nil else { return 0 }
                    return Backing.check(Backing.withProcPath(session.shadow, change))
                }
            }
            // Even a failed change may have changed something (a shadow's copy failed).
            self.nodes.attributesChanged(of: node)
            if error == 0, choosesInPlace { self.inPlaceGeneration.add(1, ordering: .releasing) }
            access.end(tookEffect: error == 0)
            request.reply(error: error)
        }
    }

    /// Read-only attributes every item has, by which clients find the control socket and the
    /// item's path from the mount root (docs/client-library.md).
    static let controlSocketAttribute = "user.containerfs.control-socket"
    static let pathAttribute = "user.containerfs.path"
    /// Reading it makes the daemon read the store's running-app records at once; its value is how
    /// many sandboxes run. `containerfs run` reads it before its program starts (docs/island.md).
    public static let runningAppsAttribute = "user.containerfs.running-apps"
    /// Where a file's previous versions are kept, when the mount keeps them (docs/versions.md).
    public static let versionsAttribute = "user.containerfs.versions"

    /// Attributes a container does not carry: SELinux labels and POSIX ACLs (mode bits, shown as
    /// policy enforces them, are the only permissions). Saying so, rather than "no data", lets tools
    /// such as ls remember it for the whole mount instead of asking for every file; cp -a falls back
    /// to chmod.
    static func isUnsupported(_ name: UnsafePointer<CChar>) -> Bool {
        strcmp(name, "security.selinux") == 0 || strncmp(name, "system.posix_acl_", 17) == 0
    }

    /// A virtual attribute's value, or the errno that keeps it from being read.
    private enum VirtualAttribute {
        case value([UInt8])
        case error(Int32)
    }

    /// The virtual attribute `name` of `node`, or nil when `name` names none.
    private func virtualAttribute(_ name: UnsafePointer<CChar>, of node: Node) -> VirtualAttribute? {
        guard strncmp(name, "user.containerfs.", 17) == 0 else { return nil }
        if strcmp(name, ContainerFileSystem.controlSocketAttribute) == 0 { return .value(controlSocketPath) }
        if strcmp(name, ContainerFileSystem.pathAttribute) == 0 { return .value(nodes.itemPath(of: node).bytes) }
        if strcmp(name, ContainerFileSystem.runningAppsAttribute) == 0, let islands {
            // `containerfs run` starts its program only once the records are read whole.
            do { return .value(Array(String(try islands.reload()).utf8)) } catch { return .error(EIO) }
        }
        if strcmp(name, ContainerFileSystem.versionsAttribute) == 0, node.isRegularFile,
           let directory = shadows.versions?.directory(of: node, in: nodes) {
            return .value(Array(directory.utf8))
        }
        return nil
    }

    public func getxattr(_ request: FuseRequest, inode: InodeNumber, name: UnsafePointer<CChar>, size: Int) {
        let node = nodes.node(inode)
        if let answer = virtualAttribute(name, of: node) {
            let value: [UInt8]
            switch answer {
            case .value(let found): value = found
            case .error(let error): return request.reply(error: error)
            }
            guard size > 0 else { return request.reply(extendedAttributeSize: value.count) }
            guard size >= value.count else { return request.reply(error: ERANGE) }
            return value.withUnsafeBytes { request.reply(buffer: $0) }
        }
        guard !Self.isUnsupported(name) else { return request.reply(error: EOPNOTSUPP) }
        guard !node.isSymlink else { return request.reply(error: ENODATA) }
        // The kernel asks for security.capability before writes (see `Node.hasNoCapability`):
        // a file known to have none answers at once.
        let asksCapability = node.isRegularFile && strcmp(name, Self.capabilityAttribute) == 0
        if asksCapability, node.hasNoCapability { return request.reply(error: ENODATA) }
        let stamp = asksCapability ? node.capabilityStamp : 0
        replyAttributeData(request, size: size) { buffer, capacity in
            // A file being written answers from its session's descriptor (one call, where a look-up
            // by name costs four). A shadow carries the file's attributes (`changeAttributes`); a
            // fresh session's is the file.
            let fromSession = !node.isRegularFile ? nil : node.withSession { session -> Int? in
                guard let session, session.shadow >= 0, session.log == nil else { return nil }
                return clinux_fgetxattr(session.shadow, name, buffer, capacity)
            }
            let count = fromSession ?? node.withProcPath { clinux_getxattr($0, name, buffer, capacity) }
            if count < 0, asksCapability, errno == ENODATA { node.noteNoCapability(asOf: stamp) }
            return count
        }
    }

    static let capabilityAttribute = "security.capability"

    public func listxattr(_ request: FuseRequest, inode: InodeNumber, size: Int) {
        let node = nodes.node(inode)
        guard !node.isSymlink else {
            return size == 0 ? request.reply(extendedAttributeSize: 0) : request.reply(buffer: UnsafeRawBufferPointer(start: nil, count: 0))
        }
        replyAttributeData(request, size: size) { buffer, capacity in
            node.withProcPath { clinux_listxattr($0, buffer?.assumingMemoryBound(to: CChar.self), capacity) }
        }
    }

    /// The two shapes of an xattr answer: the size alone when asked with size 0, else the bytes.
    func replyAttributeData(_ request: FuseRequest, size: Int,
                                    _ fetch: (UnsafeMutableRawPointer?, Int) -> Int) {
        guard size > 0 else {
            let needed = fetch(nil, 0)
            return needed < 0 ? request.reply(error: errno) : request.reply(extendedAttributeSize: needed)
        }
        withUnsafeTemporaryAllocation(byteCount: size, alignment: 8) { buffer in
            let count = fetch(buffer.baseAddress, size)
            count < 0 ? request.reply(error: errno)
                : request.reply(buffer: UnsafeRawBufferPointer(rebasing: buffer[0..<count]))
        }
    }

    public func removexattr(_ request: FuseRequest, inode: InodeNumber, name: UnsafePointer<CChar>) {
        let node = nodes.node(inode)
        let denied = Policy.changeMetadata(node.zone)
        guard denied == 0 else { return request.reply(error: denied) }
        guard !node.isSymlink, virtualAttribute(name, of: node) == nil else { return request.reply(error: EPERM) }
        let ownedName = OwnedName(FileName(name))
        changeAttributes(of: node, named: name, request) { path in ownedName.withPointer { clinux_removexattr(path, $0) } }
    }
}
