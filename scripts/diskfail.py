#!/usr/bin/env python3
"""Disk-failure harness: the store's disk dies under a mount, and every change that can no longer
be made durable is reported to its writer and leaves the previous version.

The store lives on an image (ext4, XFS or btrfs) that is itself a file on a second loop-mounted ext4
image, the lower disk (`powerloss.Image`). Shutting the lower filesystem down (FS_IOC_SHUTDOWN)
kills the store's disk: every later write or uncached read of it fails with EIO, as a disk that
stops answering does. (A device-mapper error target would do the same; this kernel has none.)

Files are written and synced, the disk dies, then each kind of change is made: rewrites and
changes closed with and without a sync, a large file's logged change, new files, an editor's save
(which stops when its fsync fails), a directory's sync. Each runs on the image's filesystem
directly too ("native"): its fsyncs must fail the same way. Through ContainerFS a close without a
sync either reports the error (native's close cannot: its writeback fails later, unseen) and the
file reads as its previous version, or, for a small file published with a record before its data is
written, succeeds as native's does and reads as written until the disk comes back (a large file's
logged change that keeps its size succeeds too, and its commit's failed sync then leaves the previous
version); once a background write has failed, closes wait for their data and report. The daemon must keep answering and unmount
cleanly. Then the
disk comes back: every file has its synced content on both, the next mount serves it, and
`containerfs check` is clean after that mount.

Usage: diskfail.py [--filesystems ext4,xfs,btrfs] [--binary PATH]
"""
import argparse
import contextlib
import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile

from powerloss import APP, LARGE, Image, read

# Larger than what btrfs keeps inline in its metadata (2 KiB), whose close has no data write that
# could fail: the next sync reports the failure there.
V1 = {name: (name + " v1 ").encode() * 1000 for name in ("rewrite", "synced", "change", "save")}
V2 = b"v2 " * 3000
V1["large"] = b"L" * (4 * LARGE)


def attempt(*calls):
    """Runs the calls in order, stopping at the first error: which call failed and with what."""
    for label, call in calls:
        try:
            call()
        except OSError as error:
            return "%s: %s" % (label, errno.errorcode.get(error.errno, error.errno))
    return None


def change(path, content, flags, sync, at=None):
    """Opens, writes, syncs (if `sync`) and closes: the first error."""
    try:
        descriptor = os.open(path, flags, 0o644)
    except OSError as error:
        return "open: %s" % errno.errorcode.get(error.errno, error.errno)
    try:
        problem = attempt(("write", lambda: os.pwrite(descriptor, content, at) if at is not None
                           else os.write(descriptor, content)),
                          *((("fsync", lambda: os.fsync(descriptor)),) if sync else ()))
    finally:
        closed = attempt(("close", lambda: os.close(descriptor)))
    return problem or closed


def save(directory, name, content):
    """An editor's save: a temporary file written and synced, renamed over the file, the directory
    synced; an error stops it, as editors do."""
    temporary = os.path.join(directory, "." + name + ".swp")
    problem = change(temporary, content, os.O_WRONLY | os.O_CREAT | os.O_EXCL, sync=True)
    if problem:
        return problem
    return attempt(("rename", lambda: os.rename(temporary, os.path.join(directory, name))),
                   ("fsync of the directory", lambda: fsync_directory(directory)))


def read_or_error(path):
    try:
        return read(path)
    except OSError as error:
        return errno.errorcode.get(error.errno, str(error.errno))


def fsync_directory(path):
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def make_directory(directory):
    return attempt(("mkdir", lambda: os.mkdir(os.path.join(directory, "folder"))),
                   ("fsync of the directory", lambda: fsync_directory(directory)))


# Each step after the disk died: (name, description, what it does, whether a sync in it must fail on
# native too, what the file reads as through ContainerFS meanwhile, and what it may read as instead
# when its close published it with a record and reported nothing).
STEPS = [
    ("rewrite", "an O_TRUNC rewrite closed without a sync",
     lambda d: change(os.path.join(d, "rewrite"), V2, os.O_WRONLY | os.O_TRUNC, sync=False), False, V1["rewrite"], V2),
    ("synced", "an O_TRUNC rewrite, fsync",
     lambda d: change(os.path.join(d, "synced"), V2, os.O_WRONLY | os.O_TRUNC, sync=True), True, V1["synced"], None),
    ("change", "a change of one byte closed without a sync",
     lambda d: change(os.path.join(d, "change"), b"X", os.O_WRONLY, sync=False, at=7), False, V1["change"],
     V1["change"][:7] + b"X" + V1["change"][8:]),
    # Its close may succeed once the log's commit record is written (whether it does depends on
    # what the page cache still holds): the commit's sync then fails, and the previous version stays.
    ("large", "a large file's logged change closed without a sync",
     lambda d: change(os.path.join(d, "large"), b"X", os.O_WRONLY, sync=False, at=LARGE), False, V1["large"],
     V1["large"]),
    ("new", "a new file closed without a sync",
     lambda d: change(os.path.join(d, "new"), V2, os.O_WRONLY | os.O_CREAT | os.O_EXCL, sync=False), False, b"", V2),
    ("new-synced", "a new file, fsync",
     lambda d: change(os.path.join(d, "new-synced"), V2, os.O_WRONLY | os.O_CREAT | os.O_EXCL, sync=True), True, b"", None),
    ("save", "an editor's save (temporary file, fsync, rename over)",
     lambda d: save(d, "save", V2), True, V1["save"], None),
    ("folder", "mkdir, fsync of its directory", make_directory, True, "dir", None),
]


