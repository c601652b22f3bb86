#!/usr/bin/env bash
# xfstests' generic tests (the quick group by default) on native ext4 and through a ContainerFS
# mount, side by side (docs/conformance.md). Needs root; takes about an hour for the quick group.
# Usage: scripts/xfstests.sh [--source DIR] [--group NAME | --tests generic/001 ...] [--keep-results DIR]
# --source: xfstests' sources, or a git repository of them (default: its public repository).
set -euo pipefail
cd "$(dirname "$0")/.."
source=""
if [ "${1:-}" = "--source" ]; then source="$2"; shift 2; fi
[ "$(id -u)" = 0 ] || { echo "xfstests: run as root: it makes loop devices, users and mounts" >&2; exit 1; }
# What xfstests' README asks for on Debian, less what only other filesystems use.
scripts/setup.sh acl attr automake bc e2fsprogs fio gawk gcc git indent libacl1-dev libaio-dev libattr1-dev \
  libcap-dev libgdbm-dev libgdbm-compat-dev libtool libtool-bin liburing-dev make psmisc python3 quota sed \
  uuid-dev uuid-runtime xfsprogs xfslibs-dev
source="$(scripts/suite-source.sh xfstests https://github.com/kdave/xfstests check "$source")"
exec python3 scripts/xfstests.py "$(scripts/build.sh --release)" "$source" "$@"
