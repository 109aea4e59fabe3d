#!/usr/bin/env bash
# Emulated hosts on one machine: network namespaces joined by a bridge, every host's link shaped with tbf.
#
#   scripts/netns-hosts.sh up H [--rate 1gbit] [--prefix chorus]   create (or reshape) H hosts
#   scripts/netns-hosts.sh down [--prefix chorus]                  remove every namespace of the prefix
#   scripts/netns-hosts.sh status [--prefix chorus]                list hosts, addresses and shaping
#   scripts/netns-hosts.sh measure [--prefix chorus] [--seconds 3] TCP goodput h1 -> h0 (and h1+h2 -> h0), python3
#
# Layout for prefix P (docs/emulated-hosts.md):
#   namespace P-br   bridge br0 with one port vI per host; no address, pure layer 2, nothing else attached
#   namespace P-hI   lo up, eth0 (veth peer of vI) with 10.213.0.(I+1)/24; host 0 is 10.213.0.1
# Every prefix has its own bridge namespace, so prefixes never see each other's traffic and may reuse the subnet;
# the root namespace is not touched. Shaping: tbf on eth0 (the host's egress) and on vI (egress of the bridge
# towards the host = the host's ingress), so all ranks of one host share RATE in each direction.
# `up` is declarative and idempotent: run it again with another H or rate and the hosts are reshaped to match
# (extra hosts removed). Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2 with `ip netns`.
set -euo pipefail

SUBNET=10.213.0
MAX_HOSTS=250

die() {
  echo "netns-hosts: $*" >&2
  exit 1
}

usage() {
  sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'
}

need_root() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (network namespaces, veth and tc need CAP_NET_ADMIN and CAP_SYS_ADMIN)"
  command -v ip > /dev/null || die "'ip' (iproute2) is not installed"
  command -v tc > /dev/null || die "'tc' (iproute2) is not installed"
  ip netns list > /dev/null 2>&1 || die "'ip netns' does not work here: $(ip netns list 2>&1 | head -n 1)"
}

# Namespaces of the prefix: the bridge and the hosts, exactly (prefix "chorus" must not match "chorus-test-h0").
list_hosts() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${prefix//./\\.}-h[0-9]+\$" | sort -V || true
}
exists() { [ -e "/var/run/netns/$1" ]; }

# Token bucket: burst of at least 64 KiB (one GSO segment group, so tbf does not have to split them) or 2 ms of
# the rate, whichever is larger; a queue of 20 ms beyond it before drops, so TCP sees the rate, not losses.
tbf_args() {
  local rate_bps=$1
  local burst=$((rate_bps / 8 / 500))
  [ "$burst" -ge 65536 ] || burst=65536
  echo "rate $rate_arg burst $burst latency 20ms"
}

# Bits per second of a tc rate ("1gbit", "500mbit", "100kbit", "1000000bit"), for the burst size.
rate_to_bps() {
  local r=${1,,}
  local num=${r%%[a-z]*} unit=${r##*[0-9.]}
  [[ "$num" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--rate $1: expected a number with a unit, e.g. 1gbit, 500mbit"
  local mult
  case "$unit" in
    bit | "") mult=1 ;;
    kbit) mult=1000 ;;
    mbit) mult=1000000 ;;
    gbit) mult=1000000000 ;;
    tbit) mult=1000000000000 ;;
    *) die "--rate $1: unit '$unit' not understood; use bit, kbit, mbit, gbit or tbit (bits per second)" ;;
  esac
  awk -v n="$num" -v m="$mult" 'BEGIN { printf "%d\n", n * m }'
}

