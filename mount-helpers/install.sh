#!/usr/bin/env bash
# Installs containerfs (a release build) and its mount helpers system-wide. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
install -m 0755 "$(scripts/build.sh --release)" /usr/local/bin/containerfs
install -m 0755 mount-helpers/mount.fuse.containerfs /sbin/mount.fuse.containerfs
install -m 0644 mount-helpers/containerfs@.service /etc/systemd/system/containerfs@.service
install -d /etc/containerfs /usr/local/share/doc/containerfs
install -m 0644 README.md /usr/local/share/doc/containerfs/README.md
echo "Installed /usr/local/bin/containerfs, /sbin/mount.fuse.containerfs and containerfs@.service."
