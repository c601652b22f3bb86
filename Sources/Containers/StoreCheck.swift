import Foundation

/// Something wrong with a store, and how to mend it when that is safe.
public struct StoreProblem: CustomStringConvertible, Sendable {
    public let description: String
    /// Repairs the problem; nil when a person must decide (nothing is ever deleted that might be a user's data).
    public let repair: (@Sendable () throws -> Void)?
}

/// The store's own consistency check: what `containerfs check` reports, and `--repair` mends.
public enum StoreCheck {
    public static func problems(in store: Store) -> [StoreProblem] {
        containerProblems(store) + workProblems(store)
    }

    /// Containers and records that do not match, fixed directories that are missing, broken seals.
    private static func containerProblems(_ store: Store) -> [StoreProblem] {
        var problems: [StoreProblem] = []
        let containers: [String]
        do { containers = try store.containerNames() } catch {
            containers = []
            problems.append(StoreProblem(description: "containers: cannot be listed (\(error)); the containers are not checked.", repair: nil))
        }
        for name in containers {
            guard let id = AppID(name) else {
                problems.append(StoreProblem(description: "containers/\(name): not an app ID; move it out of the store.", repair: nil))
                continue
            }
            if id.isGroup {
                // Unknown members are not none: a group container is only called unused when the apps could be listed.
                if let members = try? store.members(of: id), members.isEmpty {
                    problems.append(StoreProblem(description: "containers/\(name): a group container that no installed app belongs to; install an app with --group \(name), or remove it after saving what you need from it.", repair: nil))
                }
                problems += missingDirectories(of: id, in: store)
            } else if !store.isInstalled(id) {
                problems.append(StoreProblem(description: "containers/\(name): a container without an app record (a failed install or uninstall); reinstall the app, or remove the container after saving what you need from it.", repair: nil))
            }
        }
        let apps: [AppRecord]
        do { apps = try store.apps() } catch {
            apps = []
            problems.append(StoreProblem(description: "apps: cannot be read (\(error)); the installed apps are not checked.", repair: nil))
        }
        for record in apps {
            guard let id = AppID(record.id) else { continue }
            let container = store.containerPath(id)
            guard FileManager.default.fileExists(atPath: container + "/" + record.bundleName) else {
                problems.append(StoreProblem(description: "\(id): its bundle \(record.bundleName) is missing; reinstall the app (its data is kept).", repair: nil))
                continue
            }
            problems += missingDirectories(of: id, in: store)
            for group in record.groupIDs where !FileManager.default.fileExists(atPath: store.containerPath(group)) {
                problems.append(StoreProblem(description: "\(id): the container of its group \(group) is missing.", repair: { try store.repairContainer(group) }))
            }
            if let seal = try? Seal.check(store: store, id: id), !seal.isIntact {
                problems.append(StoreProblem(description: "\(id): the bundle fails its seal (\(seal.findings.count) findings; `containerfs verify` lists them); reinstall the app.", repair: nil))
            }
        }
        return problems
    }

    private static func missingDirectories(of id: AppID, in store: Store) -> [StoreProblem] {
        ContainerLayout.directories(of: id).filter { !FileManager.default.fileExists(atPath: store.containerPath(id) + "/" + $0) }.map {
            StoreProblem(description: "\(id): \($0) is missing.", repair: { try store.repairContainer(id) })
        }
    }

    /// Scratch left in STORE/work by processes that died: installs, deliveries, restores, shadows.
    private static func workProblems(_ store: Store) -> [StoreProblem] {
        var leftovers: [String] = []
        var unlisted: [StoreProblem] = []
        do {
            for name in try DirectoryHandle(path: store.workPath).names() {
                if let pid = scratchOwner(name), !isAlive(pid) { leftovers.append(name) }
            }
        } catch {
            unlisted.append(StoreProblem(description: "work: cannot be listed (\(error)); what processes that died left there is not checked.", repair: nil))
        }
        do { leftovers += try ShadowDirectory.left(in: store).map { "shadows/" + $0 } } catch {
            unlisted.append(StoreProblem(description: "work/shadows: not checked (\(error)); what daemons that died left there may put files right.", repair: nil))
        }
        return unlisted + leftovers.sorted().map { name in
            StoreProblem(description: "work/\(name): left by a process that died.", repair: {
                // Reached as the daemons reach them, never through a link planted in the store.
                if name.hasPrefix("shadows/") {
                    try store.workDirectory("shadows").map { try ShadowDirectory.remove(String(name.dropFirst("shadows/".count)), in: $0) }
                } else {
                    try FileTree.removeEntry(name, in: DirectoryHandle(path: store.workPath))
                }
            })
        }
    }

    /// The process a scratch name (`purpose-PID-random`) belongs to.
    static func scratchOwner(_ name: String) -> pid_t? {
        let parts = name.split(separator: "-")
        guard parts.count >= 3, UInt32(parts[parts.count - 1]) != nil else { return nil }
        return pid_t(parts[parts.count - 2])
    }

    private static func isAlive(_ pid: pid_t) -> Bool {
        kill(pid, 0) == 0 || errno != ESRCH
    }
}
