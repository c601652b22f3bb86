// Linux calls and constants that Swift's Glibc module leaves out (they need _GNU_SOURCE).
// Only plain types here, so this header agrees with every other module's view of libc.
#ifndef CONTAINERFS_CLINUX_H
#define CONTAINERFS_CLINUX_H

#include <sys/types.h>

extern const int clinux_O_PATH;
extern const int clinux_O_TMPFILE;
extern const int clinux_O_DIRECT;
extern const int clinux_O_NOATIME;
extern const int clinux_AT_EMPTY_PATH;
extern const long clinux_UTIME_NOW;
extern const long clinux_UTIME_OMIT;
extern const unsigned int clinux_RENAME_NOREPLACE;
extern const unsigned int clinux_RENAME_EXCHANGE;
extern const unsigned long clinux_FICLONE;
extern const short clinux_POSIX_SPAWN_SETSID;
extern const int clinux_SEEK_DATA;
extern const int clinux_SEEK_HOLE;

/// Makes a spawned child start with no descriptor from `lowest` up but those its actions set.
int clinux_spawn_close_from(void *actions, int lowest);

/// Whether `thread` leads its thread group (its process's first thread, as a single-threaded
/// process's only one is): 1, 0 when it is another's thread or gone (tgkill with signal 0).
int clinux_leads_thread_group(int thread);
int clinux_renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned int flags);
int clinux_fallocate(int fd, int mode, off_t offset, off_t length);
/// The end of the last unwritten (preallocated) extent of `fd` at or after `from`: 0 if there is
/// none, -1 with errno set if the filesystem cannot say (FIEMAP).
long long clinux_unwritten_end(int fd, long long from);
/// Whether `needle` occurs in `haystack` (memmem).
int clinux_contains(const void *haystack, size_t haystack_length, const void *needle, size_t needle_length);
/// Writes the file's dirty data and waits for the writes to end (sync_file_range over the whole
/// file: WAIT_BEFORE, WRITE, WAIT_AFTER). No cache flush, no journal commit. 0, or -1 with errno.
int clinux_write_data_and_wait(int fd);
/// Starts the writes of the file's dirty data without waiting (sync_file_range WRITE): a hint,
/// whose failure the later `clinux_write_data_and_wait` reports.
void clinux_start_writing_data(int fd);
/// CRC-32C (Castagnoli) of `length` bytes, continuing `crc` (0 to start), by ISA-L. Tells a
/// file's data from what a power cut left of it, not a forgery.
unsigned int clinux_crc32c(unsigned int crc, const void *data, size_t length);
/// The most ISA-L is given in one call (its length is an `int`).
#define CLINUX_CRC32C_PART (1 << 30)
ssize_t clinux_copy_file_range(int fd_in, off_t *off_in, int fd_out, off_t *off_out, size_t length, unsigned int flags);
int clinux_ficlone(int destination, int source);
/// Takes (`exclusive`: a write lease) or drops (0) a lease on `fd` (F_SETLEASE). 0, or -1 with errno.
int clinux_set_lease(int fd, int exclusive);
/// What of an inode's own attributes no stat shows: its flags (FS_IOC_GETFLAGS), extended flags and
/// project (FS_IOC_FSGETXATTR), each 0 where the filesystem has none. 0, or -1 with errno.
int clinux_inode_flags(int fd, unsigned int *flags, unsigned int *extended, unsigned int *project);
/// The parent of the user namespace open as `fd` (NS_GET_PARENT), or -1 with errno (EPERM above the caller's own).
int clinux_ns_parent(int fd);
int clinux_syncfs(int fd);
/// The filesystem type (statfs's f_type) of what `fd` is on, or -1 with errno.
long clinux_fs_type(int fd);
/// The device, inode number and size of `fd`'s file (statx with AT_EMPTY_PATH), its times left
/// unread: reading them makes the file's next write take a fine-grained timestamp, which ext4
/// journals, and the next fdatasync waits for that commit (docs/atomic-replace.md, "In-place
/// writes"). 0, or -1 with errno set.
int clinux_identity(int fd, unsigned long long *device, unsigned long long *inode, long long *size);
/// 1 if `path` (not followed if a link) is the root of a mount, 0 if not, or -1 with errno
/// (EOPNOTSUPP: the kernel does not tell, before Linux 5.8).
int clinux_is_mount_root(const char *path);
unsigned int clinux_major(dev_t device);
unsigned int clinux_minor(dev_t device);
/// Gives memory malloc keeps for later use back to the system.
int clinux_malloc_trim(size_t pad);
/// Makes the calling thread SCHED_BATCH, once per thread (later calls do nothing): woken, it no
/// longer preempts the thread that woke it. 0, or -1 with errno set.
int clinux_become_batch(void);
/// The bytes malloc gave the block at `pointer` (its chunk's size, less malloc's own word).
size_t clinux_malloc_usable_size(void *pointer);

ssize_t clinux_getxattr(const char *path, const char *name, void *value, size_t size);
ssize_t clinux_lgetxattr(const char *path, const char *name, void *value, size_t size);
ssize_t clinux_fgetxattr(int fd, const char *name, void *value, size_t size);
int clinux_setxattr(const char *path, const char *name, const void *value, size_t size, int flags);
int clinux_lsetxattr(const char *path, const char *name, const void *value, size_t size, int flags);
int clinux_fsetxattr(int fd, const char *name, const void *value, size_t size, int flags);
ssize_t clinux_listxattr(const char *path, char *list, size_t size);
ssize_t clinux_llistxattr(const char *path, char *list, size_t size);
ssize_t clinux_flistxattr(int fd, char *list, size_t size);
int clinux_removexattr(const char *path, const char *name);
int clinux_fremovexattr(int fd, const char *name);

/// What `clinux_write_as_group_without_fsetid` lowered, for `clinux_restore_credentials`.
struct clinux_credentials { unsigned int capabilities[6]; gid_t filesystem_group; unsigned int changed; };
enum { CLINUX_CHANGED_GROUP = 1, CLINUX_CHANGED_CAPABILITIES = 2 };
/// Lowers the calling thread's credentials (its own: other threads keep theirs) to what an
/// unprivileged writer of `group` holds for a write: CAP_FSETID dropped from the effective set,
/// and `group` as the filesystem group; `saved` keeps what it had, and which of the two it had to
/// change (none where they hold already). 0, or -1 with errno and the credentials as they were.
int clinux_write_as_group_without_fsetid(gid_t group, struct clinux_credentials *saved);
/// Takes back what `clinux_write_as_group_without_fsetid` lowered. A thread that cannot would serve
/// on with other credentials than it had: the process aborts instead.
void clinux_restore_credentials(const struct clinux_credentials *saved);

#endif
