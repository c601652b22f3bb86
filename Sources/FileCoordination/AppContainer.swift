import Foundation

/// The app's own directories, as Foundation gives them on Apple's systems (`NSHomeDirectory()`,
/// `FileManager.urls(for:in:)`, `NSTemporaryDirectory()`, `Bundle.main`). Inside `containerfs run`
/// they are the app's containers; outside, the directories of HOME, with no bundle.
public struct AppContainer: Sendable, Equatable {
    /// Set by `containerfs run`: the app's ID, and the path of its bundle.
    public static let appIDVariable = "CONTAINERFS_APP_ID"
    public static let bundleVariable = "CONTAINERFS_BUNDLE"
    /// Set by `containerfs run` for an app in groups: the directory holding their shared containers.
    public static let groupContainersVariable = "CONTAINERFS_GROUP_CONTAINERS"

    /// The app this process runs as, or nil outside `containerfs run`.
    public let appID: String?
    /// The data container: `NSHomeDirectory()`.
    public let home: URL
    /// The sealed, read-only bundle: `Bundle.main.bundleURL`.
    public let bundle: URL?
    /// `NSTemporaryDirectory()`: the container's tmp, emptied when the app's last process exits.
    public let temporary: URL
    /// Where the shared containers of the app's groups are, if it is in any.
    public let groupContainers: URL?

    public var documents: URL { home.appendingPathComponent("Documents", isDirectory: true) }
    public var library: URL { home.appendingPathComponent("Library", isDirectory: true) }
    public var caches: URL { library.appendingPathComponent("Caches", isDirectory: true) }
    public var applicationSupport: URL { library.appendingPathComponent("Application Support", isDirectory: true) }

    /// The shared container of the app group `identifier` (such as `group.com.example.shared`),
    /// or nil if the app is not in that group: Apple's
    /// `FileManager.containerURL(forSecurityApplicationGroupIdentifier:)`.
    public func containerURL(forSecurityApplicationGroupIdentifier identifier: String) -> URL? {
        guard let groupContainers, !identifier.isEmpty, !identifier.contains("/"), identifier != ".", identifier != ".." else { return nil }
        let url = groupContainers.appendingPathComponent(identifier, isDirectory: true)
        var isDirectory: ObjCBool = false
        return FileManager.default.fileExists(atPath: url.path, isDirectory: &isDirectory) && isDirectory.boolValue ? url : nil
    }

    /// A resource of the bundle (`Bundle.main.url(forResource:withExtension:)`), if it exists.
    public func resource(named name: String, withExtension type: String? = nil) -> URL? {
        guard let bundle else { return nil }
        let url = bundle.appendingPathComponent(type.map { "\(name).\($0)" } ?? name)
        return FileManager.default.fileExists(atPath: url.path) ? url : nil
    }

    public init(environment: [String: String]) {
        appID = environment[AppContainer.appIDVariable]
        home = URL(fileURLWithPath: environment["HOME"] ?? NSHomeDirectory(), isDirectory: true)
        bundle = environment[AppContainer.bundleVariable].map { URL(fileURLWithPath: $0, isDirectory: true) }
        temporary = URL(fileURLWithPath: environment["TMPDIR"] ?? "/tmp", isDirectory: true)
        groupContainers = environment[AppContainer.groupContainersVariable].map { URL(fileURLWithPath: $0, isDirectory: true) }
    }

    /// This process's.
    public static var current: AppContainer { AppContainer(environment: ProcessInfo.processInfo.environment) }
}
