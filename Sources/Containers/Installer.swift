import Foundation

/// Installs bundles into a store.
public enum Installer {
    /// Copies `bundlePath` (a `Name.app` directory) into the store and creates the container's
    /// directories, and seals the installed bundle (see `Seal`). Reinstalling an app replaces its
    /// bundle and keeps its data, as an update does.
    ///
    /// `groups` are the app groups the app joins (each one's shared container is made if it is
    /// new); nil keeps a reinstalled app's groups, as an update without new entitlements does.
    @discardableResult
    public static func install(bundle bundlePath: String, into store: Store, id requestedID: AppID? = nil,
                               groups requestedGroups: [AppID]? = nil,
                               progress: ProgressListener? = nil) throws -> AppRecord {
        let source = Store.absolute(bundlePath)
        let bundleName = (source as NSString).lastPathComponent
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: source, isDirectory: &isDirectory), isDirectory.boolValue else {
            throw ContainerError("\(bundlePath): no such bundle directory. Give the path of an app bundle, a directory named Name.app.")
        }
        guard bundleName.hasSuffix(Zone.bundleExtension), bundleName.count > Zone.bundleExtension.count else {
            throw ContainerError("\(bundlePath): a bundle's name must end in .app (for example Notes.app).")
        }
        guard let id = requestedID ?? defaultID(forBundle: source) else {
            throw ContainerError("\(bundlePath): cannot derive an app ID from the bundle's name; give one with --id com.example.name.")
        }

        guard !id.isGroup else {
            throw ContainerError("\(id): identifiers starting with \(AppID.groupPrefix) name app groups, not apps; give the app another ID with --id.")
        }
        for group in requestedGroups ?? [] where !group.isGroup {
            throw ContainerError("\(group) is not an app group's identifier: they start with \(AppID.groupPrefix), as in \(AppID.groupPrefix)com.example.shared.")
        }

        let container = store.containerPath(id)
        var groups = requestedGroups ?? []
        if store.isInstalled(id) {
            let old = try store.record(id)
            guard old.bundleName == bundleName else {
                throw ContainerError("\(id) is installed with the bundle \(old.bundleName), not \(bundleName). Uninstall it first to install a different bundle under the same ID.")
            }
            if requestedGroups == nil { groups = old.groupIDs }
        }

        // Copy into the store's scratch space first, then move into place: a failed copy leaves nothing half-installed.
        let staging = store.workPath + "/" + scratchName("install-\(id.rawValue)")
        try FileManager.default.createDirectory(atPath: staging, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: staging) }
        try TreeCopier.copy(from: source, to: staging + "/" + bundleName)

        try FileManager.default.createDirectory(atPath: container, withIntermediateDirectories: true)
        try store.repairContainer(id)
        let installed = container + "/" + bundleName
        if FileManager.default.fileExists(atPath: installed) {
            try FileManager.default.moveItem(atPath: installed, toPath: staging + "/old")
        }
        try FileManager.default.moveItem(atPath: staging + "/" + bundleName, toPath: installed)
        // Sealed where it will be served, so the recorded inode fingerprints are the served files'.
        try Seal.seal(store: store, id: id, bundleName: bundleName, progress: progress)

        // A group's container exists before any member's record names it.
        for group in groups { try store.repairContainer(group) }
        let record = AppRecord(id: id.rawValue, bundleName: bundleName, installedAt: Date(),
                               groups: groups.isEmpty ? nil : groups.map(\.rawValue))
        try store.write(record)
        // A bundle whose files a power cut took back would fail its seal. The staging directory
        // goes first, so that the sync carries its removal too (btrfs commits nothing else before
        // its next transaction, and `containerfs check` would find it after a cut).
        try? FileManager.default.removeItem(atPath: staging)
        try store.syncToDisk()
        return record
    }

    /// The bundle's `CFBundleIdentifier` from its Info.plist, or `local.NAME` from its name.
    static func defaultID(forBundle path: String) -> AppID? {
        if let data = FileManager.default.contents(atPath: path + "/Info.plist"),
           let plist = try? PropertyListSerialization.propertyList(from: data, format: nil) as? [String: Any],
           let identifier = plist["CFBundleIdentifier"] as? String, let id = AppID(identifier) {
            return id
        }
        let name = ((path as NSString).lastPathComponent as NSString).deletingPathExtension.lowercased()
        return AppID("local." + name.filter { $0.isLetter || $0.isNumber || $0 == "-" })
    }
}
