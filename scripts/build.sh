#!/usr/bin/env bash
# Sets up, builds the containerfs command, and prints the binary's path (used by the other scripts).
# --release: the optimized binary, with the Swift runtime and Foundation linked in (not loaded from
# the toolchain), so that an installed copy runs without /opt/swift and the daemon maps less.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >&2
export PATH="/opt/swift/usr/bin:$PATH"
flags=()
if [ "${1:-}" = "--release" ]; then flags=(-c release --static-swift-stdlib); fi
# A static link prints glibc's link-time warning about mktemp, which Foundation's own
# createTemporaryFile references: nothing this project can change, so it is not shown.
swift build "${flags[@]}" --product containerfs 2>&1 | { grep -v "the use of \`mktemp' is dangerous" || true; } >&2
echo "$(swift build "${flags[@]}" --show-bin-path)/containerfs"
