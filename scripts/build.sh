#!/usr/bin/env bash
# Sets up, builds the containerfs command, and prints the binary's path (used by the other scripts).
# --release: the optimized binary, with the Swift runtime and Foundation linked in (not loaded from
# the toolchain), so that an installed copy runs without /opt/swift and the daemon maps less. Linked
# by the toolchain's lld with packed relative relocations (DT_RELR, glibc 2.36 and later): the
# loader reads 36 KiB of them at start instead of 2 MiB (about 1.2 MiB less resident at idle).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >&2
export PATH="/opt/swift/usr/bin:$PATH"
flags=()
if [ "${1:-}" = "--release" ]; then
  flags=(-c release --static-swift-stdlib -Xswiftc -use-ld=lld -Xlinker -z -Xlinker pack-relative-relocs)
fi
# A static link prints glibc's link-time warning about mktemp, which Foundation's own
# createTemporaryFile references: nothing this project can change, so it is not shown.
swift build "${flags[@]}" --product containerfs 2>&1 | { grep -v "the use of \`mktemp' is dangerous" || true; } >&2
echo "$(swift build "${flags[@]}" --show-bin-path)/containerfs"
