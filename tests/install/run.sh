#!/usr/bin/env bash
# Installs the build into a temporary prefix, then builds and runs a consumer through find_package(Chorus) and
# through pkg-config. Usage: run.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log"
libdir=$(ls -d "$tmp"/prefix/lib*/ | head -n 1)
cmake -S "$src/tests/install" -B "$tmp/cmake-build" -G Ninja -DCMAKE_PREFIX_PATH="$tmp/prefix" > "$tmp/configure.log"
cmake --build "$tmp/cmake-build" > "$tmp/build.log"
LD_LIBRARY_PATH="$libdir" "$tmp/cmake-build/consumer"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
cc "$src/tests/install/consumer.c" -o "$tmp/consumer-pc" $(pkg-config --cflags --libs chorus) -Wl,-rpath,"$libdir"
"$tmp/consumer-pc"
# An installed program that links libchorus starts from any prefix without LD_LIBRARY_PATH (its RUNPATH).
if [ -x "$tmp/prefix/bin/chorus-trainer" ]; then
  env -u LD_LIBRARY_PATH "$tmp/prefix/bin/chorus-trainer" --help > /dev/null
fi
echo "install: find_package and pkg-config consumers passed"
