// The libfuse3 low-level API as Swift sees it. Function-like macros and
// versioned symbols are not importable, so they get small inline wrappers here. A C target (not a
// system library) so that the build sees when this header changes.
#ifndef CONTAINERFS_CFUSE_H
#define CONTAINERFS_CFUSE_H

#define FUSE_USE_VERSION FUSE_MAKE_VERSION(3, 14)
// Through its directory: a C target does not take pkg-config flags, and the headers include
// their neighbours by their own names.
#include <fuse3/fuse_lowlevel.h>
#include <errno.h>
#include <stddef.h>

/// Serves requests on threads of its own until the session exits (CFuse.c: libfuse's loop, ended
/// without cancelling threads). 0, or a negative errno.
int cfuse_session_loop_mt(struct fuse_session *se, unsigned max_idle_threads, unsigned max_threads);

/// SIGHUP, SIGINT and SIGTERM end the session; SIGPIPE is ignored. 0, or a negative errno.
int cfuse_set_signal_handlers(struct fuse_session *se);
void cfuse_remove_signal_handlers(void);
/// The signal that ended the session, or 0.
int cfuse_stop_signal_received(void);

static inline struct fuse_session *cfuse_session_new(struct fuse_args *args, const struct fuse_lowlevel_ops *ops, void *userdata) {
    return fuse_session_new(args, ops, sizeof(*ops), userdata);
}

#include <signal.h>

/// Blocks the stop signals in the calling thread (the threads it then starts inherit the mask), so
/// that they go to the thread that runs the session's loop; `previous` restores the mask.
static inline void cfuse_block_stop_signals(sigset_t *previous) {
    sigset_t blocked;
    sigemptyset(&blocked);
    sigaddset(&blocked, SIGTERM);
    sigaddset(&blocked, SIGINT);
    sigaddset(&blocked, SIGHUP);
    sigaddset(&blocked, SIGQUIT);
    pthread_sigmask(SIG_BLOCK, &blocked, previous);
}

// MARK: FUSE over io_uring (CFuseRing.c, docs/io-uring.md)

struct cfuse_ring;
/// Starts a queue of `depth` entries with `payload` bytes each for every possible CPU, on threads
/// of their own, once the kernel has taken an INIT answer with FUSE_OVER_IO_URING. The kernel
/// sends requests through them once every queue has registered (`cfuse_ring_state`). NULL when
/// out of memory.
struct cfuse_ring *cfuse_ring_start(struct fuse_session *se, int device, unsigned depth, size_t payload);
/// 1 when every queue registered, 0 while they are registering, -1 if one failed (the kernel then
/// goes on with /dev/fuse).
int cfuse_ring_state(struct cfuse_ring *ring);
/// For the session's custom I/O: commits `iov` (an answer: header, then its arguments) to the
/// entry that holds its request. Its size; -1 when no entry holds it (it goes to /dev/fuse); -2
/// with errno set when it could not be committed.
ssize_t cfuse_ring_reply(struct cfuse_ring *ring, const struct iovec *iov, int count);
/// Ends the queues' threads (a thread serving a request finishes it first) and closes the rings.
void cfuse_ring_stop(struct cfuse_ring *ring);
/// Stops the ring if it runs, and frees it.
void cfuse_ring_free(struct cfuse_ring *ring);
/// Whether a ring serves anywhere in the process.
int cfuse_ring_in_use(void);
/// Called before a wait (a sync, the disk): on a thread that takes a queue's requests, hands the
/// queue to another thread, so that the requests behind do not wait too. Nothing elsewhere.
void cfuse_ring_will_wait(void);

