#!/usr/bin/env python3
"""Power-loss harness: cuts the power under a ContainerFS mount and checks what fsync promised.

A store lives on a loop-mounted image (ext4 with and without a journal, XFS, btrfs). A workload runs through a mount of it; the
power is cut with FS_IOC_SHUTDOWN without flushing the log (what `xfs_io -x -c 'shutdown'` does),
which loses whatever was not made durable, as a power cut would. btrfs refuses that ioctl: its image
is a file on a second ext4 image, which is shut down instead (`--lower` does the same for all). The
image is then mounted again and every
file is checked against a model of what was synced: a file synced with some content must have it
(or a later one that was written), and never anything that was never written (torn). Each workload
also runs on the image's filesystem directly ("native"), so that the model is known to be right.
Through ContainerFS, the power is cut a second time right after the mount that recovered the store
(with no sync in between), and the files are checked again.

Usage: powerloss.py [--quick] [--filesystems ext4,ext4-nojournal,xfs,btrfs] [--lower] [--random-cuts N] [--seed S]
"""
import argparse
import contextlib
import fcntl
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import zlib

FS_IOC_SHUTDOWN = 0x8004587D  # _IOR('X', 125, __u32)
NOLOGFLUSH = 2
APP = "org.powerloss.app"


# What the mount counts as a large file (`-o large_file`).
LARGE = 64 << 10


