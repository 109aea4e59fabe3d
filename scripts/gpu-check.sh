#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU (the H200 of /work/shared/GPU-NOTES.md): configures a Release build
# with CUDA in build/gpu, builds the library, the GPU tests, the kernel benchmark and the CPU tools, runs the GPU
# test suite (kernels, and collectives on device buffers with graph capture), runs compute-sanitizer memcheck on
# small GPU tests (when compute-sanitizer is there), and prints the kernel and collective benchmark tables (ranks as
# threads, the copy-engine all-gather with every SM held, the issue's targets, then ranks as 2 and 4 processes). The
# output starts with the date, the commit and `nvidia-smi -L`, so that it can be pasted as it is into docs/perf/
# (docs/cuda.md says what to record). Meant to finish in under 8 minutes on 16 cores: every step after the build has
# a time limit (240 + 90 + 90 + 150 + 2 x 60 s at most, far less when nothing hangs).
#
# With --prebuilt DIR it builds nothing and runs the programs that scripts/gpu-pack.sh built and packed into DIR
# on another machine: for a GPU machine without Chorus's build dependencies (the lent H200 has CUDA, CMake and
# ninja, but no hwloc, GoogleTest or OpenSSL headers, and can install nothing). It refuses a pack built from other
# sources than this tree (DIR/SOURCES.sha256), and needs no git.
#
# Usage: scripts/gpu-check.sh [--prebuilt DIR] [--bytes N]   (N: buffer size of the kernel benchmark, default 256 MiB)
# Exit status: non-zero when the build, a GPU test or the benchmark fails; every failure names its step.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
prebuilt=""
bench_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --prebuilt) [ $# -ge 2 ] || { echo "gpu-check: --prebuilt needs a folder" >&2; exit 2; }; prebuilt=$2; shift 2 ;;
    *) bench_args+=("$1"); shift ;;
  esac
done
mkdir -p "$root/build"
logs="$root/build/gpu-check"  # every step's full log: $logs.<step>.log
start=$(date +%s)

step() { printf '\n== %s (%ds)\n' "$1" $(( $(date +%s) - start )); }
die() { printf 'gpu-check: %s\n' "$1" >&2; exit 1; }

echo "# Chorus GPU check"
echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
if [ -n "$prebuilt" ]; then
  [ -f "$prebuilt/COMMIT" ] && [ -d "$prebuilt/bin" ] || die "--prebuilt $prebuilt: not a pack of scripts/gpu-pack.sh"
  prebuilt=$(cd "$prebuilt" && pwd)
  echo "commit: $(cat "$prebuilt/COMMIT") (built by scripts/gpu-pack.sh on another machine; $(cat "$prebuilt/NEEDS"))"
elif git -C "$root" rev-parse --git-dir > /dev/null 2>&1; then
  dirty=""
  git -C "$root" diff --quiet HEAD -- 2>/dev/null || dirty=" (with uncommitted changes)"
  echo "commit: $(git -C "$root" rev-parse HEAD)$dirty"
else
  echo "commit: unknown (not a git checkout)"
fi
echo "host: $(hostname), $(nproc) cores, $(ldd --version 2>/dev/null | head -n 1)"
command -v nvidia-smi > /dev/null || die "nvidia-smi not found: is this a machine with an NVIDIA GPU and its driver?"
nvidia-smi -L || die "nvidia-smi -L failed: the driver does not answer"
nvidia-smi --query-gpu=driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader || true
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
  bin="$prebuilt/bin"
  perf="$prebuilt/bin"
  export LD_LIBRARY_PATH="$prebuilt/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if ! "$bin/chorus_gpu_tests" --gtest_list_tests > "$logs.load.log" 2>&1; then
    # The machine's C++ runtime is older than the one the pack was built with: use the packed one.
    export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$prebuilt/fallback"
    "$bin/chorus_gpu_tests" --gtest_list_tests > "$logs.load.log" 2>&1 \
      || { cat "$logs.load.log"; die "the packed programs do not start on this machine (above)"; }
    echo "using the packed C++ runtime ($prebuilt/fallback)"
  fi
  echo "the packed programs start: $(ls "$bin" | tr '\n' ' ')"
