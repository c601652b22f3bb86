#!/usr/bin/env bash
# A hostile user beside ordinary ones: their latencies (p50, p99) with and without it, release build.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >&2
export PATH="/opt/swift/usr/bin:$PATH"
swift build -c release --product containerfs >&2
exec python3 scripts/hostile.py "$(swift build -c release --show-bin-path)/containerfs" "$@"
