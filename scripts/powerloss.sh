#!/usr/bin/env bash
# Cuts the power under a mount (FS_IOC_SHUTDOWN on a loop-mounted ext4 and XFS image) and checks
# that everything fsync promised is there. Arguments go to powerloss.py (--random-cuts N, --seed S,
# --filesystems ext4,xfs, --quick). Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="/opt/swift/usr/bin:$PATH"
swift build
exec python3 scripts/powerloss.py --binary "$(swift build --show-bin-path)/containerfs" "$@"