/// A reply that hands the kernel a read from a descriptor, so the data can be spliced (not to a
/// request that came through a ring, whose answer is copied into its entry).
static inline int cfuse_reply_fd_read(fuse_req_t req, int fd, size_t size, off_t offset) {
    struct fuse_bufvec buf = FUSE_BUFVEC_INIT(size);
    buf.buf[0].flags = (enum fuse_buf_flags)(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
    buf.buf[0].fd = fd;
    buf.buf[0].pos = offset;
    return fuse_reply_data(req, &buf, cfuse_ring_in_use() ? FUSE_BUF_NO_SPLICE : FUSE_BUF_SPLICE_MOVE);
}

/// Copies a write's data (which may arrive as a pipe for splice) into a descriptor.
static inline ssize_t cfuse_write_buf_to_fd(struct fuse_bufvec *in_buf, int fd, off_t offset) {
    struct fuse_bufvec out_buf = FUSE_BUFVEC_INIT(fuse_buf_size(in_buf));
    out_buf.buf[0].flags = (enum fuse_buf_flags)(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
    out_buf.buf[0].fd = fd;
    out_buf.buf[0].pos = offset;
    return fuse_buf_copy(&out_buf, in_buf, 0);
}

/// Where a write's data is in memory, or NULL where it arrived otherwise (a pipe, several buffers).
static inline const void *cfuse_buf_memory(const struct fuse_bufvec *bufvec) {
    if (bufvec->count != 1 || bufvec->idx != 0 || (bufvec->buf[0].flags & FUSE_BUF_IS_FD)) return NULL;
    return (const char *)bufvec->buf[0].mem + bufvec->off;
}

// MARK: Passthrough (Linux 6.9 and later)
// libfuse 3.14 predates FUSE passthrough, in which the kernel reads and writes a file registered by
// the daemon without sending it requests. These few pieces of the kernel's protocol (7.40) are the
// ones it needs; libfuse's own headers do not carry them.

#include <linux/ioctl.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

struct cfuse_backing_map { int32_t fd; uint32_t flags; uint64_t padding; };
#define CFUSE_DEV_IOC_BACKING_OPEN _IOW(229, 1, struct cfuse_backing_map)
#define CFUSE_DEV_IOC_BACKING_CLOSE _IOW(229, 2, uint32_t)
#define CFUSE_INIT_EXT (1u << 30)
#define CFUSE_HANDLE_KILLPRIV_V2 (1u << 28)
#define CFUSE_PASSTHROUGH_FLAGS2 (1u << (37 - 32))
#define CFUSE_DIRECT_IO_ALLOW_MMAP_FLAGS2 (1u << (36 - 32))
#define CFUSE_OVER_IO_URING_FLAGS2 (1u << (41 - 32))
#define CFUSE_FOPEN_NOFLUSH (1u << 5)
#define CFUSE_FOPEN_PASSTHROUGH (1u << 7)

/// Registers `fd`'s file with the connection of `device` (the session's /dev/fuse descriptor).
/// Returns the backing id (above 0), or -errno.
static inline int cfuse_backing_open(int device, int fd) {
    struct cfuse_backing_map map = { .fd = fd, .flags = 0, .padding = 0 };
    int id = ioctl(device, CFUSE_DEV_IOC_BACKING_OPEN, &map);
    return id < 0 ? -errno : id;
}

static inline int cfuse_backing_close(int device, int id) {
    uint32_t backing = (uint32_t)id;
    return ioctl(device, CFUSE_DEV_IOC_BACKING_CLOSE, &backing) < 0 ? -errno : 0;
}

/// Answers an open: the kernel reads and writes the file registered as `backing_id` itself, and
/// with `noflush`, closes it without a FLUSH request.
static inline int cfuse_reply_open_passthrough(fuse_req_t req, uint64_t fh, int32_t backing_id, int noflush) {
    uint32_t flags = CFUSE_FOPEN_PASSTHROUGH | (noflush ? CFUSE_FOPEN_NOFLUSH : 0);
    struct { uint64_t fh; uint32_t open_flags; int32_t backing_id; } out = { fh, flags, backing_id };
    struct iovec iov = { &out, sizeof out };
    return fuse_reply_iov(req, &iov, 1);
}

/// The kernel's `fuse_attr`, `fuse_entry_out` and `fuse_open_out` (protocol 7.40), for answers
/// libfuse 3.14 cannot give.
struct cfuse_attr {
    uint64_t ino, size, blocks, atime, mtime, ctime;
    uint32_t atimensec, mtimensec, ctimensec, mode, nlink, uid, gid, rdev, blksize, flags;
};
struct cfuse_entry_out {
    uint64_t nodeid, generation, entry_valid, attr_valid;
    uint32_t entry_valid_nsec, attr_valid_nsec;
    struct cfuse_attr attr;
};
struct cfuse_open_out { uint64_t fh; uint32_t open_flags; int32_t backing_id; };
_Static_assert(sizeof(struct cfuse_entry_out) == 128, "fuse_entry_out is 128 bytes");

/// A timeout in seconds as the kernel takes it, as libfuse converts it.
static inline void cfuse_split_timeout(double timeout, uint64_t *seconds, uint32_t *nanoseconds) {
    if (!(timeout > 0.0)) { *seconds = 0; *nanoseconds = 0; return; }
    if (timeout >= 18446744073709551615.0) { *seconds = UINT64_MAX; *nanoseconds = 0; return; }
    *seconds = (uint64_t)timeout;
    double fraction = timeout - (double)*seconds;
    *nanoseconds = fraction >= 0.999999999 ? 999999999 : (uint32_t)(fraction * 1.0e9);
}

/// Answers a create as `fuse_reply_create` does, with the open passing through to `backing_id`
/// (see `cfuse_reply_open_passthrough`).
static inline int cfuse_reply_create_passthrough(fuse_req_t req, const struct fuse_entry_param *e, uint64_t fh,
                                                 int32_t backing_id, int noflush) {
    struct { struct cfuse_entry_out entry; struct cfuse_open_out open; } out;
    memset(&out, 0, sizeof out);
    out.entry.nodeid = e->ino;
    out.entry.generation = e->generation;
    cfuse_split_timeout(e->entry_timeout, &out.entry.entry_valid, &out.entry.entry_valid_nsec);
    cfuse_split_timeout(e->attr_timeout, &out.entry.attr_valid, &out.entry.attr_valid_nsec);
    const struct stat *st = &e->attr;
    out.entry.attr = (struct cfuse_attr){
        .ino = st->st_ino, .size = (uint64_t)st->st_size, .blocks = (uint64_t)st->st_blocks,
        .atime = (uint64_t)st->st_atim.tv_sec, .mtime = (uint64_t)st->st_mtim.tv_sec, .ctime = (uint64_t)st->st_ctim.tv_sec,
        .atimensec = (uint32_t)st->st_atim.tv_nsec, .mtimensec = (uint32_t)st->st_mtim.tv_nsec,
        .ctimensec = (uint32_t)st->st_ctim.tv_nsec, .mode = st->st_mode, .nlink = (uint32_t)st->st_nlink,
        .uid = st->st_uid, .gid = st->st_gid, .rdev = (uint32_t)st->st_rdev, .blksize = (uint32_t)st->st_blksize,
    };
    out.open = (struct cfuse_open_out){ fh, CFUSE_FOPEN_PASSTHROUGH | (noflush ? CFUSE_FOPEN_NOFLUSH : 0), backing_id };
    struct iovec iov = { &out, sizeof out };
    return fuse_reply_iov(req, &iov, 1);
}

/// Adds to libfuse's answer to the kernel's INIT (header and `fuse_init_out`) what libfuse 3.14
/// predates: with `killpriv_v2`, that the daemon clears set-ID bits itself (FUSE_HANDLE_KILLPRIV_V2,
/// Linux 5.11); shared mappings of files opened for direct I/O (Linux 6.6); and with `passthrough`,
/// passthrough with a stack depth of 1 (backing files on a disk filesystem, not on another stacked
/// one); and with `ring`, FUSE over io_uring (Linux 6.14), with the largest payload a request or
/// answer may then carry in `payload`. Returns whether it could; an answer that is an error stays
/// as it was, and one to a kernel without extended flags gets only the first.
static inline int cfuse_amend_init(struct iovec *iov, int count, int passthrough, int killpriv_v2, int ring,
                                   size_t *payload) {
    if (count != 2 || iov[0].iov_len < 16 || iov[1].iov_len != 64) return 0;
    int32_t error;
    memcpy(&error, (char *)iov[0].iov_base + 4, sizeof error);
    uint32_t flags;
    char *out = iov[1].iov_base;
    memcpy(&flags, out + 12, sizeof flags);
    if (error != 0) return 0;
    if (killpriv_v2) {
        flags |= CFUSE_HANDLE_KILLPRIV_V2;
        memcpy(out + 12, &flags, sizeof flags);
    }
    if (!(flags & CFUSE_INIT_EXT)) return 0;
    uint32_t flags2, depth = 1;
    memcpy(&flags2, out + 32, sizeof flags2);
    flags2 |= CFUSE_DIRECT_IO_ALLOW_MMAP_FLAGS2;
    if (passthrough) {
        flags2 |= CFUSE_PASSTHROUGH_FLAGS2;
        memcpy(out + 36, &depth, sizeof depth);
    }
    if (ring) {
        // As the kernel sizes a ring's payload: the largest of a write, a request's pages, 8 KiB.
        uint32_t max_write;
        uint16_t max_pages;
        memcpy(&max_write, out + 20, sizeof max_write);
        memcpy(&max_pages, out + 28, sizeof max_pages);
        size_t pages = (size_t)max_pages * (size_t)sysconf(_SC_PAGESIZE), largest = max_write;
        if (pages > largest) largest = pages;
        *payload = largest > 8192 ? largest : 8192;
        flags2 |= CFUSE_OVER_IO_URING_FLAGS2;
    }
    memcpy(out + 32, &flags2, sizeof flags2);
    return 1;
}

#define CFUSE_CREATE 35
#define CFUSE_TMPFILE 51

/// Reads a request. libfuse 3.14 predates FUSE_TMPFILE (an unnamed file, `open(O_TMPFILE)`), which
/// carries what FUSE_CREATE does and wants the same answer: it is handed on as a FUSE_CREATE of the
/// name "/", which no real creation can carry.
static inline ssize_t cfuse_io_read(int fd, void *buf, size_t buf_len, void *userdata) {
    (void)userdata;
    ssize_t length = read(fd, buf, buf_len);
    if (length >= 8) {
        uint32_t opcode;
        memcpy(&opcode, (char *)buf + 4, sizeof opcode);
        if (opcode == CFUSE_TMPFILE) {
            opcode = CFUSE_CREATE;
            memcpy((char *)buf + 4, &opcode, sizeof opcode);
        }
    }
    return length;
}

static inline ssize_t cfuse_io_splice(int fdin, off_t *offin, int fdout, off_t *offout, size_t len,
                                      unsigned int flags, void *userdata) {
    (void)userdata;
    // splice(2) is declared only with _GNU_SOURCE, which would change how Swift sees libc here.
    return syscall(SYS_splice, fdin, offin, fdout, offout, len, flags);
}

/// Routes the session's I/O through these functions (libfuse's custom I/O): requests are read by
/// `cfuse_io_read`, never spliced, so that each can be seen; replies go through `writev_reply` and
/// may be spliced. Call after mounting, before the loop.
static inline int cfuse_session_route_io(struct fuse_session *se,
                                         ssize_t (*writev_reply)(int, struct iovec *, int, void *)) {
    struct fuse_custom_io io = {
        .writev = writev_reply, .read = cfuse_io_read, .splice_receive = NULL, .splice_send = cfuse_io_splice,
    };
    return fuse_session_custom_io(se, &io, fuse_session_fd(se));
}

#endif
