#!/usr/bin/env bash
# Sets up, builds, and mounts the demo store (two apps with bundles, documents and Inbox files).
# Usage: scripts/demo.sh [MOUNTPOINT]    (default /tmp/containerfs-demo)
set -euo pipefail
cd "$(dirname "$0")/.."
binary="$(scripts/build.sh)"
mountpoint="${1:-/tmp/containerfs-demo}"
mkdir -p "$mountpoint"
if grep -q " $mountpoint fuse.containerfs " /proc/mounts; then
  "$binary" unmount "$mountpoint"
fi
"$binary" mount --demo "$mountpoint"
cat <<TOUR

The demo store is mounted at $mountpoint. Look around:

  ls $mountpoint                                   one folder per app
  ls $mountpoint/com.example.notes                 Notes.app  Documents  Library  tmp
  cat $mountpoint/com.example.notes/Documents/Welcome.md
  echo hello > $mountpoint/com.example.notes/Notes.app/x           read-only bundle: EROFS
  ls $mountpoint/com.example.notes/Documents/Inbox                 files sent to the app
  mv $mountpoint/com.example.notes/Documents/Inbox/report.csv $mountpoint/com.example.notes/Documents/

The binary is $binary. Unmount with:

  $binary unmount $mountpoint
TOUR
