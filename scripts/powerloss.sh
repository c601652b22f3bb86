#!/usr/bin/env bash
# Cuts the power under a mount (FS_IOC_SHUTDOWN on loop-mounted ext4 and XFS images; for btrfs, on
# an ext4 image holding its image) and checks that everything fsync promised is there. Arguments go
# to powerloss.py (--random-cuts N, --seed S, --filesystems ext4,ext4-nojournal,xfs,btrfs, --lower, --quick).
# With --disk-fails first, kills the store's disk instead (diskfail.py: every change the disk
# cannot take is reported and leaves the previous version). Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
harness=scripts/powerloss.py
if [ "${1:-}" = "--disk-fails" ]; then harness=scripts/diskfail.py; shift; fi
scripts/setup.sh
export PATH="/opt/swift/usr/bin:$PATH"
swift build
exec python3 "$harness" --binary "$(swift build --show-bin-path)/containerfs" "$@"
