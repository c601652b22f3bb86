#!/usr/bin/env python3
"""A hostile user beside ordinary ones: the ordinary users' latencies with and without it.

Mounts a scratch demo store with allow_other. The ordinary users (root, and an unprivileged user)
create, read, stat and remove files in Documents and ask the control socket for status, timing
each operation. Then a hostile user (uid 4243) holds everything it can get: as many control
connections as it is given, as many presenters (on the container and on its own files; their
messages read, never answered), a coordinated write held on a file of its own, and half-sent
one-MiB frames. The
ordinary work runs again beside it. Prints p50 and p99 of each operation, both times.

Usage: hostile.py CONTAINERFS_BINARY [--rounds N]
"""
import argparse
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

APP = "com.example.notes"
ORDINARY_UID = 4242
HOSTILE_UID = 4243


def as_user(uid):
    return ["setpriv", "--reuid=%d" % uid, "--regid=%d" % uid, "--clear-groups"]


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


# Runs as each ordinary user: timed operations, one JSON object of latencies (ms) on stdout.
ORDINARY = r'''
import json, os, socket, struct, sys, time
rounds, tag = int(sys.argv[1]), sys.argv[2]
lat = {"create+write": [], "read": [], "stat": [], "unlink": [], "status": []}
path = os.getxattr(".", "user.containerfs.control-socket").rstrip(b"\0")
def frame(t, body):
    data = json.dumps({"version": 1, "type": t, "body": body}).encode()
    return struct.pack(">I", len(data)) + data
def timed(name, f):
    start = time.perf_counter(); f(); lat[name].append((time.perf_counter() - start) * 1000)
def status():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect(path)
    s.sendall(frame("hello", {"clientName": tag}) + frame("statusRequest", {}))
    s.settimeout(30)
    for _ in range(2):
        n = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))[0]; s.recv(n, socket.MSG_WAITALL)
    s.close()
def create(name):
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644); os.write(fd, b"x" * 100); os.close(fd)
def read(name):
    with open(name, "rb") as f: f.read()
for i in range(rounds):
    name = "Documents/%s-%d" % (tag, i)
    timed("create+write", lambda: create(name))
    timed("read", lambda: read(name))
    timed("stat", lambda: os.stat(name))
    timed("unlink", lambda: os.unlink(name))
    if i % 10 == 0:
        timed("status", status)
print(json.dumps(lat))
'''

# Runs as the hostile user: holds what it can, reports what it got, then waits to be killed.
HOSTILE = r'''
import json, os, socket, struct, subprocess, sys, threading, time
path = os.getxattr(".", "user.containerfs.control-socket").rstrip(b"\0")
binary = sys.argv[1]
def frame(t, body):
    data = json.dumps({"version": 1, "type": t, "body": body}).encode()
    return struct.pack(">I", len(data)) + data
app = sys.argv[2]
for n in range(50):
    open("Documents/hostile-%d" % n, "w").write("mine")
# A coordinated write held on one of its files (its command runs once it is granted).
holder = subprocess.Popen([binary, "coordinate", "--write", "Documents/hostile-0", "--", "sleep", "3600"])
time.sleep(1)
held = []
for _ in range(200):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect(path)
    s.sendall(frame("hello", {"clientName": "hostile"}))
    s.settimeout(5)
    header = s.recv(4, socket.MSG_WAITALL)
    body = s.recv(struct.unpack(">I", header)[0], socket.MSG_WAITALL) if len(header) == 4 else b""
    if b"helloReply" in body: held.append(s)
# Presenters that never answer: on the container, on Documents, on its own files.
targets = [[app], [app, "Documents"]] + [[app, "Documents", "hostile-%d" % n] for n in range(50)]
for index, s in enumerate(held[:2]):
    try:   # past the user's share the daemon may close the connection
        s.sendall(b"".join(frame("addPresenter", {"presenter": "p%d-%d" % (index, i), "path": targets[i % len(targets)]})
                           for i in range(6000)))
    except OSError:
        pass
# Its presenters' messages are read, never answered: the daemon keeps these clients (one that
# left 4 MiB unread would be dropped).
def drain(s):
    try:
        while s.recv(65536):
            pass
    except OSError:
        pass
for s in held[:2]:
    threading.Thread(target=drain, args=(s,), daemon=True).start()
# Half-sent frames.
for s in held[2:40]:
    try:
        s.sendall(struct.pack(">I", 1 << 20) + b"x" * ((1 << 20) - 1))
    except OSError:
        pass
print(json.dumps({"connections": len(held), "holding": holder.poll() is None}), flush=True)
try:
    time.sleep(3600)
finally:
    holder.kill()
'''


