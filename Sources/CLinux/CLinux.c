#define _GNU_SOURCE 1
#include "CLinux.h"
#include <fcntl.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <linux/fs.h>
#include <linux/fiemap.h>
#include <linux/nsfs.h>
#include <malloc.h>
#include <unistd.h>
#include <spawn.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <errno.h>
#include <sys/syscall.h>
#include <signal.h>
#include <sched.h>
#include <linux/capability.h>
#include <isa-l/crc.h>

const int clinux_O_PATH = O_PATH;
const int clinux_O_TMPFILE = O_TMPFILE;
const int clinux_O_DIRECT = O_DIRECT;
const int clinux_O_NOATIME = O_NOATIME;
const int clinux_AT_EMPTY_PATH = AT_EMPTY_PATH;
const long clinux_UTIME_NOW = UTIME_NOW;
const long clinux_UTIME_OMIT = UTIME_OMIT;
const unsigned int clinux_RENAME_NOREPLACE = RENAME_NOREPLACE;
const unsigned int clinux_RENAME_EXCHANGE = RENAME_EXCHANGE;
const unsigned long clinux_FICLONE = FICLONE;
const int clinux_SEEK_DATA = SEEK_DATA;
const int clinux_SEEK_HOLE = SEEK_HOLE;
const short clinux_POSIX_SPAWN_SETSID = POSIX_SPAWN_SETSID;

int clinux_leads_thread_group(int thread) {
    // ESRCH unless the thread is in the group named; EPERM only says it may not be signalled.
    return tgkill(thread, thread, 0) == 0 || errno == EPERM;
}
int clinux_renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned int flags) {
    return renameat2(olddirfd, oldpath, newdirfd, newpath, flags);
}
int clinux_fallocate(int fd, int mode, off_t offset, off_t length) { return fallocate(fd, mode, offset, length); }
long long clinux_unwritten_end(int fd, long long from) {
    struct { struct fiemap map; struct fiemap_extent extents[32]; } request;
    unsigned long long start = (unsigned long long)from;
    long long end = 0;
    for (;;) {
        memset(&request, 0, sizeof request);
        request.map.fm_start = start;
        request.map.fm_length = FIEMAP_MAX_OFFSET - start;
        request.map.fm_extent_count = 32;
        if (ioctl(fd, FS_IOC_FIEMAP, &request.map) != 0) return -1;
        if (request.map.fm_mapped_extents == 0) return end;
        for (unsigned int index = 0; index < request.map.fm_mapped_extents; index++) {
            const struct fiemap_extent *extent = &request.extents[index];
            long long stop = (long long)(extent->fe_logical + extent->fe_length);
            if ((extent->fe_flags & FIEMAP_EXTENT_UNWRITTEN) && stop > end) end = stop;
            if (extent->fe_flags & FIEMAP_EXTENT_LAST) return end;
            start = extent->fe_logical + extent->fe_length;
        }
    }
}
int clinux_contains(const void *haystack, size_t haystack_length, const void *needle, size_t needle_length) {
    return memmem(haystack, haystack_length, needle, needle_length) != NULL;
}
int clinux_write_data_and_wait(int fd) {
    return sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
}
void clinux_start_writing_data(int fd) { (void)sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE); }
int clinux_set_lease(int fd, int exclusive) { return fcntl(fd, F_SETLEASE, exclusive ? F_WRLCK : F_UNLCK); }
int clinux_inode_flags(int fd, unsigned int *flags, unsigned int *extended, unsigned int *project) {
    int value = 0;
    struct fsxattr attributes;
    memset(&attributes, 0, sizeof attributes);
    if (ioctl(fd, FS_IOC_GETFLAGS, &value) != 0 && errno != ENOTTY && errno != EOPNOTSUPP) return -1;
    if (ioctl(fd, FS_IOC_FSGETXATTR, &attributes) != 0 && errno != ENOTTY && errno != EOPNOTSUPP) return -1;
    *flags = (unsigned int)value;
    *extended = attributes.fsx_xflags;
    *project = attributes.fsx_projid;
    return 0;
}
ssize_t clinux_copy_file_range(int fd_in, off_t *off_in, int fd_out, off_t *off_out, size_t length, unsigned int flags) {
    return copy_file_range(fd_in, off_in, fd_out, off_out, length, flags);
}
int clinux_ficlone(int destination, int source) { return ioctl(destination, FICLONE, source); }
int clinux_ns_parent(int fd) { return ioctl(fd, NS_GET_PARENT); }
int clinux_syncfs(int fd) { return syncfs(fd); }
long clinux_fs_type(int fd) {
    struct statfs system;
    return fstatfs(fd, &system) == 0 ? (long)system.f_type : -1;
}
unsigned int clinux_major(dev_t device) { return major(device); }
unsigned int clinux_minor(dev_t device) { return minor(device); }
int clinux_malloc_trim(size_t pad) { return malloc_trim(pad); }
int clinux_become_batch(void) {
    static __thread int batch;
    if (batch) return 0;
    struct sched_param parameters = { .sched_priority = 0 };
    if (sched_setscheduler(0, SCHED_BATCH, &parameters) != 0) return -1;
    batch = 1;
    return 0;
}
size_t clinux_malloc_usable_size(void *pointer) { return malloc_usable_size(pointer); }

