// FUSE over io_uring (Linux 6.14 and later, with the fuse module's `enable_uring`), for libfuse
// 3.14, which predates it (docs/io-uring.md). Each possible CPU has a queue: an io_uring holding
// `depth` entries registered with the kernel, and a thread pinned to that CPU. The kernel puts a
// request into a free entry of the requesting CPU's queue and completes that entry's command; the
// thread lays the request out as /dev/fuse would have given it and serves it through libfuse,
// whose answer comes back through the session's custom I/O (`cfuse_ring_reply`): copied into the
// entry and committed, which fetches the entry's next request in the same command. FORGET and
// INTERRUPT still come through /dev/fuse, as do notices to the kernel.
//
// A request served on the queue's thread holds up the requests behind it, so a request about to
// wait (a wait for the disk: `cfuse_ring_will_wait`) hands the queue to another thread first, a
// parked one or a new one, and parks once it is done: only one thread at a time takes completions
// from a queue. A sync, which is nothing but such a wait, is served by a worker instead, and the
// queue's thread goes on (`cfuse_ring_offload`): a hand-over costs more, since the kernel completes
// a command in the thread that submitted it, and the parked thread is woken for each of its own.
//
// io_uring cancels the commands a thread submitted when the thread ends, and an entry whose command
// is cancelled is lost to its queue (the kernel fails the request in it with ECANCELED). So only the
// queues' own threads submit, and they live until the ring stops: a thread of anyone else (a
// dispatch queue's, one of libfuse's loop, which end when idle) that answers a request queues the
// command and wakes the queue's thread through its event, which then submits it.

#define _GNU_SOURCE 1
#include "CFuse.h"
#include <liburing.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/sysinfo.h>

// The kernel's protocol 7.42 (include/uapi/linux/fuse.h); libfuse 3.14's headers predate it.
struct cfuse_in_header { uint32_t len, opcode; uint64_t unique, nodeid; uint32_t uid, gid, pid; uint16_t total_extlen, padding; };
struct cfuse_out_header { uint32_t len; int32_t error; uint64_t unique; };
struct cfuse_uring_ent_in_out { uint64_t flags, commit_id; uint32_t payload_sz, padding; uint64_t reserved; };
struct cfuse_uring_req_header {
    char in_out[128];
    char op_in[128];
    struct cfuse_uring_ent_in_out ring_ent_in_out;
};
struct cfuse_uring_cmd_req { uint64_t flags, commit_id; uint16_t qid; uint8_t padding[6]; };
_Static_assert(sizeof(struct cfuse_in_header) == 40, "fuse_in_header is 40 bytes");
_Static_assert(sizeof(struct cfuse_uring_req_header) == 288, "fuse_uring_req_header is 288 bytes");
#define CFUSE_IO_URING_CMD_REGISTER 1
#define CFUSE_IO_URING_CMD_COMMIT_AND_FETCH 2
#define CFUSE_FSYNC_OPCODE 20
#define CFUSE_FSYNCDIR_OPCODE 30
#define CFUSE_CREATE_OPCODE 35
#define CFUSE_TMPFILE_OPCODE 51

/// Room before an entry's payload for the request's header and its operation's fixed part, which
/// the kernel hands over apart from the payload: laid out there, the whole request is contiguous.
#define CFUSE_RING_PREFIX 4096
/// The completions of the poll of the queue's event: a command queued by another thread to submit,
/// or the ring stopping.
#define CFUSE_RING_WAKE ((uint64_t)1)

struct cfuse_ring_queue;

struct cfuse_ring_entry {
    struct cfuse_ring_queue *queue;
    /// Page-aligned, as the kernel pins it.
    struct cfuse_uring_req_header *header;
    /// CFUSE_RING_PREFIX bytes, then the payload.
    char *area;
    struct iovec iov[2];
    /// The request the entry holds until its answer, 0 when none.
    _Atomic uint64_t unique;
    uint64_t commit_id;
    /// While a worker is to serve its request: the request, and the next entry waiting for one.
    struct fuse_buf offloaded;
    struct cfuse_ring_entry *next_offloaded;
};

