#!/usr/bin/env bash
# Side by side, in one run: Chorus all_reduce_perf (processes under chorusrun, over shm and over tcp on loopback)
# and Open MPI's MPI_Allreduce through perf/compare (btl vader, btl tcp on lo), at 2 and 4 ranks, float sum,
# 8 B to 256 MiB. Writes a markdown table and the raw JSON under docs/perf/ (or $OUT).
# Usage: scripts/perf-compare.sh [max_bytes]   (default 256M)
set -euo pipefail
cd "$(dirname "$0")/.."
max=${1:-256M}
iters=${ITERS:-10}
out=${OUT:-docs/perf}
bin=build/release
bash scripts/build.sh chorusrun all_reduce_perf mpi_allreduce_perf
stamp=$(date -u +%Y-%m-%d)
raw="$out/raw/allreduce-$stamp"
mkdir -p "$raw"
mpirun_flags=(--allow-run-as-root --oversubscribe --bind-to none)
for n in 2 4; do
  echo "== $n ranks"
  CHORUS_TRANSPORTS=shm "$bin/chorusrun" -n "$n" "$bin/perf/all_reduce_perf" -b 8 -e "$max" -f 2 -n "$iters" -w 2 \
    -J "$raw/chorus-shm-$n.json" | tail -n 3
  CHORUS_TRANSPORTS=tcp CHORUS_SOCKET_IFNAME=lo "$bin/chorusrun" -n "$n" "$bin/perf/all_reduce_perf" -b 8 -e "$max" \
    -f 2 -n "$iters" -w 2 -J "$raw/chorus-tcp-$n.json" | tail -n 3
  mpirun "${mpirun_flags[@]}" -np "$n" --mca btl self,vader "$bin/perf/mpi_allreduce_perf" -b 8 -e "$max" -f 2 \
    -n "$iters" -w 2 -J "$raw/mpi-vader-$n.json" | tail -n 3
  mpirun "${mpirun_flags[@]}" -np "$n" --mca btl self,tcp --mca btl_tcp_if_include lo \
    "$bin/perf/mpi_allreduce_perf" -b 8 -e "$max" -f 2 -n "$iters" -w 2 -J "$raw/mpi-tcp-$n.json" | tail -n 3
done
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
python3 scripts/perf_table.py --title "All-reduce, Chorus vs Open MPI, $stamp, commit $commit" "$raw" \
  > "$out/allreduce-vs-openmpi-$stamp.md"
echo "wrote $out/allreduce-vs-openmpi-$stamp.md"
