#!/usr/bin/env python3
"""Runs the ContainerFS benchmark: the same workloads on a plain directory (native), through libfuse's
passthrough_ll, and through ContainerFS (Documents: atomic replace; tmp: in-place writes).

Stdlib only. bench/run.sh builds what this needs and calls it; it can also be run alone:

    bench.py --containerfs BIN --passthrough BIN --work DIR --results DIR

Every number is a cost (time or memory): lower is better, and a ratio above 1 means ContainerFS
costs more. Sizes come from environment variables (see bench/README.md). Nothing here asserts times.
"""

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time

APP_ID = "com.example.bench"
TARGETS = ["native", "passthrough", "hp", "hp_uring", "docs", "tmp", "presented"]
# libfuse's two passthrough examples with their defaults; ratios are against the better of them in
# each row. passthrough_hp with `-o io_uring` has a column and a ratio of its own (docs/io-uring.md).
LIBFUSE = ("passthrough", "hp")
TARGET_TITLES = {
    "native": "native",
    "passthrough": "passthrough_ll",
    "hp": "passthrough_hp",
    "hp_uring": "passthrough_hp -o io_uring",
    "docs": "ContainerFS Documents",
    "tmp": "ContainerFS tmp",
    "presented": "ContainerFS Documents, presented",
}

# The folder of Documents that a presenter (`containerfs watch`) presents while the workloads run
# in it: every change there is coordinated with a connected client.
PRESENTED = "presented"


def env_int(name, default):
    return int(os.environ.get(name, default))


def parse_size(text):
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    factors = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    if text and text[-1] in factors:
        return int(float(text[:-1]) * factors[text[-1]])
    return int(text)


