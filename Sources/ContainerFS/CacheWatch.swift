import Containers
import Dispatch
import FUSELowLevel
import Glibc
import Logging

/// Purges `Library/Caches`, oldest first, whenever the store's free space falls below a threshold;
/// never a file that is open through the mount.
final class CacheWatch: @unchecked Sendable {
    private let store: Store
    private let threshold: UInt64
    private let fileSystem: ContainerFileSystem
    private let logger: Logger
    private let timer: DispatchSourceTimer

    init(store: Store, threshold: UInt64, every interval: Double, fileSystem: ContainerFileSystem, logger: Logger) {
        self.store = store
        self.threshold = threshold
        self.fileSystem = fileSystem
        self.logger = logger
        timer = DispatchSource.makeTimerSource(queue: DispatchQueue(label: "containerfs.cache-watch"))
        timer.schedule(deadline: .now(), repeating: interval)
        timer.setEventHandler { [weak self] in self?.check() }
        timer.resume()
    }

    deinit { timer.cancel() }

    private func check() {
        guard let free = try? FreeSpace.available(at: store.root), free < threshold else { return }
        var seen: [String: BackingKey] = [:]
        let purger = CachePurger(store: store, isOpen: { path in
            var attributes = stat()
            guard lstat(path, &attributes) == 0 else { return false }
            seen[path] = BackingKey(attributes)
            return self.fileSystem.nodes.existing(BackingKey(attributes))?.openHandles.load(ordering: .relaxed) ?? 0 > 0
        })
        do {
            let report = try purger.purge(targetFreeBytes: threshold)
            // The kernel may still hold the names it looked up: they are gone now.
            for file in report.removed {
                if let key = seen[file.path], let node = fileSystem.nodes.existing(key) {
                    fileSystem.forgetName(of: node)
                }
            }
            logger.notice("purged caches: free space was below the threshold", metadata: [
                "free": "\(free)", "threshold": "\(threshold)", "removed": "\(report.removed.count)",
                "freed": "\(report.freedBytes)", "skipped-open": "\(report.skippedOpen.count)"])
        } catch {
            logger.error("cache purge failed", metadata: ["error": "\(error)"])
        }
    }
}
