#!/usr/bin/env bash
# Configures and builds the release preset (warnings are errors). Usage: scripts/build.sh [targets...]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
cmake --preset release > build-configure.log 2>&1 || { cat build-configure.log; exit 1; }
rm -f build-configure.log
if [ $# -gt 0 ]; then
  cmake --build --preset release -j "$jobs" --target "$@"
else
  cmake --build --preset release -j "$jobs"
fi
