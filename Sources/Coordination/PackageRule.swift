// Which directories are file packages. Shared by the arbiter (packages lock as a whole) and the
// presenter registry (presenters of enclosing packages hear about items inside).

public struct PackageRule: Sendable {
    /// Decides from a directory's name alone whether it is a package.
    public let isPackageName: @Sendable (PathComponent) -> Bool

    public init(isPackageName: @escaping @Sendable (PathComponent) -> Bool) {
        self.isPackageName = isPackageName
    }

    /// Any directory whose name has a non-empty extension after a dot (`Notes.app`, `x.pages`,
    /// `Proj.xcodeproj`); a leading dot alone (`.config`) is not an extension.
    public static let anyExtension = PackageRule { $0.pathExtension != nil }

    /// No directory is a package.
    public static let none = PackageRule { _ in false }

    /// The outermost package that is `path` itself or encloses it, if any. Outermost, because a
    /// package nested in a package is still part of the outer one's whole.
    public func enclosingPackage(of path: ItemPath, isDirectory: Bool) -> ItemPath? {
        // Every ancestor of an item is a directory; the item itself only if the caller says so.
        let candidates = isDirectory ? path.components.count : path.components.count - 1
        guard candidates > 0 else { return nil }
        for index in 0..<candidates where isPackageName(path.components[index]) {
            return ItemPath(components: Array(path.components[...index]))
        }
        return nil
    }

    /// The packages strictly above `path`, nearest first.
    public func packagesAbove(_ path: ItemPath) -> [ItemPath] {
        path.ancestors.filter { ancestor in ancestor.lastComponent.map(isPackageName) ?? false }
    }
}
