import CLinux
import Coordination
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Where an item lives for coordination: the control socket of the ContainerFS mount that holds
/// it, and its path below that mount's root.
public struct MountLocation: Hashable, Sendable {
    /// Absolute path of the mount's control socket.
    public var socketPath: String
    /// The item's path relative to the mount root.
    public var itemPath: ItemPath
    /// Absolute path of the mount root, when it can be told from the item's own path (it can
    /// unless the item was reached through a symlink that leaves the mount's directory names, or
    /// through a bind mount of a directory of the daemon's tree).
    public var mountRoot: String?
    /// Where the item's path led into the daemon's tree, from which the local path of any item
    /// it shows follows (`MountView.url(for:)`).
    public var view: MountView?

    public init(socketPath: String, itemPath: ItemPath, mountRoot: String?, view: MountView? = nil) {
        self.socketPath = socketPath
        self.itemPath = itemPath
        self.mountRoot = mountRoot
        self.view = view
    }
}

/// Where the mount holding an item shows the daemon's tree: the daemon's item `daemonRoot` at the
/// local path `localRoot`. A daemon's own mount shows its root; a bind mount (of an app's
/// container, as a second mount of it makes: docs/lifecycle.md) shows a directory of it.
public struct MountView: Hashable, Sendable {
    public var localRoot: String
    public var daemonRoot: ItemPath

    public init(localRoot: String, daemonRoot: ItemPath) {
        self.localRoot = localRoot
        self.daemonRoot = daemonRoot
    }

    /// The local URL of the daemon's item at `path`, made without touching the filesystem; nil
    /// if this view does not show it.
    public func url(for path: ItemPath) -> URL? {
        path.replacingPrefix(daemonRoot, with: .root).map { fileURL(root: localRoot, $0) }
    }
}

/// Finds the ContainerFS mount of a path through the two read-only virtual extended attributes
/// the daemon serves on every item of a mount:
///
/// - `user.containerfs.control-socket`: the absolute path of the mount's control socket;
/// - `user.containerfs.path`: the item's path relative to the mount root, as bytes, components
///   joined by `/`, empty for the root.
///
/// For an item that does not exist yet the parent is asked (walking up until something exists)
/// and the missing names are appended; so is it for a FIFO, socket or device, whose user.*
/// attributes Linux never shows. Attributes are read with `getxattr`, which follows
/// symlinks, as Foundation's file APIs do. Absent attributes (`ENODATA`, `ENOTSUP`) mean the
/// path is not in a ContainerFS mount.
public struct MountLocator: Sendable {
    public static let socketAttribute = "user.containerfs.control-socket"
    public static let pathAttribute = "user.containerfs.path"

    public enum AttributeResult: Hashable, Sendable {
        case value([UInt8])
        /// The item exists but has no such attribute (ENODATA, ENOTSUP…).
        case absent
        /// No such item (ENOENT, ENOTDIR).
        case noSuchItem
        case failed(errno: Int32)
    }

    public typealias AttributeReader = @Sendable (_ path: String, _ name: String) -> AttributeResult

    private let readAttribute: AttributeReader
    private let resolvesRealPath: Bool

    /// - Parameter readAttribute: injected by tests; `getxattr(2)` by default.
    public init(readAttribute: AttributeReader? = nil) {
        self.readAttribute = readAttribute ?? MountLocator.getxattrReader
        self.resolvesRealPath = readAttribute == nil
    }

    /// The mount holding `url`, or nil if it is not in a ContainerFS mount.
    public func locate(_ url: URL) -> MountLocation? {
        locate(path: url.standardizedFileURL.path)
    }

    public func locate(path: String) -> MountLocation? {
        var components = path.split(separator: "/", omittingEmptySubsequences: true).map(String.init)
        var missing: [String] = []
        while true {
            let current = "/" + components.joined(separator: "/")
            switch readAttribute(current, Self.socketAttribute) {
            case .value(let socketBytes):
                guard case .value(let pathBytes) = readAttribute(current, Self.pathAttribute),
                      let found = ItemPath(bytes: pathBytes) else { return nil }
                var itemPath = found
                for name in missing.reversed() {
                    guard let component = PathComponent(name) else { return nil }
                    itemPath = itemPath.appending(component)
                }
                let socketPath = String(decoding: socketBytes.prefix { $0 != 0 }, as: UTF8.self)
                let view = view(of: current, itemPath: found)
                return MountLocation(socketPath: socketPath, itemPath: itemPath,
                                     mountRoot: view.daemonRoot.isRoot ? view.localRoot : nil, view: view)
            case .noSuchItem:
                guard let last = components.popLast() else { return nil }
                missing.append(last)
            case .absent where MountLocator.isSpecialFile(current):
                // Linux never shows user.* attributes of FIFOs, sockets and devices (ENODATA):
                // ask the directory the item is in.
                guard let last = components.popLast() else { return nil }
                missing.append(last)
            case .absent, .failed:
                return nil
            }
        }
    }

