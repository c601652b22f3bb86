#!/usr/bin/env bash
# Fails one system call of the daemon at a time during one operation, then crashes it, and checks
# that what the daemon reported still holds after the next mount (scripts/faultsweep.py: --quick,
# --kinds, --calls, --nths, --pairs). Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="/opt/swift/usr/bin:$PATH"
swift build
exec python3 scripts/faultsweep.py --binary "$(swift build --show-bin-path)/containerfs" "$@"
