#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU (the H200 of /work/shared/GPU-NOTES.md): builds Chorus with CUDA
# (Release, build/gpu) or takes the programs scripts/gpu-pack.sh built elsewhere (--prebuilt), then
#   1. the GPU test suite, each test in a process of its own under its own time limit (a hang costs one test);
#   2. the kernel benchmark (reduction and codecs against the device-to-device copy ceiling of the same run);
#   3. the collective benchmark with ranks as threads: the issue's targets first, then the table at 1, 2, 4, 8 ranks;
#   4. compute-sanitizer memcheck on three small GPU tests (when compute-sanitizer is there);
#   5. the collective benchmark with ranks as 2 and 4 processes on the GPU (chorusrun).
# The output starts with the date, the commit and `nvidia-smi -L`, so that it can be pasted as it is into docs/perf/
# (docs/cuda.md says what to record). Every step has a time limit, and the whole run a deadline (GPU_CHECK_BUDGET,
# default 420 s after the build) that shortens the later steps, so that it ends inside a 480 s device call and leaves
# device time (15 minutes a session, the machine's start included) for a second, shorter call; a
# failed or hung step does not stop the later ones.
#
# With --prebuilt DIR it builds nothing and runs the programs that scripts/gpu-pack.sh built and packed into DIR
# on another machine: for a GPU machine without Chorus's build dependencies (the lent H200 has CUDA, CMake and
# ninja, but no hwloc, GoogleTest or OpenSSL headers, and can install nothing). It refuses a pack built from other
# sources than this tree (DIR/SOURCES.sha256, which leaves out documentation), and needs no git. --check-pack
# checks the pack (sources, and that its programs start here) and stops: run it before spending device time.
#
# Usage: scripts/gpu-check.sh [--prebuilt DIR [--check-pack]] [--bytes N]
#   N: buffer size of the kernel benchmark (default 256 MiB). GPU_CHECK_LOGS=DIR puts the full logs in DIR (default
#   build/); on the device tool, GPU_CHECK_LOGS=$OUT brings them back even when the call is cut off.
# Exit status: non-zero when the build, a GPU test or a benchmark fails; every failure names its step.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
prebuilt=""
check_pack=0
bench_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --prebuilt) [ $# -ge 2 ] || { echo "gpu-check: --prebuilt needs a folder" >&2; exit 2; }; prebuilt=$2; shift 2 ;;
    --check-pack) check_pack=1; shift ;;
    *) bench_args+=("$1"); shift ;;
  esac
done
[ "$check_pack" = 0 ] || [ -n "$prebuilt" ] || { echo "gpu-check: --check-pack needs --prebuilt DIR" >&2; exit 2; }
logdir="${GPU_CHECK_LOGS:-$root/build}"
mkdir -p "$logdir"
logs="$logdir/gpu-check"  # every step's full log: $logs.<step>.log
start=$(date +%s)

step() { printf '\n== %s (%ds)\n' "$1" $(( $(date +%s) - start )); }
die() { printf 'gpu-check: %s\n' "$1" >&2; exit 1; }

echo "# Chorus GPU check"
echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
if [ -n "$prebuilt" ]; then
  [ -f "$prebuilt/COMMIT" ] && [ -f "$prebuilt/bin.tar.gz" ] || die "--prebuilt $prebuilt: not a pack of scripts/gpu-pack.sh"
  prebuilt=$(cd "$prebuilt" && pwd)
  echo "commit: $(cat "$prebuilt/COMMIT") (built by scripts/gpu-pack.sh on another machine; $(cat "$prebuilt/NEEDS"))"
elif git -C "$root" rev-parse --git-dir > /dev/null 2>&1; then
  dirty=""
  git -C "$root" diff --quiet HEAD -- 2>/dev/null || dirty=" (with uncommitted changes)"
  echo "commit: $(git -C "$root" rev-parse HEAD)$dirty"
else
  echo "commit: unknown (not a git checkout)"
fi
echo "host: $(hostname 2>/dev/null || echo '?'), $(nproc) cores, $(free -g 2>/dev/null | awk '/^Mem:/ { print $2 " GiB memory" }'), $(ldd --version 2>/dev/null | head -n 1)"
if ! command -v nvcc > /dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
    if [ -x "$d/nvcc" ]; then export PATH="$d:$PATH"; break; fi
  done
fi

