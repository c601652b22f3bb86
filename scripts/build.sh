#!/usr/bin/env bash
# Sets up, builds the containerfs command, and prints the binary's path (used by the other scripts).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >&2
export PATH="/opt/swift/usr/bin:$PATH"
swift build --product containerfs >&2
echo "$(swift build --show-bin-path)/containerfs"
