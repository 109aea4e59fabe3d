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
# Usage: scripts/gpu-check.sh [--bytes N]   (N: buffer size of the benchmark, default 256 MiB)
# Exit status: non-zero when the build, a GPU test or the benchmark fails; every failure names its step.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build="$root/build/gpu"
bench_args=("$@")
start=$(date +%s)

step() { printf '\n== %s (%ds)\n' "$1" $(( $(date +%s) - start )); }
die() { printf 'gpu-check: %s\n' "$1" >&2; exit 1; }

echo "# Chorus GPU check"
echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
if git -C "$root" rev-parse --git-dir > /dev/null 2>&1; then
  dirty=""
  git -C "$root" diff --quiet HEAD -- 2>/dev/null || dirty=" (with uncommitted changes)"
  echo "commit: $(git -C "$root" rev-parse HEAD)$dirty"
else
  echo "commit: unknown (not a git checkout)"
fi
echo "host: $(hostname), $(nproc) cores"
command -v nvidia-smi > /dev/null || die "nvidia-smi not found: is this a machine with an NVIDIA GPU and its driver?"
nvidia-smi -L || die "nvidia-smi -L failed: the driver does not answer"
nvidia-smi --query-gpu=driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader || true
if ! command -v nvcc > /dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
    if [ -x "$d/nvcc" ]; then export PATH="$d:$PATH"; break; fi
  done
fi
command -v nvcc > /dev/null || die "nvcc not found (install the CUDA toolkit or put its bin/ on PATH)"
echo "nvcc: $(nvcc --version | tail -n 2 | head -n 1)"
for tool in cmake ninja; do command -v "$tool" > /dev/null || die "$tool not found (scripts/setup-deps.sh installs it)"; done

step "configure (Release, CHORUS_CUDA=ON, build/gpu)"
launcher=()
if command -v ccache > /dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCHORUS_WERROR=ON -DCHORUS_CUDA=ON \
  -DCHORUS_BUILD_TRAINER=OFF "${launcher[@]}" > "$build.configure.log" 2>&1 \
  || { cat "$build.configure.log"; die "configure failed (log above)"; }
grep -E "Chorus: CUDA support" "$build.configure.log" || true

step "build"
jobs=$(nproc 2>/dev/null || echo 4)
targets=(chorus chorus_gpu_tests bench_cuda_kernels bench_cuda_collectives chorusrun chorus-info chorus-plan)
ninja -C "$build" -j "$jobs" "${targets[@]}" > "$build.build.log" 2>&1 \
  || { tail -n 60 "$build.build.log"; die "build failed (last lines above; full log $build.build.log)"; }
echo "built: ${targets[*]}"

# Every step below has a time limit, and a failed or hung step does not stop the later ones: one run on a lent GPU
# must report as much as it can. The exit status is that of the first failure.
failed=""
fail_later() { echo "gpu-check: FAILED: $*" >&2; [ -n "$failed" ] || failed="$*"; }

step "GPU test suite (chorus_gpu_tests, at most ${SUITE_TIMEOUT:-240} s)"
set +e
timeout -k 10 "${SUITE_TIMEOUT:-240}" "$build/chorus_gpu_tests" 2>&1 | tee "$build.gpu-tests.log" \
  | grep -E '^\[ *(OK|FAILED|SKIPPED|PASSED|RUN) *\]|Failure|Skipped|error'
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
  fail_later "GPU tests timed out after ${SUITE_TIMEOUT:-240} s (the last [ RUN ] above hung; log $build.gpu-tests.log)"
elif [ "$rc" != 0 ]; then
  fail_later "GPU tests failed (exit $rc; full log $build.gpu-tests.log)"
fi
if grep -q "^\[  SKIPPED \]" "$build.gpu-tests.log"; then
  die "GPU tests were skipped: the test process sees no usable CUDA device"
fi

step "compute-sanitizer memcheck (one small GPU test)"
sanitizer=$(command -v compute-sanitizer || true)
if [ -z "$sanitizer" ] && [ -x "$(dirname "$(command -v nvcc)")/compute-sanitizer" ]; then
  sanitizer="$(dirname "$(command -v nvcc)")/compute-sanitizer"
fi
if [ -n "$sanitizer" ]; then
  timeout -k 10 90 "$sanitizer" --tool memcheck --error-exitcode 3 "$build/chorus_gpu_tests" --gtest_brief=1 \
    --gtest_filter='CudaCodec.UnalignedFloatBuffersMatchCpu:CudaReduce.InPlaceMatchesCpu:CudaCollectives.TheHostDoesNotWaitForTheStream' \
    || fail_later "compute-sanitizer memcheck reported errors or timed out"
else
  echo "compute-sanitizer not found: memcheck not run"
fi

step "kernel benchmark (bench_cuda_kernels ${bench_args[*]:-})"
timeout -k 10 90 "$build/perf/bench_cuda_kernels" "${bench_args[@]}" || fail_later "kernel benchmark failed"

step "collectives on device buffers at 1, 2, 4, 8 thread-ranks, copy-engine all-gather, targets (bench_cuda_collectives)"
timeout -k 10 150 "$build/perf/bench_cuda_collectives" --max-bytes "${COLL_MAX_BYTES:-268435456}" \
  || fail_later "collective benchmark failed"

for n in 2 4; do
  step "collectives on device buffers at $n processes on one GPU (chorusrun -n $n bench_cuda_collectives --processes)"
  timeout -k 10 60 "$build/chorusrun" -n "$n" --timeout 50 "$build/perf/bench_cuda_collectives" --processes \
    --max-bytes "${PROC_MAX_BYTES:-67108864}" --trials 3 || fail_later "process benchmark at $n ranks failed"
done

[ -z "$failed" ] || die "$failed"
step "done"
