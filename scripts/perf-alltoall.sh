#!/usr/bin/env bash
# Side by side, in one run: Chorus alltoall_perf (processes under chorusrun over shm: the selector's choice, then
# pairwise and bruck forced with CHORUS_ALGO) and Open MPI's MPI_Alltoall (btl vader) through perf/compare,
# N ranks on one host, float, 64 B to 4 MiB per rank. Writes a markdown table and the raw JSON under docs/perf/
# (or $OUT).
# Usage: scripts/perf-alltoall.sh [nranks]   (default 8)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-8}
out=${OUT:-docs/perf}
bin=build/release
bash scripts/build.sh chorusrun alltoall_perf mpi_alltoall_perf
stamp=$(date -u +%Y-%m-%d)
raw="$out/raw/alltoall-$stamp"
mkdir -p "$raw"
sweep=(-b 64 -e 4M -f 4 -n 100 -w 10)
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$n" --mca btl self,vader)
echo "== alltoall, $n ranks"
env CHORUS_TRANSPORTS=shm "$bin/chorusrun" -n "$n" "$bin/perf/alltoall_perf" "${sweep[@]}" -J "$raw/chorus.json" |
  tail -n 1
for algo in pairwise bruck; do
  env CHORUS_TRANSPORTS=shm CHORUS_ALGO="alltoall:$algo" "$bin/chorusrun" -n "$n" "$bin/perf/alltoall_perf" \
    "${sweep[@]}" -J "$raw/chorus-$algo.json" | tail -n 1
done
"${mpirun[@]}" "$bin/perf/mpi_alltoall_perf" "${sweep[@]}" -J "$raw/mpi.json" | tail -n 1
python3 - "$raw" "$n" > "$out/alltoall-vs-openmpi-$stamp.table.md" <<'PY'
import json, sys
raw, n = sys.argv[1], sys.argv[2]
def load(name):
    return {r["size"]: r["time_us"] for r in json.load(open(f"{raw}/{name}.json")) if not r["inplace"]}
cols = [("chorus (selector)", "chorus"), ("chorus pairwise", "chorus-pairwise"), ("chorus bruck", "chorus-bruck"),
        ("Open MPI vader", "mpi")]
data = [load(f) for _, f in cols]
print(f"\n## all-to-all, {n} ranks, out of place, time in us\n")
print("| size per rank | " + " | ".join(c for c, _ in cols) + " | x (MPI / selector) |")
print("|---" * (len(cols) + 2) + "|")
for size in sorted(data[0]):
    t = [d.get(size) for d in data]
    ratio = f"{t[3] / t[0]:.2f}" if t[0] and t[3] else "-"
    print(f"| {size} | " + " | ".join(f"{x:.1f}" if x is not None else "-" for x in t) + f" | {ratio} |")
PY
echo "table: $out/alltoall-vs-openmpi-$stamp.table.md"