else
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
  jobs=$(nproc 2>/dev/null || echo 4)
  targets=(chorus chorus_gpu_tests bench_cuda_kernels bench_cuda_collectives chorusrun chorus-info chorus-plan)
  ninja -C "$build" -j "$jobs" "${targets[@]}" > "$logs.build.log" 2>&1 \
    || { tail -n 60 "$logs.build.log"; die "build failed (last lines above; full log $logs.build.log)"; }
  echo "built: ${targets[*]}"
fi

# Every step below has a time limit, and a failed or hung step does not stop the later ones: one run on a lent GPU
# must report as much as it can. The exit status is that of the first failure.
failed=""
fail_later() { echo "gpu-check: FAILED: $*" >&2; [ -n "$failed" ] || failed="$*"; }

step "GPU test suite (chorus_gpu_tests, at most ${SUITE_TIMEOUT:-240} s)"
set +e
timeout -k 10 "${SUITE_TIMEOUT:-240}" "$bin/chorus_gpu_tests" 2>&1 | tee "$logs.gpu-tests.log" \
  | grep -E '^\[ *(OK|FAILED|SKIPPED|PASSED|RUN) *\]|Failure|Skipped|error'
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
  fail_later "GPU tests timed out after ${SUITE_TIMEOUT:-240} s (the last [ RUN ] above hung; log $logs.gpu-tests.log)"
elif [ "$rc" != 0 ]; then
  fail_later "GPU tests failed (exit $rc; full log $logs.gpu-tests.log)"
fi
if grep -q "^\[  SKIPPED \]" "$logs.gpu-tests.log"; then
  die "GPU tests were skipped: the test process sees no usable CUDA device"
fi

step "compute-sanitizer memcheck (one small GPU test)"
sanitizer=$(command -v compute-sanitizer || true)
if [ -z "$sanitizer" ] && [ -x "$(dirname "$(command -v nvcc)")/compute-sanitizer" ]; then
  sanitizer="$(dirname "$(command -v nvcc)")/compute-sanitizer"
fi
if [ -n "$sanitizer" ]; then
  timeout -k 10 90 "$sanitizer" --tool memcheck --error-exitcode 3 "$bin/chorus_gpu_tests" --gtest_brief=1 \
    --gtest_filter='CudaCodec.UnalignedFloatBuffersMatchCpu:CudaReduce.InPlaceMatchesCpu:CudaCollectives.TheHostDoesNotWaitForTheStream' \
    || fail_later "compute-sanitizer memcheck reported errors or timed out"
else
  echo "compute-sanitizer not found: memcheck not run"
fi

step "kernel benchmark (bench_cuda_kernels ${bench_args[*]:-})"
timeout -k 10 90 "$perf/bench_cuda_kernels" "${bench_args[@]}" || fail_later "kernel benchmark failed"

step "collectives on device buffers at 1, 2, 4, 8 thread-ranks, copy-engine all-gather, targets (bench_cuda_collectives)"
timeout -k 10 150 "$perf/bench_cuda_collectives" --max-bytes "${COLL_MAX_BYTES:-268435456}" \
  || fail_later "collective benchmark failed"

for n in 2 4; do
  step "collectives on device buffers at $n processes on one GPU (chorusrun -n $n bench_cuda_collectives --processes)"
  timeout -k 10 60 "$bin/chorusrun" -n "$n" --timeout 50 "$perf/bench_cuda_collectives" --processes \
    --max-bytes "${PROC_MAX_BYTES:-67108864}" --trials 3 || fail_later "process benchmark at $n ranks failed"
done

[ -z "$failed" ] || die "$failed"
step "done"
