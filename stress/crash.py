#!/usr/bin/env python3
"""Crash rounds: writers rewrite files (in place and by editor-style rename) while the daemon is
killed with SIGKILL; after each remount every file must be its old or its new version, never torn,
and the store must pass `containerfs check`.

Usage: crash.py CONTAINERFS STORE MOUNTPOINT APP [--rounds N] [--files N]
Prints what it tried and the figures; exits 1 on any torn or lost file.
"""
import argparse, glob, json, multiprocessing, os, signal, subprocess, sys, time


def version(index, generation):
    line = f"file-{index}-generation-{generation}-" + "x" * 1000 + "\n"
    return line * 64


def writer(documents, files, start_generation, stop):
    generation = start_generation
    while not stop.is_set():
        generation += 1
        for index in range(files):
            try:
                path = os.path.join(documents, f"f{index}")
                if index % 2:
                    with open(path, "w") as f:
                        f.write(version(index, generation))
                else:
                    temporary = path + f".{os.getpid()}.tmp"
                    with open(temporary, "w") as f:
                        f.write(version(index, generation))
                    os.rename(temporary, path)
            except OSError:
                return


def daemon_pid(store):
    for record in glob.glob(os.path.join(store, "work", "mounts", "*.json")):
        return json.load(open(record))["pid"]
    return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("containerfs")
    parser.add_argument("store")
    parser.add_argument("mountpoint")
    parser.add_argument("app")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--files", type=int, default=40)
    args = parser.parse_args()
    documents = os.path.join(args.mountpoint, args.app, "Documents")
    for index in range(args.files):
        with open(os.path.join(documents, f"f{index}"), "w") as f:
            f.write(version(index, 0))
    checked = torn = lost = faults = 0
    for round_number in range(1, args.rounds + 1):
        stop = multiprocessing.Event()
        writers = [multiprocessing.Process(target=writer, args=(documents, args.files, round_number * 1000, stop))
                   for _ in range(2)]
        for process in writers:
            process.start()
        time.sleep(0.5 + (round_number % 5) * 0.1)
        pid = daemon_pid(args.store)
        os.kill(pid, signal.SIGKILL)
        faults += 1
        stop.set()
        for process in writers:
            process.join(timeout=20)
            if process.is_alive():
                process.kill()
        subprocess.run([args.containerfs, "mount", args.store, args.mountpoint], check=True)
        for index in range(args.files):
            path = os.path.join(documents, f"f{index}")
            checked += 1
            try:
                content = open(path).read()
            except FileNotFoundError:
                lost += 1
                print(f"round {round_number}: f{index} is gone")
                continue
            header = content.split("-x", 1)[0] if content else ""
            parts = header.split("-")
            whole = len(parts) == 4 and content == version(index, int(parts[3]))
            if not whole:
                torn += 1
                print(f"round {round_number}: f{index} is torn ({len(content)} bytes)")
        check = subprocess.run([args.containerfs, "check", args.store], capture_output=True, text=True)
        if check.returncode != 0:
            print(f"round {round_number}: the store fails its check:\n{check.stdout}")
            lost += 1
    print(f"crash rounds: {faults} faults injected (daemon killed mid-write), {checked} files checked, "
          f"{torn} torn, {lost} lost")
    sys.exit(0 if torn == 0 and lost == 0 else 1)


if __name__ == "__main__":
    main()
