// The libfuse3 low-level API as Swift sees it. Function-like macros and
// versioned symbols are not importable, so they get small inline wrappers here.
#ifndef CONTAINERFS_CFUSE_SHIM_H
#define CONTAINERFS_CFUSE_SHIM_H

#define FUSE_USE_VERSION FUSE_MAKE_VERSION(3, 14)
#include <fuse_lowlevel.h>
#include <errno.h>
#include <stddef.h>

static inline int cfuse_session_loop_mt(struct fuse_session *se, unsigned max_idle_threads, unsigned max_threads) {
    struct fuse_loop_config *config = fuse_loop_cfg_create();
    if (config == NULL) return -ENOMEM;
    fuse_loop_cfg_set_idle_threads(config, max_idle_threads);
    fuse_loop_cfg_set_max_threads(config, max_threads);
    fuse_loop_cfg_set_clone_fd(config, 1);
    int result = fuse_session_loop_mt(se, config);
    fuse_loop_cfg_destroy(config);
    return result;
}

static inline struct fuse_session *cfuse_session_new(struct fuse_args *args, const struct fuse_lowlevel_ops *ops, void *userdata) {
    return fuse_session_new(args, ops, sizeof(*ops), userdata);
}

/// A reply that hands the kernel a read from a descriptor, so the data can be spliced.
static inline int cfuse_reply_fd_read(fuse_req_t req, int fd, size_t size, off_t offset) {
    struct fuse_bufvec buf = FUSE_BUFVEC_INIT(size);
    buf.buf[0].flags = (enum fuse_buf_flags)(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
    buf.buf[0].fd = fd;
    buf.buf[0].pos = offset;
    return fuse_reply_data(req, &buf, FUSE_BUF_SPLICE_MOVE);
}

/// Copies a write's data (which may arrive as a pipe for splice) into a descriptor.
static inline ssize_t cfuse_write_buf_to_fd(struct fuse_bufvec *in_buf, int fd, off_t offset) {
    struct fuse_bufvec out_buf = FUSE_BUFVEC_INIT(fuse_buf_size(in_buf));
    out_buf.buf[0].flags = (enum fuse_buf_flags)(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
    out_buf.buf[0].fd = fd;
    out_buf.buf[0].pos = offset;
    return fuse_buf_copy(&out_buf, in_buf, 0);
}

#endif
