#!/usr/bin/env bash
# Builds, on this machine, everything scripts/gpu-check.sh runs, and packs it into one folder that a GPU machine
# without Chorus's build dependencies can run (the lent H200 of /work/.library/device: CUDA, CMake and ninja, but
# no hwloc, GoogleTest or OpenSSL headers, and nothing can be installed there). Then, on the GPU machine:
#
#   bash scripts/gpu-check.sh --prebuilt .gpu-pack
#
# The pack (.gpu-pack/, ignored by git):
#   bin.tar.gz chorus_gpu_tests, gpu_mp_worker, chorusrun, bench_cuda_kernels, bench_cuda_collectives
#              (Release, CUDA sm_90 machine code plus compute_90 PTX, UCX and ibverbs off: none is needed on one GPU),
#              gzipped: each program links the whole library, 50 MiB together, 18 MiB packed; gpu-check unpacks it
#   lib/       the shared libraries they load that are not the C library's own (libcudart, libhwloc, libcrypto ...)
#   fallback/  this machine's libstdc++ and libgcc_s, used there only when the machine's own are too old
#   COMMIT     the commit, and whether the working tree differed from it
#   SOURCES.sha256  checksums of every tracked and untracked-not-ignored file but the documentation: gpu-check
#              refuses a pack built from other sources than the tree it runs in (no git is needed there)
#
# The binaries need glibc 2.34 and GLIBCXX 3.4.30 at most (Debian 12 builds them); the script prints both.
# Usage: scripts/gpu-pack.sh            Exit status: non-zero when the build fails or the pack is too large.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build="$root/build/gpu-pack"
pack="$root/.gpu-pack"
max_mib=56  # the device tool carries 64 MiB in all, the tracked tree included
mkdir -p "$root/build"

command -v nvcc > /dev/null || export PATH="/usr/local/cuda/bin:$PATH"
launcher=()
if command -v ccache > /dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCHORUS_WERROR=ON -DCHORUS_CUDA=ON \
  -DCHORUS_UCX=OFF -DCHORUS_IBVERBS=OFF -DCHORUS_BUILD_TRAINER=OFF -DCHORUS_BUILD_MPI_COMPARE=OFF "${launcher[@]}" \
  > "$build.configure.log" 2>&1 || { cat "$build.configure.log"; echo "gpu-pack: configure failed" >&2; exit 1; }
programs=(chorus_gpu_tests gpu_mp_worker chorusrun perf/bench_cuda_kernels perf/bench_cuda_collectives)
targets=()
for p in "${programs[@]}"; do targets+=("$(basename "$p")"); done
ninja -C "$build" -j "$(nproc)" "${targets[@]}"

rm -rf "$pack"
mkdir -p "$pack/bin" "$pack/lib" "$pack/fallback"
for p in "${programs[@]}"; do cp "$build/$p" "$pack/bin/"; done
strip --strip-unneeded "$pack"/bin/*

# Every shared library the programs load, except those of the C library itself (always there, and tied to the
# machine's kernel and loader) and the C++ runtime (the machine's own is newer, else fallback/ below).
is_system() {
  case "$1" in
    linux-vdso* | ld-linux* | libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | libstdc++* | libgcc_s*)
      return 0 ;;
  esac
  return 1
}
for b in "$pack"/bin/*; do
  ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
  is_system "$name" || cp -L "$path" "$pack/lib/$name"
done
for name in libstdc++.so.6 libgcc_s.so.1; do
  cp -L "$(ldconfig -p | awk -v n="$name" '$1 == n && /x86-64/ { print $NF; exit }')" "$pack/fallback/$name"
done

# Which sources the pack was built from, so that gpu-check can refuse a pack and a tree that differ.
state=""
if ! git diff --quiet HEAD --; then
  state=" (with uncommitted changes)"
elif [ -n "$(git ls-files --others --exclude-standard)" ]; then
  state=" (with untracked files)"
fi
echo "$(git rev-parse HEAD)$state" > "$pack/COMMIT"
# Documentation is left out, so that notes written after packing do not make the pack stale.
git ls-files -z --cached --others --exclude-standard -- ':!docs/' ':!*.md' | xargs -0 sha256sum > "$pack/SOURCES.sha256"

glibc=$(for b in "$pack"/bin/* "$pack"/lib/*; do objdump -T "$b"; done | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1)
glibcxx=$(for b in "$pack"/bin/*; do objdump -T "$b"; done | grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tail -n 1)
echo "needs: $glibc, $glibcxx" > "$pack/NEEDS"
ls -l "$pack/bin" "$pack/lib"
tar -C "$pack" -czf "$pack/bin.tar.gz" bin
rm -rf "$pack/bin"
size_mib=$(( ($(du -sb "$pack" | cut -f1) + $(git ls-files -z | xargs -0 du -cb | tail -n 1 | cut -f1)) >> 20 ))
echo "gpu-pack: $pack ($(du -sh "$pack" | cut -f1); with the tree ${size_mib} MiB of the 64 the device tool carries)"
echo "gpu-pack: commit $(cat "$pack/COMMIT"); $(cat "$pack/NEEDS")"
[ "$size_mib" -le "$max_mib" ] || { echo "gpu-pack: the pack is larger than ${max_mib} MiB" >&2; exit 1; }
echo "gpu-pack: check it here with: bash scripts/gpu-check.sh --prebuilt .gpu-pack --check-pack"
echo "gpu-pack: on the GPU machine run: bash scripts/gpu-check.sh --prebuilt .gpu-pack"