struct cfuse_ring_queue {
    struct cfuse_ring *ring;
    struct io_uring uring;
    /// Guards the submission side (answers from other threads share it with the queue's threads)
    /// and the counts below; `changed` is signalled when they change.
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int qid, wake, made, closed;
    /// Threads of the queue alive, parked, and handed the queue but not yet woken.
    int threads, parked, handed;
    /// Entries registered, and those the connection let go since (counted by the thread that takes
    /// completions).
    unsigned registered, gone;
    /// Set (under `lock`) by the thread that took completions when the queue's threads are to leave.
    int leaving;
    /// Published once allocated (answers from other threads look through them), before any is
    /// registered: the kernel uses a queue once every queue has one entry registered.
    _Atomic(struct cfuse_ring_entry *) entries;
    /// The workers that serve its syncs, on its CPU (`cfuse_ring_offload`): the entries waiting
    /// for one, first to last, how many wait, the workers alive and idle. Guarded by `work_lock`;
    /// `work_changed` is signalled when there is work, and when a worker leaves.
    pthread_mutex_t work_lock;
    pthread_cond_t work_changed;
    struct cfuse_ring_entry *offloaded_first, *offloaded_last;
    int offloaded, workers, idle;
};

struct cfuse_ring {
    struct fuse_session *se;
    int device;
    unsigned queues, depth;
    size_t payload;
    _Atomic int stopping;
    /// Queues with entries registered; and those that failed.
    _Atomic unsigned ready, failed;
    struct cfuse_ring_queue *queue;
};

/// The entry whose request the current thread serves, the queue whose completions it takes, and the
/// queue it belongs to, if it is a queue's thread.
static _Thread_local struct cfuse_ring_entry *cfuse_ring_current;
static _Thread_local struct cfuse_ring_queue *cfuse_ring_taker;
static _Thread_local struct cfuse_ring_queue *cfuse_ring_own;
/// Set once any session's ring serves: its answers cannot be spliced into /dev/fuse.
static _Atomic int cfuse_ring_serving;

int cfuse_ring_in_use(void) { return atomic_load_explicit(&cfuse_ring_serving, memory_order_relaxed); }

static void cfuse_ring_prepare(struct io_uring_sqe *sqe, struct cfuse_ring_entry *entry, uint32_t command) {
    memset(sqe, 0, 128);
    sqe->opcode = IORING_OP_URING_CMD;
    sqe->fd = entry->queue->ring->device;
    sqe->cmd_op = command;
    if (command == CFUSE_IO_URING_CMD_REGISTER) {
        sqe->addr = (uint64_t)(uintptr_t)entry->iov;
        sqe->len = 2;
    }
    struct cfuse_uring_cmd_req request = { .flags = 0, .commit_id = entry->commit_id, .qid = (uint16_t)entry->queue->qid };
    memcpy(sqe->cmd, &request, sizeof request);
    io_uring_sqe_set_data(sqe, entry);
}

/// Queues `command` for `entry`. The thread that takes the queue's completions submits it before
/// it waits again: at once when it is the caller, or woken through the queue's event when the
/// caller is no thread of the queue's; another thread of the queue submits it itself. 0, or a
/// negative errno.
static int cfuse_ring_send(struct cfuse_ring_entry *entry, uint32_t command) {
    struct cfuse_ring_queue *queue = entry->queue;
    int wake = 0;
    pthread_mutex_lock(&queue->lock);
    int result = -ENOTCONN;
    if (!queue->closed) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&queue->uring);
        // The ring has a submission slot for every entry and the event's poll, and an entry has one
        // command at a time.
        if (sqe == NULL) {
            result = -EIO;
        } else {
            cfuse_ring_prepare(sqe, entry, command);
            result = 0;
            if (cfuse_ring_own != queue) {
                wake = 1;
            } else if (cfuse_ring_taker != queue) {
                result = io_uring_submit(&queue->uring);
                if (result > 0) result = 0;
            }
        }
    }
    pthread_mutex_unlock(&queue->lock);
    uint64_t one = 1;
    // A full count (EAGAIN) has a wake-up due already.
    if (wake && write(queue->wake, &one, sizeof one) < 0 && errno != EAGAIN) result = -errno;
    return result;
}

