#!/usr/bin/env bash
# The whole test suite with FUSE over io_uring on for every mount (docs/io-uring.md): turns on the
# fuse module's enable_uring (root), runs scripts/test.sh with the arguments given, and puts the
# switch back as it was, whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
switch=/sys/module/fuse/parameters/enable_uring
if [ ! -e "$switch" ]; then
  echo "test-io-uring: this kernel's fuse module has no io_uring (Linux 6.14 and later, CONFIG_FUSE_IO_URING)" >&2
  exit 1
fi
was="$(cat "$switch")"
trap 'echo "$was" > "$switch" || echo "test-io-uring: could not set $switch back to $was" >&2' EXIT
echo 1 > "$switch"
scripts/test.sh "$@"
