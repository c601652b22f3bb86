#!/usr/bin/env python3
"""Fault sweep: one system call of the daemon fails, once, during one operation; what the daemon
said about it must still hold after it crashes.

A store lives on a loop-mounted ext4 image (`powerloss.Image`). For each kind of operation (a
rewrite with and without fsync, a new file with and without fsync, a file created and closed
unwritten, a change in place synced, a change without truncation, an append with and without
fsync, a truncation, an editor's save with and without fsync (and two without in a row), a large
file's logged change with and without fsync, a rename, a hard link, a copy the daemon makes
(copy_file_range), an allocation, a change through a shared mapping, a rewrite then an unlink, two
processes rewriting it at once; and on names and directories: an unlink, a mkdir, an rmdir, a new directory with a file
in it, with and without fsyncs, a directory's rename, alone and over an empty one, a symbolic link),
each system call the daemon makes for them, and a few positions N, strace makes the
Nth call of that system call in the daemon fail with EIO while the operation runs. A database-like
change follows on the same file, unfaulted (open O_RDWR, pwrite, fsync). Then the daemon is killed
(SIGKILL, a crash: the page cache stays), the store mounted again, and each file checked:
- a follow-up whose fsync returned must be there;
- otherwise an operation that reported success must be there whole, and one that failed must have
  left a whole version, the previous one or the new one; for names and directories, the tree
  under each name the operation touches (both names of a rename) is compared, and a directory's
  follow-up is a new file in it, fsync'd.
Every operation also runs, unfaulted, on a plain directory and on the mount, where it must end with
what the checks expect: the model is known to be right.

With --pairs each operation runs at once with one of the next kind, on another file, under the
same fault: whichever of the two makes the failing call gets the error, and both files are checked.

With --presented a presenter (`containerfs watch`) presents Documents through every operation, so
that each is coordinated with a connected client, and the daemon's sends to it (`sendto`) are
among the calls that fail: a presenter the daemon cannot reach must cost no file its version nor
hang an operation. A watcher that is gone is started again before the next case.

Usage: faultsweep.py [--kinds K,K] [--calls C,C] [--nths 1,2,4,1+] [--no-follow] [--quick] [--pairs] [--presented]

An N with a plus (`1+`) fails that call and every later one while the operation runs: what the
daemon tries again fails again, until the operation has ended.
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

from powerloss import Image, mounted, read

KINDS = {
    "rewrite": "f = os.open(p, os.O_WRONLY | os.O_TRUNC); os.write(f, new); os.close(f)",
    "rewrite-fsync": "f = os.open(p, os.O_WRONLY | os.O_TRUNC); os.write(f, new); os.fsync(f); os.close(f)",
    "create": "f = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644); os.write(f, new); os.close(f)",
    "create-fsync": "f = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644); os.write(f, new); os.fsync(f); os.close(f)",
    "create-unwritten": "f = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644); os.close(f)",
    "in-place-fsync": "f = os.open(p, os.O_RDWR); os.pwrite(f, new, 0); os.fsync(f); os.close(f)",
    "change": "f = os.open(p, os.O_WRONLY); os.pwrite(f, new, 0); os.close(f)",
    "append": "f = os.open(p, os.O_WRONLY | os.O_APPEND); os.write(f, new); os.close(f)",
    "truncate": "os.truncate(p, 5)",
    "save": "t = p + '.tmp'; f = os.open(t, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644); os.write(f, new); "
            "os.fsync(f); os.close(f); os.rename(t, p)",
    # A large file's change without truncation goes through a redo log (`-o large_file`, 64 KiB here).
    "large-change": "f = os.open(p, os.O_WRONLY); os.pwrite(f, new, 0); os.close(f)",
    "large-change-fsync": "f = os.open(p, os.O_WRONLY); os.pwrite(f, new, 0); os.fsync(f); os.close(f)",
    "rename": "os.rename(p, p + '.moved')",
    "link": "os.link(p, p + '.link')",
    # The kernel hands a copy between two files of the mount to the daemon (FUSE_COPY_FILE_RANGE).
    "copy-over": "s = os.open(p + '.source', os.O_RDONLY); f = os.open(p, os.O_WRONLY | os.O_TRUNC); "
                 "os.copy_file_range(s, f, len(new)); os.close(f); os.close(s)",
    "fallocate": "f = os.open(p, os.O_WRONLY); os.posix_fallocate(f, 0, os.fstat(f).st_size + 4096); os.close(f)",
    "mmap": "import mmap; f = os.open(p, os.O_RDWR); m = mmap.mmap(f, 0); m[0:len(new)] = new; m.flush(); "
            "m.close(); os.close(f)",
    "append-fsync": "f = os.open(p, os.O_WRONLY | os.O_APPEND); os.write(f, new); os.fsync(f); os.close(f)",
    "save-unsynced": "t = p + '.tmp'; f = os.open(t, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644); os.write(f, new); "
                     "os.close(f); os.rename(t, p)",
    # The second save replaces the first while the first's record still waits for its data.
    "save-unsynced-twice": "for _ in range(2):\n"
                           "    t = p + '.tmp'; f = os.open(t, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644); "
                           "os.write(f, new); os.close(f); os.rename(t, p)",
    "rewrite-unlink": "f = os.open(p, os.O_WRONLY | os.O_TRUNC); os.write(f, new); os.close(f); os.unlink(p)",
    # Two processes rewrite the file at once, with the same content: one session, two writers.
    "rewrite-two": "c = os.fork()\n"
                   "try:\n"
                   "    f = os.open(p, os.O_WRONLY | os.O_TRUNC); os.write(f, new); os.close(f)\n"
                   "except OSError as error:\n"
                   "    if c == 0: os._exit(error.errno)\n"
                   "    raise\n"
                   "if c == 0: os._exit(0)\n"
                   "status = os.waitstatus_to_exitcode(os.waitpid(c, 0)[1])\n"
                   "if status: raise OSError(status, 'the other writer failed')",
}
# Operations on names and directories. Their state is the tree under each name they touch
# (`TREES`): before, after, and what else a failed one may leave.
CREATE_A = "f = os.open(p + '/a', os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644); os.write(f, new); "
KINDS.update({
    "unlink": "os.unlink(p)",
    "mkdir": "os.mkdir(p)",
    "rmdir": "os.rmdir(p)",
    "mkdir-file": "os.mkdir(p); " + CREATE_A + "os.close(f)",
    "dir-fsync": "os.mkdir(p); " + CREATE_A + "os.fsync(f); os.close(f); "
                 "d = os.open(p, os.O_RDONLY | os.O_DIRECTORY); os.fsync(d); os.close(d)",
    "rename-dir": "os.rename(p, p + '.moved')",
    # Over an empty directory, which goes.
    "rename-dir-over": "os.rename(p, p + '.moved')",
    "symlink": "os.symlink('target of ' + p, p)",
})
CALLS = ["unlinkat", "renameat", "renameat2", "linkat", "fsync", "fdatasync", "sync_file_range", "ftruncate",
         "fchmod", "fchown", "utimensat", "openat", "pwrite64", "copy_file_range", "fcntl", "fallocate", "ioctl",
         "mkdirat", "symlinkat", "fchownat"]
FOLLOW_UP = "in-place-fsync"
# A directory's follow-up: a new file in it, synced.
FOLLOW_UP_IN = "f = os.open(p + '/follow', os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644); os.write(f, new); os.fsync(f); os.close(f)"
KINDS["follow-in"] = FOLLOW_UP_IN


def trees(kind, old, new, path):
    """A tree kind's states, each a tuple of what its names hold (`tree`): before, after, and the
    others a failure may leave; None for a file kind."""
    a = lambda content: (("a", content),)
    return {
        "rename": ((old, None), (None, old), []),
        "unlink": ((old,), (None,), []),
        "mkdir": ((None,), ((),), []),
        "rmdir": (((),), (None,), []),
        "mkdir-file": ((None,), (a(new),), [((),), (a(b""),)]),
        "dir-fsync": ((None,), (a(new),), [((),), (a(b""),)]),
        "rename-dir": ((a(old), None), (None, a(old)), []),
        "rename-dir-over": ((a(old), ()), (None, a(old)), []),
        "symlink": ((None,), (("->", "target of " + path),), []),
    }.get(kind)


def is_directory(state):
    return isinstance(state, tuple) and (not state or state[0] != "->")


def followed(state, follow):
    """`state` after its follow-up wrote `follow`: over a file's start, or as a new file in a directory."""
    if isinstance(state, bytes):
        return follow + state[len(follow):]
    return tuple(sorted(state + (("follow", follow),)))


