#!/usr/bin/env bash
# pjdfstest on a plain directory and in a mount, side by side (docs/conformance.md). Needs root.
# Usage: scripts/conformance.sh [--source DIR] [--only DIR...] [--jobs N]
# --source: pjdfstest's sources, or a git repository of them (default: its public repository).
set -euo pipefail
cd "$(dirname "$0")/.."
source=""
if [ "${1:-}" = "--source" ]; then source="$2"; shift 2; fi
scripts/setup.sh autoconf automake make gcc
source="$(scripts/suite-source.sh pjdfstest https://github.com/pjd/pjdfstest configure.ac "$source")"
exec python3 scripts/conformance.py "$(scripts/build.sh --release)" "$source" "$@"
