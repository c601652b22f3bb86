import Foundation

/// A daemon's shadow directory, STORE/work/shadows/PID (docs/atomic-replace.md).
public enum ShadowDirectory {
    /// Names of second links to files that the daemon created and was writing in place: their
    /// published version is the empty file.
    public static let freshPrefix = "fresh-"

    /// Removes the shadow directory of a daemon that is gone. Its shadows are unpublished writes;
    /// the files it was writing in place since creating them are emptied back to their published
    /// version. Committed logs of large files' rewrites are applied first (`DeltaLog`). A directory
    /// holding a log that cannot be applied, or a file that cannot be emptied, stays (its marks are
    /// what says what to do), and the error says why.
    public static func remove(atPath path: String) throws {
        let recovery = DeltaLog.recover(inDirectoryAt: path)
        guard recovery == 0 else {
            throw POSIXError(POSIXErrorCode(rawValue: recovery) ?? .EIO)
        }
        for name in (try? FileManager.default.contentsOfDirectory(atPath: path)) ?? [] where name.hasPrefix(freshPrefix) {
            let descriptor = open(path + "/" + name, O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
            guard descriptor >= 0 else {
                if errno == ENOENT { continue }
                throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO)
            }
            let emptied = ftruncate(descriptor, 0) == 0 ? 0 : errno
            close(descriptor)
            guard emptied == 0 else { throw POSIXError(POSIXErrorCode(rawValue: emptied) ?? .EIO) }
        }
        try FileManager.default.removeItem(atPath: path)
    }
}
