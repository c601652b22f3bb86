#if canImport(Glibc)
import Glibc
#endif

/// What each operation may do in each zone (docs/policy.md).
///
/// Each check answers `0` when the operation is allowed, or the errno to fail it with.
/// Policy holds for every caller, root included; ordinary mode bits are the kernel's
/// (`default_permissions`).
public enum Policy {
    /// Creating a file, directory, symlink or device node, or a hard link, inside `parent`.
    public static func create(in parent: Zone) -> Int32 {
        switch parent {
        case .groupRoot, .documents, .library, .libraryDirectory, .data, .caches, .cachesItem, .tmp, .tmpItem: return 0
        case .bundle: return EROFS
        case .mountRoot, .containerRoot, .inbox, .inboxItem, .stray: return EACCES
        }
    }

    /// Unlinking or removing `item` (whose zone follows from its parent's and its name).
    public static func remove(_ item: Zone) -> Int32 {
        switch item {
        case .inboxItem, .data, .cachesItem, .tmpItem: return 0
        case .bundle: return EROFS
        case .mountRoot, .containerRoot, .groupRoot, .documents, .inbox, .library, .libraryDirectory, .caches, .tmp, .stray: return EACCES
        }
    }

    /// Opening `item` for writing, truncating it, or allocating space in it.
    public static func write(_ item: Zone) -> Int32 {
        switch item {
        case .data, .cachesItem, .tmpItem: return 0
        case .bundle: return EROFS
        case .mountRoot, .containerRoot, .groupRoot, .documents, .inbox, .inboxItem, .library, .libraryDirectory, .caches, .tmp, .stray:
            return EACCES
        }
    }

    /// chmod, chown, utimes, and setting or removing extended attributes of `item`.
    public static func changeMetadata(_ item: Zone) -> Int32 {
        // The fixed directories themselves keep the shape the installer gave them.
        write(item)
    }

    /// Renaming `source` into `destinationParent`, replacing `destination` if it exists
    /// (the zone of the new name, which is also the zone of any item it replaces).
    public static func rename(_ source: Zone, to destination: Zone, in destinationParent: Zone,
                              replacing: Bool) -> Int32 {
        let leaving = remove(source)
        if leaving != 0 { return leaving }
        let arriving = create(in: destinationParent)
        if arriving != 0 { return arriving }
        if replacing {
            let replaced = remove(destination)
            if replaced != 0 { return replaced }
        }
        return crossing(from: source, to: destination)
    }

    /// Swapping two existing items (`RENAME_EXCHANGE`): each one leaves and arrives.
    public static func exchange(_ first: Zone, in firstParent: Zone, with second: Zone, in secondParent: Zone) -> Int32 {
        for result in [remove(first), remove(second), create(in: firstParent), create(in: secondParent),
                       crossing(from: first, to: second)] where result != 0 {
            return result
        }
        return 0
    }

    /// A hard link to `source` named in `destinationParent`: no way to make a read-only item writable.
    public static func link(_ source: Zone, into destinationParent: Zone) -> Int32 {
        switch source {
        case .bundle: return EROFS
        case .inboxItem: return EACCES
        default: break
        }
        let arriving = create(in: destinationParent)
        if arriving != 0 { return arriving }
        return crossing(from: source, to: destinationParent.child(named: "_"))
    }

    /// Moves and links between tmp and everything else fail as across filesystems do,
    /// so `mv` and `cp -l` fall back to copying.
    static func crossing(from source: Zone, to destination: Zone) -> Int32 {
        source.renameDomain == destination.renameDomain ? 0 : EXDEV
    }

    /// The permission bits `stat` shows for an item, so that what it shows matches what is enforced.
    public static func visibleMode(_ mode: mode_t, of item: Zone, isDirectory: Bool) -> mode_t {
        let noWrite = mode & ~mode_t(0o222)
        switch item {
        case .bundle, .mountRoot, .containerRoot, .stray: return noWrite
        // Inbox directories keep their write bits: deleting from them is allowed.
        case .inboxItem: return isDirectory ? mode : noWrite
        case .groupRoot, .documents, .inbox, .library, .libraryDirectory, .data, .caches, .cachesItem, .tmp, .tmpItem: return mode
        }
    }
}