/// Arms the poll of the queue's event (under the queue's lock).
static int cfuse_ring_arm_wake(struct cfuse_ring_queue *queue) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&queue->uring);
    if (sqe == NULL) return -EIO;
    io_uring_prep_poll_multishot(sqe, queue->wake, POLLIN);
    io_uring_sqe_set_data64(sqe, CFUSE_RING_WAKE);
    return 0;
}

/// Commits the answer in `entry`: `out` (its length set here) and `payload` bytes already copied
/// after the prefix. The entry no longer holds a request. 0, or a negative errno.
static int cfuse_ring_commit(struct cfuse_ring_entry *entry, struct cfuse_out_header out, size_t payload) {
    out.len = (uint32_t)(sizeof out + payload);
    memcpy(entry->header->in_out, &out, sizeof out);
    entry->header->ring_ent_in_out.payload_sz = (uint32_t)payload;
    atomic_store(&entry->unique, 0);
    return cfuse_ring_send(entry, CFUSE_IO_URING_CMD_COMMIT_AND_FETCH);
}

static int cfuse_ring_offload(struct cfuse_ring_entry *entry, struct fuse_buf buf);
static void cfuse_ring_pin(int cpu);

/// Lays the request out as /dev/fuse gives it (header, the operation's fixed part, the payload)
/// and serves it through libfuse.
static void cfuse_ring_serve(struct cfuse_ring_entry *entry) {
    struct cfuse_ring *ring = entry->queue->ring;
    struct cfuse_in_header in;
    memcpy(&in, entry->header->in_out, sizeof in);
    entry->commit_id = entry->header->ring_ent_in_out.commit_id;
    size_t payload = entry->header->ring_ent_in_out.payload_sz;
    size_t fixed = (size_t)in.len - sizeof in - payload;
    if ((size_t)in.len < sizeof in + payload || fixed > sizeof entry->header->op_in || payload > ring->payload) {
        // Not a request as the protocol lays them out: answered EIO, not handed to libfuse.
        (void)cfuse_ring_commit(entry, (struct cfuse_out_header){ .error = -EIO, .unique = in.unique }, 0);
        return;
    }
    if (in.opcode == CFUSE_TMPFILE_OPCODE) in.opcode = CFUSE_CREATE_OPCODE;   // as cfuse_io_read does
    char *start = entry->area + CFUSE_RING_PREFIX - fixed - sizeof in;
    memcpy(start, &in, sizeof in);
    memcpy(start + sizeof in, entry->header->op_in, fixed);
    atomic_store(&entry->unique, in.unique);
    struct fuse_buf buf = { .size = in.len, .flags = (enum fuse_buf_flags)0, .mem = start, .fd = -1, .pos = 0 };
    // A sync waits for the disk.
    if ((in.opcode == CFUSE_FSYNC_OPCODE || in.opcode == CFUSE_FSYNCDIR_OPCODE) && cfuse_ring_offload(entry, buf)) return;
    cfuse_ring_current = entry;
    fuse_session_process_buf(ring->se, &buf);
    cfuse_ring_current = NULL;
}

