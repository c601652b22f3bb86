import Crypto
import Foundation

/// What a seal records about one item of a bundle, in the spirit of `_CodeSignature/CodeResources`.
public struct SealedItem: Codable, Sendable, Equatable {
    public var kind: Kind
    /// Permission bits, such as 0o755.
    public var mode: UInt32
    /// A regular file's SHA-256, in hex.
    public var sha256: String?
    public var size: UInt64?
    /// A symlink's target, as written (symlinks are never followed).
    public var target: String?
    /// What the file's inode looked like when sealed; lets the mount-time check skip hashing
    /// files that have not been touched since (any write changes ctime, which users cannot set back).
    public var fingerprint: Fingerprint?

    public enum Kind: String, Codable, Sendable { case file, directory, symlink }
}

public struct Fingerprint: Codable, Sendable, Equatable {
    public var inode: UInt64
    public var size: Int64
    public var mtime: Int64
    public var ctime: Int64

    init(_ info: stat) {
        inode = UInt64(info.st_ino)
        size = Int64(info.st_size)
        mtime = info.st_mtim.nanoseconds
        ctime = info.st_ctim.nanoseconds
    }
}

/// The signed list of everything in an installed bundle, kept at STORE/apps/ID/seal.json
/// (outside the container, so nothing the app or the mount can write touches it).
public struct SealManifest: Codable, Sendable, Equatable {
    public static let currentFormat = 1
    public var format: Int
    public var appID: String
    public var bundleName: String
    public var sealedAt: Date
    /// Bundle-relative paths ("Info.plist", "Frameworks/Kit.framework/Kit").
    public var items: [String: SealedItem]
}

/// One way in which a bundle does not match its seal.
public struct SealFinding: Sendable, Equatable, CustomStringConvertible {
    public enum Problem: Sendable, Equatable {
        /// The item is in the seal but its contents, kind, target or mode differ.
        case modified(String)
        /// The item is not in the seal.
        case added
        /// The item is in the seal but gone.
        case removed
        /// The bundle directory itself is missing or is not a directory.
        case bundleMissing
        /// There is no manifest, or it cannot be read.
        case manifestMissing(String)
        /// The manifest's signature does not check out against the store's key.
        case signatureInvalid(String)
        /// The bundle could not be compared with its seal (a walk or a read failed).
        case uncheckable(String)
    }

    /// Bundle-relative; empty for findings about the whole bundle or its manifest.
    public let path: String
    public let problem: Problem

    public var description: String {
        let subject = path.isEmpty ? "the bundle" : path
        switch problem {
        case .modified(let how): return "\(subject): \(how)"
        case .added: return "\(subject): added after sealing"
        case .removed: return "\(subject): removed after sealing"
        case .bundleMissing: return "the bundle directory is missing"
        case .manifestMissing(let why): return "no usable seal manifest (\(why))"
        case .signatureInvalid(let why): return "the seal's signature is not valid (\(why))"
        case .uncheckable(let why): return "the bundle could not be checked against its seal (\(why))"
        }
    }

    /// Whether this finding leaves nothing in the bundle that can be vouched for.
    var condemnsWholeBundle: Bool {
        switch problem {
        case .bundleMissing, .manifestMissing, .signatureInvalid, .uncheckable: return true
        case .modified, .added, .removed: return false
        }
    }
}

/// The result of checking a bundle against its seal.
public struct SealReport: Sendable {
    public let id: AppID
    public let bundleName: String
    public let findings: [SealFinding]
    /// How many items of the bundle were compared.
    public let itemsChecked: Int
    /// True when the seal itself is missing or forged, or the bundle is gone: serve nothing from it.
    public let isUntrusted: Bool
    /// Bundle-relative paths whose content does not match the seal (changed or added items).
    /// The daemon fails reads of these with EIO.
    public let mismatchedPaths: Set<String>

    init(id: AppID, bundleName: String, findings: [SealFinding], itemsChecked: Int) {
        self.id = id
        self.bundleName = bundleName
        self.findings = findings
        self.itemsChecked = itemsChecked
        isUntrusted = findings.contains(where: \.condemnsWholeBundle)
        mismatchedPaths = Set(findings.filter { $0.problem != .removed && !$0.condemnsWholeBundle }.map(\.path))
    }

    public var isIntact: Bool { findings.isEmpty }

