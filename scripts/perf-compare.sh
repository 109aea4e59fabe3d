#!/usr/bin/env bash
# Side by side, in one run: Chorus all_reduce_perf (processes under chorusrun, over shm and over tcp on loopback),
# Open MPI's MPI_Allreduce (btl vader, btl tcp on lo) and Gloo's allreduce (ring, tcp on loopback) through
# perf/compare, at 2 and 4 ranks, float sum, 8 B to 256 MiB. Writes a markdown table and the raw JSON under
# docs/perf/ (or $OUT).
# Usage: scripts/perf-compare.sh [max_bytes]   (default 256M)
set -euo pipefail
cd "$(dirname "$0")/.."
max=${1:-256M}
# Small sizes need many iterations for a stable mean; large ones are slow (Open MPI moves 0.2 GB/s there).
small_iters=${SMALL_ITERS:-500}
large_iters=${LARGE_ITERS:-20}
out=${OUT:-docs/perf}
bin=build/release
bash scripts/build.sh chorusrun all_reduce_perf mpi_allreduce_perf
# Gloo's column where CMake found libgloo-dev (scripts/setup-deps.sh installs it).
gloo=0
if grep -q 'gloo_allreduce_perf' "$bin/build.ninja"; then
  bash scripts/build.sh gloo_allreduce_perf
  gloo=1
else
  echo "perf-compare: Gloo not found (apt-get install libgloo-dev): no Gloo column" >&2
fi
stamp=$(date -u +%Y-%m-%d)
raw="$out/raw/allreduce-$stamp"
mkdir -p "$raw"
mpirun_flags=(--allow-run-as-root --oversubscribe --bind-to none)
# run NAME -- command...: the sweep in two halves (8 B..1 MiB, 2 MiB..max), JSON merged into NAME.json.
run() {
  local name=$1
  shift 2
  "$@" -b 8 -e 1M -f 2 -n "$small_iters" -w 20 -J "$raw/$name.small.json" | tail -n 2
  "$@" -b 2M -e "$max" -f 2 -n "$large_iters" -w 3 -J "$raw/$name.large.json" | tail -n 2
  python3 -c 'import json,sys; json.dump(json.load(open(sys.argv[1])) + json.load(open(sys.argv[2])), open(sys.argv[3], "w"), indent=1)' \
    "$raw/$name.small.json" "$raw/$name.large.json" "$raw/$name.json"
  rm -f "$raw/$name.small.json" "$raw/$name.large.json"
}
for n in 2 4; do
  echo "== $n ranks"
  run "chorus-shm-$n" -- env CHORUS_TRANSPORTS=shm "$bin/chorusrun" -n "$n" "$bin/perf/all_reduce_perf"
  run "chorus-tcp-$n" -- env CHORUS_TRANSPORTS=tcp CHORUS_SOCKET_IFNAME=lo "$bin/chorusrun" -n "$n" \
    "$bin/perf/all_reduce_perf"
  run "mpi-vader-$n" -- mpirun "${mpirun_flags[@]}" -np "$n" --mca btl self,vader "$bin/perf/mpi_allreduce_perf"
  run "mpi-tcp-$n" -- mpirun "${mpirun_flags[@]}" -np "$n" --mca btl self,tcp --mca btl_tcp_if_include lo \
    "$bin/perf/mpi_allreduce_perf"
  if [ "$gloo" = 1 ]; then run "gloo-tcp-$n" -- "$bin/chorusrun" -n "$n" "$bin/perf/gloo_allreduce_perf"; fi
done
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
python3 scripts/perf_table.py --title "All-reduce, Chorus vs Open MPI and Gloo, $stamp, commit $commit" "$raw" \
  > "$out/allreduce-vs-openmpi-gloo-$stamp.md"
echo "wrote $out/allreduce-vs-openmpi-gloo-$stamp.md"
