#!/usr/bin/env bash
# The selector's choices for a large cluster that no test machine has: chorus-plan on topologies/cluster-512x8.json
# (512 hosts x 8 H200, NVLink 900 GB/s inside a host, 8 x 400 Gb/s NICs per host), all-reduce from 1 KiB to 4 GiB,
# every candidate's predicted time and bus bandwidth. Writes docs/perf/cluster-512x8-plan-<date>.md.
# Takes minutes and a few GB of memory: the 4096-rank ring and hierarchical programs have O(N^2) steps.
# Usage: scripts/plan-cluster.sh [coll]   (default allreduce)
set -euo pipefail
cd "$(dirname "$0")/.."
coll=${1:-allreduce}
bin=${CHORUS_BUILD:-build/release}
out=${OUT:-docs/perf}
[ "${SKIP_BUILD:-0}" = 1 ] || bash scripts/build.sh chorus-plan
stamp=$(date -u +%Y-%m-%d)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
file="$out/cluster-512x8-plan-$stamp.md"
start=$(date +%s)
table=$("$bin/chorus-plan" --topo topologies/cluster-512x8.json --coll "$coll" --bytes 1K:4G --step 4 --why)
secs=$(($(date +%s) - start))
{
  echo "# $coll on 512 hosts x 8 GPUs, predicted ($stamp, commit $commit)"
  echo
  echo "\`$bin/chorus-plan --topo topologies/cluster-512x8.json --coll $coll --bytes 1K:4G --step 4 --why\`"
  echo "($secs s on the 2-core development machine, most of it generating the 4096-rank programs). Topology: 512"
  echo "hosts x 8 H200, gpu_peer (NVLink) 900 GB/s and 2 us, 8 x 50 GB/s NICs per host (400 GB/s egress and"
  echo "ingress per host), 50 GB/s and 5 us per network connection, reduce and copy 2000 GB/s. Times in us, algbw"
  echo "and busbw in GB/s (nccl-tests definitions). The verifier proves the chosen tree at 4096 ranks and the"
  echo "hierarchical program at 64 x 8 (tests/unit/verifier_test.cc, Verifier.ChosenProgramsForTheClusterAtScale)."
  echo
  echo '```'
  echo "$table"
  echo '```'
} > "$file"
echo "wrote $file"