    /// The report of a bundle whose check failed with `error`: nothing in it is vouched for.
    public static func unchecked(_ id: AppID, bundleName: String, because error: any Error) -> SealReport {
        SealReport(id: id, bundleName: bundleName, findings: [SealFinding(path: "", problem: .uncheckable("\(error)"))],
                   itemsChecked: 0)
    }

    /// Whether the daemon may serve the bundle item at `bundleRelativePath` as intact
    /// (called per open, so it is a set lookup).
    public func allowsReading(_ bundleRelativePath: String) -> Bool {
        !isUntrusted && !mismatchedPaths.contains(bundleRelativePath)
    }
}

/// Seals bundles at install and checks them later.
public enum Seal {
    /// How hard to look.
    public enum Depth: Sendable {
        /// Hash every file (the `verify` command).
        case full
        /// Hash only files whose inode changed since sealing (mount time).
        case quick
    }

    /// Hashes the installed bundle of `id` and writes its signed manifest.
    @discardableResult
    public static func seal(store: Store, id: AppID, bundleName: String,
                            progress: ProgressListener? = nil) throws -> SealManifest {
        let container = try DirectoryHandle(path: store.containerPath(id))
        let bundle = try DirectoryHandle(in: container, bundleName)
        if let progress { progress.begin("Sealing \(bundleName)", totalUnits: try FileTree.totalFileBytes(bundle)) }
        defer { progress?.end() }

        var items: [String: SealedItem] = [:]
        let hasher = FileHasher()
        try FileTree.walk(bundle) { entry in
            let mode = UInt32(entry.info.st_mode & 0o7777)
            switch entry.kind {
            case .directory:
                items[entry.path] = SealedItem(kind: .directory, mode: mode)
            case .symlink:
                items[entry.path] = SealedItem(kind: .symlink, mode: mode, target: try entry.parent.readLink(entry.name))
            case .file:
                let digest = try hasher.sha256(of: entry, progress: progress)
                items[entry.path] = SealedItem(kind: .file, mode: mode, sha256: digest.hex, size: digest.size,
                                               fingerprint: Fingerprint(digest.info))
            case .other:
                throw ContainerError("\(entry.fullPath): a device, socket or pipe cannot be part of a bundle; remove it and reinstall.")
            }
            return true
        }

        let manifest = SealManifest(format: SealManifest.currentFormat, appID: id.rawValue, bundleName: bundleName,
                                    sealedAt: Date(), items: items)
        let bytes = try JSONEncoder.store.encode(manifest)
        let signature = try SealingKey.loadOrCreate(in: store).signature(for: bytes)
        try FileManager.default.createDirectory(atPath: store.recordDirectory(id), withIntermediateDirectories: true)
        try bytes.write(to: URL(fileURLWithPath: store.sealManifestPath(id)), options: .atomic)
        try Data(signature.base64EncodedString().utf8).write(to: URL(fileURLWithPath: store.sealSignaturePath(id)), options: .atomic)
        return manifest
    }

    /// Checks the bundle of `id` against its seal and reports every difference.
    public static func verify(store: Store, id: AppID, depth: Depth = .full,
                              progress: ProgressListener? = nil) throws -> SealReport {
        let record = try store.record(id)
        var findings: [SealFinding] = []
        func report(_ checked: Int = 0) -> SealReport {
            SealReport(id: id, bundleName: record.bundleName, findings: findings, itemsChecked: checked)
        }

        let manifest: SealManifest
        switch loadManifest(store: store, id: id, bundleName: record.bundleName) {
        case .refused(let finding):
            findings.append(finding)
            guard case .signatureInvalid = finding.problem,
                  let unsigned = try? decodeManifest(store: store, id: id) else { return report() }
            // Still compare against the unsigned manifest: it tells the user what changed.
            manifest = unsigned
        case .trusted(let signed):
            manifest = signed
        }

        let bundle: DirectoryHandle
        do {
            bundle = try DirectoryHandle(in: DirectoryHandle(path: store.containerPath(id)), record.bundleName)
        } catch {
            findings.append(SealFinding(path: "", problem: .bundleMissing))
            return report()
        }
        if let progress { progress.begin("Verifying \(record.bundleName)", totalUnits: try FileTree.totalFileBytes(bundle)) }
        defer { progress?.end() }

        var unseen = manifest.items
        let hasher = FileHasher()
        var checked = 0
        var directoriesReplaced: Set<String> = []
        try FileTree.walk(bundle) { entry in
            checked += 1
            guard let sealed = unseen.removeValue(forKey: entry.path) else {
                findings.append(SealFinding(path: entry.path, problem: .added))
                return true
            }
            if sealed.kind == .directory && entry.kind != .directory { directoriesReplaced.insert(entry.path) }
            if let difference = try compare(entry, with: sealed, depth: depth, hasher: hasher, progress: progress) {
                findings.append(SealFinding(path: entry.path, problem: .modified(difference)))
            }
            // A directory that replaced a file is walked so that its contents show up as added.
            return true
        }
        let goneDirectories = directoriesReplaced.union(unseen.filter { $0.value.kind == .directory }.keys)
        for path in unseen.keys.sorted() where !isInside(path, anyOf: goneDirectories) {
            findings.append(SealFinding(path: path, problem: .removed))
        }
        findings.sort { $0.path < $1.path }
        return report(checked)
    }