def ordinary_round(home, rounds):
    runs = [subprocess.Popen([sys.executable, "-c", ORDINARY, str(rounds), "root"], cwd=home, stdout=subprocess.PIPE),
            subprocess.Popen(as_user(ORDINARY_UID) + ["/usr/bin/python3", "-c", ORDINARY, str(rounds), "user"],
                             cwd=home, stdout=subprocess.PIPE)]
    merged = {}
    for run in runs:
        out, _ = run.communicate(timeout=1800)
        if run.returncode != 0:
            raise RuntimeError("an ordinary user's run failed")
        for name, values in json.loads(out).items():
            merged.setdefault(name, []).extend(values)
    return merged


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="containerfs-hostile-")
    os.chmod(scratch, 0o755)
    mountpoint = os.path.join(scratch, "mnt")
    os.mkdir(mountpoint)
    env = dict(os.environ, XDG_DATA_HOME=os.path.join(scratch, "data"))
    subprocess.run([args.binary, "mount", "--demo", mountpoint, "-o", "allow_other"], env=env, check=True)
    hostile = None
    try:
        home = os.path.join(mountpoint, APP)
        # Documents is fixed through the mount: opened to everyone in the store itself.
        os.chmod(os.path.join(scratch, "data/containerfs/demo/containers", APP, "Documents"), 0o1777)
        time.sleep(1.5)   # the kernel's cached attributes of Documents expire
        quiet = ordinary_round(home, args.rounds)
        print("ordinary users alone: done", file=sys.stderr, flush=True)
        hostile = subprocess.Popen(as_user(HOSTILE_UID) + ["/usr/bin/python3", "-c", HOSTILE, args.binary, APP],
                                   cwd=home, stdout=subprocess.PIPE, text=True)
        got = json.loads(hostile.stdout.readline())
        print("hostile user in place: %d connections" % got["connections"], file=sys.stderr, flush=True)
        beside = ordinary_round(home, args.rounds)
        print("hostile user held %d control connections (of 200 tried), 12,000 presenters asked for, "
              "%s, 38 half-sent 1 MiB frames" % (got["connections"], "a coordinated write" if got["holding"]
                                                   else "no coordinated write (refused)"))
        print("%-14s %12s %12s %14s %14s" % ("operation", "p50 alone", "p99 alone", "p50 beside", "p99 beside"))
        for name in quiet:
            print("%-14s %10.2f ms %10.2f ms %12.2f ms %12.2f ms" % (
                name, percentile(quiet[name], 0.5), percentile(quiet[name], 0.99),
                percentile(beside[name], 0.5), percentile(beside[name], 0.99)))
    finally:
        if hostile is not None:
            hostile.kill()
            hostile.wait()
        # Whatever the users left running (the hostile user's coordinate and its command) holds
        # the mount busy; nothing else runs as these test users.
        for uid in (HOSTILE_UID, ORDINARY_UID):
            subprocess.run(["pkill", "-KILL", "-U", str(uid)])
        subprocess.run(["fusermount3", "-u", "-z", mountpoint])
        time.sleep(1)
        subprocess.run(["rm", "-rf", scratch])


if __name__ == "__main__":
    main()