if [ -n "$prebuilt" ]; then
  step "prebuilt programs ($prebuilt)"
  # The sources travel beside the pack: refuse a pack of other sources (a stale pack would report on old code).
  (cd "$root" && sha256sum --quiet --check "$prebuilt/SOURCES.sha256") > "$logs.sources.log" 2>&1 \
    || { head -n 20 "$logs.sources.log"; die "the pack was built from other sources than this tree (files above): rerun scripts/gpu-pack.sh"; }
  unpacked=$(mktemp -d)  # the programs, unpacked outside the pack (and outside the logs that travel back)
  trap 'rm -rf "$unpacked"' EXIT
  tar -xzf "$prebuilt/bin.tar.gz" -C "$unpacked" || die "--prebuilt $prebuilt: cannot unpack bin.tar.gz"
  chmod +x "$unpacked"/bin/* 2> /dev/null || true  # in case a copy dropped the modes
  bin="$unpacked/bin"
  perf="$unpacked/bin"
  export LD_LIBRARY_PATH="$prebuilt/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if ! "$bin/chorus_gpu_tests" --gtest_list_tests > "$logs.load.log" 2>&1; then
    # The machine's C++ runtime is older than the one the pack was built with: use the packed one.
    export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$prebuilt/fallback"
    "$bin/chorus_gpu_tests" --gtest_list_tests > "$logs.load.log" 2>&1 \
      || { cat "$logs.load.log"; die "the packed programs do not start on this machine (above)"; }
    echo "using the packed C++ runtime ($prebuilt/fallback)"
  fi
  echo "the pack matches this tree, and its programs start: $(ls "$bin" | tr '\n' ' ')"
  if [ "$check_pack" = 1 ]; then
    echo "gpu-check: pack checked (--check-pack); on the GPU machine: bash scripts/gpu-check.sh --prebuilt ${prebuilt#"$root"/}"
    exit 0
  fi
fi

command -v nvidia-smi > /dev/null || die "nvidia-smi not found: is this a machine with an NVIDIA GPU and its driver?"
nvidia-smi -L || die "nvidia-smi -L failed: the driver does not answer"
nvidia-smi --query-gpu=driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader || true

if [ -z "$prebuilt" ]; then
  command -v nvcc > /dev/null || die "nvcc not found (install the CUDA toolkit or put its bin/ on PATH)"
  echo "nvcc: $(nvcc --version | tail -n 2 | head -n 1)"
  for tool in cmake ninja; do command -v "$tool" > /dev/null || die "$tool not found (scripts/setup-deps.sh installs it)"; done
  build="$root/build/gpu"
  bin="$build"
  perf="$build/perf"
  step "configure (Release, CHORUS_CUDA=ON, build/gpu)"
  launcher=()
  if command -v ccache > /dev/null; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  fi
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCHORUS_WERROR=ON -DCHORUS_CUDA=ON \
    -DCHORUS_BUILD_TRAINER=OFF "${launcher[@]}" > "$logs.configure.log" 2>&1 \
    || { cat "$logs.configure.log"; die "configure failed (log above)"; }
  grep -E "Chorus: CUDA support" "$logs.configure.log" || true

  step "build"
  targets=(chorus chorus_gpu_tests gpu_mp_worker bench_cuda_kernels bench_cuda_collectives chorusrun)
  ninja -C "$build" -j "$(nproc 2> /dev/null || echo 4)" "${targets[@]}" > "$logs.build.log" 2>&1 \
    || { tail -n 60 "$logs.build.log"; die "build failed (last lines above; full log $logs.build.log)"; }
  echo "built: ${targets[*]}"
fi

failed=""
fail_later() { echo "gpu-check: FAILED: $*" >&2; [ -n "$failed" ] || failed="$*"; }
# Seconds a step may take: its own limit, cut to what is left of the run's deadline (0: no time left).
deadline=$(( $(date +%s) + ${GPU_CHECK_BUDGET:-420} ))
limit() {
  local left=$(( deadline - $(date +%s) - 5 ))
  [ "$left" -gt 0 ] || left=0
  echo $(( $1 < left ? $1 : left ))
}
# Runs "$@" under `timeout` for at most `limit $1` seconds; returns its status (124 or 137 when cut off, 125 when
# no time was left).
timed() {
  local lim
  lim=$(limit "$1")
  shift
  [ "$lim" -ge 5 ] || { echo "(no time left before the deadline: not run)"; return 125; }
  timeout -k 5 "$lim" "$@"
}

step "GPU test suite (chorus_gpu_tests, each test its own process: at most 60 s each, 150 s for the largest)"
: > "$logs.gpu-tests.log"
mapfile -t tests < <("$bin/chorus_gpu_tests" --gtest_list_tests | awk '/^[^ ]/ { suite = $1 } /^  [^ ]/ { print suite $1 }')
[ "${#tests[@]}" -gt 0 ] || die "chorus_gpu_tests lists no tests"
passed=0 skipped=0
for t in "${tests[@]}"; do
  per=60
  case "$t" in *EveryCollective*) per=150 ;; esac
  t0=$(date +%s)
  set +e
  timed "$per" "$bin/chorus_gpu_tests" --gtest_filter="$t" > "$logs.one-test.log" 2>&1
  rc=$?
  set -e
  { echo "### $t (exit $rc, $(( $(date +%s) - t0 )) s)"; cat "$logs.one-test.log"; } >> "$logs.gpu-tests.log"
  if [ "$rc" = 0 ] && grep -q "^\[  SKIPPED \] $t" "$logs.one-test.log"; then
    skipped=$((skipped + 1))
    echo "[ SKIPPED  ] $t: $(grep -m 1 -A 1 'Skipped' "$logs.one-test.log" | tail -n 1)"
  elif [ "$rc" = 0 ]; then
    passed=$((passed + 1))
    echo "[       OK ] $t ($(( $(date +%s) - t0 )) s)"
  else
    case "$rc" in
      124 | 137) why="timed out after $(( $(date +%s) - t0 )) s" ;;
      125) why="not run: no time left" ;;
      *) why="exit $rc" ;;
    esac
    echo "[  FAILED  ] $t ($why)"
    grep -E "Failure|error|Expected|Which is|Value of|actual|rank " "$logs.one-test.log" | head -n 12 | sed 's/^/    /'
    fail_later "GPU test $t ($why; full log $logs.gpu-tests.log)"
  fi
done
rm -f "$logs.one-test.log"
echo "GPU tests: ${#tests[@]} run, $passed passed, $skipped skipped"
[ "$skipped" = 0 ] || die "GPU tests were skipped: the test process sees no usable CUDA device"

step "kernel benchmark (bench_cuda_kernels ${bench_args[*]:-})"
timed 90 "$perf/bench_cuda_kernels" "${bench_args[@]}" || fail_later "kernel benchmark failed or timed out"

step "collectives on device buffers, ranks as threads: targets, then 1, 2, 4, 8 ranks (bench_cuda_collectives)"
timed 150 "$perf/bench_cuda_collectives" --max-bytes "${COLL_MAX_BYTES:-268435456}" \
  || fail_later "collective benchmark failed or timed out"

step "compute-sanitizer memcheck (three small GPU tests)"
sanitizer=$(command -v compute-sanitizer || true)
if [ -n "$sanitizer" ]; then
  rc=0
  timed 90 "$sanitizer" --tool memcheck --error-exitcode 3 "$bin/chorus_gpu_tests" --gtest_brief=1 \
    --gtest_filter='CudaCodec.UnalignedFloatBuffersMatchCpu:CudaReduce.InPlaceMatchesCpu:CudaCollectives.SmallAllReducesOnTheDirectPath' \
    || rc=$?
  case "$rc" in
    0) echo "memcheck: no errors" ;;
    3) fail_later "compute-sanitizer memcheck reported memory errors" ;;
    124 | 137) fail_later "compute-sanitizer memcheck timed out" ;;
    125) fail_later "compute-sanitizer memcheck not run: no time left" ;;
    *) fail_later "a test failed under compute-sanitizer memcheck (exit $rc; memcheck itself found no error)" ;;
  esac
else
  echo "compute-sanitizer not found: memcheck not run"
fi

for n in 2 4; do
  step "collectives on device buffers at $n processes on one GPU (chorusrun -n $n bench_cuda_collectives --processes)"
  timed 60 "$bin/chorusrun" -n "$n" --timeout 50 "$perf/bench_cuda_collectives" --processes \
    --max-bytes "${PROC_MAX_BYTES:-67108864}" --trials 3 || fail_later "process benchmark at $n ranks failed or timed out"
done

[ -z "$failed" ] || die "$failed"
step "done"