    /// The bundle-relative paths of `id` whose content does not match the seal, found quickly
    /// (files whose inode is unchanged since sealing are not rehashed). When the seal itself
    /// cannot be trusted, `SealReport.isUntrusted` says so; use `allowsReading` for the whole rule.
    public static func check(store: Store, id: AppID) throws -> SealReport {
        try verify(store: store, id: id, depth: .quick)
    }

    // MARK: - Comparing

    private static func compare(_ entry: FileTree.Entry, with sealed: SealedItem, depth: Depth,
                                hasher: FileHasher, progress: ProgressListener?) throws -> String? {
        let actualKind: SealedItem.Kind
        switch entry.kind {
        case .file: actualKind = .file
        case .directory: actualKind = .directory
        case .symlink: actualKind = .symlink
        case .other: return "was a \(sealed.kind.rawValue), is now a device, socket or pipe"
        }
        guard actualKind == sealed.kind else { return "was a \(sealed.kind.rawValue), is now a \(actualKind.rawValue)" }
        let mode = UInt32(entry.info.st_mode & 0o7777)

        switch actualKind {
        case .symlink:
            let target = try entry.parent.readLink(entry.name)
            if target != sealed.target { return "symlink target changed from \(sealed.target ?? "?") to \(target)" }
        case .file:
            let untouched = depth == .quick && sealed.fingerprint == Fingerprint(entry.info)
            if !untouched {
                let digest = try hasher.sha256(of: entry, progress: progress)
                if digest.hex != sealed.sha256 || digest.size != sealed.size { return "contents changed" }
            } else {
                progress?.advance(by: Int64(entry.info.st_size))
            }
        case .directory:
            break
        }
        // Symlink modes mean nothing on Linux.
        if actualKind != .symlink, mode != sealed.mode {
            return "mode changed from \(String(sealed.mode, radix: 8)) to \(String(mode, radix: 8))"
        }
        return nil
    }

    /// A removed directory's contents are reported once, as the directory.
    private static func isInside(_ path: String, anyOf directories: Set<String>) -> Bool {
        var parent = (path as NSString).deletingLastPathComponent
        while !parent.isEmpty {
            if directories.contains(parent) { return true }
            parent = (parent as NSString).deletingLastPathComponent
        }
        return false
    }

    // MARK: - The manifest and its signature

    private static func decodeManifest(store: Store, id: AppID) throws -> SealManifest {
        guard let data = FileManager.default.contents(atPath: store.sealManifestPath(id)) else {
            throw ContainerError("\(store.sealManifestPath(id)) is missing")
        }
        return try JSONDecoder.store.decode(SealManifest.self, from: data)
    }

