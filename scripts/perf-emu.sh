#!/usr/bin/env bash
# Every algorithm side by side on emulated hosts (network namespaces, links shaped to 1 Gbit/s each way; shm inside
# a host, tcp between hosts), in one run: for each setup (2 hosts x 2 ranks, 4 hosts x 2 ranks) and each of
# all-reduce, all-gather and reduce-scatter, the perf tool runs once per algorithm (-A) and once with the selector's
# choice, float32 sum, 4 KiB to 64 MiB in steps of 4 (8 sizes). Then chorus-tune measures the link classes of the
# same setup, and scripts/perf_emu_table.py compares the simulator's predictions (chorus-plan with that tuning)
# with the measurements. Root only. Output: docs/perf/emulated-hosts-<date>.md and raw JSON beside it.
# Usage: sudo scripts/perf-emu.sh [setups]   (default "2x2 4x2"; e.g. "2x2")
set -euo pipefail
cd "$(dirname "$0")/.."
setups=${1:-"2x2 4x2"}
rate=${RATE:-1gbit}
out=${OUT:-docs/perf}
bin=${CHORUS_BUILD:-build/release}
prefix=chorus-perf
[ "$(id -u)" -eq 0 ] || { echo "perf-emu: must run as root (network namespaces and tc)" >&2; exit 2; }
[ "${SKIP_BUILD:-0}" = 1 ] || bash scripts/build.sh chorusrun chorus-plan chorus-tune all_reduce_perf all_gather_perf \
  reduce_scatter_perf
stamp=$(date -u +%Y-%m-%d)
raw="$out/raw/emulated-$stamp"
mkdir -p "$raw"
trap 'bash scripts/netns-hosts.sh down --prefix "$prefix" > /dev/null || true' EXIT

declare -A tool=([allreduce]=all_reduce_perf [allgather]=all_gather_perf [reducescatter]=reduce_scatter_perf)
declare -A algos=([allreduce]="ring oneshot tree rhd hier" [allgather]="ring rhd bruck pat hier"
  [reducescatter]="ring rhd pat hier")
for setup in $setups; do
  hosts=${setup%x*}
  per=${setup#*x}
  n=$((hosts * per))
  bash scripts/netns-hosts.sh up "$hosts" --rate "$rate" --prefix "$prefix" > /dev/null
  run() {
    "$bin/chorusrun" -n "$n" --hosts "$hosts" --netns-prefix "$prefix" --timeout 900 "$@"
  }
  if [ "${SKIP_TUNE:-0}" != 1 ]; then
    echo "== $setup: tuning"
    run "$bin/chorus-tune" -o "$raw/tune-$setup.json" | tail -n 12
  fi
  # The selector of the "auto" runs sees what chorus-plan sees: the setup's topology file (hosts and their shared
  # 1 Gbit/s links) with the link costs just measured.
  export CHORUS_TOPO_FILE=topologies/emu-$setup.json
  if [ -f "$raw/tune-$setup.json" ]; then export CHORUS_TUNE_FILE=$raw/tune-$setup.json; else unset CHORUS_TUNE_FILE; fi
  # ONLY_TUNE=1: refresh the tuning files of an existing run (the table is then regenerated from its records).
  [ "${ONLY_TUNE:-0}" = 1 ] && colls="" || colls="allreduce allgather reducescatter"
  for coll in $colls; do
    for a in ${algos[$coll]} auto; do
      flag=()
      [ "$a" = auto ] || flag=(-A "$a")
      echo "== $setup $coll $a"
      # Small sizes need more iterations for a stable mean; 64 MiB at 1 Gbit/s takes about a second.
      run "$bin/perf/${tool[$coll]}" "${flag[@]}" -b 4K -e 256K -f 4 -n 50 -w 5 -c 1 \
        -J "$raw/$setup-$coll-$a.small.json" | tail -n 1
      run "$bin/perf/${tool[$coll]}" "${flag[@]}" -b 1M -e 64M -f 4 -n 4 -w 1 -c 1 \
        -J "$raw/$setup-$coll-$a.large.json" | tail -n 1
      python3 -c 'import json,sys; json.dump(json.load(open(sys.argv[1])) + json.load(open(sys.argv[2])), open(sys.argv[3], "w"), indent=1)' \
        "$raw/$setup-$coll-$a.small.json" "$raw/$setup-$coll-$a.large.json" "$raw/$setup-$coll-$a.json"
      rm -f "$raw/$setup-$coll-$a.small.json" "$raw/$setup-$coll-$a.large.json"
    done
  done
  bash scripts/netns-hosts.sh down --prefix "$prefix" > /dev/null
  unset CHORUS_TOPO_FILE CHORUS_TUNE_FILE
done
[ "${SKIP_TABLE:-0}" = 1 ] && exit 0
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
python3 scripts/perf_emu_table.py --bin "$bin" --raw "$raw" --setups "$setups" \
  --title "Emulated hosts at $rate, $stamp, commit $commit" > "$out/emulated-hosts-$stamp.md"
echo "wrote $out/emulated-hosts-$stamp.md"
