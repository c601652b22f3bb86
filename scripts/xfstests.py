#!/usr/bin/env python3
"""xfstests on native ext4 and through a ContainerFS mount, side by side (docs/conformance.md).

Builds xfstests from its sources and runs the same tests twice in one run: on ext4 loop images
(TEST_DEV and SCRATCH_DEV), and with FSTYP=fuse on ContainerFS mounts whose root is a directory of
an app's Documents (`-o app=ID,root=Documents/xfstests`), with stores on an ext4 loop image of the
same size. A test that passes on ext4 and not through the mount (failed, or not run) is unexplained
unless docs/conformance.md lists it (a line "- `generic/NNN`: reason" under "xfstests"). Exits 1 if
any is unexplained.

Whatever happens, the mounts are taken down, the loop devices detached and the work directory
removed; a mount helper installed for the run is removed again.

Usage: xfstests.py CONTAINERFS_BINARY XFSTESTS_SOURCE [--group quick] [--tests generic/001 ...]
                   [--image-size 6G] [--test-limit SECONDS] [--keep-results DIR]
"""
import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree

APP = "org.xfstests"
USERS = ["fsgqa", "fsgqa2", "123456-fsgqa"]
HELPER = "/sbin/mount.fuse.containerfs"


def run(command, **kwargs):
    return subprocess.run(command, check=True, **kwargs)


def build(source, into):
    run(["cp", "-a", source + "/.", into])
    run(["make", "-s", "-j%d" % (os.cpu_count() or 2)], cwd=into, stdout=subprocess.DEVNULL)
    return into


def tests_of_group(suite, group):
    tests = []
    for line in open(os.path.join(suite, "tests/generic/group.list"), encoding="utf-8"):
        fields = line.split()
        if fields and fields[0].isdigit() and group in fields[1:]:
            tests.append("generic/" + fields[0])
    return tests


def double(size):
    """Twice a size as truncate(1) takes it ("6G" gives "12G")."""
    match = re.fullmatch(r"(\d+)([KMGT]?)", size)
    if not match:
        raise SystemExit("xfstests: --image-size takes a number and an optional K, M, G or T: %s" % size)
    return "%d%s" % (2 * int(match.group(1)), match.group(2))