ssize_t cfuse_ring_reply(struct cfuse_ring *ring, const struct iovec *iov, int count) {
    if (ring == NULL || count < 1 || iov[0].iov_len < sizeof(struct cfuse_out_header)) return -1;
    struct cfuse_out_header out;
    memcpy(&out, iov[0].iov_base, sizeof out);
    if (out.unique == 0) return -1;
    // The request the thread serves; else any entry holding it.
    struct cfuse_ring_entry *entry = NULL;
    struct cfuse_ring_entry *current = cfuse_ring_current;
    uint64_t expected = out.unique;
    if (current && current->queue->ring == ring && atomic_compare_exchange_strong(&current->unique, &expected, 0)) entry = current;
    for (unsigned q = 0; entry == NULL && q < ring->queues; q++) {
        struct cfuse_ring_entry *entries = atomic_load(&ring->queue[q].entries);
        for (unsigned e = 0; entry == NULL && entries && e < ring->depth; e++) {
            expected = out.unique;
            if (atomic_compare_exchange_strong(&entries[e].unique, &expected, 0)) entry = &entries[e];
        }
    }
    if (entry == NULL) return -1;
    size_t total = 0, payload = 0;
    for (int index = 0; index < count; index++) total += iov[index].iov_len;
    char *into = entry->area + CFUSE_RING_PREFIX;
    for (int index = 0; index < count; index++) {
        const char *from = iov[index].iov_base;
        size_t length = iov[index].iov_len;
        if (index == 0) { from += sizeof out; length -= sizeof out; }
        if (payload + length > ring->payload) {
            // Larger than any answer the kernel asks for.
            out.error = -EIO;
            payload = 0;
            break;
        }
        memcpy(into + payload, from, length);
        payload += length;
    }
    int result = cfuse_ring_commit(entry, out, payload);
    if (result < 0) {
        errno = -result;
        return -2;
    }
    return (ssize_t)total;
}

static void *cfuse_ring_successor(void *argument);

/// Starts a detached thread running `body` with `argument`, the stop signals blocked. 0, or an errno.
static int cfuse_ring_spawn(void *(*body)(void *), void *argument) {
    pthread_attr_t attributes;
    int error = pthread_attr_init(&attributes);
    if (error != 0) return error;
    pthread_t thread;
    sigset_t previous;
    cfuse_block_stop_signals(&previous);
    error = pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
    if (error == 0) error = pthread_create(&thread, &attributes, body, argument);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    pthread_attr_destroy(&attributes);
    return error;
}

void cfuse_ring_will_wait(void) {
    struct cfuse_ring_queue *queue = cfuse_ring_taker;
    if (queue == NULL) return;
    pthread_mutex_lock(&queue->lock);
    // What this thread answered goes now: the next taker may be waiting already.
    (void)io_uring_submit(&queue->uring);
    int handed = 0;
    if (queue->parked > queue->handed) {
        queue->handed++;
        pthread_cond_broadcast(&queue->changed);
        handed = 1;
    } else if (cfuse_ring_spawn(cfuse_ring_successor, queue) == 0) {
        // Without a thread the queue stays with this one, which holds it up while it waits.
        queue->threads++;
        handed = 1;
    }
    if (handed) cfuse_ring_taker = NULL;
    pthread_mutex_unlock(&queue->lock);
}

/// A worker: serves the entries offloaded to its queue until the ring stops. Workers stay, as a
/// queue's threads do, at most one an entry; on the queue's CPU, so that handing them a request
/// wakes no other CPU.
static void *cfuse_ring_worker(void *argument) {
    struct cfuse_ring_queue *queue = argument;
    cfuse_ring_pin(queue->qid);
    pthread_mutex_lock(&queue->work_lock);
    for (;;) {
        queue->idle++;
        while (queue->offloaded_first == NULL && !atomic_load(&queue->ring->stopping)) pthread_cond_wait(&queue->work_changed, &queue->work_lock);
        queue->idle--;
        struct cfuse_ring_entry *entry = queue->offloaded_first;
        if (entry == NULL) break;
        queue->offloaded_first = entry->next_offloaded;
        if (queue->offloaded_first == NULL) queue->offloaded_last = NULL;
        queue->offloaded--;
        pthread_mutex_unlock(&queue->work_lock);
        // Its answer finds the entry here, and wakes the queue's thread to submit it.
        cfuse_ring_current = entry;
        fuse_session_process_buf(queue->ring->se, &entry->offloaded);
        cfuse_ring_current = NULL;
        pthread_mutex_lock(&queue->work_lock);
    }
    queue->workers--;
    pthread_cond_broadcast(&queue->work_changed);
    pthread_mutex_unlock(&queue->work_lock);
    return NULL;
}