def scenario(binary, root, filesystem, native):
    """One run: returns the problems found (empty when every check held)."""
    label = "%s %s" % (filesystem, "native" if native else "containerfs")
    problems = []
    image = Image(tempfile.mkdtemp(dir=root), filesystem, binary, native, lower=True)
    try:
        image.make()
        backing = os.path.join(image.store, "containers", APP, "Documents")
        directory = image.start()
        for name, content in V1.items():
            if change(os.path.join(directory, name), content, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, sync=True):
                raise RuntimeError("%s: the first version could not be written" % label)
        fsync_directory(directory)
        os.sync()

        image.cut()  # the lower disk: the store's disk dies
        for name, description, step, sync_fails, previous, recorded in STEPS:
            problem = step(directory)
            expected = sync_fails or not native
            verdict = []
            found = None if native else read_or_error(os.path.join(directory, name))
            if not native and not problem and recorded is not None and found == recorded:
                # Published with a record, as a local disk's close would: the next mount checks it.
                print("%-18s %-58s %-30s %s" % (label, description, "no error (a record)", "ok"))
                continue
            if expected and not problem:
                verdict.append("no error reported")
            # XFS and btrfs stop at their first failed write and then refuse reads: so does the
            # mount then, and there is no version to see.
            if found == "EIO" and read_or_error(os.path.join(backing, name)) == "EIO":
                found = previous
            if not native and found != previous:
                verdict.append("reads %r, not the previous version" % (found[:24] if isinstance(found, bytes) else found))
            problems += ["%s, %s: %s" % (label, description, v) for v in verdict]
            print("%-18s %-58s %-30s %s" % (label, description, problem or "no error",
                                             "FAILED: " + "; ".join(verdict) if verdict else "ok"))
        with contextlib.suppress(OSError):
            os.listdir(directory)
        problem = image.unmount()
        if problem:
            problems.append("%s: after the disk died: %s" % (label, problem))

        image.stop()
        served = image.reopen()  # the disk is back
        if not native:
            served = image.start()
        for name, content in V1.items():
            if read(os.path.join(served, name)) != content:
                problems.append("%s: %s lost its synced version after the disk came back" % (label, name))
        for name in ("new", "new-synced"):
            if read(os.path.join(served, name)) not in (None, b""):
                problems.append("%s: %s has content that was never synced" % (label, name))
        if not native:
            problem = image.unmount()
            if problem:
                problems.append("%s: after the disk came back: %s" % (label, problem))
            check = subprocess.run([binary, "check", image.store], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if check.returncode != 0:
                problems.append("%s: check after the disk came back: %s" % (label, check.stdout.strip()))
        print("%-18s %-58s %s" % (label, "the disk came back: synced versions, a clean check",
                                  "FAILED" if any(p.startswith(label + ":") for p in problems) else "ok"))
    finally:
        image.remove()
    return problems


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--filesystems", default="ext4,xfs,btrfs")
    parser.add_argument("--binary", default=None)
    arguments = parser.parse_args()
    if os.geteuid() != 0:
        print("diskfail: needs root (loop devices, mounts, FS_IOC_SHUTDOWN)")
        return 2
    binary = arguments.binary or os.path.join(os.path.dirname(__file__), "..", ".build", "debug", "containerfs")
    problems, runs = [], 0
    root = tempfile.mkdtemp(prefix="containerfs-diskfail-")
    try:
        for filesystem in arguments.filesystems.split(","):
            if shutil.which("mkfs." + filesystem) is None:
                print("diskfail: skipping %s: mkfs.%s is missing (scripts/setup.sh installs it)" % (filesystem, filesystem))
                continue
            for native in (True, False):
                problems += scenario(binary, root, filesystem, native)
                runs += 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("diskfail: runs %d, steps %d, problems %d" % (runs, runs * len(STEPS), len(problems)))
    for problem in problems:
        print("  " + problem)
    return 1 if problems or runs == 0 else 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    sys.exit(main())