up() {
  local h=$1
  if ! [[ "$h" =~ ^[0-9]+$ ]] || [ "$h" -lt 1 ] || [ "$h" -gt "$MAX_HOSTS" ]; then
    die "up: expected a host count between 1 and $MAX_HOSTS, got '$h'"
  fi
  need_root
  local bps
  bps=$(rate_to_bps "$rate_arg")
  [ "$bps" -gt 0 ] || die "--rate $rate_arg must be positive"
  local args
  args=$(tbf_args "$bps")
  local br="$prefix-br"
  # Hosts beyond H, from an earlier `up` with more hosts, go first.
  local ns idx
  for ns in $(list_hosts); do
    idx=${ns##*-h}
    if [ "$idx" -ge "$h" ]; then
      ip netns del "$ns"
      if exists "$br"; then ip -n "$br" link del "v$idx" 2> /dev/null || true; fi
    fi
  done
  exists "$br" || ip netns add "$br"
  ip -n "$br" link set lo up
  ip -n "$br" link show br0 > /dev/null 2>&1 || ip -n "$br" link add br0 type bridge
  ip -n "$br" link set br0 up
  for ((i = 0; i < h; ++i)); do
    ns="$prefix-h$i"
    exists "$ns" || ip netns add "$ns"
    ip -n "$ns" link set lo up
    # A half-built pair (one end lost with a deleted namespace) is rebuilt.
    if ! ip -n "$ns" link show eth0 > /dev/null 2>&1 || ! ip -n "$br" link show "v$i" > /dev/null 2>&1; then
      ip -n "$ns" link del eth0 2> /dev/null || true
      ip -n "$br" link del "v$i" 2> /dev/null || true
      ip -n "$br" link add "v$i" type veth peer name eth0 netns "$ns"
    fi
    ip -n "$br" link set "v$i" master br0 up
    ip -n "$ns" addr replace "$SUBNET.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    # shellcheck disable=SC2086
    tc -n "$ns" qdisc replace dev eth0 root tbf $args
    # shellcheck disable=SC2086
    tc -n "$br" qdisc replace dev "v$i" root tbf $args
  done
  # Neighbour discovery between every pair, so the first real message does not pay for ARP and a broken bridge
  # shows up here rather than in a benchmark.
  # A TCP connect to a closed port of host 0 answers "refused" (a reset) only when the path works both ways; no
  # ping needed.
  local why
  for ((i = 1; i < h; ++i)); do
    why=$(ip netns exec "$prefix-h$i" timeout 3 bash -c "echo > /dev/tcp/$SUBNET.1/9" 2>&1) || true
    [[ "$why" == *refused* ]] ||
      die "host $i cannot reach host 0 ($SUBNET.1) over the bridge: ${why:-no answer within 3 s}"
  done
  echo "netns-hosts: $h host(s) up with prefix '$prefix' at $rate_arg each way: namespaces $prefix-h0..$prefix-h$((h - 1))," \
    "addresses $SUBNET.1..$SUBNET.$h on eth0, bridge in $br"
}

down() {
  [ "$(id -u)" -eq 0 ] || die "must run as root to delete network namespaces"
  command -v ip > /dev/null || die "'ip' (iproute2) is not installed"
  local ns n=0
  for ns in $(list_hosts); do
    ip netns del "$ns"
    n=$((n + 1))
  done
  if exists "$prefix-br"; then ip netns del "$prefix-br"; fi
  echo "netns-hosts: removed $n host(s) with prefix '$prefix'"
}

status() {
  command -v ip > /dev/null || die "'ip' (iproute2) is not installed"
  local hosts
  hosts=$(list_hosts)
  if [ -z "$hosts" ]; then
    echo "netns-hosts: no hosts with prefix '$prefix'"
    exists "$prefix-br" && echo "  (bridge namespace $prefix-br exists without hosts)"
    return 0
  fi
  [ "$(id -u)" -eq 0 ] || die "status: must run as root to look inside the namespaces"
  local ns addr egress ingress idx
  echo "netns-hosts: prefix '$prefix', bridge namespace $prefix-br$(exists "$prefix-br" || echo ' (MISSING)')"
  for ns in $hosts; do
    idx=${ns##*-h}
    addr=$(ip -n "$ns" -4 -o addr show dev eth0 2> /dev/null | awk '{print $4}' | head -n 1)
    egress=$(tc -n "$ns" qdisc show dev eth0 2> /dev/null | grep -o 'rate [^ ]*' | head -n 1)
    ingress=$(tc -n "$prefix-br" qdisc show dev "v$idx" 2> /dev/null | grep -o 'rate [^ ]*' | head -n 1)
    echo "  $ns  eth0 ${addr:-(no address)}  egress ${egress:-unshaped}  ingress ${ingress:-unshaped}"
  done
}

# One TCP stream per sender into a sink on host 0 for SECONDS; prints each stream's goodput (payload bits, so
# about 95.6% of a tbf rate, which counts whole Ethernet frames).
MEASURE_PY='
import socket, sys, threading, time
def sink(port, nconn):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(nconn); print("ready", flush=True)
    out = []
    def drain(c):
        tot, t0 = 0, None
        while True:
            b = c.recv(1 << 20)
            if not b: break
            t0 = t0 or time.time(); tot += len(b)
        out.append(tot * 8 / (time.time() - t0) / 1e6)
    ts = [threading.Thread(target=drain, args=(s.accept()[0],)) for _ in range(nconn)]
    [t.start() for t in ts]; [t.join() for t in ts]
    print(" + ".join("%.0f" % r for r in sorted(out)) + " = %.0f Mbit/s" % sum(out), flush=True)
def source(host, port, secs):
    c = socket.create_connection((host, port)); buf = b"x" * (1 << 20); t0 = time.time()
    while time.time() - t0 < secs: c.sendall(buf)
    c.close()
if sys.argv[1] == "sink": sink(int(sys.argv[2]), int(sys.argv[3]))
else: source(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
'

# measure_streams N: N senders (hosts 1..N) into host 0.
measure_streams() {
  local n=$1 port=$((20000 + RANDOM % 10000)) fifo
  fifo=$(mktemp -u)
  mkfifo "$fifo"
  ip netns exec "$prefix-h0" python3 -c "$MEASURE_PY" sink "$port" "$n" > "$fifo" &
  local sink_pid=$! line
  exec 3< "$fifo"
  read -r line <&3 # "ready"
  local pids=()
  for ((i = 1; i <= n; ++i)); do
    ip netns exec "$prefix-h$i" python3 -c "$MEASURE_PY" source "$SUBNET.1" "$port" "$measure_seconds" &
    pids+=($!)
  done
  wait "${pids[@]}"
  read -r line <&3
  wait "$sink_pid"
  exec 3<&-
  rm -f "$fifo"
  echo "$line"
}

measure() {
  need_root
  command -v python3 > /dev/null || die "measure needs python3"
  local hosts
  hosts=$(list_hosts | wc -l)
  [ "$hosts" -ge 2 ] || die "measure needs at least 2 hosts with prefix '$prefix' (run: up 2 --prefix $prefix)"
  local rate
  rate=$(tc -n "$prefix-h0" qdisc show dev eth0 | grep -o 'rate [^ ]*' | head -n 1)
  echo "netns-hosts: shaped at ${rate#rate }; TCP goodput over ${measure_seconds} s:"
  echo "  h1 -> h0 (one stream):                   $(measure_streams 1)"
  if [ "$hosts" -ge 3 ]; then
    echo "  h1 + h2 -> h0 (sharing h0's ingress):    $(measure_streams 2)"
  fi
}

[ $# -ge 1 ] || {
  usage >&2
  exit 2
}
cmd=$1
shift
count=""
if [ "$cmd" = up ]; then
  [ $# -ge 1 ] || die "up: the host count is missing (usage: up H [--rate 1gbit] [--prefix chorus])"
  count=$1
  shift
fi
prefix=chorus
rate_arg=1gbit
measure_seconds=3
while [ $# -gt 0 ]; do
  case "$1" in
    --rate)
      [ $# -ge 2 ] || die "--rate needs a value"
      rate_arg=$2
      shift 2
      ;;
    --prefix)
      [ $# -ge 2 ] || die "--prefix needs a value"
      prefix=$2
      shift 2
      ;;
    --seconds)
      [ $# -ge 2 ] || die "--seconds needs a value"
      measure_seconds=$2
      shift 2
      ;;
    -h | --help)
      usage
      exit 0
      ;;
    *) die "unknown argument '$1'" ;;
  esac
done
[[ "$prefix" =~ ^[A-Za-z0-9][A-Za-z0-9_.-]*$ ]] || die "--prefix '$prefix': use letters, digits, '.', '_' and '-'"

case "$cmd" in
  up) up "$count" ;;
  down) down ;;
  status) status ;;
  measure) measure ;;
  -h | --help | help) usage ;;
  *)
    echo "netns-hosts: unknown command '$cmd'" >&2
    usage >&2
    exit 2
    ;;
esac
