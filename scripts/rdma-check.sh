#!/usr/bin/env bash
# Where an RDMA device exists (InfiniBand, RoCE, or soft-RoCE: `rdma link add rxe0 type rxe netdev eth0`), runs in
# one command what cannot run elsewhere: the multi-process correctness matrix over the ibverbs transport (2, 3 and 4
# ranks), the fault cases (a killed rank is named, mismatched calls are reported), and the all-reduce perf sweep
# over ibverbs beside tcp, written to docs/perf/rdma-<date>.md (raw JSON under docs/perf/raw/rdma-<date>/).
# Every rank runs on this host, so the queue pairs loop back through the device; across hosts, start
# all_reduce_perf / mp_worker with your launcher and CHORUS_TRANSPORTS=ibverbs.
# CHORUS_IB_HCA, CHORUS_IB_GID_INDEX and CHORUS_IB_QPS_PER_CONNECTION pass through.
# Exit status: 0 all passed, 1 something failed, 2 no usable RDMA device here (nothing run).
# Usage: scripts/rdma-check.sh [max_bytes]   (default 256M)
set -euo pipefail
cd "$(dirname "$0")/.."
max=${1:-256M}
out=${OUT:-docs/perf}
bin=${BIN:-build/release}
if [ -z "${BIN:-}" ]; then bash scripts/build.sh chorusrun chorus-info mp_worker all_reduce_perf; fi

if ! found=$("$bin/chorus-info" --transport ibverbs); then
  echo "rdma-check: cannot run: $found" >&2
  echo "rdma-check: needs an RDMA device with an active port (and libibverbs-dev at build time); nothing was run" >&2
  exit 2
fi
echo "rdma-check: $found"

failed=0
check() {  # check NAME EXPECTED_COUNT PATTERN -- command...: runs it, counts PATTERN in its output
  local name=$1 want=$2 pattern=$3
  shift 4
  local log
  log=$(mktemp)
  "$@" > "$log" 2>&1 || true
  local got
  got=$(grep -c -- "$pattern" "$log" || true)
  if [ "$got" = "$want" ] && ! grep -q "FAIL" "$log"; then
    echo "rdma-check: PASS $name"
  else
    echo "rdma-check: FAIL $name (expected $want x '$pattern', saw $got); its output:"
    sed 's/^/    /' "$log" | tail -n 40
    failed=1
  fi
  rm -f "$log"
}

export CHORUS_TRANSPORTS=ibverbs
for n in 2 3 4; do
  check "matrix, $n ranks" "$n" "cases passed" -- "$bin/chorusrun" -n "$n" --timeout 600 "$bin/mp_worker" matrix
done
check "matrix, 2 ranks, 2 queue pairs per connection" 2 "cases passed" -- \
  env CHORUS_IB_QPS_PER_CONNECTION=2 "$bin/chorusrun" -n 2 --timeout 600 "$bin/mp_worker" matrix
check "a killed rank is named" 3 "kill: error names rank 2" -- "$bin/chorusrun" -n 4 --timeout 120 "$bin/mp_worker" kill
check "mismatched count" 4 "mismatch: reported with both fingerprints" -- \
  "$bin/chorusrun" -n 4 --timeout 120 "$bin/mp_worker" mismatch-count
unset CHORUS_TRANSPORTS

stamp=$(date -u +%Y-%m-%d)
raw="$out/raw/rdma-$stamp"
mkdir -p "$raw"
sweep() {  # sweep NAME ENV...: all_reduce_perf on 2 ranks, 8 B..max, JSON into NAME.json
  local name=$1
  shift
  echo "== all_reduce_perf over $name"
  env "$@" "$bin/chorusrun" -n 2 "$bin/perf/all_reduce_perf" -b 8 -e 1M -f 2 -n 200 -w 20 -J "$raw/$name.small.json" |
    tail -n 2
  env "$@" "$bin/chorusrun" -n 2 "$bin/perf/all_reduce_perf" -b 2M -e "$max" -f 2 -n 20 -w 3 \
    -J "$raw/$name.large.json" | tail -n 2
  python3 -c 'import json,sys; json.dump(json.load(open(sys.argv[1])) + json.load(open(sys.argv[2])), open(sys.argv[3], "w"), indent=1)' \
    "$raw/$name.small.json" "$raw/$name.large.json" "$raw/$name.json"
  rm -f "$raw/$name.small.json" "$raw/$name.large.json"
}
if sweep ibverbs CHORUS_TRANSPORTS=ibverbs && sweep tcp CHORUS_TRANSPORTS=tcp; then
  commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  python3 scripts/perf_transports_table.py --title "All-reduce over ibverbs and tcp, 2 ranks, $stamp, commit $commit" \
    --note "$found" "$raw" tcp ibverbs > "$out/rdma-$stamp.md"
  echo "rdma-check: wrote $out/rdma-$stamp.md"
else
  echo "rdma-check: FAIL the perf sweep"
  failed=1
fi
if [ "$failed" = 0 ]; then echo "rdma-check: all passed"; else echo "rdma-check: FAILED"; fi
exit "$failed"
