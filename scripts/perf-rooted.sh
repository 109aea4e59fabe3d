#!/usr/bin/env bash
# Side by side, in one run: Chorus gather_perf and scatter_perf (processes under chorusrun over shm, the selector's
# choice, then each algorithm forced with CHORUS_ALGO) and Open MPI's MPI_Gather / MPI_Scatter (btl vader) through
# perf/compare, 4 ranks, root 2, float, 128 B to 64 MiB (the root's whole buffer). Writes a markdown table and the
# raw JSON under docs/perf/ (or $OUT).
# Usage: scripts/perf-rooted.sh [nranks]   (default 4)
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-4}
out=${OUT:-docs/perf}
bin=build/release
bash scripts/build.sh chorusrun gather_perf scatter_perf mpi_gather_perf mpi_scatter_perf
stamp=$(date -u +%Y-%m-%d)
raw="$out/raw/rooted-$stamp"
mkdir -p "$raw"
sweep=(-b 128 -e 64M -f 4 -n 200 -w 10 -r 2)
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$n" --mca btl self,vader)
for coll in gather scatter; do
  echo "== $coll, $n ranks"
  env CHORUS_TRANSPORTS=shm "$bin/chorusrun" -n "$n" "$bin/perf/${coll}_perf" "${sweep[@]}" -J "$raw/chorus-$coll.json" |
    tail -n 1
  for algo in linear binomial; do
    env CHORUS_TRANSPORTS=shm CHORUS_ALGO="$coll:$algo" "$bin/chorusrun" -n "$n" "$bin/perf/${coll}_perf" "${sweep[@]}" \
      -J "$raw/chorus-$coll-$algo.json" | tail -n 1
  done
  "${mpirun[@]}" "$bin/perf/mpi_${coll}_perf" "${sweep[@]}" -J "$raw/mpi-$coll.json" | tail -n 1
done
python3 - "$raw" "$n" > "$out/rooted-vs-openmpi-$stamp.table.md" <<'PY'
import json, sys
raw, n = sys.argv[1], sys.argv[2]
def load(name):
    return {r["size"]: r["time_us"] for r in json.load(open(f"{raw}/{name}.json")) if not r["inplace"]}
for coll in ("gather", "scatter"):
    cols = [("chorus (selector)", f"chorus-{coll}"), ("chorus linear", f"chorus-{coll}-linear"),
            ("chorus binomial", f"chorus-{coll}-binomial"), ("Open MPI vader", f"mpi-{coll}")]
    data = [load(f) for _, f in cols]
    print(f"\n## {coll}, {n} ranks, root 2, out of place, time in us\n")
    print("| size | " + " | ".join(c for c, _ in cols) + " | x (MPI / selector) |")
    print("|---" * (len(cols) + 2) + "|")
    for size in sorted(data[0]):
        t = [d.get(size) for d in data]
        ratio = f"{t[3] / t[0]:.2f}" if t[0] and t[3] else "-"
        print(f"| {size} | " + " | ".join(f"{x:.1f}" if x is not None else "-" for x in t) + f" | {ratio} |")
PY
echo "table: $out/rooted-vs-openmpi-$stamp.table.md (goes under the notes of rooted-vs-openmpi-$stamp.md)"
