// Most of the shim is inline (include/CFuse.h). Here: the multi-threaded loop and its signals.
//
// libfuse's own fuse_session_loop_mt ends by cancelling the worker threads that still wait in
// read(): ThreadSanitizer halts a daemon whose thread ends inside an interceptor, and a cancelled
// worker cannot be told from one that ended on its own. This loop keeps libfuse's shape (a worker
// starts another when none is left waiting, up to a maximum; one that finds too many waiting
// leaves) and ends without cancelling anything: when the session exits, each worker still in its
// loop is woken with CFUSE_WAKE_SIGNAL (its read fails with EINTR, or the kernel's ENODEV comes
// first after an unmount) and leaves, and every thread is joined before the loop returns. Only a
// worker waiting for a request is woken: one serving a request finishes it undisturbed (a signal
// there could fail an interruptible call with EINTR), then sees that the session exited.

#include "CFuse.h"
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#define CFUSE_WAKE_SIGNAL (SIGRTMIN + 4)
#define CFUSE_FORGET 2
#define CFUSE_BATCH_FORGET 42

static void cfuse_wake(int signal) { (void)signal; }

/// A handler without SA_RESTART: the wait it interrupts fails with EINTR.
static int cfuse_handle(int signal, void (*handler)(int)) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = handler;
    sigemptyset(&action.sa_mask);
    action.sa_flags = 0;
    return sigaction(signal, &action, NULL);
}

/// Now, for a deadline `milliseconds` ahead.
static struct timespec cfuse_deadline(long milliseconds) {
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_nsec += milliseconds * 1000 * 1000;
    deadline.tv_sec += deadline.tv_nsec / 1000000000;
    deadline.tv_nsec %= 1000000000;
    return deadline;
}

struct cfuse_worker {
    struct cfuse_worker *next;
    struct cfuse_loop *loop;
    pthread_t thread;
    struct fuse_buf buf;
    /// Left its loop: to be joined. Waiting for a request (or about to): may be woken. Under the
    /// loop's lock.
    int done, idle;
};

struct cfuse_loop {
    struct fuse_session *se;
    pthread_mutex_t lock;
    /// Posted by each worker that leaves.
    sem_t finish;
    /// Every thread not joined yet, and counts of those in their loop and of those waiting for a
    /// request. Under `lock`.
    struct cfuse_worker *workers;
    int running, waiting;
    int max_idle, max_threads;
    int error;
};

static int cfuse_start_worker(struct cfuse_loop *loop);

static void *cfuse_work(void *argument) {
    struct cfuse_worker *worker = argument;
    struct cfuse_loop *loop = worker->loop;
    while (!fuse_session_exited(loop->se)) {
        int result = fuse_session_receive_buf(loop->se, &worker->buf);
        if (result == -EINTR) continue;
        if (result <= 0) {
            if (result < 0) {
                pthread_mutex_lock(&loop->lock);
                if (loop->error == 0) loop->error = result;
                pthread_mutex_unlock(&loop->lock);
                fuse_session_exit(loop->se);
            }
            break;
        }
        // A burst of forgets must not start a thread each: they do not count as taking a waiter.
        uint32_t opcode = 0;
        if (!(worker->buf.flags & FUSE_BUF_IS_FD) && worker->buf.size >= 8) memcpy(&opcode, (char *)worker->buf.mem + 4, 4);
        int forget = opcode == CFUSE_FORGET || opcode == CFUSE_BATCH_FORGET;
        pthread_mutex_lock(&loop->lock);
        worker->idle = 0;
        if (!forget) loop->waiting--;
        // A failure to start one leaves the requests to the threads there are.
        if (loop->waiting == 0 && loop->running < loop->max_threads) (void)cfuse_start_worker(loop);
        pthread_mutex_unlock(&loop->lock);

        fuse_session_process_buf(loop->se, &worker->buf);

        pthread_mutex_lock(&loop->lock);
        worker->idle = 1;
        if (!forget) loop->waiting++;
        int idle = loop->waiting > loop->max_idle && loop->running > 1;
        pthread_mutex_unlock(&loop->lock);
        if (idle) break;
    }
    // Leaving, as one too many waiting or because the session exited: the loop's wait hears of it.
    pthread_mutex_lock(&loop->lock);
    loop->waiting--;
    loop->running--;
    worker->done = 1;
    pthread_mutex_unlock(&loop->lock);
    sem_post(&loop->finish);
    return NULL;
}