ssize_t clinux_getxattr(const char *path, const char *name, void *value, size_t size) { return getxattr(path, name, value, size); }
ssize_t clinux_lgetxattr(const char *path, const char *name, void *value, size_t size) { return lgetxattr(path, name, value, size); }
ssize_t clinux_fgetxattr(int fd, const char *name, void *value, size_t size) { return fgetxattr(fd, name, value, size); }
int clinux_setxattr(const char *path, const char *name, const void *value, size_t size, int flags) { return setxattr(path, name, value, size, flags); }
int clinux_lsetxattr(const char *path, const char *name, const void *value, size_t size, int flags) { return lsetxattr(path, name, value, size, flags); }
int clinux_fsetxattr(int fd, const char *name, const void *value, size_t size, int flags) { return fsetxattr(fd, name, value, size, flags); }
ssize_t clinux_listxattr(const char *path, char *list, size_t size) { return listxattr(path, list, size); }
ssize_t clinux_llistxattr(const char *path, char *list, size_t size) { return llistxattr(path, list, size); }
ssize_t clinux_flistxattr(int fd, char *list, size_t size) { return flistxattr(fd, list, size); }
int clinux_removexattr(const char *path, const char *name) { return removexattr(path, name); }
int clinux_fremovexattr(int fd, const char *name) { return fremovexattr(fd, name); }

int clinux_spawn_close_from(void *actions, int lowest) {
    return posix_spawn_file_actions_addclosefrom_np((posix_spawn_file_actions_t *)actions, lowest);
}

// CRC-32C is iSCSI's CRC, which ISA-L (Debian's libisal) folds with carry-less multiplication,
// choosing the code for the processor at the first call. It keeps the register as is, so the
// inversions are done here, and it takes an `int` length, so longer buffers go in parts.
unsigned int clinux_crc32c(unsigned int crc, const void *data, size_t length) {
    uint32_t state = ~(uint32_t)crc;
    unsigned char *bytes = (unsigned char *)data;
    while (length > 0) {
        int part = length > CLINUX_CRC32C_PART ? CLINUX_CRC32C_PART : (int)length;
        state = crc32_iscsi(bytes, part, state);
        bytes += part;
        length -= (size_t)part;
    }
    return ~state;
}

_Static_assert(sizeof(((struct clinux_credentials *)0)->capabilities) == 2 * sizeof(struct __user_cap_data_struct),
               "two capability words of three fields");

int clinux_write_as_group_without_fsetid(gid_t group, struct clinux_credentials *saved) {
    struct __user_cap_header_struct header = { _LINUX_CAPABILITY_VERSION_3, 0 };
    struct __user_cap_data_struct held[2], lowered[2];
    if (syscall(SYS_capget, &header, held) != 0) return -1;
    memcpy(saved->capabilities, held, sizeof held);
    saved->changed = 0;
    // Filesystem group and capabilities are the thread's own: other threads keep theirs. Each
    // change makes the kernel commit new credentials: what already holds is left alone.
    saved->filesystem_group = (gid_t)syscall(SYS_setfsgid, (gid_t)-1);
    if (saved->filesystem_group != group) {
        syscall(SYS_setfsgid, group);
        if ((gid_t)syscall(SYS_setfsgid, (gid_t)-1) != group) {
            syscall(SYS_setfsgid, saved->filesystem_group);
            errno = EPERM;
            return -1;
        }
        saved->changed |= CLINUX_CHANGED_GROUP;
    }
    if (held[0].effective & (1u << CAP_FSETID)) {
        memcpy(lowered, held, sizeof lowered);
        lowered[0].effective &= ~(1u << CAP_FSETID);
        if (syscall(SYS_capset, &header, lowered) != 0) {
            int error = errno;
            if (saved->changed & CLINUX_CHANGED_GROUP) syscall(SYS_setfsgid, saved->filesystem_group);
            errno = error;
            return -1;
        }
        saved->changed |= CLINUX_CHANGED_CAPABILITIES;
    }
    return 0;
}

void clinux_restore_credentials(const struct clinux_credentials *saved) {
    struct __user_cap_header_struct header = { _LINUX_CAPABILITY_VERSION_3, 0 };
    struct __user_cap_data_struct held[2];
    memcpy(held, saved->capabilities, sizeof held);
    int failed = 0;
    if (saved->changed & CLINUX_CHANGED_GROUP) {
        syscall(SYS_setfsgid, saved->filesystem_group);
        failed = (gid_t)syscall(SYS_setfsgid, (gid_t)-1) != saved->filesystem_group;
    }
    if (!failed && (saved->changed & CLINUX_CHANGED_CAPABILITIES)) failed = syscall(SYS_capset, &header, held) != 0;
    if (failed) {
        static const char message[] = "containerfs: cannot restore a thread's credentials\n";
        (void)!write(2, message, sizeof message - 1);
        abort();
    }
}

#ifndef STATX_ATTR_MOUNT_ROOT
#define STATX_ATTR_MOUNT_ROOT 0x00002000
#endif

int clinux_is_mount_root(const char *path) {
    struct statx attributes;
    if (statx(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT, 0, &attributes) != 0) return -1;
    if (!(attributes.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT)) {
        errno = EOPNOTSUPP;
        return -1;
    }
    return (attributes.stx_attributes & STATX_ATTR_MOUNT_ROOT) != 0;
}

int clinux_identity(int fd, unsigned long long *device, unsigned long long *inode, long long *size) {
    struct statx attributes;
    if (statx(fd, "", AT_EMPTY_PATH, STATX_INO | STATX_SIZE, &attributes) != 0) return -1;
    *device = makedev(attributes.stx_dev_major, attributes.stx_dev_minor);
    *inode = attributes.stx_ino;
    *size = (long long)attributes.stx_size;
    return 0;
}
