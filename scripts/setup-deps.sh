#!/usr/bin/env bash
# Installs the Debian packages Chorus needs to build, test and benchmark. Idempotent: installs only what is
# missing. Needs root (or sudo) when something is missing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libssl-dev            # HMAC for bootstrap and transport authentication
  libgtest-dev          # unit and multi-process tests
  libbenchmark-dev      # microbenchmarks
  nlohmann-json3-dev    # perf tools' JSON output, topology files
  libhwloc-dev          # topology discovery: NUMA nodes, cores, GPUs and NICs (src/topology/discover.cc)
  openmpi-bin libopenmpi-dev  # perf/compare baseline
  iproute2              # emulated hosts (network namespaces)
  libopenblas-dev       # the reference trainer's matrix products (trainer/ is built only when OpenBLAS is found)
  gnuplot-nox           # the reference trainer's loss-curve plot (loss.png)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-deps: every package is installed"
  exit 0
fi
echo "setup-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
