#!/usr/bin/env bash
# Prints the directory of a test suite's sources: SOURCE itself if it holds them (MARKER is one of
# their files), else a clone of SOURCE (a URL, or a clone without a work tree), or of DEFAULT_URL,
# made in .build/NAME/src.
# Usage: scripts/suite-source.sh NAME DEFAULT_URL MARKER [SOURCE]
set -euo pipefail
cd "$(dirname "$0")/.."
name="$1" default="$2" marker="$3" source="${4:-}"
if [ -n "$source" ] && [ -f "$source/$marker" ]; then
  (cd "$source" && pwd)
  exit 0
fi
into=".build/$name/src"
rm -rf "$into"
mkdir -p ".build/$name"
git clone -q "${source:-$default}" "$into" >&2
(cd "$into" && pwd)