/// Hands the request in `entry` to a worker of its queue, an idle one or a new one. 0 when it
/// cannot (no thread could be made): the caller serves it.
static int cfuse_ring_offload(struct cfuse_ring_entry *entry, struct fuse_buf buf) {
    struct cfuse_ring_queue *queue = entry->queue;
    pthread_mutex_lock(&queue->work_lock);
    int offloaded = queue->idle > queue->offloaded;
    if (!offloaded && cfuse_ring_spawn(cfuse_ring_worker, queue) == 0) {
        queue->workers++;
        offloaded = 1;
    }
    if (offloaded) {
        entry->offloaded = buf;
        entry->next_offloaded = NULL;
        if (queue->offloaded_last) queue->offloaded_last->next_offloaded = entry; else queue->offloaded_first = entry;
        queue->offloaded_last = entry;
        queue->offloaded++;
        pthread_cond_signal(&queue->work_changed);
    }
    pthread_mutex_unlock(&queue->work_lock);
    return offloaded;
}

/// An anonymous mapping of `size` bytes (page-aligned, untouched until used), or NULL.
static void *cfuse_ring_map(size_t size) {
    void *memory = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return memory == MAP_FAILED ? NULL : memory;
}

/// Makes the queue's ring, arms the poll of its event and registers its entries. 0 once one entry
/// is registered (the kernel may use the queue from then on, and the thread must stay to serve it:
/// its commands end with it), or a negative errno.
static int cfuse_ring_make_queue(struct cfuse_ring_queue *queue) {
    struct cfuse_ring *ring = queue->ring;
    struct io_uring_params params;
    memset(&params, 0, sizeof params);
    params.flags = IORING_SETUP_SQE128 | IORING_SETUP_CQSIZE;
    params.cq_entries = (ring->depth + 1) * 4;
    pthread_mutex_lock(&queue->lock);
    int result = io_uring_queue_init_params(ring->depth + 1, &queue->uring, &params);
    if (result == 0) queue->made = 1;
    pthread_mutex_unlock(&queue->lock);
    if (result < 0) return result;
    pthread_mutex_lock(&queue->lock);
    result = cfuse_ring_arm_wake(queue);
    if (result == 0) result = io_uring_submit(&queue->uring);
    pthread_mutex_unlock(&queue->lock);
    if (result < 0) return result;
    struct cfuse_ring_entry *entries = calloc(ring->depth, sizeof *entries);
    if (entries == NULL) return -ENOMEM;
    for (unsigned index = 0; index < ring->depth; index++) entries[index].queue = queue;
    atomic_store(&queue->entries, entries);
    // Out of memory part way, the queue goes on with the entries it has.
    for (unsigned index = 0; index < ring->depth; index++) {
        struct cfuse_ring_entry *entry = &entries[index];
        entry->header = cfuse_ring_map(sizeof *entry->header);
        entry->area = cfuse_ring_map(CFUSE_RING_PREFIX + ring->payload);
        if (entry->header == NULL || entry->area == NULL) break;
        entry->iov[0] = (struct iovec){ entry->header, sizeof *entry->header };
        entry->iov[1] = (struct iovec){ entry->area + CFUSE_RING_PREFIX, ring->payload };
        result = cfuse_ring_send(entry, CFUSE_IO_URING_CMD_REGISTER);
        if (result < 0) break;
        queue->registered++;
    }
    return queue->registered > 0 ? 0 : (result < 0 ? result : -ENOMEM);
}

