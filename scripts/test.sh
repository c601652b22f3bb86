#!/usr/bin/env bash
# Sets up, builds and runs every test. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="/opt/swift/usr/bin:$PATH"
# The daemon the tests mount, then the tests: after a failed build, --build-tests alone was seen to
# leave the executable as it was.
swift build --product containerfs
swift build --build-tests
# The tests are XCTest; skipping the empty Swift Testing pass keeps the closing line the real count.
swift test --skip-build --disable-swift-testing "$@"
