// Which directories are file packages. Shared by the arbiter (packages lock as a whole) and the
// presenter registry (presenters of enclosing packages hear about items inside).

public struct PackageRule: Sendable {
    /// Decides from a directory's name alone whether it is a package.
    public let isPackageName: @Sendable (PathComponent) -> Bool
    /// How many leading components are never packages, whatever their names: a whole-store mount's
    /// first component is a container root named by its app ID (`org.example.notes`), and one
    /// coordinated access must not lock a whole container (docs/coordination.md).
    public let fixedDepth: Int

    public init(fixedDepth: Int = 0, isPackageName: @escaping @Sendable (PathComponent) -> Bool) {
        self.fixedDepth = fixedDepth
        self.isPackageName = isPackageName
    }

    /// The same rule, with the first `depth` components never packages.
    public func fixing(depth: Int) -> PackageRule {
        PackageRule(fixedDepth: depth, isPackageName: isPackageName)
    }

    /// Any directory whose name has a non-empty extension after a dot (`Notes.app`, `x.pages`,
    /// `Proj.xcodeproj`); a leading dot alone (`.config`) is not an extension.
    public static let anyExtension = PackageRule { $0.hasPathExtension }

    /// No directory is a package.
    public static let none = PackageRule { _ in false }

    /// The outermost package that is `path` itself or encloses it, if any. Outermost, because a
    /// package nested in a package is still part of the outer one's whole.
    public func enclosingPackage(of path: ItemPath, isDirectory: Bool) -> ItemPath? {
        // Every ancestor of an item is a directory; the item itself only if the caller says so.
        let candidates = isDirectory ? path.components.count : path.components.count - 1
        for index in fixedDepth..<max(candidates, fixedDepth) where isPackageName(path.components[index]) {
            return ItemPath(components: Array(path.components[...index]))
        }
        return nil
    }

    /// Whether the directory these names lead to from the root is a package.
    public func isPackage(_ names: ArraySlice<PathComponent>) -> Bool {
        names.count > fixedDepth && names.last.map(isPackageName) ?? false
    }

    /// The packages strictly above `path`, nearest first.
    public func packagesAbove(_ path: ItemPath) -> [ItemPath] {
        path.ancestors.filter { isPackage($0.components[...]) }
    }
}
