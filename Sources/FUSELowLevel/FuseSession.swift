import CFuse
import CLinux
import Glibc
import Synchronization

public struct FuseError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// A libfuse low-level session: the kernel connection, the mount, and the loop that serves requests.
///
/// POSIX (`fcntl`) and BSD (`flock`) locks are left to the kernel, which keeps them for every
/// process using the mount and makes waiters sleep in the kernel, never in a worker thread.
public final class FuseSession {
    private let session: OpaquePointer
    private var arguments: fuse_args
    private let box: Unmanaged<FileSystemBox>
    private var mounted = false
    private var signalHandlersInstalled = false

    /// `options` are libfuse's own command-line options, such as `["-o", "allow_other", "-d"]`.
    public init(options: [String], fileSystem: any LowLevelFileSystem) throws {
        arguments = fuse_args(argc: 0, argv: nil, allocated: 0)
        for argument in ["containerfs"] + options {
            guard fuse_opt_add_arg(&arguments, argument) == 0 else { throw FuseError("out of memory") }
        }
        box = Unmanaged.passRetained(FileSystemBox(fileSystem))
        var operations = makeOperations()
        guard let session = cfuse_session_new(&arguments, &operations, box.toOpaque()) else {
            fuse_opt_free_args(&arguments)
            box.release()
            throw FuseError("libfuse refused the options \(options.joined(separator: " ")) (see the message above).")
        }
        self.session = session
        box.takeUnretainedValue().session.store(UInt(bitPattern: UnsafeMutableRawPointer(session)), ordering: .releasing)
    }

    deinit {
        cfuse_ring_free(ring)
        if signalHandlersInstalled { cfuse_remove_signal_handlers() }
        if mounted { fuse_session_unmount(session) }
        fuse_session_destroy(session)
        fuse_opt_free_args(&arguments)
        box.release()
    }

    /// Mounts, and routes the session's I/O through `sendReply` and `cfuse_io_read` (libfuse's
    /// custom I/O), which speak the parts of the kernel's protocol newer than libfuse 3.14.
    public func mount(at mountPoint: String) throws {
        guard fuse_session_mount(session, mountPoint) == 0 else {
            throw FuseError("could not mount at \(mountPoint) (see the message above).")
        }
        mounted = true
        guard cfuse_session_route_io(session, sendReply) == 0 else {
            throw FuseError("libfuse refused custom I/O")
        }
    }

    /// Offers the kernel FUSE passthrough (Linux 6.9 and later): it may then read files the daemon
    /// registers (`openBacking`) without sending it requests. libfuse 3.14 predates passthrough, so
    /// the reply hook adds the flag to its answer to the kernel's INIT. Call after `mount`, before
    /// `run`. Whether the kernel agreed shows at the first `openBacking`.
    public func offerPassthrough() {
        box.takeUnretainedValue().offersPassthrough.store(true, ordering: .releasing)
    }

    /// Takes over the clearing of set-user-ID and set-group-ID bits from the kernel
    /// (FUSE_HANDLE_KILLPRIV_V2, Linux 5.11): the kernel then stops asking the daemon before each
    /// write whether it must clear privileges (a GETXATTR of `security.capability`, and a SETATTR
    /// of the mode), and the daemon must clear them on writes, truncations and allocations by
    /// callers without CAP_FSETID. Files registered for passthrough are then registered with
    /// credentials that hold no CAP_FSETID and have the file's group (`openBacking`), so that the
    /// backing filesystem clears them on a write the daemon never sees, as for an unprivileged
    /// writer of that group. Call after `mount`, before `run`.
    public func takeOverSetIDClearing() {
        box.takeUnretainedValue().clearsSetID.store(true, ordering: .releasing)
    }

    /// Offers the kernel FUSE over io_uring (Linux 6.14 and later, where the fuse module's
    /// `enable_uring` is set): requests then come through a ring per CPU, `depth` entries each,
    /// served on a thread of each (docs/io-uring.md). libfuse 3.14 predates it, so the reply hook
    /// adds the flag to the INIT answer and starts the rings once the kernel has taken it. Call
    /// after `mount`, before `run`; `ioUringState` tells whether the kernel took them.
    public func offerIOUring(depth: UInt32 = 16) {
        box.takeUnretainedValue().ringDepth.store(max(depth, 1), ordering: .releasing)
    }

    /// Whether requests come through io_uring: nil when not offered or not started (a kernel that
    /// did not take it), false while the queues register or if one failed, true once they serve.
    public var ioUringState: Bool? {
        guard let ring else { return nil }
        return cfuse_ring_state(ring) == 1
    }

    private var ring: OpaquePointer? {
        OpaquePointer(bitPattern: box.takeUnretainedValue().ring.load(ordering: .acquiring))
    }

    /// SIGINT, SIGTERM and SIGHUP end the loop, so that the mount is taken down cleanly.
    public func installSignalHandlers() throws {
        guard cfuse_set_signal_handlers(session) == 0 else { throw FuseError("could not install signal handlers") }
        signalHandlersInstalled = true
    }

