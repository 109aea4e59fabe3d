#!/usr/bin/env bash
# Installs what is missing, builds the release preset and runs every test suite with ctest: unit (one process,
# ranks as threads), multiproc (real processes over shm, tcp and UCX, started by chorusrun; ibverbs where an RDMA
# device exists). Suites that need something this machine lacks skip themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-deps.sh
bash scripts/build.sh
jobs=$(nproc 2>/dev/null || echo 2)
ctest --preset release -j "$jobs" --timeout 900
