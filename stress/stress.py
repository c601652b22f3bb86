#!/usr/bin/env python3
"""Load on a mounted container: processes doing mixed operations on shared and private files.

Usage: stress.py CONTAINER_DIR [--seconds N] [--workers N] [--daemon-pid PID]

Every worker keeps private files whose last written content it remembers: at the end each one
must hold exactly that (no lost update). Shared files and directories are raced on purpose:
ENOENT, EEXIST, ENOTEMPTY from those races are expected; anything else (EIO, ENOTCONN, a hang)
is a failure. With --daemon-pid, the daemon's descriptors and memory are sampled before and after.
Prints what it tried and the figures, and exits 1 on any failure.
"""
import argparse, errno, json, multiprocessing, os, random, sys, time

OPS = [int(o) for o in os.environ.get("STRESS_OPS", "0,1,2,3,4,5,6,7,8,9,10,11,12").split(",")]
EXPECTED = {errno.ENOENT, errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR}


def worker(root, index, seconds, results):
    rng = random.Random(index)
    shared = os.path.join(root, "shared")
    private = os.path.join(root, f"private-{index}")
    os.makedirs(private, exist_ok=True)
    mine = {}
    counts = {"ops": 0, "expected_errors": 0, "failures": []}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        op = rng.choice(OPS)
        name = f"f{rng.randrange(20)}"
        try:
            if op == 0:  # private write, remembered
                data = f"{index}-{counts['ops']}-" + "x" * rng.randrange(1, 5000)
                with open(os.path.join(private, name), "w") as f:
                    f.write(data)
                mine[name] = data
            elif op == 1:  # private append
                path = os.path.join(private, name)
                if name in mine:
                    with open(path, "a") as f:
                        f.write("+")
                    mine[name] += "+"
            elif op == 2:  # private atomic save (editor style)
                data = f"saved-{counts['ops']}"
                tmp = os.path.join(private, "." + name + ".tmp")
                with open(tmp, "w") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, os.path.join(private, name))
                mine[name] = data
            elif op == 3:  # shared atomic save: readers must see one writer's whole version
                tmp = os.path.join(shared, f".{name}.{index}.tmp")
                with open(tmp, "w") as f:
                    f.write(str(index) * rng.randrange(1, 3000))
                os.replace(tmp, os.path.join(shared, name))
            elif op == 10:  # shared plain write: concurrent writers interleave, as on any disk
                with open(os.path.join(shared, "g" + name), "w") as f:
                    f.write(str(index) * rng.randrange(1, 3000))
            elif op == 4:  # shared read: any complete version, one writer's digit throughout
                with open(os.path.join(shared, name)) as f:
                    content = f.read()
                if content and len(set(content)) != 1:
                    counts["failures"].append(f"torn read of shared/{name}: {content[:40]!r}")
            elif op == 11:  # rewrite in place (O_TRUNC) of a file others read; it says its own length
                body = str(index) * rng.randrange(1, 300000)
                with open(os.path.join(shared, f"v{index}"), "w") as f:
                    f.write(f"{len(body)}:{body}")
            elif op == 12:  # shared read of a rewritten file in small reads, asking its size between
                path = os.path.join(shared, f"v{rng.randrange(8)}")
                with open(path, "rb", buffering=0) as f:
                    content = bytearray()
                    while chunk := f.read(rng.choice((4096, 65536, 200000))):
                        content += chunk
                        if rng.random() < 0.3:
                            os.stat(path)
                if content:
                    header, _, body = bytes(content).partition(b":")
                    if not header.isdigit() or int(header) != len(body) or len(set(body)) > 1:
                        counts["failures"].append(f"torn or cut read of {path}: "
                                                  f"{len(content)} bytes, starts {bytes(content[:20])!r}")
            elif op == 5:
                os.rename(os.path.join(shared, name), os.path.join(shared, f"f{rng.randrange(20)}"))
            elif op == 6:
                os.unlink(os.path.join(shared, name))
            elif op == 7:
                os.mkdir(os.path.join(shared, "d" + name))
            elif op == 8:
                os.rmdir(os.path.join(shared, "d" + name))
            else:
                os.listdir(shared)
                os.stat(shared)
        except OSError as error:
            if error.errno in EXPECTED:
                counts["expected_errors"] += 1
            else:
                counts["failures"].append(f"op {op} on {name}: {error}")
        counts["ops"] += 1
    lost = 0
    for name, data in mine.items():
        with open(os.path.join(private, name)) as f:
            if f.read() != data:
                lost += 1
                counts["failures"].append(f"lost update: private-{index}/{name}")
    counts["files_checked"] = len(mine)
    counts["lost"] = lost
    results.put(counts)


def sample(pid):
    if not pid:
        return None
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    status = open(f"/proc/{pid}/status").read()
    rss = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
    return {"fds": fds, "rss_kib": rss}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--daemon-pid", type=int, default=0)
    args = parser.parse_args()
    os.makedirs(os.path.join(args.root, "shared"), exist_ok=True)
    before = sample(args.daemon_pid)
    results = multiprocessing.Queue()
    processes = [multiprocessing.Process(target=worker, args=(args.root, i, args.seconds, results))
                 for i in range(args.workers)]
    for process in processes:
        process.start()
    reports = [results.get(timeout=args.seconds + 120) for _ in processes]
    for process in processes:
        process.join(timeout=30)
    hung = [p.pid for p in processes if p.is_alive()]
    # Let the kernel forget, so the daemon can release what it held.
    os.system("sync; echo 2 > /proc/sys/vm/drop_caches 2>/dev/null")
    # Closes published without waiting for their data hold a descriptor until their batch is
    # written (a second after its first).
    deadline = time.monotonic() + 5
    while True:
        time.sleep(0.5)
        after = sample(args.daemon_pid)
        if not (before and after) or after["fds"] <= before["fds"] + 64 or time.monotonic() > deadline:
            break
    summary = {
        "workers": args.workers, "seconds": args.seconds,
        "operations": sum(r["ops"] for r in reports),
        "expected_race_errors": sum(r["expected_errors"] for r in reports),
        "files_checked": sum(r["files_checked"] for r in reports),
        "files_lost": sum(r["lost"] for r in reports),
        "failures": [f for r in reports for f in r["failures"]][:20],
        "hung_workers": hung, "daemon_before": before, "daemon_after": after,
    }
    print(json.dumps(summary, indent=2))
    print(f"stress: {summary['operations']} operations, {summary['files_checked']} files checked, "
          f"{summary['files_lost']} lost, {len(summary['failures'])} failures")
    ok = not summary["failures"] and not hung and summary["files_lost"] == 0
    if before and after and after["fds"] > before["fds"] + 64:
        print(f"stress: the daemon's descriptors grew from {before['fds']} to {after['fds']}")
        ok = False
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