def names(kind, path):
    """The names a kind's state covers."""
    return (path, path + ".moved") if kind.startswith("rename") else (path,)


def tree(path):
    """None for nothing, a file's bytes, ("->", target) for a symbolic link, a directory's sorted
    ((name, tree), ...)."""
    if os.path.islink(path):
        return ("->", os.readlink(path))
    if os.path.isdir(path):
        return tuple(sorted((name, tree(os.path.join(path, name))) for name in os.listdir(path)))
    return read(path)


def creates(kind):
    return kind.startswith("create")


def is_tree(kind):
    return trees(kind, b"", b"", "") is not None


def expected(kind, old, new):
    """What the file holds after `kind` succeeded on a file holding `old` (nothing for a new file)."""
    if creates(kind):
        return b"" if kind == "create-unwritten" else new
    if kind in ("in-place-fsync", "change", "large-change", "large-change-fsync", "mmap"):
        return new + old[len(new):]
    return {"append": old + new, "append-fsync": old + new, "truncate": old[:5], "link": old,
            "fallocate": old + bytes(4096), "rewrite-unlink": None}.get(kind, new)


def target(kind, path):
    """Where the operation leaves the file: a rename moves it."""
    return path + ".moved" if kind.startswith("rename") else path


def follow_up(kind):
    """The fsync'd change that follows `kind` on its target, unfaulted: in place for a file, a new
    file in a directory; None where the operation leaves nothing to change."""
    last = trees(kind, b"", b"", "")[1][-1] if is_tree(kind) else b""
    return FOLLOW_UP if isinstance(last, bytes) else "follow-in" if is_directory(last) else None