def ensure_users():
    """The users and group xfstests runs its permission tests as."""
    def group_exists(name):
        return subprocess.run(["getent", "group", name], stdout=subprocess.DEVNULL).returncode == 0

    for user in USERS:
        if subprocess.run(["id", user], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
            # useradd refuses to make a user's own group where a group of that name exists already
            # (made by hand, or by a run that stopped before its users): the user joins it instead.
            run(["useradd", "-m"] + (["-g", user] if group_exists(user) else []) + [user])
            print("xfstests: added the user %s" % user)
    if not group_exists("fsgqa"):
        run(["groupadd", "fsgqa"])
        print("xfstests: added the group fsgqa")


class Run:
    """The run's loop devices, mounts and helper, all undone by `close`."""

    def __init__(self, work):
        self.work = work
        self.loops = []
        self.mounts = []
        self.helper_backup = None
        self.helper_installed = False

    def image(self, name, size):
        path = os.path.join(self.work, name + ".img")
        run(["truncate", "-s", size, path])
        run(["mkfs.ext4", "-q", "-F", path])
        device = subprocess.run(["losetup", "-f", "--show", path], check=True, capture_output=True,
                                text=True).stdout.strip()
        self.loops.append(device)
        return device

    def mount(self, device, at):
        os.makedirs(at, exist_ok=True)
        run(["mount", device, at])
        self.mounts.append(at)

    def install_helper(self, source):
        if os.path.exists(HELPER):
            if open(HELPER, "rb").read() == open(source, "rb").read():
                return
            self.helper_backup = os.path.join(self.work, "helper.saved")
            shutil.copy2(HELPER, self.helper_backup)
        shutil.copy2(source, HELPER)
        os.chmod(HELPER, 0o755)
        self.helper_installed = True

    def close(self):
        # FUSE mounts the suite left (an interrupted test), then ours.
        for line in reversed(open("/proc/mounts", encoding="utf-8").read().splitlines()):
            target = line.split()[1]
            if target.startswith(self.work + "/"):
                if subprocess.run(["umount", target], stderr=subprocess.DEVNULL).returncode != 0:
                    subprocess.run(["umount", "-l", target])
        for device in self.loops:
            subprocess.run(["losetup", "-d", device])
        if self.helper_installed:
            if self.helper_backup:
                shutil.copy2(self.helper_backup, HELPER)
            else:
                os.unlink(HELPER)
        # Daemons leave once unmounted; give them a moment before their stores go.
        time.sleep(1)
        subprocess.run(["rm", "-rf", self.work])


def write_config(path, settings):
    with open(path, "w", encoding="utf-8") as config:
        for key, value in settings.items():
            config.write("export %s=%s\n" % (key, shlex.quote(value)))


def kill_test(test):
    """Kills a test that hangs, with everything it started, however deep (a program run in a
    pipeline is a grandchild, and one left alive keeps the test filesystem busy for every later
    test's remount): check then goes on to the next."""
    found = subprocess.run(["pgrep", "-f", "/tests/" + test + "$"], capture_output=True, text=True).stdout.split()
    tree = []
    for pid in found:
        tree += [pid] + descendants(pid)
    # Stopped first, so that none starts another meanwhile.
    for signal_name in ("-STOP", "-KILL"):
        for pid in tree:
            subprocess.run(["kill", signal_name, pid], stderr=subprocess.DEVNULL)


def descendants(pid):
    """The processes below `pid`, children first."""
    children = {}
    listing = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    for line in listing.splitlines():
        child, parent = line.split()
        children.setdefault(parent, []).append(child)
    found, pending = [], [pid]
    while pending:
        for child in children.get(pending.pop(0), []):
            found.append(child)
            pending.append(child)
    return found


def check(suite, config, base, tests, log, limit):
    """Runs xfstests' check, killing a test that runs longer than `limit` seconds (xfstests has no
    limit of its own; a test waiting for what a mount does not do would stop the run); returns
    {test: ("pass" | "fail" | "notrun", message)} and the seconds it took."""
    started = time.monotonic()
    killed = {}
    with open(log, "w", encoding="utf-8") as output:
        run = subprocess.Popen(["./check", "-R", "xunit"] + tests, cwd=suite, stdout=output, stderr=subprocess.STDOUT,
                               env=dict(os.environ, HOST_OPTIONS=config))
        current, since = None, time.monotonic()
        while run.poll() is None:
            time.sleep(5)
            lines = open(log, encoding="utf-8", errors="replace").read().splitlines()
            last = next((line.split()[0] for line in reversed(lines) if line.startswith("generic/")), None)
            if last != current:
                current, since = last, time.monotonic()
            elif current and time.monotonic() - since > limit and current not in killed:
                killed[current] = True
                kill_test(current)
    elapsed = time.monotonic() - started
    results = {}
    report = os.path.join(base, "result.xml")
    if os.path.exists(report):
        for case in ElementTree.parse(report).getroot().iter("testcase"):
            name = case.get("name")
            skipped, failure = case.find("skipped"), case.find("failure")
            if skipped is not None:
                results[name] = ("notrun", skipped.get("message", ""))
            elif failure is not None:
                results[name] = ("fail", failure.get("message", ""))
            else:
                results[name] = ("pass", "")
    for test in tests:
        results.setdefault(test, ("fail", "no result (see %s)" % log))
    for test in killed:
        results[test] = ("fail", "killed after %d s without an end" % limit)
    return results, elapsed


def expected_failures(path):
    """docs/conformance.md's xfstests list: {test: reason}, from lines "- `generic/NNN`, ...: reason"
    (a reason may go on over the next indented lines) under a heading with "xfstests" and "expected"."""
    expected, inside = {}, False
    for line in open(path, encoding="utf-8"):
        if line.startswith("## "):
            inside = "xfstests" in line.lower() and "expected" in line.lower()
        if inside and line.startswith("- "):
            names, _, reason = line[2:].partition(": ")
            for name in re.findall(r"`(generic/\d+)`", names):
                expected[name] = reason.strip()
    return expected


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("source")
    parser.add_argument("--group", default="quick")
    parser.add_argument("--tests", nargs="*", default=[])
    parser.add_argument("--image-size", default="6G")
    parser.add_argument("--test-limit", type=int, default=600, help="seconds before a test is killed")
    parser.add_argument("--keep-results", help="copy both sides' results and logs here")
    args = parser.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    expected = expected_failures(os.path.join(root, "docs/conformance.md"))

    ensure_users()
    work = tempfile.mkdtemp(prefix="containerfs-xfstests-", dir="/var/tmp")
    os.chmod(work, 0o755)
    setup = Run(work)
    try:
        suite = build(args.source, os.path.join(work, "xfstests"))
        tests = args.tests or tests_of_group(suite, args.group)
        # Native ext4.
        native = {
            "TEST_DEV": setup.image("native-test", args.image_size), "TEST_DIR": work + "/native/test",
            "SCRATCH_DEV": setup.image("native-scratch", args.image_size), "SCRATCH_MNT": work + "/native/scratch",
            "FSTYP": "ext4", "RESULT_BASE": work + "/results/native",
        }
        for key in ("TEST_DIR", "SCRATCH_MNT"):
            os.makedirs(native[key])
        # ContainerFS: a store for each mount on an ext4 image; the sources are only names
        # (`store=` says where the store is), so that umount of the source finds the mount.
        # Both stores share one image: twice the size, so that each has what a native image has
        # free (tests that need gigabytes free check).
        setup.mount(setup.image("backing", double(args.image_size)), work + "/backing")
        bundle = work + "/backing/X.app"
        os.makedirs(bundle)
        open(bundle + "/X", "w").close()
        for name in ("test", "scratch"):
            store = work + "/backing/" + name
            run([args.binary, "install", store, bundle, "--id", APP], stdout=subprocess.DEVNULL)
            os.makedirs(store + "/containers/" + APP + "/Documents/xfstests")
        setup.install_helper(os.path.join(root, "mount-helpers/mount.fuse.containerfs"))

        def options(name):
            # subtype= (empty): the type "fuse" that xfstests checks a FUSE mount for.
            return "-o store=%s/backing/%s,app=%s,root=Documents/xfstests,allow_other,subtype=" % (work, name, APP)
        ours = {
            "TEST_DEV": "containerfs-xfstests-test", "TEST_DIR": work + "/containerfs/test",
            "SCRATCH_DEV": "containerfs-xfstests-scratch", "SCRATCH_MNT": work + "/containerfs/scratch",
            "FSTYP": "fuse", "FUSE_SUBTYP": ".containerfs", "TEST_FS_MOUNT_OPTS": options("test"),
            "MOUNT_OPTIONS": options("scratch"), "RESULT_BASE": work + "/results/containerfs",
            "CONTAINERFS": args.binary,
        }
        for key in ("TEST_DIR", "SCRATCH_MNT"):
            os.makedirs(ours[key])
        write_config(work + "/native.config", native)
        write_config(work + "/containerfs.config", ours)
        print("xfstests: %d tests (%s), native ext4 first" % (len(tests), args.group if not args.tests else "as given"),
              flush=True)
        plain, plain_time = check(suite, work + "/native.config", native["RESULT_BASE"], tests, work + "/native.log",
                                  args.test_limit)
        print("xfstests: ContainerFS", flush=True)
        mounted, mounted_time = check(suite, work + "/containerfs.config", ours["RESULT_BASE"], tests,
                                      work + "/containerfs.log", args.test_limit)
        if args.keep_results:
            os.makedirs(args.keep_results, exist_ok=True)
            for name in ("native.log", "containerfs.log", "results"):
                subprocess.run(["cp", "-a", os.path.join(work, name), args.keep_results])
    finally:
        setup.close()

    def tally(results):
        counts = {"pass": 0, "fail": 0, "notrun": 0}
        for outcome, _ in results.values():
            counts[outcome] += 1
        return counts
    unexplained, explained, only_here = [], [], []
    for test in tests:
        if plain[test][0] != "pass" or mounted[test][0] == "pass":
            if mounted[test][0] == "pass" and plain[test][0] != "pass":
                only_here.append(test)
            continue
        (explained if test in expected else unexplained).append(test)
    a, b = tally(plain), tally(mounted)
    print("xfstests generic, %d tests" % len(tests))
    print("  native ext4:  %d passed, %d failed, %d not run (%.0f s)" % (a["pass"], a["fail"], a["notrun"], plain_time))
    print("  ContainerFS:  %d passed, %d failed, %d not run (%.0f s)" % (b["pass"], b["fail"], b["notrun"], mounted_time))
    print("  passing on ext4 only: %d listed in docs/conformance.md, %d not" % (len(explained), len(unexplained)))
    if only_here:
        print("  passing in ContainerFS only: %s" % " ".join(only_here))
    for test in unexplained:
        outcome, message = mounted[test]
        print("  UNEXPLAINED %s: %s %s" % (test, outcome, message.splitlines()[0] if message else ""))
    sys.exit(1 if unexplained else 0)


if __name__ == "__main__":
    main()