/// Takes the queue's completions and serves them, until told to leave or until it handed the
/// queue to another thread (then 0: the caller parks).
static int cfuse_ring_take(struct cfuse_ring_queue *queue) {
    struct cfuse_ring *ring = queue->ring;
    cfuse_ring_taker = queue;
    while (!queue->leaving && !atomic_load(&ring->stopping)) {
        pthread_mutex_lock(&queue->lock);
        (void)io_uring_submit(&queue->uring);
        pthread_mutex_unlock(&queue->lock);
        struct io_uring_cqe *cqe;
        int result = io_uring_wait_cqe(&queue->uring, &cqe);
        // Interrupted, or completions held back until the ring has room for them.
        if (result == -EINTR || result == -EAGAIN || result == -EBUSY) continue;
        if (result < 0) break;
        uint64_t data = io_uring_cqe_get_data64(cqe);
        int status = cqe->res;
        unsigned flags = cqe->flags;
        // Seen before it is served: a thread the queue is handed to meanwhile takes the next.
        io_uring_cqe_seen(&queue->uring, cqe);
        if (data == CFUSE_RING_WAKE) {
            // Commands to submit (the loop's top), or the stop. The event's count is emptied, and
            // the poll armed again once it ended.
            uint64_t count;
            while (read(queue->wake, &count, sizeof count) > 0) {}
            if (!(flags & IORING_CQE_F_MORE)) {
                pthread_mutex_lock(&queue->lock);
                (void)cfuse_ring_arm_wake(queue);
                pthread_mutex_unlock(&queue->lock);
            }
            continue;
        }
        struct cfuse_ring_entry *entry = (struct cfuse_ring_entry *)(uintptr_t)data;
        if (status == 0) {
            cfuse_ring_serve(entry);
        } else if (status == -EAGAIN || status == -EINTR) {
            (void)cfuse_ring_send(entry, entry->commit_id ? CFUSE_IO_URING_CMD_COMMIT_AND_FETCH
                                                          : CFUSE_IO_URING_CMD_REGISTER);
        } else if (++queue->gone == queue->registered) {
            // The connection let go of every entry (ENOTCONN at an unmount).
            break;
        }
        if (cfuse_ring_taker != queue) return 0;
    }
    cfuse_ring_taker = NULL;
    pthread_mutex_lock(&queue->lock);
    queue->leaving = 1;
    pthread_mutex_unlock(&queue->lock);
    return 1;
}

/// After a request it served while the queue went to another thread: waits to be handed the
/// queue again. 0 when it was, 1 when the thread is to leave. A thread stays until the ring stops
/// (the commands it submitted end with it), so a queue has at most a thread per entry and one.
static int cfuse_ring_park(struct cfuse_ring_queue *queue) {
    pthread_mutex_lock(&queue->lock);
    int leave = 1;
    queue->parked++;
    while (queue->handed == 0 && !queue->leaving && !atomic_load(&queue->ring->stopping) && !queue->closed) {
        pthread_cond_wait(&queue->changed, &queue->lock);
    }
    queue->parked--;
    if (queue->handed > 0) {
        queue->handed--;
        leave = 0;
    }
    pthread_mutex_unlock(&queue->lock);
    return leave;
}

/// A queue's thread: takes its completions, parks while another does, leaves when told to.
static void cfuse_ring_run(struct cfuse_ring_queue *queue) {
    while (!cfuse_ring_take(queue) && !cfuse_ring_park(queue)) {}
    pthread_mutex_lock(&queue->lock);
    queue->threads--;
    // A thread parked while this one took the queue's leave follows it out.
    pthread_cond_broadcast(&queue->changed);
    pthread_mutex_unlock(&queue->lock);
}

/// On the CPU whose requests the queue holds, where the kernel queues them; a CPU the process may
/// not use leaves the thread where the scheduler puts it.
static void cfuse_ring_pin(int cpu) {
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    CPU_SET(cpu, &cpus);
    (void)sched_setaffinity(0, sizeof cpus, &cpus);
}

static void *cfuse_ring_successor(void *argument) {
    struct cfuse_ring_queue *queue = argument;
    cfuse_ring_own = queue;
    cfuse_ring_pin(queue->qid);
    cfuse_ring_run(queue);
    return NULL;
}

static void *cfuse_ring_first(void *argument) {
    struct cfuse_ring_queue *queue = argument;
    cfuse_ring_own = queue;
    cfuse_ring_pin(queue->qid);
    if (cfuse_ring_make_queue(queue) < 0) {
        atomic_fetch_add(&queue->ring->failed, 1);
        pthread_mutex_lock(&queue->lock);
        queue->threads--;
        pthread_cond_broadcast(&queue->changed);
        pthread_mutex_unlock(&queue->lock);
        return NULL;
    }
    atomic_fetch_add(&queue->ring->ready, 1);
    cfuse_ring_run(queue);
    return NULL;
}

