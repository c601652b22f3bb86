#!/usr/bin/env bash
# Kills the store's disk under a mount (ext4 and XFS images inside a loop-mounted ext4 image that is
# shut down) and checks that every change that could not be made durable was reported and left the
# previous version. Arguments go to diskfail.py (--filesystems ext4,xfs). Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="/opt/swift/usr/bin:$PATH"
swift build
exec python3 scripts/diskfail.py --binary "$(swift build --show-bin-path)/containerfs" "$@"