def make(path, state):
    """Makes `state` (as `tree` reads it) at `path`."""
    if state is None:
        return
    if isinstance(state, bytes):
        with open(path, "wb") as file:
            file.write(state)
    elif state and state[0] == "->":
        os.symlink(state[1], path)
    else:
        os.mkdir(path)
        for name, inner in state:
            make(os.path.join(path, name), inner)


def start(kind, path, new, timeout=30):
    """Starts `kind` on `path` in a child; `outcome` tells how it ended."""
    script = "import os\np = %r; new = %r\ntry:\n%s\n    print('ok')\nexcept OSError as error:\n    print(error.errno)\n" % (
        path, new, textwrap.indent(KINDS[kind], "    "))
    return subprocess.Popen(["timeout", str(timeout), "python3", "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def outcome(child):
    """"ok", an errno's number, or what went wrong."""
    output, errors = child.communicate()
    if child.returncode == 124:
        return "hung"
    return output.strip() or "crashed: " + errors.strip()[-200:]


def operate(kind, path, new):
    return outcome(start(kind, path, new))


class Case:
    def __init__(self, number, kind, call, nth, folder):
        self.kind, self.call, self.nth = kind, call, nth
        self.path = os.path.join(folder, "f%d" % number)
        self.old = ("old version %d" % number).encode() if is_tree(kind) else b"" if creates(kind) else ("old version %d, " % number).encode() * (5000 if kind.startswith("large") else 4)
        self.new = ("NEW %d" % number).encode()
        self.follow = ("FOLLOW-UP %d" % number).encode()
        self.result = self.followed = self.injected = None

    def prepare(self):
        if is_tree(self.kind):
            before = trees(self.kind, self.old, self.new, self.path)[0]
            for name, state in zip(names(self.kind, self.path), before):
                make(name, state)
            return
        if not creates(self.kind):
            with open(self.path, "wb") as file:
                file.write(self.old)
        if self.kind == "copy-over":
            with open(self.path + ".source", "wb") as file:
                file.write(self.new)

    def observe(self, folder, into):
        """What the case's names hold when its folder is seen as `into`: the file's content, or a
        tree kind's state."""
        seen = lambda path: os.path.join(into, os.path.relpath(path, folder))
        if is_tree(self.kind):
            return tuple(tree(seen(name)) for name in names(self.kind, self.path))
        return read(seen(target(self.kind, self.path)))

    def problem(self, found):
        """What is wrong with finding `found` after the crash, or None."""
        if is_tree(self.kind):
            return self.tree_problem(found)
        if self.followed == "ok":
            return None if found is not None and found.startswith(self.follow) else "the fsync'd follow-up is lost"
        wanted = expected(self.kind, self.old, self.new)
        if self.result == "ok":
            return None if found == wanted else "what the operation said it did is lost"
        whole = [self.old, wanted] + ([None] if creates(self.kind) else [])
        if self.kind == "rewrite-unlink":
            whole.append(self.new)
        return None if found in whole else "neither version whole"

    def tree_problem(self, found):
        before, after, others = trees(self.kind, self.old, self.new, self.path)
        whole = [after] if self.result == "ok" else [before, after] + others
        if self.followed == "ok":
            whole = [state[:-1] + (followed(state[-1], self.follow),) for state in whole if state[-1] is not None]
        if found in whole:
            return None
        if self.followed == "ok":
            return "the fsync'd follow-up is lost"
        return "what the operation said it did is lost" if self.result == "ok" else "neither state whole"

    def __str__(self):
        return "%s, %s #%s failed (%d injected): %s, follow-up %s" % (self.kind, self.call, self.nth, self.injected or 0,
                                                                     self.result, self.followed)


def model_holds(image_folder, scratch):
    """Each kind, unfaulted, on a plain directory and through the mount: ends as `expected` says."""
    problems = []
    for place, folder in (("plain directory", scratch), ("mount", image_folder)):
        os.makedirs(folder, exist_ok=True)
        for number, kind in enumerate(KINDS):
            if kind == "follow-in":
                continue
            case = Case(number, kind, "-", 0, folder)
            case.prepare()
            result = operate(kind, case.path, case.new)
            found = case.observe(folder, folder)
            wanted = trees(kind, case.old, case.new, case.path)[1] if is_tree(kind) else expected(kind, case.old, case.new)
            if result != "ok" or found != wanted:
                problems.append("%s: %s gave %s, %r" % (place, kind, result, found))
    return problems


def strace(pid, call, nth, log):
    tracer = subprocess.Popen(["strace", "-f", "-qq", "-p", str(pid), "-e", "trace=" + call,
                               "-e", "inject=%s:error=EIO:when=%s" % (call, nth), "-o", log])
    # Attached once every thread of the daemon names it as its tracer.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        threads = os.listdir("/proc/%d/task" % pid)
        if threads and all("TracerPid:\t%d\n" % tracer.pid in open("/proc/%d/task/%s/status" % (pid, t)).read()
                           for t in threads):
            return tracer
        time.sleep(0.02)
    tracer.kill()
    raise RuntimeError("strace did not attach to the daemon")


class Watcher:
    """A presenter of `folder` (`containerfs watch`), started again when it is gone."""

    def __init__(self, binary, folder, log):
        self.binary, self.folder, self.log = binary, folder, log
        self.process = None
        self.starts = 0

    def ensure(self):
        if self.process is not None and self.process.poll() is None:
            return
        self.starts += 1
        output = open(self.log, "a")
        self.process = subprocess.Popen([self.binary, "watch", self.folder], stdout=output, stderr=output)
        output.close()
        # Registered once it hears a change made after it started.
        probe = os.path.join(self.folder, ".watch-probe-%d" % self.starts)
        deadline = time.monotonic() + 10
        heard = False
        while not heard and time.monotonic() < deadline:
            with open(probe, "w") as file:
                file.write("probe")
            time.sleep(0.1)
            with open(self.log) as lines:
                heard = os.path.basename(probe) in lines.read()
        os.unlink(probe)
        if not heard:
            print("faultsweep: the presenter heard nothing in 10 s; the next cases may run unpresented (%s)" % self.log,
                  flush=True)

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait()


def sweep(image, cases, follow, together=1, presented=False):
    """Runs the cases `together` at a time, each group's operations at once under one fault; with
    `presented`, while a presenter presents the folder."""
    folder = image.start()
    pid = image.daemon.pid
    watcher = Watcher(image.binary, folder, os.path.join(image.root, "watch.log")) if presented else None
    for first in range(0, len(cases), together):
        group = cases[first:first + together]
        if watcher:
            watcher.ensure()
        for case in group:
            case.prepare()
        time.sleep(0.05)
        log = os.path.join(image.root, "strace.log")
        tracer = strace(pid, group[0].call, group[0].nth, log)
        try:
            children = [start(case.kind, case.path, case.new) for case in group]
            for case, child in zip(group, children):
                case.result = outcome(child)
            # The kernel's release and the background's work follow the close.
            time.sleep(0.3)
        finally:
            tracer.send_signal(signal.SIGINT)
            tracer.wait()
        with open(log) as lines:
            injected = sum("INJECTED" in line for line in lines)
        for case in group:
            case.injected = injected
            then = follow_up(case.kind) if follow else None
            case.followed = operate(then, target(case.kind, case.path), case.follow) if then else "not made"
        if image.daemon.poll() is not None:
            raise RuntimeError("the daemon died at " + ", ".join(map(str, group)))
    time.sleep(1)
    if watcher:
        watcher.stop()
        print("faultsweep: the presenter was started %d times" % watcher.starts, flush=True)
    # A crash: the daemon goes, the page cache stays.
    image.daemon.kill()
    image.daemon.wait()
    image.daemon = None
    subprocess.run(["fusermount3", "-u", "-z", image.fuse], stderr=subprocess.DEVNULL)
    served = image.start()
    bad = []
    for case in cases:
        problem = case.problem(case.observe(folder, served))
        if problem or case.result in ("hung",) or case.result.startswith("crashed"):
            bad.append("%s: %s" % (case, problem or case.result))
    problem = image.unmount()
    if problem:
        bad.append("after the sweep: " + problem)
    return bad


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default=os.path.join(os.path.dirname(__file__), "..", ".build", "debug", "containerfs"))
    parser.add_argument("--kinds", default=",".join(kind for kind in KINDS if kind != "follow-in"))
    parser.add_argument("--calls", default=",".join(CALLS))
    parser.add_argument("--nths", default="1,2,4")
    parser.add_argument("--no-follow", action="store_true", help="no fsync'd change in place after each operation")
    parser.add_argument("--quick", action="store_true", help="the calls that make, remove and rename names, first call only")
    parser.add_argument("--pairs", action="store_true",
                        help="each case at once with a case of the next kind, on another file, under the same fault")
    parser.add_argument("--presented", action="store_true",
                        help="a presenter presents Documents meanwhile; its sends (sendto) fail too")
    arguments = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("faultsweep: needs root (loop devices, strace on the daemon)")
    if shutil.which("strace") is None:
        sys.exit("faultsweep: needs strace (scripts/setup.sh installs it)")
    kinds, calls = arguments.kinds.split(","), arguments.calls.split(",")
    nths = arguments.nths.split(",")
    if not all(n.rstrip("+").isdigit() and int(n.rstrip("+")) > 0 for n in nths):
        sys.exit("faultsweep: --nths takes positive numbers, each with an optional + (%s)" % arguments.nths)
    if arguments.quick:
        calls, nths = ["unlinkat", "renameat", "renameat2", "linkat", "mkdirat"], ["1"]
    if arguments.presented and "sendto" not in calls:
        calls.append("sendto")
    unknown = [kind for kind in kinds if kind not in KINDS or kind == "follow-in"]
    if unknown:
        sys.exit("faultsweep: unknown kinds %s (known: %s)" % (", ".join(unknown), ", ".join(KINDS)))
    root = tempfile.mkdtemp(prefix="containerfs-faultsweep.")
    image = Image(root, "ext4", os.path.realpath(arguments.binary), native=False)
    failed = False
    try:
        image.make()
        problems = model_holds(os.path.join(image.start(), "model"), os.path.join(root, "plain"))
        image.unmount()
        for problem in problems:
            print("model: " + problem)
        failed |= bool(problems)
        cases = []
        for index, kind in enumerate(kinds):
            for call in calls:
                for nth in nths:
                    cases.append(Case(len(cases), kind, call, nth, os.path.join(image.fuse, "Documents")))
                    if arguments.pairs:
                        partner = kinds[(index + 1) % len(kinds)]
                        cases.append(Case(len(cases), partner, call, nth, os.path.join(image.fuse, "Documents")))
        print("faultsweep: %d cases (%d kinds, %d calls, failing call %s), %s%s" % (
            len(cases), len(kinds), len(calls), "/".join(map(str, nths)),
            "each followed by an fsync'd change in place" if not arguments.no_follow else "no follow-ups",
            ", Documents presented" if arguments.presented else ""), flush=True)
        bad = sweep(image, cases, not arguments.no_follow, 2 if arguments.pairs else 1, arguments.presented)
        for line in bad:
            print("BAD " + line)
        outcomes = {}
        for case in cases:
            outcomes[case.result] = outcomes.get(case.result, 0) + 1
        print("faultsweep: %d cases, %d injected a failure, outcomes %s, %d bad" % (
            len(cases), sum(1 for case in cases if case.injected), outcomes, len(bad)))
        failed |= bool(bad)
    finally:
        image.remove()
        shutil.rmtree(root, ignore_errors=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
