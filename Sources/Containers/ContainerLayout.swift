/// The fixed shape of every container, as iOS gives it.
public enum ContainerLayout {
    /// The directories every container has, parents first, relative to the container root.
    public static let directories = [
        "Documents",
        "Documents/Inbox",
        "Library",
        "Library/Application Support",
        "Library/Caches",
        "Library/Preferences",
        "tmp",
    ]

    /// The directories every group container has: its root and `Library` are the group's,
    /// shared by its apps (docs/island.md).
    public static let groupDirectories = [
        "Library",
        "Library/Application Support",
        "Library/Caches",
        "Library/Preferences",
    ]

    /// The fixed directories of the container `id`.
    public static func directories(of id: AppID) -> [String] { id.isGroup ? groupDirectories : directories }

    public static let inbox = "Documents/Inbox"
    public static let caches = "Library/Caches"
    public static let tmp = "tmp"
}