def run(*args, **kwargs):
    return subprocess.run(args, check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


class Image:
    """A loop-mounted filesystem image holding a store; mounted through ContainerFS or used natively.

    `lower`: the image is a file on a second loop-mounted ext4 image (the lower disk), and the power
    is cut under it by shutting the lower disk down without flushing its log: what the image's
    filesystem had not flushed (its syncs reach the lower disk as flushes of the image's file) is
    lost, whatever that filesystem is. This cuts btrfs, which refuses FS_IOC_SHUTDOWN, and kills a
    disk for `diskfail.py`."""

    def __init__(self, root, filesystem, binary, native, lower=False):
        self.root, self.filesystem, self.binary, self.native = root, filesystem, binary, native
        self.lower = os.path.join(root, "lower") if lower else None
        self.path = os.path.join(self.lower or root, "image." + filesystem)
        self.disk = os.path.join(root, "disk")
        self.fuse = os.path.join(root, "fuse")
        for directory in (self.disk, self.fuse) + ((self.lower,) if lower else ()):
            os.makedirs(directory, exist_ok=True)
        self.daemon = None
        self.device = None
        self.lower_device = None

    def make(self):
        if self.lower:
            lower_image = os.path.join(self.root, "lower.img")
            with open(lower_image, "wb") as image:
                image.truncate(1 << 30)
            run("mkfs.ext4", "-q", "-F", lower_image)
            self.lower_device = run("losetup", "--find", "--show", lower_image).stdout.strip()
            run("mount", self.lower_device, self.lower)
        with open(self.path, "wb") as image:
            image.truncate(512 << 20)
        mkfs = {"ext4": ["mkfs.ext4", "-q", "-F"], "xfs": ["mkfs.xfs", "-q", "-f"],
                "btrfs": ["mkfs.btrfs", "-q", "-f"],
                # Without a journal, a file's sync carries none of its names: the daemon syncs its
                # directories too (docs/atomic-replace.md, "Durability").
                "ext4-nojournal": ["mkfs.ext4", "-q", "-F", "-O", "^has_journal"]}[self.filesystem]
        run(*mkfs, self.path)
        self.attach()
        if self.native:
            os.makedirs(os.path.join(self.disk, "Documents"))
            return
        bundle = os.path.join(self.root, "bundle", "PowerLoss.app")
        os.makedirs(bundle, exist_ok=True)
        with open(os.path.join(bundle, "Info.plist"), "w") as plist:
            plist.write("<plist/>\n")
        run(self.binary, "install", self.store, bundle, "--id", APP)

    @property
    def store(self):
        return os.path.join(self.disk, "store")

    def attach(self):
        # One loop device for the image's life (or the lower disk's): an automatic one is released
        # after the unmount, at a moment of the kernel's choosing, and the next mount would find it
        # still there.
        if self.device is None:
            self.device = run("losetup", "--find", "--show", self.path).stdout.strip()
        run("mount", self.device, self.disk)

    def start(self):
        """Mounts the store (if not native); returns the directory the workload writes in."""
        if self.native:
            return os.path.join(self.disk, "Documents")
        # Files of 64 KiB count as large: their write-only changes go through a redo log
        # (docs/atomic-replace.md, "Large files"), which the workloads below change.
        self.daemon = subprocess.Popen([self.binary, "mount", "-f", self.store, self.fuse,
                                        "--app", APP, "-o", "large_file=%d" % LARGE],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(200):
            if mounted(self.fuse):
                return os.path.join(self.fuse, "Documents")
            if self.daemon.poll() is not None:
                raise RuntimeError("the daemon did not mount: " + self.daemon.stderr.read().decode())
            time.sleep(0.05)
        raise RuntimeError("the mount did not appear")

    def cut(self, model=None):
        """Cuts the power: the image's filesystem (or the lower disk) stops, and loses what was not
        durable."""
        if model is not None:
            model.cut_at = time.monotonic()
        descriptor = os.open(self.lower or self.disk, os.O_RDONLY)
        try:
            fcntl.ioctl(descriptor, FS_IOC_SHUTDOWN, struct.pack("I", NOLOGFLUSH))
        finally:
            os.close(descriptor)

    def unmount(self):
        """Unmounts the mount, if any: what went wrong, or "" when `fusermount3 -u` worked and the
        daemon exited (a lazy unmount and a kill follow whatever happens)."""
        if self.daemon is None:
            return ""
        problem = ""
        if mounted(self.fuse) and subprocess.run(["fusermount3", "-u", self.fuse], stderr=subprocess.PIPE).returncode != 0:
            problem = "fusermount3 -u failed; "
            subprocess.run(["fusermount3", "-u", "-z", self.fuse], stderr=subprocess.DEVNULL)
        try:
            self.daemon.wait(timeout=10)
        except subprocess.TimeoutExpired:
            problem += "the daemon did not exit after the unmount; "
            self.daemon.kill()
            self.daemon.wait()
        self.daemon = None
        return problem

    def stop(self, keep_disk=False):
        """Takes the mounts down whatever state they are in (the image's too, unless `keep_disk`)."""
        self.unmount()
        if not keep_disk and mounted(self.disk):
            umount(self.disk)

    def reopen(self):
        """Mounts the image again after a cut: the directory where the workload's files now are."""
        if self.lower:
            # The image's loop device holds its file open on the lower disk, which cannot unmount
            # until it is gone.
            subprocess.run(["losetup", "-d", self.device])
            self.device = None
            umount(self.lower)
            run("mount", self.lower_device, self.lower)
        try:
            self.attach()
        except subprocess.CalledProcessError as error:
            raise RuntimeError("the image does not mount after the cut: " + error.stderr.strip())
        if self.native:
            return os.path.join(self.disk, "Documents")
        return os.path.join(self.disk, "store", "containers", APP, "Documents")

    def serves(self, model):
        """After a cut: the next mount serves every file as the disk has it, a clean unmount follows,
        and `containerfs check` is clean then. Returns what went wrong, or ""."""
        if self.native:
            return ""
        backing = os.path.join(self.disk, "store", "containers", APP, "Documents")
        try:
            served = self.start()
            for name in model.synced:
                on_disk, through_mount = (read(os.path.join(place, name)) for place in (backing, served))
                if on_disk != through_mount:
                    return "%s: the mount serves %r, the disk has %r" % (name, through_mount, on_disk)
        finally:
            self.stop(keep_disk=True)
        result = subprocess.run([self.binary, "check", self.store],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return "" if result.returncode == 0 else "check: " + result.stdout.strip()

    def remove(self):
        self.stop()
        if self.device:
            subprocess.run(["losetup", "-d", self.device])
        if self.lower:
            if mounted(self.lower):
                umount(self.lower)
            if self.lower_device:
                subprocess.run(["losetup", "-d", self.lower_device])
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.root, "lower.img"))
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


def umount(path):
    """Unmounts `path`; a filesystem just shut down may still be busy for a moment."""
    for _ in range(50):
        if subprocess.run(["umount", path], stderr=subprocess.PIPE).returncode == 0:
            return
        time.sleep(0.1)
    raise RuntimeError("cannot unmount %s: %s" % (path, subprocess.run(
        ["umount", path], stderr=subprocess.PIPE, text=True).stderr.strip()))


class Model:
    """What was written and what was synced, per name (None: the name must not exist)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.written = {}   # name -> every content written (None for a removal)
        self.synced = {}    # name -> [(index in written[name], when its sync returned)]
        self.cut_at = None  # when the cut began: a sync returning later raced with it
        self.appended = set()  # names only ever appended to: shared live, so a disk's rules hold

    def wrote(self, name, content):
        with self.lock:
            self.written.setdefault(name, []).append(content)

    def sync(self, name):
        with self.lock:
            self.synced.setdefault(name, []).append((len(self.written[name]) - 1, time.monotonic()))

    def check_after_cut(self, image):
        """`check` of what a program finds after the cut: the files through the next mount, which
        first recovers the store (a version published without waiting for its data goes back to
        its previous version unless it reads as its record says; docs/atomic-replace.md)."""
        directory = image.reopen()
        if image.native:
            return self.check(directory)
        self.before_recovery = listing(image.store)
        try:
            return self.check(image.start())
        finally:
            image.stop(keep_disk=True)

    def check(self, directory):
        """(checked, lost, torn) with the names of the bad ones."""
        checked, lost, torn = 0, [], []
        for name, syncs in self.synced.items():
            promised = [index for index, when in syncs if self.cut_at is None or when < self.cut_at]
            if not promised:
                continue
            index = promised[-1]
            checked += 1
            found = read(os.path.join(directory, name))
            versions = self.written[name]
            if name in self.appended and isinstance(found, bytes) and found.startswith(versions[index]) \
                    and len(found) <= max(len(v) for v in versions[index:]):
                # Appends not yet synced may be partly there, or zeros, as on a disk (ext4 shows the
                # same): a file shared live keeps a disk's rules (docs/atomic-replace.md).
                continue
            if found not in versions:
                torn.append((name, "%s; the version synced last was the %dth of %d" % (
                    describe(found, versions), index + 1, len(versions))))
            elif max(i for i, version in enumerate(versions) if version == found) < index:
                lost.append((name, found[:40] if isinstance(found, bytes) else found))
        return checked, lost, torn


def listing(store):
    """The store's Documents and shadow directories as a cut left them, before a mount recovers
    them: what a failing cut prints, to tell which step left what."""
    lines = []
    places = [os.path.join(store, "containers", APP, "Documents")]
    shadows = os.path.join(store, "work", "shadows")
    places += [os.path.join(shadows, name) for name in sorted(os.listdir(shadows))] if os.path.isdir(shadows) else []
    for place in places:
        lines.append(os.path.relpath(place, store) + ":")
        for name in sorted(os.listdir(place)):
            path = os.path.join(place, name)
            attributes = os.lstat(path)
            start = read(path)[:12] if os.path.isfile(path) else b""
            lines.append("  %-40s ino %-6d links %d size %-7d %r" % (name, attributes.st_ino, attributes.st_nlink,
                                                                 attributes.st_size, start))
    return "\n".join(lines)


def describe(found, versions):
    """A short account of content that is no version written: its length and where it departs."""
    if not isinstance(found, bytes):
        return found
    closest = max((v for v in versions if isinstance(v, bytes)), key=lambda v: len(os.path.commonprefix([v, found])),
                  default=b"")
    common = len(os.path.commonprefix([closest, found]))
    return "%d bytes, like a version of %d bytes for %d, then %r" % (len(found), len(closest), common,
                                                                    found[common:common + 24])


def mounted(path):
    """Whether something is mounted on `path` (a filesystem shut down fails the stat ismount makes)."""
    path = os.path.realpath(path)
    with open("/proc/self/mounts") as mounts:
        return any(line.split()[1] == path for line in mounts)


def read(path):
    """A file's content, "dir" for a directory, None when there is nothing."""
    try:
        with open(path, "rb") as file:
            return file.read()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        return "dir"


def fsync_path(path):
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def unsynced(_descriptor):
    """A close without a sync (`write_file`'s `sync`)."""


def write_file(path, content, flags, sync=os.fsync):
    descriptor = os.open(path, flags, 0o644)
    try:
        os.write(descriptor, content)
        sync(descriptor)
    finally:
        os.close(descriptor)


def steps(directory, model):
    """The workload of chosen cuts: each step changes something and syncs it; the cut comes right
    after the step's sync returned. Yields each step's description."""
    d = lambda name: os.path.join(directory, name)

    def made(name, content, flags):
        """A new file written and synced, and its directory synced."""
        model.wrote(name, content)
        write_file(d(name), content, flags)
        fsync_path(directory)
        model.sync(name)

    def changed(name, content, flags, becomes=None, sync=os.fsync):
        """`content` written through `flags` and synced; the file then holds `becomes`."""
        model.wrote(name, becomes if becomes is not None else content)
        write_file(d(name), content, flags, sync=sync)
        model.sync(name)

    made("new", b"new file v1", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    yield "a new file, fsync, fsync of its directory"

    # ext4 and XFS keep a new file's name with its fsync: so must the mount.
    model.wrote("unlisted", b"a new file whose directory was not synced")
    write_file(d("unlisted"), b"a new file whose directory was not synced", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    model.sync("unlisted")
    yield "a new file, fsync (its directory not synced)"

    changed("new", b"rewrite v2", os.O_WRONLY | os.O_TRUNC)
    yield "an O_TRUNC rewrite, fsync"

    changed("new", b"rewrite v3 by fdatasync", os.O_WRONLY | os.O_TRUNC, sync=os.fdatasync)
    yield "an O_TRUNC rewrite, fdatasync"

    # A close without a sync publishes too, and another file's sync then commits the journal with
    # that publish in it: the file must be a version, never empty or torn (native may tear here).
    model.wrote("new", b"rewrite v4, closed without a sync")
    write_file(d("new"), b"rewrite v4, closed without a sync", os.O_WRONLY | os.O_TRUNC, sync=unsynced)
    made("other", b"another file", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    yield "an O_TRUNC rewrite closed without a sync, then another file's fsync"

    # Over 1 MiB and written in order, a file is published with a record too (its writes gave the
    # checksum), where it waited for its data before.
    made("big", b"big v1", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    big = bytes(range(256)) * (3 << 12)
    model.wrote("big", big)
    write_file(d("big"), big, os.O_WRONLY | os.O_TRUNC, sync=unsynced)
    changed("other", b"another file, after the big one", os.O_WRONLY | os.O_TRUNC)
    yield "a 3 MiB O_TRUNC rewrite closed without a sync, then another file's fsync"

    model.wrote("new", b"REWRITE v4, closed without a sync")
    write_file(d("new"), b"REWRITE", os.O_WRONLY, sync=unsynced)
    model.wrote("other", b"another file, v2")
    write_file(d("other"), b"another file, v2", os.O_WRONLY | os.O_TRUNC)
    model.sync("other")
    yield "a write-only change closed without a sync, then another file's fsync"

    # A close without a sync leaves a record of its publish until the data is written; a change in
    # place right after (a database opening the file it just wrote) must not meet it after a cut.
    model.wrote("reopened", b"written, closed without a sync")
    write_file(d("reopened"), b"written, closed without a sync", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, sync=unsynced)
    model.wrote("reopened", b"CHANGED, closed without a sync")
    write_file(d("reopened"), b"CHANGED", os.O_RDWR, sync=os.fdatasync)
    model.sync("reopened")
    yield "a new file closed without a sync, changed in place at once, fdatasync"

    made("patched", b"0123456789", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    changed("patched", b"ABC", os.O_WRONLY, becomes=b"ABC3456789")
    yield "a write-only change without truncation, fsync"

    large = bytes(range(256)) * (LARGE // 128)
    made("large", large, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    changed("large", b"LARGE", os.O_WRONLY, becomes=b"LARGE" + large[5:])
    yield "a write-only change of a large file (a redo log), fsync"

    made("db", b"page one", os.O_RDWR | os.O_CREAT)
    changed("db", b"PAGE", os.O_RDWR, becomes=b"PAGE one")
    yield "a read-write change in place, fsync"

    made("log", b"line 1\n", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    changed("log", b"line 2\n", os.O_WRONLY | os.O_APPEND, becomes=b"line 1\nline 2\n", sync=os.fdatasync)
    yield "an append, fdatasync"

    made("saved", b"editor v1", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    write_file(d(".saved.swp"), b"editor v2", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    model.wrote("saved", b"editor v2")
    os.rename(d(".saved.swp"), d("saved"))
    fsync_path(directory)
    model.sync("saved")
    yield "an editor's save: temporary file, fsync, rename over, fsync of the directory"

    def save_unsynced(content):
        """As sed -i and many scripts save, without any sync: a temporary file, renamed over."""
        write_file(d(".saved.new"), content, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, sync=unsynced)
        model.wrote("saved", content)
        os.rename(d(".saved.new"), d("saved"))

    save_unsynced(b"editor v3, saved without a sync")
    model.wrote("other", b"another file, v3")
    write_file(d("other"), b"another file, v3", os.O_WRONLY | os.O_TRUNC)
    model.sync("other")
    yield "a save by rename without a sync, then another file's fsync"

    # Two in a row: the second replaces the first while the first's record still waits.
    save_unsynced(b"editor v4, saved without a sync")
    save_unsynced(b"editor v5, right after v4")
    model.wrote("other", b"another file, v4")
    write_file(d("other"), b"another file, v4", os.O_WRONLY | os.O_TRUNC)
    model.sync("other")
    yield "two saves by rename without a sync in a row, then another file's fsync"

    os.mkdir(d("folder"))
    model.wrote("folder", "dir")
    fsync_path(directory)
    model.sync("folder")
    yield "mkdir, fsync of the directory"

    os.link(d("log"), d("log.link"))
    model.wrote("log.link", b"line 1\nline 2\n")
    fsync_path(directory)
    model.sync("log.link")
    yield "link, fsync of the directory"

    os.rename(d("patched"), d("folder/patched"))
    model.wrote("patched", None)
    model.wrote("folder/patched", b"ABC3456789")
    fsync_path(directory)
    fsync_path(d("folder"))
    model.sync("patched")
    model.sync("folder/patched")
    yield "rename into a folder, fsync of both directories"

    os.unlink(d("db"))
    model.wrote("db", None)
    fsync_path(directory)
    model.sync("db")
    yield "unlink, fsync of the directory"

    # sync(2), as sync(1) without arguments does. (syncfs(2) of a FUSE mount reaches the daemon only
    # for virtiofs: the kernel never sends FUSE_SYNCFS through /dev/fuse; docs/atomic-replace.md.)
    model.wrote("synced-by-sync", b"sync")
    write_file(d("synced-by-sync"), b"sync", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, sync=lambda _: None)
    os.sync()
    model.sync("synced-by-sync")
    yield "a new file, sync"


def concurrent(directory, model, stop, seed):
    """Writers of every kind at once, until `stop`; each records what it synced."""
    def writer(number):
        rng = random.Random(seed * 100 + number)
        name = "c%d" % number
        path = os.path.join(directory, name)
        version = 0
        while not stop.is_set():
            version += 1
            content = (b"%s v%d " % (name.encode(), version)) * rng.randint(1, 3000)
            kind = number % 4
            try:
                if kind == 0:  # rewrites, every other one closed without a sync
                    model.wrote(name, content)
                    synced = version % 2 == 1
                    write_file(path, content, os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                               sync=os.fsync if synced else unsynced)
                    if version == 1:
                        fsync_path(directory)
                    if not synced:
                        continue
                elif kind == 1:  # editor saves
                    temporary = path + ".tmp"
                    write_file(temporary, content, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                    model.wrote(name, content)
                    os.rename(temporary, path)
                    fsync_path(directory)
                elif kind == 3:  # changes to parts of a large file, synced every other time
                    if version == 1:
                        content = bytes(rng.getrandbits(8) for _ in range(2 * LARGE))
                        model.wrote(name, content)
                        write_file(path, content, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                        fsync_path(directory)
                    else:
                        changed = bytearray(model.written[name][-1])
                        descriptor = os.open(path, os.O_WRONLY)
                        try:
                            for _ in range(3):
                                offset = rng.randrange(0, len(changed) + 100)
                                piece = b"%s v%d" % (name.encode(), version) * rng.randint(1, 200)
                                os.pwrite(descriptor, piece, offset)
                                changed[len(changed):offset] = bytes(max(0, offset - len(changed)))
                                changed[offset:offset + len(piece)] = piece
                            model.wrote(name, bytes(changed))
                            if version % 2 == 0:
                                os.fsync(descriptor)
                        finally:
                            os.close(descriptor)
                        if version % 2:
                            continue
                else:  # appends
                    model.appended.add(name)
                    previous = model.written.get(name, [b""])[-1]
                    model.wrote(name, previous + content[:64])
                    write_file(path, content[:64], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
                    if version == 1:
                        fsync_path(directory)
                model.sync(name)
            except OSError:
                return  # the power went
    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    return threads


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true",
                        help="ext4 and btrfs only, nine chosen cuts, a restore and two random ones")
    parser.add_argument("--filesystems", default="ext4,ext4-nojournal,xfs,btrfs")
    parser.add_argument("--lower", action="store_true",
                        help="cut the power under ext4 and XFS too by shutting down a disk their image is a file on")
    parser.add_argument("--random-cuts", type=int, default=10)
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    parser.add_argument("--binary", default=None)
    parser.add_argument("--native-only", action="store_true", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if os.geteuid() != 0:
        print("powerloss: needs root (loop devices, mounts, FS_IOC_SHUTDOWN)")
        return 2
    binary = arguments.binary or os.path.join(os.path.dirname(__file__), "..", ".build", "debug", "containerfs")
    filesystems = ["ext4", "btrfs"] if arguments.quick else arguments.filesystems.split(",")
    random_cuts = 2 if arguments.quick else arguments.random_cuts
    print("powerloss: seed %d" % arguments.seed)
    # A new file, a rewrite, one closed without a sync, write-only changes, an append, an editor's
    # save, and saves by rename without a sync (one, then two in a row).
    chosen = [2, 3, 5, 7, 9, 12, 13, 14, 15] if arguments.quick else None
    totals = {"cuts": 0, "checked": 0, "lost": 0, "torn": 0, "unclean": 0}
    failed = False
    root = tempfile.mkdtemp(prefix="containerfs-powerloss-")
    try:
        for filesystem in filesystems:
            tool = "mkfs." + filesystem.split("-")[0]
            if shutil.which(tool) is None:
                print("powerloss: skipping %s: %s is missing (scripts/powerloss.sh installs it)" % (filesystem, tool))
                continue
            # btrfs refuses FS_IOC_SHUTDOWN: its power is cut under the disk its image is on.
            lower = arguments.lower or filesystem == "btrfs"
            for native in ((True,) if arguments.native_only else (True, False)):
                label = "%s %s%s" % (filesystem, "native" if native else "containerfs", " (lower)" if lower else "")
                step_count = len(list(steps(tempfile.mkdtemp(dir=root), Model())))
                for point in chosen or range(1, step_count + 1):
                    def chosen_cut(image, model, directory, point=point):
                        done = ""
                        for number, description in enumerate(steps(directory, model), start=1):
                            done = description
                            if number == point:
                                break
                        image.cut(model)
                        return "after: " + done
                    failed |= one_cut(root, filesystem, binary, native, label, totals, chosen_cut, lower)
                if not native:
                    failed |= restore_cut(root, filesystem, binary, label, totals, lower)
                for journal in ("WAL",) if arguments.quick else ("WAL", "DELETE"):
                    failed |= sqlite_cut(root, filesystem, binary, native, label, totals, lower, journal,
                                         arguments.seed + zlib.crc32((filesystem + journal).encode()) % 1000)
                if not arguments.quick:
                    failed |= lmdb_cut(root, filesystem, binary, native, label, totals, lower,
                                       arguments.seed + zlib.crc32((filesystem + "lmdb").encode()) % 1000)
                rng = random.Random(arguments.seed + zlib.crc32(filesystem.encode()) % 1000)
                for cut in range(random_cuts):
                    def random_cut(image, model, directory, cut=cut):
                        stop = threading.Event()
                        threads = concurrent(directory, model, stop, arguments.seed + cut)
                        delay = rng.uniform(0.2, 1.5)
                        time.sleep(delay)
                        image.cut(model)
                        stop.set()
                        for thread in threads:
                            thread.join()
                        return "random cut %d at %.2f s" % (cut + 1, delay)
                    failed |= one_cut(root, filesystem, binary, native, label, totals, random_cut, lower)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("powerloss: cuts %(cuts)d, files checked %(checked)d, lost %(lost)d, torn %(torn)d, "
          "unclean checks %(unclean)d" % totals)
    return 1 if failed else 0


def one_cut(root, filesystem, binary, native, label, totals, workload, lower):
    """Makes an image, runs `workload` on it until it cuts the power, and checks what is left."""
    image = Image(tempfile.mkdtemp(dir=root), filesystem, binary, native, lower)
    try:
        image.make()
        model = Model()
        what = workload(image, model, image.start())
        image.stop()
        checked, lost, torn = model.check_after_cut(image)
        if native and not os.environ.get("POWERLOSS_NATIVE_TORN"):
            # POSIX lets a native file show garbage where writes were not synced (a rewrite that
            # was truncated, then cut off): only the synced state counts there.
            torn = []
        unclean = image.serves(model)
        if not native and not (lost or torn or unclean):
            # The mount that served the files recovered the store first (logs applied, new files
            # emptied, shadows removed), with no sync after: a second cut now must find the same.
            image.cut()
            image.stop()
            checked, lost, torn = model.check_after_cut(image)
            if lost or torn:
                what += ", and again after the mount that recovered"
            unclean = image.serves(model)
        failed = report(totals, label, what, checked, lost, torn, unclean)
        if failed and getattr(model, "before_recovery", None):
            print("  as the cut left the store, before the next mount recovered it:")
            print(textwrap.indent(model.before_recovery, "  "))
        return failed
    finally:
        image.remove()


def restore_cut(root, filesystem, binary, label, totals, lower):
    """`containerfs restore` (no mount: it refuses a mounted app), and `containerfs uninstall` of
    another app, the power cut as they return: every file the backup holds must be there, and the
    other app gone (a bare filesystem has neither to compare with)."""
    image = Image(tempfile.mkdtemp(dir=root), filesystem, binary, False, lower)
    try:
        image.make()
        documents = os.path.join(image.store, "containers", APP, "Documents")
        backed_up = {"r%d" % n: b"backed up %d " % n * (n + 1) * 50 for n in range(20)}
        for name, content in backed_up.items():
            with open(os.path.join(documents, name), "wb") as file:
                file.write(content)
        archive = os.path.join(image.root, "backup.cfsbackup")
        run(binary, "backup", image.store, APP, archive)
        for name in backed_up:
            os.unlink(os.path.join(documents, name))
        os.sync()
        other = os.path.join(image.root, "bundle", "Other.app")
        os.makedirs(other)
        with open(os.path.join(other, "Info.plist"), "w") as plist:
            plist.write("<plist/>\n")
        run(binary, "install", image.store, other, "--id", "org.powerloss.other")
        run(binary, "restore", image.store, APP, archive)
        run(binary, "uninstall", image.store, "org.powerloss.other", "--force")
        image.cut()
        image.stop()
        restored = image.reopen()
        found = {name: read(os.path.join(restored, name)) for name in backed_up}
        lost = [(name, found[name]) for name in backed_up if found[name] is None]
        torn = [(name, describe(found[name], [content])) for name, content in backed_up.items()
                if found[name] is not None and found[name] != content]
        listed = subprocess.run([binary, "list", image.store], stdout=subprocess.PIPE, text=True).stdout
        check = subprocess.run([binary, "check", image.store], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        unclean = ("the uninstalled app is back; " if "org.powerloss.other" in listed else "") + \
            ("" if check.returncode == 0 else "check: " + check.stdout.strip())
        return report(totals, label, "after: containerfs restore from a backup, uninstall of another app",
                      len(backed_up), lost, torn, unclean)
    finally:
        image.remove()


def database_cut(root, filesystem, binary, native, label, totals, lower, seed, name, start, verify):
    """A database's writer commits one item per transaction in Documents until the power is cut at
    a random moment. `start(directory, committed, stop)` starts it, appending (item, when its commit
    returned) to `committed` until `stop`, and returns what waits for it to end; `verify(directory,
    promised)` returns (lost, torn) from what the disk has (through a mount, for ContainerFS), where
    `promised` is the last item whose commit returned before the cut began."""
    image = Image(tempfile.mkdtemp(dir=root), filesystem, binary, native, lower)
    try:
        image.make()
        committed = [(0, 0.0)]
        stop = threading.Event()
        finish = start(image.start(), committed, stop)
        delay = random.Random(seed).uniform(0.3, 1.5)
        time.sleep(delay)
        cut_at = time.monotonic()
        image.cut()
        stop.set()
        finish()
        # A commit that returned after the cut began raced with it (SQLite does not fail a commit
        # whose directory it cannot open to sync): only those before count.
        promised = max(item for item, when in committed if when < cut_at)
        image.stop()
        place = image.reopen()
        if not native:
            image.stop(keep_disk=True)
            place = image.start()  # through the mount, as a program would open it after the cut
        lost, torn = verify(place, promised)
        unclean = ""
        if not native:
            image.stop(keep_disk=True)
            result = subprocess.run([binary, "check", image.store], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            unclean = "" if result.returncode == 0 else "check: " + result.stdout.strip()
        what = "%s, an item a transaction, cut at %.2f s (%d committed)" % (name, delay, promised)
        return report(totals, label, what, 1, lost, torn, unclean)
    finally:
        image.remove()


def sqlite_cut(root, filesystem, binary, native, label, totals, lower, journal, seed):
    """SQLite (the system's library, through Python) commits a row per transaction (`synchronous`
    FULL for WAL, EXTRA for a rollback journal) while a second connection reads: the database must
    pass its integrity check and hold every row whose commit returned."""
    import sqlite3

    def start(directory, committed, stop):
        path = os.path.join(directory, "app.db")

        # SQLite keeps a closed connection's descriptor while another of the process holds locks
        # on the file: each closes its own, so that the disk can be unmounted after the cut.
        def writer():
            connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            try:
                connection.execute("PRAGMA journal_mode=%s" % journal)
                # A rollback journal's commit is its deletion, which only EXTRA syncs (the
                # directory after the unlink): with FULL, SQLite may roll the last transaction back
                # after a cut, natively too. WAL commits with FULL's sync of the log.
                connection.execute("PRAGMA synchronous=%s" % ("FULL" if journal == "WAL" else "EXTRA"))
                connection.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v TEXT)")
                row = 0
                while not stop.is_set():
                    row += 1
                    connection.execute("BEGIN")
                    connection.execute("INSERT INTO t VALUES (?, ?)", (row, "row %d " % row * 20))
                    connection.execute("COMMIT")
                    committed.append((row, time.monotonic()))
            except sqlite3.Error:
                pass  # the power went
            finally:
                with contextlib.suppress(sqlite3.Error):
                    connection.close()

        def reader():
            while not stop.is_set():
                connection = None
                try:
                    connection = sqlite3.connect("file:%s?mode=ro" % path, uri=True)
                    connection.execute("SELECT count(*) FROM t").fetchone()
                except sqlite3.Error:
                    time.sleep(0.01)
                finally:
                    if connection is not None:
                        with contextlib.suppress(sqlite3.Error):
                            connection.close()

        threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
        for thread in threads:
            thread.start()
        return lambda: [thread.join() for thread in threads]

    def verify(directory, promised):
        lost, torn = [], []
        connection = sqlite3.connect(os.path.join(directory, "app.db"), isolation_level=None)
        try:
            integrity = connection.execute("PRAGMA integrity_check").fetchone()[0]
            count, highest = connection.execute("SELECT count(*), coalesce(max(id), 0) FROM t").fetchone()
            if integrity != "ok" or count != highest:
                torn.append(("app.db", "integrity %s, %d rows, highest %d" % (integrity, count, highest)))
            if highest < promised:
                lost.append(("app.db", "%d rows committed, %d there" % (promised, highest)))
        except sqlite3.Error as error:
            torn.append(("app.db", str(error)))
        finally:
            connection.close()
        return lost, torn

    return database_cut(root, filesystem, binary, native, label, totals, lower, seed, "sqlite3 " + journal, start, verify)


LMDB_WRITER = """
import lmdb, sys
env = lmdb.open(sys.argv[1], map_size=64 << 20)
row = 0
while True:
    row += 1
    with env.begin(write=True) as txn:
        txn.put(b'%08d' % row, b'row %d ' % row * 20)
    print(row, flush=True)
"""

LMDB_CHECK = """
import lmdb, sys
env = lmdb.open(sys.argv[1], map_size=64 << 20)
with env.begin() as txn:
    keys = [int(key) for key, _ in txn.cursor()]
print(len(keys), max(keys, default=0))
"""


def lmdb_cut(root, filesystem, binary, native, label, totals, lower, seed):
    """LMDB (Debian's python3-lmdb, in a process of its own) commits a key per transaction: it must
    open again and hold every key whose commit returned, and none missing before it."""
    python = "/usr/bin/python3"
    if subprocess.run([python, "-c", "import lmdb"], stderr=subprocess.DEVNULL).returncode != 0:
        print("%-26s lmdb: skipped: %s has no lmdb module (python3-lmdb; scripts/setup.sh installs it)" % (label, python))
        return False

    def start(directory, committed, stop):
        database = os.path.join(directory, "lmdb")
        os.mkdir(database)
        writer = subprocess.Popen([python, "-c", LMDB_WRITER, database], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True)

        def follow():
            for line in writer.stdout:
                committed.append((int(line), time.monotonic()))
        follower = threading.Thread(target=follow)
        follower.start()

        def finish():
            stop.wait()
            writer.kill()
            writer.wait()
            follower.join()
        return finish

    def verify(directory, promised):
        check = subprocess.run([python, "-c", LMDB_CHECK, os.path.join(directory, "lmdb")],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if check.returncode != 0:
            return [], [("lmdb", check.stdout.strip()[-200:])]
        count, highest = map(int, check.stdout.split())
        torn = [("lmdb", "%d keys, the highest %d" % (count, highest))] if count != highest else []
        lost = [("lmdb", "%d committed, %d there" % (promised, highest))] if highest < promised else []
        return lost, torn

    return database_cut(root, filesystem, binary, native, label, totals, lower, seed, "lmdb", start, verify)


def report(totals, label, what, checked, lost, torn, unclean):
    totals["cuts"] += 1
    totals["checked"] += checked
    totals["lost"] += len(lost)
    totals["torn"] += len(torn)
    totals["unclean"] += 1 if unclean else 0
    bad = lost or torn or unclean
    print("%-26s %-80s checked %3d lost %d torn %d%s" % (label, what, checked, len(lost), len(torn),
                                                          "" if not bad else "  FAILED %s %s %s" % (lost, torn, unclean)))
    return bool(bad)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    sys.exit(main())