    private static func loadManifest(store: Store, id: AppID, bundleName: String) -> ManifestLoad {
        func fail(_ problem: SealFinding.Problem) -> ManifestLoad {
            .refused(SealFinding(path: "", problem: problem))
        }
        guard let data = FileManager.default.contents(atPath: store.sealManifestPath(id)) else {
            return fail(.manifestMissing("\(store.sealManifestPath(id)) is missing"))
        }
        guard let manifest = try? JSONDecoder.store.decode(SealManifest.self, from: data) else {
            return fail(.manifestMissing("\(store.sealManifestPath(id)) is damaged"))
        }
        guard let encoded = FileManager.default.contents(atPath: store.sealSignaturePath(id)),
              let signature = Data(base64Encoded: String(decoding: encoded, as: UTF8.self)
                                    .trimmingCharacters(in: .whitespacesAndNewlines)) else {
            return fail(.signatureInvalid("\(store.sealSignaturePath(id)) is missing or damaged"))
        }
        let key: Curve25519.Signing.PrivateKey
        do {
            guard let existing = try SealingKey.load(from: store) else {
                return fail(.signatureInvalid("the store's sealing key \(store.sealingKeyPath) is missing"))
            }
            key = existing
        } catch {
            return fail(.signatureInvalid("\(error)"))
        }
        guard key.publicKey.isValidSignature(signature, for: data) else {
            return fail(.signatureInvalid("the manifest was changed after it was signed"))
        }
        guard manifest.appID == id.rawValue, manifest.bundleName == bundleName else {
            return fail(.signatureInvalid("the manifest belongs to \(manifest.appID)/\(manifest.bundleName), not \(id)/\(bundleName)"))
        }
        return .trusted(manifest)
    }

    private enum ManifestLoad {
        case trusted(SealManifest)
        case refused(SealFinding)
    }
}

/// The store's Ed25519 key that signs seal manifests, at STORE/keys/seal-signing.key (mode 0600).
///
/// It guards against a manifest edited to match a tampered bundle by anyone who cannot read the
/// key; whoever can read the store's keys directory (root, the store's owner) can forge seals.
enum SealingKey {
    static func load(from store: Store) throws -> Curve25519.Signing.PrivateKey? {
        guard let data = FileManager.default.contents(atPath: store.sealingKeyPath) else { return nil }
        do {
            return try Curve25519.Signing.PrivateKey(rawRepresentation: data)
        } catch {
            throw ContainerError("\(store.sealingKeyPath) is damaged; every seal in the store must be redone: delete it and reinstall the apps.")
        }
    }

    /// The store's key, created on first use. Two installs racing to create it agree on one key:
    /// each writes its own candidate and links it into place, and the loser reads the winner's.
    static func loadOrCreate(in store: Store) throws -> Curve25519.Signing.PrivateKey {
        if let key = try load(from: store) { return key }
        let directory = store.keysPath
        if mkdir(directory, 0o700) != 0 && errno != EEXIST { throw posixError("mkdir", directory) }
        let candidate = directory + "/." + scratchName("seal-signing.key")
        let fd = Glibc.open(candidate, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw posixError("create", candidate) }
        defer { unlink(candidate) }
        let key = Curve25519.Signing.PrivateKey()
        let raw = [UInt8](key.rawRepresentation)
        let written = raw.withUnsafeBytes { write(fd, $0.baseAddress, raw.count) }
        let synced = fsync(fd) == 0
        close(fd)
        guard written == raw.count, synced else { throw posixError("write", candidate) }
        if link(candidate, store.sealingKeyPath) != 0 {
            guard errno == EEXIST, let winner = try load(from: store) else { throw posixError("link", store.sealingKeyPath) }
            return winner
        }
        return key
    }
}

/// SHA-256 of files, reading through one reusable buffer.
final class FileHasher {
    private var buffer = [UInt8](repeating: 0, count: 1 << 20)

    struct Digest {
        let hex: String
        let size: UInt64
        /// The file's status as of the read, taken on the same descriptor.
        let info: stat
    }

    func sha256(of entry: FileTree.Entry, progress: ProgressListener?) throws -> Digest {
        let fd = try entry.parent.openFile(entry.name)
        defer { close(fd) }
        return try sha256(fd: fd, path: entry.fullPath, progress: progress)
    }

    func sha256(fd: Int32, path: String, progress: ProgressListener?) throws -> Digest {
        var hash = SHA256()
        var size: UInt64 = 0
        while true {
            let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count < 0 { if errno == EINTR { continue }; throw posixError("read", path) }
            if count == 0 { break }
            buffer.withUnsafeBytes { hash.update(bufferPointer: UnsafeRawBufferPointer(rebasing: $0[0..<count])) }
            size += UInt64(count)
            progress?.advance(by: Int64(count))
        }
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw posixError("stat", path) }
        return Digest(hex: hash.finalize().map { String(format: "%02x", $0) }.joined(), size: size, info: info)
    }
}
