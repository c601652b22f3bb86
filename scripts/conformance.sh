#!/usr/bin/env bash
# pjdfstest on a plain directory and in a mount, side by side (docs/conformance.md). Needs root.
# Usage: scripts/conformance.sh [--source DIR] [--only DIR...] [--jobs N]
# --source: pjdfstest's sources, or a git repository of them (default: its public repository).
set -euo pipefail
cd "$(dirname "$0")/.."
source=""
if [ "${1:-}" = "--source" ]; then source="$2"; shift 2; fi
scripts/setup.sh
for tool in autoreconf:autoconf aclocal:automake make:make cc:gcc; do
  command -v "${tool%%:*}" >/dev/null || { echo "conformance: installing ${tool##*:}"; apt-get install -y -qq "${tool##*:}" >/dev/null; }
done
# A git repository (a URL, or a clone without a work tree) is cloned into .build/conformance.
if [ -z "$source" ] || [ ! -f "$source/configure.ac" ]; then
  origin="${source:-https://github.com/pjd/pjdfstest}"
  source=.build/conformance/pjdfstest
  rm -rf "$source"
  mkdir -p .build/conformance
  git clone -q "$origin" "$source"
fi
export PATH="/opt/swift/usr/bin:$PATH"
swift build -c release --product containerfs >&2
exec python3 scripts/conformance.py "$(swift build -c release --show-bin-path)/containerfs" "$(cd "$source" && pwd)" "$@"
