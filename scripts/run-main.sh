#!/usr/bin/env bash
# The main job: install what is missing, build, then 4 local ranks (processes started by chorusrun, talking over
# shared memory) run verified collectives: all_reduce_perf from 8 B to 64 MiB and all_gather_perf, every result
# checked on every rank (#wrong must be 0). Then the reference trainer: the same 4 ranks train a small byte-level
# transformer with FSDP (ZeRO-3) and mixture-of-experts layers over Chorus for 300 steps on the licence texts in
# /usr/share/common-licenses, one line per step, and plot the loss curve to build/trainer-run/loss.png.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-deps.sh
bash scripts/build.sh chorusrun all_reduce_perf all_gather_perf chorus-trainer
bin=build/release
echo
echo "== chorusrun -n 4 all_reduce_perf -b 8 -e 64M -f 2 -c 1 -n 20 -w 5"
"$bin/chorusrun" -n 4 "$bin/perf/all_reduce_perf" -b 8 -e 64M -f 2 -c 1 -n 20 -w 5
echo
echo "== chorusrun -n 4 all_gather_perf -b 1K -e 64M -f 4 -c 1 -n 20 -w 5"
"$bin/chorusrun" -n 4 "$bin/perf/all_gather_perf" -b 1K -e 64M -f 4 -c 1 -n 20 -w 5
echo
echo "== chorusrun -n 4 chorus-trainer --steps 300   (FSDP over 4 ranks, 4 experts per MoE block, docs/trainer.md)"
"$bin/chorusrun" -n 4 "$bin/trainer/chorus-trainer" --steps 300 --out build/trainer-run --overwrite
