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
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <errno.h>
#include <sys/syscall.h>
#include <signal.h>
#include <linux/capability.h>
#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

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

// CRC-32C, reflected polynomial 0x82F63B78: a table for processors without the instruction.
// With it, three streams run side by side (the instruction's latency is three cycles, its
// throughput one a cycle) over three adjacent blocks, whose CRCs are then joined: a CRC register
// moved past N zero bytes is a linear map, kept as four tables of 256 (Mark Adler's method).
#define CRC32C_POLY 0x82F63B78u
#define CRC32C_LONG 8192
#define CRC32C_SHORT 256
static uint32_t crc32c_table[256];
static uint32_t crc32c_long[4][256], crc32c_short[4][256];
static pthread_once_t crc32c_once = PTHREAD_ONCE_INIT;
static int crc32c_hardware;

static uint32_t crc32c_matrix_times(const uint32_t *matrix, uint32_t vector) {
    uint32_t sum = 0;
    for (; vector; vector >>= 1, matrix++) if (vector & 1) sum ^= *matrix;
    return sum;
}

static void crc32c_matrix_square(uint32_t *square, const uint32_t *matrix) {
    for (int row = 0; row < 32; row++) square[row] = crc32c_matrix_times(matrix, matrix[row]);
}

/// Tables that move a CRC register past `length` zero bytes (`length` a power of two).
static void crc32c_zeros(uint32_t zeros[4][256], size_t length) {
    uint32_t operator[32], other[32];
    other[0] = CRC32C_POLY;  // one zero bit
    for (int row = 1; row < 32; row++) other[row] = 1u << (row - 1);
    crc32c_matrix_square(operator, other);  // two
    crc32c_matrix_square(other, operator);  // four
    for (size_t bytes = 1; ; bytes <<= 1) {
        crc32c_matrix_square(operator, other);  // eight bits times `bytes`
        if (bytes == length) break;
        memcpy(other, operator, sizeof other);
    }
    for (uint32_t byte = 0; byte < 256; byte++) {
        for (int place = 0; place < 4; place++) zeros[place][byte] = crc32c_matrix_times(operator, byte << (8 * place));
    }
}

static inline uint32_t crc32c_shift(uint32_t zeros[4][256], uint32_t crc) {
    return zeros[0][crc & 0xFF] ^ zeros[1][(crc >> 8) & 0xFF] ^ zeros[2][(crc >> 16) & 0xFF] ^ zeros[3][crc >> 24];
}

static void crc32c_prepare(void) {
    for (uint32_t index = 0; index < 256; index++) {
        uint32_t value = index;
        for (int bit = 0; bit < 8; bit++) value = value & 1 ? (value >> 1) ^ CRC32C_POLY : value >> 1;
        crc32c_table[index] = value;
    }
#if defined(__x86_64__)
    crc32c_hardware = __builtin_cpu_supports("sse4.2");
    if (crc32c_hardware) {
        crc32c_zeros(crc32c_long, CRC32C_LONG);
        crc32c_zeros(crc32c_short, CRC32C_SHORT);
    }
#endif
}

static uint32_t crc32c_bytes(uint32_t crc, const unsigned char *bytes, size_t length) {
    for (; length > 0; bytes++, length--) crc = crc32c_table[(crc ^ *bytes) & 0xFF] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2")))
static inline uint64_t crc32c_word(uint64_t crc, const unsigned char *bytes) {
    uint64_t word;
    memcpy(&word, bytes, 8);
    return _mm_crc32_u64(crc, word);
}

/// Three blocks of `block` bytes side by side while 3 × `block` remain.
__attribute__((target("sse4.2")))
static uint64_t crc32c_three(uint64_t crc, const unsigned char **bytes, size_t *length, size_t block,
                             uint32_t zeros[4][256]) {
    while (*length >= 3 * block) {
        uint64_t second = 0, third = 0;
        const unsigned char *next = *bytes, *end = next + block;
        for (; next < end; next += 8) {
            crc = crc32c_word(crc, next);
            second = crc32c_word(second, next + block);
            third = crc32c_word(third, next + 2 * block);
        }
        crc = crc32c_shift(zeros, (uint32_t)crc) ^ (uint32_t)second;
        crc = crc32c_shift(zeros, (uint32_t)crc) ^ (uint32_t)third;
        *bytes += 3 * block;
        *length -= 3 * block;
    }
    return crc;
}

__attribute__((target("sse4.2")))
static uint32_t crc32c_sse42(uint32_t crc, const unsigned char *bytes, size_t length) {
    for (; length > 0 && ((uintptr_t)bytes & 7) != 0; bytes++, length--) crc = _mm_crc32_u8(crc, *bytes);
    uint64_t value = crc;
    value = crc32c_three(value, &bytes, &length, CRC32C_LONG, crc32c_long);
    value = crc32c_three(value, &bytes, &length, CRC32C_SHORT, crc32c_short);
    for (; length >= 8; bytes += 8, length -= 8) value = crc32c_word(value, bytes);
    crc = (uint32_t)value;
    for (; length > 0; bytes++, length--) crc = _mm_crc32_u8(crc, *bytes);
    return crc;
}
#endif

unsigned int clinux_crc32c(unsigned int crc, const void *data, size_t length) {
    pthread_once(&crc32c_once, crc32c_prepare);
#if defined(__x86_64__)
    if (crc32c_hardware) return ~crc32c_sse42(~(uint32_t)crc, data, length);
#endif
    return ~crc32c_bytes(~(uint32_t)crc, data, length);
}

unsigned int clinux_crc32c_portable(unsigned int crc, const void *data, size_t length) {
    pthread_once(&crc32c_once, crc32c_prepare);
    return ~crc32c_bytes(~(uint32_t)crc, data, length);
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