CONFIG = {
    "BENCH_SIZE": os.environ.get("BENCH_SIZE", "1G"),          # fio file size
    "BENCH_REPS": env_int("BENCH_REPS", 5),                     # repetitions per workload (median reported)
    "BENCH_RAND_IOS": env_int("BENCH_RAND_IOS", 20000),         # 4 KiB operations per random fio run
    "BENCH_META_FILES": env_int("BENCH_META_FILES", 10000),     # files created, stat'ed and unlinked
    "BENCH_TREE": os.environ.get("BENCH_TREE", "/usr/include"),  # source tree for ls -lR and tar
    # repository git clones (over file://, as from a server); by default the one holding this script
    "BENCH_GIT_REPO": os.environ.get("BENCH_GIT_REPO", os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "BENCH_SAVES": env_int("BENCH_SAVES", 1000),                # editor saves per run
    "BENCH_OVERWRITES": env_int("BENCH_OVERWRITES", 1000),      # O_TRUNC overwrites of one file
    "BENCH_OVERWRITE_SIZE": os.environ.get("BENCH_OVERWRITE_SIZE", "64K"),  # what each overwrite writes
    "BENCH_CP_SIZE": os.environ.get("BENCH_CP_SIZE", "1M"),     # file copied over an existing one
    "BENCH_CP_RUNS": env_int("BENCH_CP_RUNS", 30),              # hyperfine runs of that cp
    "BENCH_CP_LARGE_SIZE": os.environ.get("BENCH_CP_LARGE_SIZE", "32M"),  # and a larger one
    "BENCH_MANY_FILES": env_int("BENCH_MANY_FILES", 100000),    # files listed for the memory workload
    "BENCH_PRESENTERS": env_int("BENCH_PRESENTERS", 1000),
    "BENCH_REWRITES": env_int("BENCH_REWRITES", 1000),          # open(O_CREAT|O_TRUNC), write 4 KiB, close
    "BENCH_SQLITE_ROWS": env_int("BENCH_SQLITE_ROWS", 2000),    # single-row transactions per journal mode      # presenters registered for the latency workload
    "BENCH_NOTIFY_SAMPLES": env_int("BENCH_NOTIFY_SAMPLES", 500),  # writes timed for the latency workload
}


def raise_descriptor_limit():
    """passthrough_ll holds a descriptor for every inode the kernel knows, so listing 100,000 files
    through it needs more than the usual 1,024 or 20,000 (ContainerFS holds descriptors on directories
    only). The daemons inherit this limit. Returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max(hard, 1 << 20)
    if os.geteuid() == 0:
        try:
            with open("/proc/sys/fs/nr_open") as file:
                wanted = min(wanted, int(file.read()))
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
            return wanted
        except (OSError, ValueError):
            pass
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def log(message):
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(argv, **kwargs):
    return subprocess.run(argv, check=True, **kwargs)


def timed(argv, shell=False):
    start = time.perf_counter()
    subprocess.run(argv, check=True, shell=shell, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


CAN_DROP = os.geteuid() == 0


def drop_caches():
    """Writes back and drops the page cache, dentries and inodes (FUSE ones too: the kernel forgets them)."""
    os.sync()
    if CAN_DROP:
        with open("/proc/sys/vm/drop_caches", "w") as control:
            control.write("3\n")
        # Load the tools again, so that a cold binary (fio's libraries are large) is not timed.
        for tool in ("fio", "ls", "tar", "find", "cat", "git"):
            subprocess.run([tool, "--version"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# ---------------------------------------------------------------- mounts and daemons

class Daemons:
    """Starts the FUSE daemons in the foreground as children, and always stops them again.

    The pids and mount points go to WORK/started.pids and WORK/started.mounts too, so that run.sh's
    trap can clean up even if this script is killed."""

    def __init__(self, work, containerfs, passthrough, passthrough_hp):
        self.work = work
        self.containerfs = containerfs
        self.passthrough = passthrough
        self.passthrough_hp = passthrough_hp
        self.children = {}   # mount point -> Popen
        self.watchers = []   # presenters (`containerfs watch`), stopped before the mounts

    def _note(self, name, value):
        with open(os.path.join(self.work, name), "a") as notes:
            notes.write(f"{value}\n")

    def _start(self, argv, mount_point, log_name):
        os.makedirs(mount_point, exist_ok=True)
        logfile = open(os.path.join(self.work, log_name), "ab")
        self._note("started.mounts", mount_point)
        child = subprocess.Popen(argv, stdout=logfile, stderr=logfile, stdin=subprocess.DEVNULL)
        self._note("started.pids", child.pid)
        self.children[mount_point] = child
        deadline = time.monotonic() + 60
        while not os.path.ismount(mount_point):
            if child.poll() is not None:
                raise RuntimeError(f"{argv[0]} exited with {child.returncode}; see {logfile.name}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{mount_point} was not mounted within 60 s; see {logfile.name}")
            time.sleep(0.05)
        return child

    def mount_passthrough(self, source, mount_point):
        # passthrough_ll's defaults: cache=auto (1 s entry/attribute timeouts), no writeback cache,
        # multi-threaded.
        return self._start([self.passthrough, "-f", "-o", f"source={source}", mount_point],
                           mount_point, "passthrough_ll.log")

    def mount_passthrough_hp(self, source, mount_point, io_uring=False):
        # passthrough_hp's defaults: reads and writes through FUSE passthrough where the kernel
        # allows, a day's entry and attribute timeouts, splice, multi-threaded; or requests through
        # io_uring, served on a thread per CPU.
        return self._start([self.passthrough_hp, "--foreground"] + (["-o", "io_uring"] if io_uring else [])
                           + [source, mount_point], mount_point,
                           "passthrough_hp_io_uring.log" if io_uring else "passthrough_hp.log")

    def mount_containerfs(self, store, mount_point):
        child = self._start([self.containerfs, "mount", "-f", store, mount_point], mount_point, "containerfs.log")
        return containerfs_pid(store) or child.pid

    def unmount(self, mount_point):
        child = self.children.pop(mount_point, None)
        if os.path.ismount(mount_point):
            if subprocess.run(["fusermount3", "-u", mount_point], stderr=subprocess.DEVNULL).returncode != 0:
                time.sleep(1)
                if subprocess.run(["fusermount3", "-u", mount_point], stderr=subprocess.DEVNULL).returncode != 0:
                    subprocess.run(["fusermount3", "-uz", mount_point])
        if child is not None:
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.send_signal(signal.SIGTERM)
                try:
                    child.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()

    def stop_all(self):
        for watcher in self.watchers:
            watcher.terminate()
            try:
                watcher.wait(timeout=10)
            except subprocess.TimeoutExpired:
                watcher.kill()
                watcher.wait()
        self.watchers = []
        for mount_point in list(self.children):
            try:
                self.unmount(mount_point)
            except Exception as error:  # keep stopping the others
                log(f"cleanup of {mount_point}: {error}")


def containerfs_pid(store):
    mounts = os.path.join(store, "work", "mounts")
    for name in sorted(os.listdir(mounts)) if os.path.isdir(mounts) else []:
        if name.endswith(".json"):
            try:
                with open(os.path.join(mounts, name)) as record:
                    return int(json.load(record)["pid"])
            except (ValueError, KeyError, OSError):
                pass
    return None


def memory_kib(pid):
    """VmHWM (peak resident set), VmRSS and RssAnon (its private part: heap and stacks, not the
    pages of the program's files, which the page cache holds anyway) of a process, in KiB."""
    values = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon"):
                values[key] = int(rest.split()[0])
    return values


# ---------------------------------------------------------------- workloads
# Each takes the directory to work in and returns {workload key: value} (a cost: lower is better),
# or {key: (value, extra)} where extra is shown next to the value and kept in the JSON.

def fio(name, path, rw, block, size, extra=()):
    argv = ["fio", f"--name={name}", f"--filename={path}", f"--rw={rw}", f"--bs={block}", f"--size={size}",
            "--direct=0", "--ioengine=psync", "--fallocate=none", "--output-format=json", *extra]
    start = time.perf_counter()
    output = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    wall = time.perf_counter() - start
    job = json.loads(output[output.index("{"):])["jobs"][0]
    side = job["read"] if rw in ("read", "randread") else job["write"]
    return wall, side


def workload_fio(directory):
    """fio's own rate, as the time the I/O took (file size / bandwidth, or operations / IOPS): it
    leaves out fio's start-up (a fixed ~0.3 s here), opening the file and the final fsync. What
    opening costs in Documents (a shadow copy) is measured on its own by workload_change_one_byte.
    The reads read READ_FILE, one file hard-linked into every column's backing directory and read
    once before (see share_read_file)."""
    size = parse_size(CONFIG["BENCH_SIZE"])
    shared = os.path.join(directory, READ_FILE)
    ios = CONFIG["BENCH_RAND_IOS"]
    path = os.path.join(directory, "fio.dat")
    if os.path.exists(path):
        os.unlink(path)
    results = {}
    # Sequential write of a new file; end_fsync so that no dirty data is left for the next step.
    wall, side = fio("seqwrite", path, "write", "1M", size, ["--end_fsync=1"])
    results["seq_write"] = (size / side["bw_bytes"], f"{side['bw_bytes'] / (1 << 20):.0f} MiB/s")
    results["seq_write_wall"] = wall
    # The sequential read is a step of its own (sequential_reads).
    drop_caches()
    wall, side = fio("randread", shared, "randread", "4k", size, [f"--number_ios={ios}"])
    results["rand_read"] = (ios / side["iops"], f"{side['iops'] / 1000:.1f}k IOPS")
    results["rand_read_wall"] = wall
    drop_caches()
    wall, side = fio("randwrite", path, "randwrite", "4k", size, [f"--number_ios={ios}", "--end_fsync=1"])
    results["rand_write"] = (ios / side["iops"], f"{side['iops'] / 1000:.1f}k IOPS")
    results["rand_write_wall"] = wall
    # Change one byte of the large file: open write-only, pwrite, close, after dropping the caches;
    # the median of ONE_BYTE_SAMPLES changes, each at another place (one sample moved by 40% between
    # columns that run the same code). Documents logs the change and applies it in place (a
    # reflinked shadow where the store's filesystem has them).
    samples = []
    for index in range(ONE_BYTE_SAMPLES):
        drop_caches()
        start = time.perf_counter()
        descriptor = os.open(path, os.O_WRONLY)
        os.pwrite(descriptor, b"!", index * (size // ONE_BYTE_SAMPLES) + 4097)
        os.close(descriptor)
        samples.append(time.perf_counter() - start)
    results["one_byte"] = statistics.median(samples)
    os.unlink(path)
    return results


# Nine: one cold change takes 0.8-1.4 ms on every filesystem, and the median of five moved by 20%
# between columns that run the same code (bench/HISTORY.md).
ONE_BYTE_SAMPLES = 9


READ_FILE = "fio-read.dat"

SEQUENTIAL_READ_ROUNDS = 4  # per repetition

# A balanced Latin square for the four columns: over four rounds each column reads first, second,
# third and last once, and follows each other column once (a rotation would always put the same
# column before it).
BALANCED_ORDERS = [(0, 1, 3, 2), (1, 2, 0, 3), (2, 3, 1, 0), (3, 0, 2, 1)]


def sequential_reads(places, order, reps, results):
    """Cold sequential reads of READ_FILE, the columns taking turns, one read each per round. Cold
    reads on this machine come out at either about 0.5 s or 1.5 s per GiB, in spells of seconds
    that hit whatever runs then: so no column reads all its samples in one spell, and none always
    reads after the same column."""
    size = parse_size(CONFIG["BENCH_SIZE"])
    rounds = SEQUENTIAL_READ_ROUNDS * reps
    for round_index in range(rounds):
        for target in [order[i] for i in BALANCED_ORDERS[round_index % len(BALANCED_ORDERS)]]:
            drop_caches()
            # The host takes back the memory the guest just freed (free page reporting, after about
            # 2 s); a read that started meanwhile would race it.
            time.sleep(3)
            wall, side = fio("seqread", os.path.join(places[target], READ_FILE), "read", "1M", size)
            results.add(target, {"seq_read": (size / side["bw_bytes"], f"{side['bw_bytes'] / (1 << 20):.0f} MiB/s"),
                                 "seq_read_wall": wall})
        log(f"sequential reads: round {round_index + 1}/{rounds} done")


def share_read_file(backing_directories):
    """Writes READ_FILE once, links it into each backing directory, and reads it once. The disk of a
    virtual machine has a cache of its own on the host, which dropping the guest's caches leaves
    alone: a column that read its file right after another column read the same blocks (or wrote
    them) read up to 2.5 times faster. So every column reads the same blocks, from a warm host."""
    first, *others = backing_directories
    path = os.path.join(first, READ_FILE)
    with open(path, "wb") as file:
        chunk = os.urandom(1 << 20)
        for _ in range(parse_size(CONFIG["BENCH_SIZE"]) >> 20):
            file.write(chunk)
        os.fsync(file.fileno())
    for directory in others:
        os.link(path, os.path.join(directory, READ_FILE))
    drop_caches()
    with open(path, "rb") as file:
        while file.read(1 << 20):
            pass


# The missing names' search path, 120 names a round: 300 rounds took 0.10-0.18 s, where a pause
# of the machine's decided the row (bench/HISTORY.md); 1,000 rounds take about 0.35 s natively.
MISSING_ROUNDS = 1000


def workload_metadata(directory):
    count = CONFIG["BENCH_META_FILES"]
    folder = os.path.join(directory, "meta")
    os.mkdir(folder)
    names = [os.path.join(folder, f"file{index:06d}.txt") for index in range(count)]
    data = b"a small file\n" * 8
    start = time.perf_counter()
    for name in names:
        descriptor = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(descriptor, data)
        os.close(descriptor)
    create = time.perf_counter() - start
    drop_caches()
    start = time.perf_counter()
    for name in names:
        os.stat(name)
    stat = time.perf_counter() - start
    start = time.perf_counter()
    for name in names:
        os.unlink(name)
    unlink = time.perf_counter() - start
    # A search path, as a compiler's include search or Python's imports walk it: each name is
    # looked for in every directory, and found in none.
    search = [os.path.join(folder, f"path{index}") for index in range(6)]
    for place in search:
        os.mkdir(place)
    # Nothing left to write back (10,000 unlinks): the rounds time the look-ups alone.
    os.sync()
    start = time.perf_counter()
    for _ in range(MISSING_ROUNDS):
        for header in range(20):
            for place in search:
                os.path.exists(os.path.join(place, f"header{header}.h"))
    missing = time.perf_counter() - start
    for place in search:
        os.rmdir(place)
    os.rmdir(folder)
    return {"meta_create": create, "meta_stat": stat, "meta_unlink": unlink, "meta_missing": missing}


def workload_tree(directory, archive, scratch):
    folder = os.path.join(directory, "tree")
    os.mkdir(folder)
    results = {}
    results["tar_extract"] = timed(["tar", "-xf", archive, "-C", folder])
    drop_caches()
    results["ls_lR"] = timed(["ls", "-lR", folder])
    drop_caches()
    # Through a pipe: GNU tar skips reading the files when the archive is /dev/null itself.
    results["tar_create"] = timed(f"tar -cf - -C '{folder}' . | cat > /dev/null", shell=True)
    results["rm_rf"] = timed(["rm", "-rf", folder])
    return results


def workload_tools(directory, tree_copy, repository):
    """Programs that write many files their own way: rsync (a temporary file each, written, its mode
    and times set, renamed into place) and git (a pack received, indexed, checked out)."""
    results = {}
    destination = os.path.join(directory, "rsync")
    results["rsync"] = timed(["rsync", "-a", tree_copy + "/", destination + "/"])
    clone = os.path.join(directory, "clone")
    results["git_clone"] = timed(["git", "clone", "--quiet", "file://" + repository, clone])
    # The first status after a clone hashes again every file whose time is the index's second
    # ("racily clean"): all of them or none, as the clock falls, on any filesystem. One untimed
    # status first writes the index that a user's later ones start from.
    run(["git", "-C", clone, "status", "--porcelain"], stdout=subprocess.DEVNULL)

    def cold_status():
        drop_caches()
        return timed(["git", "-C", clone, "status", "--porcelain"])

    # One cold status takes about 0.02-0.05 s or 0.07-0.19 s at random, native included, in spells
    # of seconds (bench/README.md): the median of three.
    results["git_status"] = statistics.median(cold_status() for _ in range(3))
    run(["rm", "-rf", destination, clone])
    return results


def workload_save(directory):
    """An editor's safe save: write a temporary file, fsync it, rename it over the original."""
    count = CONFIG["BENCH_SAVES"]
    folder = os.path.join(directory, "save")
    os.mkdir(folder)
    original = os.path.join(folder, "document.txt")
    temporary = os.path.join(folder, ".document.txt.swp")
    with open(original, "wb") as file:
        file.write(b"version 0\n" * 400)
    start = time.perf_counter()
    for index in range(count):
        content = (f"version {index + 1}\n" * 400).encode()
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(descriptor, content)
        os.fsync(descriptor)
        os.close(descriptor)
        os.rename(temporary, original)
    elapsed = time.perf_counter() - start
    shutil.rmtree(folder)
    return {"editor_save": (elapsed / count * 1000, f"{count / elapsed:.0f} saves/s")}


def rewrites(directory, key, count, size, flags):
    """Opens one existing file `count` times with `flags`, writes `size` bytes, closes: the time
    per rewrite, with the rate."""
    path = os.path.join(directory, f"{key}.bin")
    content = os.urandom(size)
    with open(path, "wb") as file:
        file.write(content)
    start = time.perf_counter()
    for _ in range(count):
        descriptor = os.open(path, flags, 0o644)
        os.write(descriptor, content)
        os.close(descriptor)
    elapsed = time.perf_counter() - start
    os.unlink(path)
    return {key: (elapsed / count * 1000, f"{count / elapsed:.0f}/s")}


def workload_overwrite(directory):
    """The goal's measure of atomic replace: open an existing file with O_TRUNC, write, close."""
    return rewrites(directory, "overwrite", CONFIG["BENCH_OVERWRITES"], parse_size(CONFIG["BENCH_OVERWRITE_SIZE"]),
                    os.O_WRONLY | os.O_TRUNC)


def workload_rewrite(directory):
    """The common form of a rewrite: open(O_CREAT|O_TRUNC) of an existing file (a shell's `>`, cp,
    Python's open("w")), write 4 KiB, close."""
    return rewrites(directory, "rewrite", CONFIG["BENCH_REWRITES"], 4096, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)


def workload_sqlite(directory):
    """SQLite's own durability: one row per transaction (synchronous=FULL), in WAL and in rollback
    (DELETE) journal mode."""
    import sqlite3
    rows = CONFIG["BENCH_SQLITE_ROWS"]
    measured = {}
    for mode, key in (("wal", "sqlite_wal"), ("delete", "sqlite_rollback")):
        path = os.path.join(directory, f"bench-{mode}.db")
        connection = sqlite3.connect(path, isolation_level=None)
        connection.execute(f"PRAGMA journal_mode={mode}")
        connection.execute("PRAGMA synchronous=FULL")
        connection.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, value TEXT)")
        start = time.perf_counter()
        for index in range(rows):
            connection.execute("INSERT INTO t(value) VALUES (?)", (f"row {index}",))
        elapsed = time.perf_counter() - start
        count = connection.execute("SELECT count(*) FROM t").fetchone()[0]
        connection.close()
        if count != rows:
            raise RuntimeError(f"sqlite {mode}: {count} rows, not {rows}")
        for suffix in ("", "-wal", "-shm", "-journal"):
            if os.path.exists(path + suffix):
                os.unlink(path + suffix)
        measured[key] = (elapsed, f"{rows / elapsed:.0f}/s")
    return measured


def workload_cp(directory, source, scratch, key):
    folder = os.path.join(directory, "cp")
    os.mkdir(folder)
    target = os.path.join(folder, "target.bin")
    shutil.copyfile(source, target)
    report = os.path.join(scratch, "hyperfine.json")
    run(["hyperfine", "-N", "--style", "none", "--warmup", "3", "--runs", str(CONFIG["BENCH_CP_RUNS"]),
         "--export-json", report, f"cp {source} {target}"], stdout=subprocess.DEVNULL)
    with open(report) as file:
        median = json.load(file)["results"][0]["median"]
    shutil.rmtree(folder)
    return {key: median * 1000}


def notification_latency(directory, binary):
    """Time from the close of a write to the presenter's presentedItemDidChange, with
    BENCH_PRESENTERS presenters registered (one `containerfs watch` client): median and p99."""
    import select
    folder = os.path.join(directory, "presented")
    os.makedirs(folder, exist_ok=True)
    paths = []
    for index in range(CONFIG["BENCH_PRESENTERS"]):
        path = os.path.join(folder, f"item-{index}.txt")
        with open(path, "w") as file:
            file.write("0")
        paths.append(path)
    watched = paths[0]
    watcher = subprocess.Popen([binary, "watch", "--json"] + paths, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, bufsize=0)
    descriptor = watcher.stdout.fileno()
    pending = b""

    def next_line(limit):
        """The next whole line, waiting at most `limit` seconds; None if none came."""
        nonlocal pending
        deadline = time.perf_counter() + limit
        while b"\n" not in pending:
            remaining = deadline - time.perf_counter()
            if remaining <= 0 or not select.select([descriptor], [], [], remaining)[0]:
                return None
            chunk = os.read(descriptor, 65536)
            if not chunk:
                return None
            pending += chunk
        line, pending = pending.split(b"\n", 1)
        return line

    def wait_for_change(limit):
        deadline = time.perf_counter() + limit
        while True:
            line = next_line(max(0, deadline - time.perf_counter()))
            if line is None:
                return False
            if b'"presentedItemDidChange"' in line:
                return True

    def drain():
        while next_line(0.05) is not None:
            pass

    latencies = []
    try:
        # The presenters register in the background: write until one is heard.
        for _ in range(100):
            with open(watched, "w") as file:
                file.write("warm")
            if wait_for_change(0.5):
                break
        else:
            return {}
        for sample in range(CONFIG["BENCH_NOTIFY_SAMPLES"]):
            drain()  # the reacquire of the last write, and anything late: only this write's change counts
            with open(watched, "w") as file:
                file.write(str(sample))
            start = time.perf_counter()
            if not wait_for_change(10):
                break
            latencies.append(time.perf_counter() - start)
    finally:
        watcher.terminate()
        watcher.wait()
    if not latencies:
        return {}
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return {"notify_latency": statistics.median(latencies), "notify_p99": p99}


# ---------------------------------------------------------------- the report

# key, title, unit, scale (value * scale is shown), targets
WORKLOADS = [
    ("seq_write", "fio sequential write of {size}, 1 MiB blocks", "s", 1, TARGETS),
    ("seq_read", "fio sequential read of {size}, 1 MiB blocks (cold cache)", "s", 1, TARGETS),
    ("rand_read", "fio random read, 4 KiB, {ios} ops (cold cache)", "s", 1, TARGETS),
    ("rand_write", "fio random write, 4 KiB, {ios} ops", "s", 1, TARGETS),
    ("one_byte", "change 1 byte of that {size} file (open, pwrite, close; median of " + str(ONE_BYTE_SAMPLES) + ", cold)", "ms", 1000, TARGETS),
    ("meta_create", "create {meta} small files", "s", 1, TARGETS),
    ("meta_stat", "stat {meta} files (cold cache)", "s", 1, TARGETS),
    ("meta_unlink", "unlink {meta} files", "s", 1, TARGETS),
    ("meta_missing", f"stat {MISSING_ROUNDS * 120:,} missing names (a search path: 6 directories, 20 names, {MISSING_ROUNDS:,} rounds)", "s", 1, TARGETS),
    ("tar_extract", "tar extract {tree} ({tree_files} entries)", "s", 1, TARGETS),
    ("ls_lR", "ls -lR of that tree (cold cache)", "s", 1, TARGETS),
    ("tar_create", "tar create of that tree (cold cache)", "s", 1, TARGETS),
    ("rm_rf", "rm -rf of that tree", "s", 1, TARGETS),
    ("rsync", "rsync -a of that tree from the native disk", "s", 1, TARGETS),
    ("git_clone", "git clone of {git_repo} over file:// ({git_files} files)", "s", 1, TARGETS),
    ("git_status", "git status of that clone (cold cache, after a first status)", "s", 1, TARGETS),
    ("editor_save", "editor save (write tmp, fsync, rename over), per save", "ms", 1, TARGETS),
    ("overwrite", "open with O_TRUNC, write {overwrite_size}, close, per file", "ms", 1, TARGETS),
    ("rewrite", "open with O_CREAT|O_TRUNC, write 4 KiB, close, per file", "ms", 1, TARGETS),
    ("cp_over", "cp {cp_size} over an existing file (hyperfine median)", "ms", 1, TARGETS),
    ("cp_large", "cp {cp_large_size} over an existing file (hyperfine median)", "ms", 1, TARGETS),
    ("sqlite_wal", "SQLite WAL, {sqlite_rows} single-row transactions", "s", 1, TARGETS),
    ("sqlite_rollback", "SQLite rollback journal, {sqlite_rows} single-row transactions", "s", 1, TARGETS),
    ("many_list", "find -ls of {many} files (cold cache)", "s", 1, ["native", "passthrough", "hp", "docs"]),
    ("idle_rss", "daemon memory right after mounting (VmRSS)", "MiB", 1 / 1024, ["passthrough", "hp", "docs"]),
    ("idle_anon", "of which private (RssAnon: heap and stacks, not the program's own pages)", "MiB", 1 / 1024,
     ["passthrough", "hp", "docs"]),
    ("many_hwm", "daemon peak memory (VmHWM) after listing {many} files", "MiB", 1 / 1024,
     ["passthrough", "hp", "docs"]),
    ("many_per_file", "daemon memory per listed file ((VmHWM after − VmRSS before) / files)", "bytes", 1,
     ["passthrough", "hp", "docs"]),
    ("notify_latency", "presenter notification latency, median ({presenters} presenters)", "ms", 1000, ["docs"]),
    ("notify_p99", "presenter notification latency, p99 ({presenters} presenters)", "ms", 1000, ["docs"]),
]


def format_number(value):
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def format_ratio(value):
    if value >= 100:
        return f"{value:.0f}×"
    return f"{value:.1f}×" if value >= 10 else f"{value:.2f}×"


class Results:
    def __init__(self):
        self.samples = {}   # key -> target -> [values]
        self.extras = {}    # key -> target -> [extra strings]
        self.failures = {}  # key -> target -> message

    def fail(self, target, key, message):
        self.failures.setdefault(key, {})[target] = message

    def add(self, target, measured):
        for key, value in measured.items():
            extra = None
            if isinstance(value, tuple):
                value, extra = value
            self.samples.setdefault(key, {}).setdefault(target, []).append(value)
            self.extras.setdefault(key, {}).setdefault(target, []).append(extra)

    def median(self, key, target):
        values = self.samples.get(key, {}).get(target)
        return statistics.median(values) if values else None

    def extra(self, key, target):
        """The extra of the sample closest to the median."""
        values = self.samples.get(key, {}).get(target)
        if not values:
            return None
        middle = statistics.median(values)
        index = min(range(len(values)), key=lambda i: abs(values[i] - middle))
        return self.extras[key][target][index]


def render(results, info):
    names = info["names"]
    lines = [
        "| workload | unit | " + " | ".join(TARGET_TITLES[target] for target in TARGETS)
        + " | ContainerFS / best of passthrough_ll and _hp | ContainerFS / passthrough_hp -o io_uring | ContainerFS / native |",
        "|---|---|" + "---:|" * (len(TARGETS) + 3),
    ]
    rows = []
    for key, title, unit, scale, targets in WORKLOADS:
        title = title.format(**names)
        cells = []
        for target in TARGETS:
            value = results.median(key, target)
            if value is None:
                cells.append("failed" if target in results.failures.get(key, {}) else "—")
                continue
            text = format_number(value * scale)
            extra = results.extra(key, target)
            cells.append(f"{text} ({extra})" if extra else text)
        ratios = []
        for base in ("libfuse", "hp_uring", "native"):
            if base == "libfuse":
                values = [v for v in (results.median(key, t) for t in LIBFUSE) if v is not None]
                base_value = min(values) if values else None
            else:
                base_value = results.median(key, base)
            parts = []
            for target, label in (("docs", "Documents"), ("tmp", "tmp"), ("presented", "presented")):
                value = results.median(key, target)
                if value is not None and base_value:
                    parts.append((label, value / base_value))
            if not parts:
                ratios.append("—")
            elif len(parts) == 1:
                ratios.append(format_ratio(parts[0][1]))
            else:
                others = ", ".join(f"{label} {format_ratio(ratio)}" for label, ratio in parts[1:])
                ratios.append(f"{format_ratio(parts[0][1])} ({others})")
        rows.append({"key": key, "workload": title, "unit": unit, "cells": dict(zip(TARGETS, cells)),
                     "ratio_passthrough": ratios[0], "ratio_hp_uring": ratios[1], "ratio_native": ratios[2]})
        lines.append(f"| {title} | {unit} | " + " | ".join(cells) + f" | {ratios[0]} | {ratios[1]} | {ratios[2]} |")
    return "\n".join(lines) + "\n", rows


# ---------------------------------------------------------------- the run

def make_many(root, count):
    """count empty files in folders of 1,000, created directly (not through any mount)."""
    for index in range(count):
        folder = os.path.join(root, f"d{index // 1000:04d}")
        if index % 1000 == 0:
            os.makedirs(folder)
        os.close(os.open(os.path.join(folder, f"f{index:07d}"), os.O_WRONLY | os.O_CREAT, 0o644))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--containerfs", required=True)
    parser.add_argument("--passthrough", required=True)
    parser.add_argument("--passthrough-hp", required=True)
    parser.add_argument("--libfuse-version", default="", help="what passthrough_hp was built from")
    parser.add_argument("--io-uring", action="store_true",
                        help="the fuse module takes requests through io_uring: passthrough_hp -o io_uring gets a column")
    parser.add_argument("--work", required=True, help="scratch directory (on the disk being measured)")
    parser.add_argument("--scratch", default="", help="what the scratch disk is, for the report")
    parser.add_argument("--results", required=True, help="where latest.md and latest.json go")
    parser.add_argument("--command", default="bench/run.sh", help="the command shown in the report")
    arguments = parser.parse_args()
    descriptor_limit = raise_descriptor_limit()

    work = os.path.abspath(arguments.work)
    os.makedirs(work, exist_ok=True)
    daemons = Daemons(work, os.path.abspath(arguments.containerfs), os.path.abspath(arguments.passthrough),
                      os.path.abspath(arguments.passthrough_hp))
    results = Results()
    started = datetime.datetime.now(datetime.timezone.utc)
    reps = CONFIG["BENCH_REPS"]
    only = set(filter(None, os.environ.get("BENCH_ONLY", "").split(",")))

    native = os.path.join(work, "native")
    pt_source, pt_mount = os.path.join(work, "pt-source"), os.path.join(work, "pt-mount")
    hp_source, hp_mount = os.path.join(work, "hp-source"), os.path.join(work, "hp-mount")
    hpu_source, hpu_mount = os.path.join(work, "hpu-source"), os.path.join(work, "hpu-mount")
    store, cfs_mount = os.path.join(work, "store"), os.path.join(work, "cfs-mount")
    backing_documents = os.path.join(store, "containers", APP_ID, "Documents")
    for folder in (native, pt_source, hp_source, hpu_source):
        os.makedirs(folder)

    # The store: a one-file bundle is enough.
    bundle = os.path.join(work, "Bench.app")
    os.makedirs(bundle)
    with open(os.path.join(bundle, "Info.txt"), "w") as file:
        file.write("ContainerFS benchmark bundle\n")
    run([daemons.containerfs, "install", store, bundle, "--id", APP_ID], stdout=subprocess.DEVNULL)

    # Inputs, made once on the native disk.
    archive = os.path.join(work, "tree.tar")
    tree = os.path.abspath(CONFIG["BENCH_TREE"])
    run(["tar", "-cf", archive, "-C", os.path.dirname(tree), os.path.basename(tree)])
    tree_files = sum(1 + len(files) for _, _, files in os.walk(tree))
    tree_copy = os.path.join(work, "tree-copy")
    os.makedirs(tree_copy)
    run(["tar", "-xf", archive, "-C", tree_copy])
    repository = os.path.abspath(CONFIG["BENCH_GIT_REPO"])
    # Counted only for the step that clones it: a run without it needs no git checkout.
    git_files = 0 if only and "tools" not in only else len(subprocess.run(
        ["git", "-C", repository, "ls-files"], check=True, capture_output=True, text=True).stdout.splitlines())
    cp_source = os.path.join(work, "cp-source.bin")
    with open(cp_source, "wb") as file:
        file.write(os.urandom(parse_size(CONFIG["BENCH_CP_SIZE"])))
    cp_large_source = os.path.join(work, "cp-large-source.bin")
    with open(cp_large_source, "wb") as file:
        file.write(os.urandom(parse_size(CONFIG["BENCH_CP_LARGE_SIZE"])))

    memory = {}
    try:
        # 1. Memory: fresh daemons list many files that were created behind their backs.
        many = CONFIG["BENCH_MANY_FILES"]
        # passthrough_ll holds an O_PATH descriptor per inode the kernel knows: listing more files
        # than the descriptor limit fails with EMFILE. Without CAP_SYS_RESOURCE the limit cannot be
        # raised (20,000 in some containers), so its listing shrinks to fit, in whole folders of
        # 1,000; only its memory per file is then comparable. ContainerFS lists them all.
        fitting = min(many, (descriptor_limit - 2000) // 1000 * 1000)
        listed = {"native": many, "passthrough": fitting, "hp": fitting, "docs": many}
        if listed["passthrough"] < many:
            log(f"memory: passthrough_ll lists {listed['passthrough']} files, not {many}: "
                f"the descriptor limit is {descriptor_limit}")
        memory["files_listed"] = many
        memory["passthrough_files_listed"] = listed["passthrough"]
        log(f"memory: creating {many} files in each backing directory")
        make_many(os.path.join(native, "many"), many)
        make_many(os.path.join(pt_source, "many"), listed["passthrough"])
        make_many(os.path.join(hp_source, "many"), listed["hp"])
        make_many(os.path.join(backing_documents, "many"), many)
        pt_pid = daemons.mount_passthrough(pt_source, pt_mount).pid
        hp_pid = daemons.mount_passthrough_hp(hp_source, hp_mount).pid
        cfs_pid = daemons.mount_containerfs(store, cfs_mount)
        memory["passthrough_idle"] = memory_kib(pt_pid)
        memory["hp_idle"] = memory_kib(hp_pid)
        memory["docs_idle"] = memory_kib(cfs_pid)
        for target in ("passthrough", "hp", "docs"):
            idle = memory[f"{target}_idle"]
            results.add(target, {"idle_rss": idle["VmRSS"], "idle_anon": idle["RssAnon"]})
        places = {"native": native, "passthrough": pt_mount, "hp": hp_mount,
                  "docs": os.path.join(cfs_mount, APP_ID, "Documents")}
        for rep in range(reps):
            for target, place in places.items():
                drop_caches()
                try:
                    elapsed = timed(["find", os.path.join(place, "many"), "-ls"])
                except subprocess.CalledProcessError as error:
                    log(f"memory: find through {target} failed ({error.returncode}); see its log")
                    results.fail(target, "many_list", f"find exited with {error.returncode}")
                    if rep == 0 and target != "native":
                        results.fail(target, "many_hwm", "the listing failed")
                    continue
                complete = listed[target] == many
                shortfall = f"lists only {listed[target]:,} files: one descriptor per inode, limit {descriptor_limit:,}"
                if complete:
                    results.add(target, {"many_list": elapsed})
                elif rep == 0:
                    results.fail(target, "many_list", shortfall)
                if rep == 0 and target in ("passthrough", "hp", "docs"):
                    pid = {"passthrough": pt_pid, "hp": hp_pid}.get(target, cfs_pid)
                    status = memory_kib(pid)
                    memory[f"{target}_after_list"] = status
                    idle = memory[f"{target}_idle"]["VmRSS"]
                    per_file = (status["VmHWM"] - idle) * 1024 / listed[target]
                    if complete:
                        results.add(target, {"many_hwm": status["VmHWM"], "many_per_file": per_file})
                    else:
                        results.fail(target, "many_hwm", shortfall)
                        results.add(target, {"many_per_file": (per_file, f"{listed[target]:,} files")})
            log(f"memory: listing rep {rep + 1}/{reps} done")
        daemons.unmount(pt_mount)
        daemons.unmount(hp_mount)
        daemons.unmount(cfs_mount)
        for root in (native, pt_source, hp_source, backing_documents):
            shutil.rmtree(os.path.join(root, "many"))

        # 2. Everything else, on fresh mounts.
        daemons.mount_passthrough(pt_source, pt_mount)
        daemons.mount_passthrough_hp(hp_source, hp_mount)
        if arguments.io_uring:
            daemons.mount_passthrough_hp(hpu_source, hpu_mount, io_uring=True)
        daemons.mount_containerfs(store, cfs_mount)
        # The first four in this order are the columns of the sequential reads (BALANCED_ORDERS).
        places = {
            "native": native,
            "passthrough": pt_mount,
            "hp": hp_mount,
            "docs": os.path.join(cfs_mount, APP_ID, "Documents"),
            "tmp": os.path.join(cfs_mount, APP_ID, "tmp"),
            "presented": os.path.join(cfs_mount, APP_ID, "Documents", PRESENTED),
        }
        if arguments.io_uring:
            places["hp_uring"] = hpu_mount
        os.makedirs(places["presented"], exist_ok=True)
        presenter = subprocess.Popen([arguments.containerfs, "watch", places["presented"]],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        daemons.watchers.append(presenter)
        steps = [
            ("fio", workload_fio),
            ("metadata", workload_metadata),
            ("tree", lambda place: workload_tree(place, archive, work)),
            ("tools", lambda place: workload_tools(place, tree_copy, repository)),
            ("editor save", workload_save),
            ("overwrite", workload_overwrite),
            ("rewrite", workload_rewrite),
            ("sqlite", workload_sqlite),
            ("cp", lambda place: {**workload_cp(place, cp_source, work, "cp_over"),
                                  **workload_cp(place, cp_large_source, work, "cp_large")}),
        ]
        if not only or "fio" in only or "seqread" in only:
            share_read_file([native, pt_source, hp_source, hpu_source, backing_documents, os.path.join(store, "containers", APP_ID, "tmp"),
                             os.path.join(backing_documents, PRESENTED)])
        order = list(places)
        if not only or "seqread" in only:
            sequential_reads(places, order, reps, results)
        for name, step in [(name, step) for name, step in steps if not only or name in only]:
            for rep in range(reps):
                # Each repetition starts with another column, so that none always follows the
                # previous step's writeback; and each step starts with nothing dirty.
                for target in order[rep % len(order):] + order[:rep % len(order)]:
                    place = places[target]
                    os.sync()
                    start = time.perf_counter()
                    results.add(target, step(place))
                    log(f"{name} rep {rep + 1}/{reps} {target}: {time.perf_counter() - start:.1f} s")
        if not only or "latency" in only:
            results.add("docs", notification_latency(places["docs"], arguments.containerfs))
    finally:
        daemons.stop_all()

    info = {
        "names": {
            "size": size_label(CONFIG["BENCH_SIZE"]),
            "ios": f"{CONFIG['BENCH_RAND_IOS']:,}",
            "meta": f"{CONFIG['BENCH_META_FILES']:,}",
            "tree": "a copy of " + tree,
            "tree_files": f"{tree_files:,}",
            "git_repo": repository if "BENCH_GIT_REPO" in os.environ else "this repository",
            "git_files": f"{git_files:,}",
            "cp_size": size_label(CONFIG["BENCH_CP_SIZE"]),
            "cp_large_size": size_label(CONFIG["BENCH_CP_LARGE_SIZE"]),
            "overwrite_size": size_label(CONFIG["BENCH_OVERWRITE_SIZE"]),
            "many": f"{memory.get('files_listed', CONFIG['BENCH_MANY_FILES']):,}",
            "presenters": f"{CONFIG['BENCH_PRESENTERS']:,}",
            "sqlite_rows": f"{CONFIG['BENCH_SQLITE_ROWS']:,}",
        },
    }
    table, rows = render(results, info)
    finished = datetime.datetime.now(datetime.timezone.utc)
    header = (
        f"ContainerFS benchmark, {finished:%Y-%m-%d %H:%M} UTC, `{arguments.command}` "
        f"({reps} repetitions, medians; {os.cpu_count()} CPUs, kernel {platform.release()}, "
        f"backing filesystem {filesystem_type(work)}"
        + (f", {arguments.scratch}" if arguments.scratch else "")
        + f"; caches dropped: {'yes' if CAN_DROP else 'no (not root)'}).\n"
        "Lower is better everywhere; a ratio above 1 means ContainerFS costs more. "
        "fio cells are the time fio measured for the I/O alone (size / bandwidth, operations / IOPS; "
        "without opening the file or the final fsync), with fio's rate in brackets; "
        "the wall times of the fio runs are in latest.json. Ratios are for Documents, with tmp and the presented folder of Documents in brackets.\n"
    )
    notes = (
        "\nNotes:\n"
        "- passthrough_ll runs with its defaults: `-o cache=auto` (1 s entry and attribute timeouts), "
        "no writeback cache, multi-threaded. passthrough_hp (libfuse's current sources"
        + (f", {arguments.libfuse_version}" if arguments.libfuse_version else "")
        + ") runs with its defaults: reads and writes through FUSE passthrough, a day's entry and attribute "
        f"timeouts, splice, multi-threaded"
        + ("; its column `-o io_uring` adds requests through io_uring (the fuse module's `enable_uring`, which "
           "bench/run.sh turned on for the run, and which ContainerFS then uses too: docs/io-uring.md)"
           if arguments.io_uring else "; the fuse module takes no requests through io_uring here, so neither does ContainerFS")
        + f". The daemons run with a limit of {descriptor_limit:,} open "
        "descriptors (passthrough_ll and _hp hold one per inode the kernel knows; ContainerFS one per directory "
        "the kernel knows and per open file).\n"
        "- ContainerFS Documents writes with direct I/O through a shadow copy published at close; tmp "
        "writes in place. Readers of both read through FUSE passthrough (the kernel reads the file "
        "itself) while no one writes the file, where the kernel and a root daemon allow it.\n"
        + (f"- passthrough_ll and passthrough_hp cannot list {memory['files_listed']:,} files here: each holds one descriptor per "
           f"inode the kernel knows, and the descriptor limit is {descriptor_limit:,} (raising it needs "
           f"CAP_SYS_RESOURCE). Their listing times and peaks show as failed; their memory per file comes from "
           f"listing {memory['passthrough_files_listed']:,} files.\n"
           if memory.get("passthrough_files_listed", 0) < memory.get("files_listed", 0) else "")
        + "- Notification latency: one `containerfs watch` client presents the items; the time runs from "
        "the return of close() after a write to the arrival of its presentedItemDidChange line.\n"
        "- Documents, presented: a folder of Documents that one `containerfs watch` client presents "
        "while the workloads run in it, so that every change there is coordinated with a connected "
        "presenter. The watcher hears every message, requests included, and asks to be waited for on "
        "none (it has no hook to run), so each operation costs a notification, not a round trip: as "
        "on Apple's systems, where a presenter that does not implement a request is not waited for. "
        "Sequential reads leave it out (the four-column rotation).\n"
    )
    markdown = header + "\n" + table + notes
    os.makedirs(arguments.results, exist_ok=True)
    with open(os.path.join(arguments.results, "latest.md"), "w") as file:
        file.write(markdown)
    with open(os.path.join(arguments.results, "latest.json"), "w") as file:
        json.dump({
            "started": started.isoformat(timespec="seconds"),
            "finished": finished.isoformat(timespec="seconds"),
            "command": arguments.command,
            "host": {"cpus": os.cpu_count(), "kernel": platform.release(),
                     "memory_kib": meminfo_total(), "filesystem": filesystem_type(work),
                     "scratch": arguments.scratch},
            "caches_dropped": CAN_DROP,
            "descriptor_limit": descriptor_limit,
            "failures": results.failures,
            "config": CONFIG,
            "workloads": [{"key": key, "title": title.format(**info["names"]), "unit": unit, "scale": scale}
                          for key, title, unit, scale, _ in WORKLOADS],
            "samples": results.samples,
            "extras": results.extras,
            "medians": {key: {target: results.median(key, target) for target in TARGETS
                              if results.median(key, target) is not None} for key in results.samples},
            "memory_kib": memory,
            "table": rows,
        }, file, indent=2)
        file.write("\n")
    print(markdown)


def size_label(text):
    size = parse_size(text)
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor} {unit}"
    return f"{size} bytes"


def filesystem_type(path):
    """The filesystem's type, and for ext4 whether it has a journal: syncs cost differently."""
    result = subprocess.run(["findmnt", "-no", "FSTYPE,SOURCE", "-T", path], capture_output=True, text=True)
    fields = result.stdout.split()
    if not fields:
        return "unknown"
    if fields[0] == "ext4" and len(fields) > 1:
        try:
            with open(f"/sys/fs/ext4/{os.path.basename(os.path.realpath(fields[1]))}/journal_task") as file:
                return "ext4 (journal)" if file.read().strip()[:1].isdigit() else "ext4 (no journal)"
        except OSError:
            pass
    return fields[0]


def meminfo_total():
    with open("/proc/meminfo") as file:
        for line in file:
            if line.startswith("MemTotal:"):
                return int(line.split()[1])
    return None


if __name__ == "__main__":
    main()
