#!/usr/bin/env bash
# Sets up, builds and runs every test. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="/opt/swift/usr/bin:$PATH"
swift build --build-tests
swift test --skip-build "$@"
