import Foundation

extension Store {
    /// Empties a container's `tmp/`, as at every mount and unmount. Symlinks inside are removed, never followed.
    public func emptyTemporaryDirectory(of id: AppID) throws {
        let tmp = containerPath(id) + "/" + ContainerLayout.tmp
        for name in (try? FileManager.default.contentsOfDirectory(atPath: tmp)) ?? [] {
            try FileManager.default.removeItem(atPath: tmp + "/" + name)
        }
    }
}
