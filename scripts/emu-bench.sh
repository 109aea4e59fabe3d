#!/usr/bin/env bash
# Runs a perf tool across emulated hosts: brings up H network-namespace hosts whose links are shaped to RATE each
# way (scripts/netns-hosts.sh), starts the tool under `chorusrun --hosts` with R ranks per host, prints its output,
# and removes the hosts on exit (also on failure or Ctrl-C). Root only. docs/emulated-hosts.md explains the setup.
#
# Usage: scripts/emu-bench.sh [options] TOOL [tool args...]
#   TOOL                  a perf tool name (all_reduce_perf, ...) looked up in BUILD/perf/, or a path
#   --hosts H             emulated hosts (default 2)
#   --ranks-per-host R    ranks on each host (default 1); or --placement N0,N1,... for uneven hosts
#   --rate RATE           tc rate of every host's link, each direction (default 1gbit)
#   --prefix P            namespace prefix (default chorus-bench: a user's own `chorus` hosts are left alone)
#   --build DIR           build directory holding chorusrun and perf/ (default build/release, or $CHORUS_BUILD)
#   --timeout SEC         stop the ranks after SEC seconds (default 1800)
# Example: scripts/emu-bench.sh --hosts 4 --ranks-per-host 2 all_reduce_perf -b 8 -e 64M -f 4
# Environment variables (CHORUS_*) reach every rank unchanged.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")

die() {
  echo "emu-bench: $*" >&2
  exit 2
}

hosts=2 per_host=1 placement="" rate=1gbit prefix=chorus-bench timeout=1800
build=${CHORUS_BUILD:-$root/build/release}
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts | --ranks-per-host | --placement | --rate | --prefix | --build | --timeout)
      [ $# -ge 2 ] || die "$1 needs a value"
      case "$1" in
        --hosts) hosts=$2 ;;
        --ranks-per-host) per_host=$2 ;;
        --placement) placement=$2 ;;
        --rate) rate=$2 ;;
        --prefix) prefix=$2 ;;
        --build) build=$2 ;;
        --timeout) timeout=$2 ;;
      esac
      shift 2
      ;;
    -h | --help)
      sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    --)
      shift
      break
      ;;
    -*) die "unknown option '$1' (options come before the tool; see --help)" ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || die "no perf tool given (e.g. all_reduce_perf); see --help"
tool=$1
shift
if ! [[ "$hosts" =~ ^[0-9]+$ ]] || [ "$hosts" -lt 1 ]; then die "--hosts '$hosts': expected a positive count"; fi
if ! [[ "$per_host" =~ ^[0-9]+$ ]] || [ "$per_host" -lt 1 ]; then
  die "--ranks-per-host '$per_host': expected a positive count"
fi
[ "$(id -u)" -eq 0 ] || die "must run as root (network namespaces and tc)"

chorusrun=$build/chorusrun
[ -x "$chorusrun" ] || die "$chorusrun not found: build first (scripts/build.sh chorusrun $tool, or --build DIR)"
if [[ "$tool" == */* ]]; then
  tool_path=$tool
else
  tool_path=$build/perf/$tool
fi
[ -x "$tool_path" ] || die "$tool_path not found or not executable"

if [ -n "$placement" ]; then
  [[ "$placement" =~ ^[0-9]+(,[0-9]+)+$ ]] || die "--placement '$placement': expected counts like 3,5"
  hosts=$(($(tr -cd , <<< "$placement" | wc -c) + 1))
  hosts_arg=$placement
  nranks=$(($(tr , + <<< "$placement")))
  n_args=()
else
  hosts_arg=$hosts
  nranks=$((hosts * per_host))
  n_args=(-n "$nranks")
fi

# shellcheck disable=SC2317  # called by the trap
cleanup() {
  bash "$here/netns-hosts.sh" down --prefix "$prefix" > /dev/null || echo "emu-bench: could not remove the hosts" >&2
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bash "$here/netns-hosts.sh" up "$hosts" --rate "$rate" --prefix "$prefix"
echo "emu-bench: $nranks ranks on $hosts hosts (${placement:-$per_host per host}), links shaped to $rate each way:" \
  "$(basename "$tool_path") $*"
status=0
"$chorusrun" --hosts "$hosts_arg" "${n_args[@]}" --netns-prefix "$prefix" --timeout "$timeout" "$tool_path" "$@" ||
  status=$?
exit "$status"