struct cfuse_ring *cfuse_ring_start(struct fuse_session *se, int device, unsigned depth, size_t payload) {
    int cpus = get_nprocs_conf();
    if (cpus < 1 || depth < 1) return NULL;
    struct cfuse_ring *ring = calloc(1, sizeof *ring);
    if (ring == NULL) return NULL;
    ring->se = se;
    ring->device = device;
    ring->queues = (unsigned)cpus;
    ring->depth = depth;
    ring->payload = payload;
    ring->queue = calloc(ring->queues, sizeof *ring->queue);
    if (ring->queue == NULL) {
        free(ring);
        return NULL;
    }
    // Its answers never splice (`cfuse_reply_fd_read`) from here on.
    atomic_store(&cfuse_ring_serving, 1);
    for (unsigned q = 0; q < ring->queues; q++) {
        struct cfuse_ring_queue *queue = &ring->queue[q];
        queue->ring = ring;
        queue->qid = (int)q;
        pthread_mutex_init(&queue->lock, NULL);
        pthread_cond_init(&queue->changed, NULL);
        pthread_mutex_init(&queue->work_lock, NULL);
        pthread_cond_init(&queue->work_changed, NULL);
        queue->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        queue->threads = 1;
        if (queue->wake < 0 || cfuse_ring_spawn(cfuse_ring_first, queue) != 0) {
            queue->threads = 0;
            atomic_fetch_add(&ring->failed, 1);
        }
    }
    return ring;
}

int cfuse_ring_state(struct cfuse_ring *ring) {
    if (ring == NULL) return -1;
    if (atomic_load(&ring->failed) > 0) return -1;
    return atomic_load(&ring->ready) == ring->queues ? 1 : 0;
}

void cfuse_ring_stop(struct cfuse_ring *ring) {
    if (ring == NULL || atomic_exchange(&ring->stopping, 1)) return;
    for (unsigned q = 0; q < ring->queues; q++) {
        struct cfuse_ring_queue *queue = &ring->queue[q];
        uint64_t one = 1;
        // Wakes the thread that waits for a completion; the parked ones see `stopping`. A thread
        // serving a request finishes it first.
        if (queue->wake >= 0 && write(queue->wake, &one, sizeof one) < 0) { /* the count is full: a wake-up is due */ }
        pthread_mutex_lock(&queue->lock);
        pthread_cond_broadcast(&queue->changed);
        while (queue->threads > 0) pthread_cond_wait(&queue->changed, &queue->lock);
        // Late answers find the queue closed; the kernel ends the commands left with the ring.
        if (queue->made) io_uring_queue_exit(&queue->uring);
        queue->made = 0;
        queue->closed = 1;
        pthread_mutex_unlock(&queue->lock);
    }
    // A worker serving a request finishes it first; its answer finds its queue closed.
    for (unsigned q = 0; q < ring->queues; q++) {
        struct cfuse_ring_queue *queue = &ring->queue[q];
        pthread_mutex_lock(&queue->work_lock);
        pthread_cond_broadcast(&queue->work_changed);
        while (queue->workers > 0) pthread_cond_wait(&queue->work_changed, &queue->work_lock);
        pthread_mutex_unlock(&queue->work_lock);
    }
}

void cfuse_ring_free(struct cfuse_ring *ring) {
    if (ring == NULL) return;
    cfuse_ring_stop(ring);
    for (unsigned q = 0; q < ring->queues; q++) {
        struct cfuse_ring_queue *queue = &ring->queue[q];
        struct cfuse_ring_entry *entries = atomic_load(&queue->entries);
        for (unsigned e = 0; entries && e < ring->depth; e++) {
            if (entries[e].header) munmap(entries[e].header, sizeof *entries[e].header);
            if (entries[e].area) munmap(entries[e].area, CFUSE_RING_PREFIX + ring->payload);
        }
        free(entries);
        if (queue->wake >= 0) close(queue->wake);
        pthread_cond_destroy(&queue->changed);
        pthread_mutex_destroy(&queue->lock);
        pthread_cond_destroy(&queue->work_changed);
        pthread_mutex_destroy(&queue->work_lock);
    }
    free(ring->queue);
    free(ring);
}
