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

    public static let inbox = "Documents/Inbox"
    public static let caches = "Library/Caches"
    public static let tmp = "tmp"
}
