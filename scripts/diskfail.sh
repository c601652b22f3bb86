#!/usr/bin/env bash
# Kills the store's disk under a mount and checks that every change the disk could not take was
# reported and left the previous version (scripts/diskfail.py; --filesystems ext4,xfs,btrfs).
exec "$(dirname "$0")/powerloss.sh" --disk-fails "$@"
