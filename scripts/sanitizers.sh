#!/usr/bin/env bash
# Runs the whole test suite with AddressSanitizer, then ThreadSanitizer. The daemon the tests
# mount is built with the same sanitizer, so its findings fail the tests that drive it.
# Usage: scripts/sanitizers.sh [address|thread]...   (default: both)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="/opt/swift/usr/bin:$PATH"
for sanitizer in "${@:-address thread}"; do
  for kind in $sanitizer; do
    echo "== $kind sanitizer"
    swift build --build-tests -Xswiftc -sanitize="$kind" --scratch-path ".build-$kind"
    # CONTAINERFS_SANITIZER lets the tests that a sanitizer cannot judge say so and skip.
    CONTAINERFS_SANITIZER="$kind" ASAN_OPTIONS=detect_leaks=0 TSAN_OPTIONS=halt_on_error=1 \
      swift test --skip-build -Xswiftc -sanitize="$kind" --scratch-path ".build-$kind"
  done
done