/// Joins the workers that left. Under the loop's lock: a worker that is done takes it no more.
static void cfuse_join_done(struct cfuse_loop *loop) {
    struct cfuse_worker **link = &loop->workers;
    while (*link) {
        struct cfuse_worker *worker = *link;
        if (!worker->done) {
            link = &worker->next;
            continue;
        }
        *link = worker->next;
        pthread_join(worker->thread, NULL);
        free(worker->buf.mem);
        free(worker);
    }
}

/// Starts a worker, under the loop's lock. 0, or an errno.
static int cfuse_start_worker(struct cfuse_loop *loop) {
    cfuse_join_done(loop);
    struct cfuse_worker *worker = calloc(1, sizeof *worker);
    if (worker == NULL) return ENOMEM;
    worker->loop = loop;
    worker->idle = 1;
    // Stop signals go to the thread that runs the loop, whose wait they interrupt.
    sigset_t previous;
    cfuse_block_stop_signals(&previous);
    int error = pthread_create(&worker->thread, NULL, cfuse_work, worker);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    if (error != 0) {
        free(worker);
        return error;
    }
    worker->next = loop->workers;
    loop->workers = worker;
    loop->running++;
    loop->waiting++;
    return 0;
}

int cfuse_session_loop_mt(struct fuse_session *se, unsigned max_idle_threads, unsigned max_threads) {
    struct cfuse_loop loop = {
        .se = se, .workers = NULL, .running = 0, .waiting = 0,
        .max_idle = (int)max_idle_threads, .max_threads = max_threads > 0 ? (int)max_threads : 1, .error = 0,
    };
    if (cfuse_handle(CFUSE_WAKE_SIGNAL, cfuse_wake) != 0) return -errno;
    if (pthread_mutex_init(&loop.lock, NULL) != 0) return -ENOMEM;
    if (sem_init(&loop.finish, 0, 0) != 0) {
        pthread_mutex_destroy(&loop.lock);
        return -errno;
    }
    pthread_mutex_lock(&loop.lock);
    int error = cfuse_start_worker(&loop);
    pthread_mutex_unlock(&loop.lock);
    if (error != 0) fuse_session_exit(se);
    // A stop signal interrupts the wait (its handler has no SA_RESTART), and so does a worker
    // that left when the session exited; a signal taken by another thread shows within a second.
    while (!fuse_session_exited(se)) {
        struct timespec deadline = cfuse_deadline(1000);
        sem_timedwait(&loop.finish, &deadline);
    }
    for (;;) {
        pthread_mutex_lock(&loop.lock);
        int running = loop.running;
        for (struct cfuse_worker *worker = loop.workers; worker; worker = worker->next) {
            if (!worker->done && worker->idle) pthread_kill(worker->thread, CFUSE_WAKE_SIGNAL);
        }
        pthread_mutex_unlock(&loop.lock);
        if (running == 0) break;
        // Woken again until gone: a wake-up that comes just before a worker's read is lost.
        struct timespec deadline = cfuse_deadline(20);
        sem_timedwait(&loop.finish, &deadline);
    }
    pthread_mutex_lock(&loop.lock);
    cfuse_join_done(&loop);
    pthread_mutex_unlock(&loop.lock);
    sem_destroy(&loop.finish);
    pthread_mutex_destroy(&loop.lock);
    fuse_session_reset(se);
    return error != 0 ? -error : loop.error;
}

// MARK: Signals

static struct fuse_session *volatile cfuse_signalled_session;
static volatile sig_atomic_t cfuse_stop_signal;

static void cfuse_stop(int signal) {
    if (cfuse_stop_signal == 0) cfuse_stop_signal = signal;
    struct fuse_session *se = cfuse_signalled_session;
    if (se) fuse_session_exit(se);
}

int cfuse_set_signal_handlers(struct fuse_session *se) {
    cfuse_signalled_session = se;
    cfuse_stop_signal = 0;
    if (cfuse_handle(SIGHUP, cfuse_stop) != 0 || cfuse_handle(SIGINT, cfuse_stop) != 0 ||
        cfuse_handle(SIGTERM, cfuse_stop) != 0 || cfuse_handle(SIGPIPE, SIG_IGN) != 0) {
        return -errno;
    }
    return 0;
}

void cfuse_remove_signal_handlers(void) {
    cfuse_handle(SIGHUP, SIG_DFL);
    cfuse_handle(SIGINT, SIG_DFL);
    cfuse_handle(SIGTERM, SIG_DFL);
    cfuse_handle(SIGPIPE, SIG_DFL);
    cfuse_signalled_session = NULL;
}

int cfuse_stop_signal_received(void) { return cfuse_stop_signal; }
