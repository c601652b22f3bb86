#!/usr/bin/env bash
# The long load test: mounts a scratch store and runs stress/stress.py against it for minutes.
# Then crash rounds (stress/crash.py): the daemon killed mid-write, remounted, every file checked.
# Usage: scripts/stress.sh [SECONDS] [WORKERS] [CRASH_ROUNDS]    (default 300 s, 8 workers, 20 rounds)
set -euo pipefail
cd "$(dirname "$0")/.."
binary="$(scripts/build.sh)"
scratch="$(mktemp -d)"
mountpoint="$scratch/mnt"
mkdir -p "$mountpoint" "$scratch/Stress.app"
echo '<plist/>' > "$scratch/Stress.app/Info.plist"
cleanup() { "$binary" unmount "$mountpoint" 2>/dev/null || fusermount3 -u -z "$mountpoint" 2>/dev/null || true; rm -rf "$scratch"; }
trap cleanup EXIT
"$binary" install "$scratch/store" "$scratch/Stress.app" --id com.example.stress >/dev/null
"$binary" mount "$scratch/store" "$mountpoint"
pid=$(python3 -c "import json,glob; print(json.load(open(glob.glob('$scratch/store/work/mounts/*.json')[0]))['pid'])")
python3 stress/stress.py "$mountpoint/com.example.stress/Documents" --seconds "${1:-300}" --workers "${2:-8}" --daemon-pid "$pid"
# Then faults: the daemon killed in the middle of writes, again and again.
python3 stress/crash.py "$binary" "$scratch/store" "$mountpoint" com.example.stress --rounds "${3:-20}"
