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
  libucx-dev            # the ucx transport (transports/ucx/; optional in CMake: CHORUS_UCX)
  libibverbs-dev        # the ibverbs transport (transports/ibverbs/; rdma-core; optional: CHORUS_IBVERBS)
  ibverbs-providers     # rdma-core's device drivers (mlx5, rxe, efa, ...), needed where an RDMA device exists
  openmpi-bin libopenmpi-dev  # perf/compare baseline (Open MPI)
  libgloo-dev           # perf/compare baseline (Gloo, PyTorch's CPU backend)
  iproute2              # emulated hosts (network namespaces)
  libopenblas-dev       # the reference trainer's matrix products (trainer/ is built only when OpenBLAS is found)
  gnuplot-nox           # the reference trainer's loss-curve plot (loss.png)
)

# Optional, not installed here: the CUDA toolkit (nvcc), for CHORUS_CUDA=ON/AUTO (docs/cuda.md). Without it AUTO
# builds without CUDA. Use NVIDIA's toolkit (CUDA 12 or later, e.g. /usr/local/cuda) or Debian non-free's
# nvidia-cuda-toolkit where its version is recent enough for sm_90.

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
