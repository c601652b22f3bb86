#!/usr/bin/env bash
# A hostile user beside ordinary ones: their latencies (p50, p99) with and without it, release build.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/hostile.py "$(scripts/build.sh --release)" "$@"
