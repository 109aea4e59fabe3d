#!/usr/bin/env bash
# All-reduce over every host transport in one run, side by side: shm, tcp (loopback), UCX over its shared memory
# (CHORUS_UCX_TLS=sm) and UCX over tcp (CHORUS_UCX_TLS=tcp, loopback only). 4 ranks under chorusrun, float sum,
# 8 B to 64 MiB. Writes docs/perf/transports-<date>.md and the raw JSON under docs/perf/raw/transports-<date>/
# (or under $OUT). Usage: scripts/perf-transports.sh [ranks] [max_bytes]   (default 4 64M)
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${1:-4}
max=${2:-64M}
small_iters=${SMALL_ITERS:-200}
large_iters=${LARGE_ITERS:-20}
out=${OUT:-docs/perf}
bin=${BIN:-build/release}
if [ -z "${BIN:-}" ]; then bash scripts/build.sh chorusrun chorus-info all_reduce_perf; fi
if ! "$bin/chorus-info" --transport ucx > /dev/null; then
  echo "perf-transports: $("$bin/chorus-info" --transport ucx)" >&2
  echo "perf-transports: UCX cannot run here; install libucx-dev (scripts/setup-deps.sh) and rebuild" >&2
  exit 2
fi
stamp=$(date -u +%Y-%m-%d)
raw="$out/raw/transports-$stamp"
mkdir -p "$raw"
# run NAME ENV...: the sweep in two halves (8 B..1 MiB many times, 2 MiB..max fewer), JSON merged into NAME.json.
run() {
  local name=$1
  shift
  echo "== $name ($*)"
  env "$@" "$bin/chorusrun" -n "$ranks" "$bin/perf/all_reduce_perf" -b 8 -e 1M -f 2 -n "$small_iters" -w 20 \
    -J "$raw/$name.small.json" | tail -n 2
  env "$@" "$bin/chorusrun" -n "$ranks" "$bin/perf/all_reduce_perf" -b 2M -e "$max" -f 2 -n "$large_iters" -w 3 \
    -J "$raw/$name.large.json" | tail -n 2
  python3 -c 'import json,sys; json.dump(json.load(open(sys.argv[1])) + json.load(open(sys.argv[2])), open(sys.argv[3], "w"), indent=1)' \
    "$raw/$name.small.json" "$raw/$name.large.json" "$raw/$name.json"
  rm -f "$raw/$name.small.json" "$raw/$name.large.json"
}
# Loopback for both tcp columns, so they compare the transports and not the interfaces.
run shm CHORUS_TRANSPORTS=shm
run tcp CHORUS_TRANSPORTS=tcp CHORUS_SOCKET_IFNAME=lo
run ucx-sm CHORUS_TRANSPORTS=ucx CHORUS_UCX_TLS=sm
run ucx-tcp CHORUS_TRANSPORTS=ucx CHORUS_UCX_TLS=tcp UCX_NET_DEVICES=lo
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git diff --quiet 2>/dev/null || echo " (with uncommitted changes)")
python3 scripts/perf_transports_table.py \
  --title "All-reduce over each transport, $ranks ranks, $stamp, commit $commit$dirty" \
  --note "$("$bin/chorus-info" --transport ucx)" \
  --note "ucx-sm: CHORUS_UCX_TLS=sm; ucx-tcp: CHORUS_UCX_TLS=tcp UCX_NET_DEVICES=lo; tcp: CHORUS_SOCKET_IFNAME=lo" \
  "$raw" shm tcp ucx-sm ucx-tcp > "$out/transports-$stamp.md"
echo "wrote $out/transports-$stamp.md"
