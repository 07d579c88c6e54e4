#!/usr/bin/env bash
# The engine's figures of issue 19 from one run of one build: the slow-head
# CPU ratio (a 256 KiB head against a 32 KiB one, each sent 1 byte per 40 µs)
# on both drivers, then memory per idle and kept-alive connection at 10,000
# connections (scripts/bench-conns.sh) for zgix on both drivers, nginx and
# HAProxy.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/bench-engine.sh [options]

Part 1, slow heads: zgix (1 shard, CPU 0; limits.max_header_bytes 400000,
max_headers 256, client_header_timeout_ms 60000; the cluster is a closed
port, so each head ends in a 502) is sent a head of 32 KiB and one of 256 KiB
(2 KiB fields) 1 byte per --gap-us by scripts/lib/slow-head-client.py on
CPU 1. CPU = zgix's utime + stime ticks (10 ms, /proc/PID/stat) over each
send. Rounds interleave the sizes and the drivers (uring 32 K, uring 256 K,
epoll 32 K, epoll 256 K, next round). Prints each reading and, per driver,
the ratio of the medians. Fails if a head is not answered 502.

Part 2, memory: scripts/bench-conns.sh --connections N --rounds R --no-build
on the same binaries (its own help says how).

  --rounds N        rounds of each part (default 3)
  --connections N   part 2's connection count (default 10000)
  --gap-us US       part 1's pacing (default 40)
  --targets LIST    part 2's targets (default zgix,zgix-epoll,nginx,haproxy)
  --no-build        use $ZGIX_BIN / $ZGIX_BENCH_BIN or the release binaries
  -h, --help        this text
USAGE
}

rounds=3 conns=10000 gap_us=40 targets="zgix,zgix-epoll,nginx,haproxy" build=1
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds="$2"; shift 2 ;;
        --connections) conns="$2"; shift 2 ;;
        --gap-us) gap_us="$2"; shift 2 ;;
        --targets) targets="$2"; shift 2 ;;
        --no-build) build=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench-engine: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
done

root="$(cd "$(dirname "$0")/.." && pwd)"
bench_name=bench-engine
# shellcheck source=lib/bench-common.sh
. "$root/scripts/lib/bench-common.sh"
release_bins
[ -x "$zgix_bin" ] || { echo "bench-engine: no binary at $zgix_bin" >&2; exit 1; }
ulimit -l unlimited 2>/dev/null || ulimit -l "$(ulimit -Hl)" 2>/dev/null || true
pid=""

port=18190
closed_port=18191
echo "bench-engine: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'), $(uptime)"
echo "bench-engine: part 1, slow heads, 1 byte per $gap_us µs; zgix on CPU 0, client on CPU 1"

start() { # DRIVER
    cat >"$tmp/$1.json" <<JSON
{
  "cpus": [0],
  "io": {"driver": "$1"},
  "limits": {"busy_poll_us": 0, "max_header_bytes": 400000, "max_headers": 256,
             "client_header_timeout_ms": 60000},
  "listeners": [{"bind": "127.0.0.1:$port", "http": {"cluster": "closed"}}],
  "clusters": {"closed": {"endpoints": ["127.0.0.1:$closed_port"]}}
}
JSON
    "$zgix_bin" --config "$tmp/$1.json" >"$tmp/$1.log" 2>&1 &
    pid=$!
    pids+=("$pid")
    local i
    for i in $(seq 100); do grep -q "ready (" "$tmp/$1.log" && break; sleep 0.1; done
    grep -q "ready (.*, $1)" "$tmp/$1.log" || { echo "bench-engine: zgix did not start on $1:" >&2; cat "$tmp/$1.log" >&2; exit 1; }
}

stop() {
    stop_pid "$pid"
    pid=""
}

declare -A ticks
for r in $(seq "$rounds"); do
    for d in uring epoll; do
        start "$d"
        for size in 32768 262144; do
            out="$(taskset -c 1 python3 "$root/scripts/lib/slow-head-client.py" "$port" "$size" "$gap_us" "$pid")"
            # bytes fields seconds ticks status-line
            read -r bytes _fields secs t status <<<"$out"
            case "$status" in *" 502 "*) ;; *) echo "bench-engine: $d $size: answer was '$status'" >&2; exit 1 ;; esac
            echo "round $r $d head $bytes bytes: $t ticks over ${secs} s"
            ticks[$d-$size]+="$t "
        done
        stop
    done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
for d in uring epoll; do
    small="$(echo "${ticks[$d-32768]}" | median)"
    big="$(echo "${ticks[$d-262144]}" | median)"
    ratio="$(awk -v a="$big" -v b="$small" 'BEGIN { printf "%.1f", (b > 0) ? a / b : 0 }')"
    echo "slow heads, $d: 32 KiB ${ticks[$d-32768]}(median $small), 256 KiB ${ticks[$d-262144]}(median $big): ratio $ratio (linear 8, goal <= 10)"
done

echo "bench-engine: part 2, memory per connection at $conns connections"
ZGIX_BIN="$zgix_bin" "$root/scripts/bench-conns.sh" --connections "$conns" --rounds "$rounds" \
    --targets "$targets" --no-build
