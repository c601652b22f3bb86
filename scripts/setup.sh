#!/usr/bin/env bash
# Installs what ContainerFS needs to build, run and test on Debian: libfuse3, ISA-L and the tools the
# tests drive, and any packages named as arguments (the longer suites' tools). Safe to run again:
# it installs only what is missing.
set -euo pipefail

packages=(libfuse3-dev liburing-dev libisal-dev fuse3 pkg-config attr python3 python3-gdbm sqlite3 git vim-tiny rsync tar util-linux bubblewrap
  xfsprogs btrfs-progs python3-lmdb lmdb-utils strace "$@")
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "setup: run as root, or install sudo, to install ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v swift >/dev/null; then
  [ -x /opt/swift/usr/bin/swift ] || { echo "setup: Swift 6 is needed: put it on PATH (or at /opt/swift)" >&2; exit 1; }
fi

if [ ! -e /dev/fuse ]; then
  modprobe fuse 2>/dev/null || true
  [ -e /dev/fuse ] || { echo "setup: /dev/fuse is missing: load the fuse module, or give the container --device /dev/fuse" >&2; exit 1; }
fi