    /// Serves requests until unmounted or stopped by a signal. Returns 0 when unmounted, the
    /// signal's number when one stopped it (both clean ends), or a negative errno. Every thread
    /// that served requests has ended when it returns.
    public func run(multithreaded: Bool = true, maxIdleThreads: UInt32 = 10, maxThreads: UInt32 = 64) -> Int32 {
        let status = multithreaded ? cfuse_session_loop_mt(session, maxIdleThreads, maxThreads) : fuse_session_loop(session)
        // The rings' threads too (a thread serving a request finishes it first).
        cfuse_ring_stop(ring)
        let signal = cfuse_stop_signal_received()
        return signal != 0 ? signal : status
    }

    public func unmount() {
        if mounted {
            fuse_session_unmount(session)
            mounted = false
        }
    }

    // MARK: Telling the kernel what changed behind its back

    /// Drops the kernel's cached attributes and, for the range given, data of `inode` (length 0: all of it;
    /// a negative offset: none).
    @discardableResult
    public func invalidateInode(_ inode: InodeNumber, offset: off_t = 0, length: off_t = 0) -> Int32 {
        // The kernel waits there for pages being read, whose requests may be in this thread's queue.
        if offset >= 0 { RequestThreads.willWait() }
        return fuse_lowlevel_notify_inval_inode(session, inode, offset, length)
    }
}

/// libfuse's custom I/O `writev`: every reply, the first of which answers the kernel's INIT. An
/// answer to a request that came through a ring goes into the ring's entry.
private func sendReply(_ device: Int32, _ vectors: UnsafeMutablePointer<iovec>?, _ count: Int32,
                       _ userdata: UnsafeMutableRawPointer?) -> Int {
    guard let userdata, let vectors else { return writev(device, vectors, count) }
    let box = Unmanaged<FileSystemBox>.fromOpaque(userdata).takeUnretainedValue()
    if let ring = OpaquePointer(bitPattern: box.ring.load(ordering: .acquiring)) {
        let sent = cfuse_ring_reply(ring, vectors, count)
        if sent != -1 { return sent == -2 ? -1 : sent }
    }
    guard box.amendsInitReply.load(ordering: .relaxed), box.amendsInitReply.exchange(false, ordering: .acquiringAndReleasing) else {
        return writev(device, vectors, count)
    }
    let depth = box.ringDepth.load(ordering: .acquiring)
    var payload = 0
    let amended = cfuse_amend_init(vectors, count, box.offersPassthrough.load(ordering: .acquiring) ? 1 : 0,
                                   box.clearsSetID.load(ordering: .acquiring) ? 1 : 0, depth > 0 ? 1 : 0, &payload)
    let written = writev(device, vectors, count)
    // The kernel has taken the answer when the write returns: the rings may register.
    if written > 0, amended == 1, depth > 0, payload > 0,
       let session = OpaquePointer(bitPattern: box.session.load(ordering: .acquiring)),
       let ring = cfuse_ring_start(session, device, depth, payload) {
        box.ring.store(UInt(bitPattern: UnsafeMutableRawPointer(ring)), ordering: .releasing)
    }
    return written
}

/// The threads that serve requests.
public enum RequestThreads {
    /// To be called before a request waits for the disk (a sync, another thread's write): where
    /// requests come through io_uring, the thread serving it hands its queue to another, so that
    /// the requests behind this one are not held up. Costs nothing elsewhere.
    @inline(__always)
    public static func willWait() { cfuse_ring_will_wait() }
}

/// Files the kernel reads and writes itself, without requests (FUSE passthrough).
public protocol BackingFileRegistry: AnyObject {
    /// Registers the file open on `descriptor`. Returns its backing id (above 0) for
    /// `FuseRequest.reply(opened:passthrough:)`, or a negative errno.
    func openBacking(_ descriptor: Int32) -> Int32
    /// Forgets a backing id; files the kernel opened with it keep their file. 0, or the errno of a
    /// refusal (an id the kernel does not hold: the daemon's count of its handles went wrong).
    func closeBacking(_ id: Int32) -> Int32
}

extension FuseSession: BackingFileRegistry {
    /// When the daemon clears set-ID bits (`takeOverSetIDClearing`), registers with the credentials
    /// of an unprivileged writer of the file's group: the kernel makes passthrough writes with the
    /// credentials of the registration, and the backing filesystem then clears set-user-ID, and
    /// set-group-ID where the group may execute, as it would for such a writer.
    public func openBacking(_ descriptor: Int32) -> Int32 {
        let device = fuse_session_fd(session)
        guard box.takeUnretainedValue().clearsSetID.load(ordering: .relaxed) else { return cfuse_backing_open(device, descriptor) }
        var attributes = stat()
        guard fstat(descriptor, &attributes) == 0 else { return -errno }
        var saved = clinux_credentials()
        guard clinux_write_as_group_without_fsetid(attributes.st_gid, &saved) == 0 else { return -errno }
        defer { clinux_restore_credentials(&saved) }
        return cfuse_backing_open(device, descriptor)
    }
    public func closeBacking(_ id: Int32) -> Int32 { -cfuse_backing_close(fuse_session_fd(session), id) }
}

/// Tells the kernel that cached attributes or data are no longer true. No entry notices
/// (`FUSE_NOTIFY_INVAL_ENTRY`): the kernel takes the directory's lock for one, and a notice that
/// waits there for a request the daemon serves never ends if the daemon dies, nor does the mount.
public protocol KernelCacheNotifier: AnyObject {
    @discardableResult func invalidateInode(_ inode: InodeNumber, offset: off_t, length: off_t) -> Int32
}

extension FuseSession: KernelCacheNotifier {}