    /// Pairs the item's absolute path with its path in the daemon's tree: the nearest directory
    /// above it that is a mount's root (the kernel says so, `statx`) shows the daemon's item
    /// whose path is the item's less the names below that directory. Without it (tests'
    /// attributes, a kernel before 5.8), the names the two paths end with alike are below the
    /// view's root in both: a view found so may start above the place really mounted (a bind
    /// mount of `app` at `/srv/app` pairs `/srv` with the daemon's root), and names what is
    /// outside it wrongly.
    private func view(of absolutePath: String, itemPath: ItemPath) -> MountView {
        var absolute = absolutePath
        if resolvesRealPath, let resolved = realpath(absolutePath, nil) {
            absolute = String(cString: resolved)
            free(resolved)
        }
        if resolvesRealPath, let view = Self.view(of: absolute, itemPath: itemPath, isMountRoot: Self.isMountRoot) { return view }
        let names = absolute.split(separator: "/", omittingEmptySubsequences: true).map { Array($0.utf8) }
        let tail = itemPath.components.map(\.bytes)
        var shared = 0
        while shared < min(names.count, tail.count), names[names.count - 1 - shared] == tail[tail.count - 1 - shared] { shared += 1 }
        let root = names.dropLast(shared).map { String(decoding: $0, as: UTF8.self) }
        return MountView(localRoot: "/" + root.joined(separator: "/"),
                         daemonRoot: ItemPath(components: Array(itemPath.components.dropLast(shared))))
    }

    /// The view of the mount holding `absolute`, whose root is the nearest directory above it (or
    /// it) that `isMountRoot` says is one (nil: it cannot tell); nil if the names below that root
    /// are not those the item's path ends with.
    static func view(of absolute: String, itemPath: ItemPath, isMountRoot: (String) -> Bool?) -> MountView? {
        var names = absolute.split(separator: "/", omittingEmptySubsequences: true).map(String.init)
        var below: [String] = []
        while true {
            guard let isRoot = isMountRoot("/" + names.joined(separator: "/")) else { return nil }
            if isRoot { break }
            guard let name = names.popLast() else { return nil }
            below.insert(name, at: 0)
        }
        let components = itemPath.components
        guard below.count <= components.count,
              zip(below, components.suffix(below.count)).allSatisfy({ Array($0.utf8) == $1.bytes }) else { return nil }
        return MountView(localRoot: "/" + names.joined(separator: "/"), daemonRoot: ItemPath(components: Array(components.dropLast(below.count))))
    }

    /// Whether `path` is a mount's root; nil if the kernel does not tell.
    private static func isMountRoot(_ path: String) -> Bool? {
        switch clinux_is_mount_root(path) {
        case 1: true
        case 0: false
        default: nil
        }
    }

    /// An existing item that is neither a regular file nor a directory (after following symlinks).
    static func isSpecialFile(_ path: String) -> Bool {
        var info = stat()
        guard stat(path, &info) == 0 else { return false }
        let type = info.st_mode & S_IFMT
        return type != S_IFREG && type != S_IFDIR
    }

    /// `getxattr(2)`, looked up at run time: Swift's Glibc module leaves out <sys/xattr.h>.
    public static let getxattrReader: AttributeReader = { path, name in
        guard let getxattr = systemGetxattr else { return .absent }
        var size = 256
        while true {
            var buffer = [UInt8](repeating: 0, count: size)
            let count = buffer.withUnsafeMutableBytes { getxattr(path, name, $0.baseAddress, $0.count) }
            if count >= 0 { return .value(Array(buffer[..<count])) }
            switch errno {
            case ERANGE where size < 1 << 20: size *= 4
            case ENODATA, ENOTSUP, EOPNOTSUPP: return .absent
            case ENOENT, ENOTDIR: return .noSuchItem
            default: return .failed(errno: errno)
            }
        }
    }
}

private typealias GetxattrFunction = @convention(c) (
    UnsafePointer<CChar>, UnsafePointer<CChar>, UnsafeMutableRawPointer?, Int) -> Int

private let systemGetxattr: GetxattrFunction? = {
    guard let symbol = dlsym(dlopen(nil, RTLD_NOW), "getxattr") else { return nil }
    return unsafeBitCast(symbol, to: GetxattrFunction.self)
}()
