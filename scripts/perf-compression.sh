#!/usr/bin/env bash
# Compressed all-reduce on emulated hosts (issue 4): 2 hosts x 2 ranks in network namespaces, 1 Gbit/s each way
# between hosts (shm inside a host, tcp between), float32 sum, side by side in one run: the fp32 ring, and with
# compression int8 and int4 quantize-once (two-level: exact inside a host), int8 hierarchical (the inter-host ring
# coded), the re-quantizing int8 ring, the one-level quantize-once for comparison, and int8 quantize-once with the
# Hadamard rotation. Reports effective busbw (uncompressed bytes over time), its ratio to the fp32 ring, and
# the relative L2 error against an fp64 reference. Root only.
# Output: docs/perf/compression-emulated-<date>.md and the raw JSON under docs/perf/raw/compression-<date>/.
# Usage: sudo scripts/perf-compression.sh [bytes]   (default 64M)
set -euo pipefail
cd "$(dirname "$0")/.."
bytes=${1:-64M}
rate=${RATE:-1gbit}
out=${OUT:-docs/perf}
bin=${CHORUS_BUILD:-build/release}
prefix=chorus-zperf
[ "$(id -u)" -eq 0 ] || { echo "perf-compression: must run as root (network namespaces and tc)" >&2; exit 2; }
[ "${SKIP_BUILD:-0}" = 1 ] || bash scripts/build.sh chorusrun all_reduce_perf
stamp=$(date -u +%Y-%m-%d)
raw="$out/raw/compression-$stamp"
mkdir -p "$raw"
trap 'bash scripts/netns-hosts.sh down --prefix "$prefix" > /dev/null || true' EXIT
bash scripts/netns-hosts.sh up 2 --rate "$rate" --prefix "$prefix" > /dev/null
cases=("fp32-ring|-A ring" "int8-qonce|-Z int8 -A qonce" "int4-qonce|-Z int4 -A qonce" "int8-hier|-Z int8 -A hier"
  "int8-ring|-Z int8 -A ring" "int8-qonce-flat|-Z int8 -A qonce-flat" "int4-qonce-flat|-Z int4 -A qonce-flat"
  "int8-qonce-rht|-Z int8:rht -A qonce")
for c in "${cases[@]}"; do
  name=${c%%|*}
  flags=${c#*|}
  echo "== $name"
  # shellcheck disable=SC2086
  "$bin/chorusrun" -n 4 --hosts 2 --netns-prefix "$prefix" --timeout 900 "$bin/perf/all_reduce_perf" $flags \
    -b "$bytes" -e "$bytes" -n "${ITERS:-4}" -w 1 -c 1 -J "$raw/$name.json" | grep -vE '^#  Rank' | tail -n 4
done
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
python3 - "$raw" "$stamp" "$commit" "$rate" "$bytes" > "$out/compression-emulated-$stamp.md" <<'PY'
import json, sys
raw, stamp, commit, rate, size = sys.argv[1:]
names = ["fp32-ring", "int8-qonce", "int4-qonce", "int8-hier", "int8-ring", "int8-qonce-flat", "int4-qonce-flat",
         "int8-qonce-rht"]
rows = {n: [r for r in json.load(open(f"{raw}/{n}.json")) if not r["inplace"]][0] for n in names}
base = rows["fp32-ring"]["busbw"]
print(f"# Compressed all-reduce on emulated hosts, {stamp}, commit {commit}\n")
print(f"2 hosts x 2 ranks (network namespaces; shm inside a host, tcp between, {rate} each way per host), float32 "
      f"sum of {size} per rank, out of place, mean over iterations, all in one run of "
      "`sudo bash scripts/perf-compression.sh`. Effective busbw counts the uncompressed bytes "
      "(2(N-1)/N x size / time); relative L2 error is against an fp64 reference of the same pseudo-normal inputs.\n")
print("| schedule | time (ms) | effective busbw (GB/s) | vs fp32 ring | relative L2 error | target |")
print("|---|---|---|---|---|---|")
targets = {"int8-qonce": ">= 3.0x", "int4-qonce": ">= 5.5x", "int8-hier": ">= 3.0x"}
for n in names:
    r = rows[n]
    err = r.get("rel_error")
    print(f"| {n} | {r['time_us']/1e3:.1f} | {r['busbw']:.3f} | {r['busbw']/base:.2f}x | "
          f"{'%.1e' % err if err is not None else 'exact'} | {targets.get(n, '')} |")
PY
echo "wrote $out/compression-emulated-$stamp.md"
