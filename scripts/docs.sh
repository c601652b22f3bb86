#!/usr/bin/env bash
# Builds the client library's DocC documentation (Sources/FileCoordination/FileCoordination.docc)
# into .build/docs/FileCoordination.doccarchive, with the toolchain's docc. Usage: scripts/docs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/opt/swift/usr/bin:$PATH"
# The library's symbols alone (dump-symbol-graph writes every module's).
swift package dump-symbol-graph --minimum-access-level public >&2
graphs=.build/docs/symbol-graphs
rm -rf "$graphs" && mkdir -p "$graphs"
cp "$(swift build --show-bin-path)/../symbolgraph/FileCoordination"*.symbols.json "$graphs/"
mkdir -p .build/docs
docc convert Sources/FileCoordination/FileCoordination.docc --additional-symbol-graph-dir "$graphs" \
  --fallback-display-name FileCoordination --fallback-bundle-identifier org.containerfs.FileCoordination \
  --output-path .build/docs/FileCoordination.doccarchive --warnings-as-errors
echo "docs: .build/docs/FileCoordination.doccarchive (docc preview, or any static web server of its contents)"
