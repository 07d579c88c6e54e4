#!/usr/bin/env bash
# What a fleet-scoped rate limit adds to the request path, in user-space
# instructions counted by valgrind's callgrind:
#  1. the check itself: admission/examples/rate_check_cost.rs runs N and 5N
#     checks box-scoped and fleet-scoped (one thread, synthetic clock): the
#     count is the same on every run, whatever else the machine does;
#  2. in context: zgix's shard thread per request with the rate limit off,
#     box-scoped and fleet-scoped (syncing with a redis-server this script
#     starts on 127.0.0.1), N and 5N keep-alive requests on one connection,
#     interleaved rounds. These counts depend on timing (how many event-loop
#     turns a request takes), so they vary from run to run on a loaded machine;
#     they give the scale of a request, part 1 gives the difference.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/callgrind-admission.sh [--requests N] [--rounds R] [--no-build]

Needs valgrind, python3 and redis-server. Runs zgix (release build, one shard,
epoll driver: valgrind does not model io_uring's shared rings) in front of a
zgix-bench origin; prints instructions per request for "off", "box" and
"fleet" and the fleet/box ratio of the request path. Everything started is
stopped on exit; only 127.0.0.1 is used.

  --requests N   N of the two runs (default 1000; the second is 5N)
  --rounds R     interleaved rounds of off, box, fleet; medians (default 3)
  --no-build     use the release binaries already built
USAGE
}

n=1000 rounds=3 build=1
while [ $# -gt 0 ]; do
    case "$1" in
        --requests) n="$2"; shift 2 ;;
        --rounds) rounds="$2"; shift 2 ;;
        --no-build) build=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "callgrind-admission: unknown option $1 (try --help)" >&2; exit 2 ;;
    esac
done

root="$(cd "$(dirname "$0")/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
if [ "$build" = 1 ]; then
    (cd "$root" && cargo build --release -q -p zgix -p zgix-bench &&
        cargo build --release -q -p zgix-admission --example rate_check_cost)
fi
cost_bin="$target_dir/release/examples/rate_check_cost"
zgix_bin="$target_dir/release/zgix"
bench_bin="$target_dir/release/zgix-bench"
for t in valgrind python3 redis-server; do
    command -v "$t" >/dev/null || { echo "callgrind-admission: $t is missing" >&2; exit 1; }
done

bench_name=callgrind-admission
# shellcheck source=lib/bench-common.sh
. "$root/scripts/lib/bench-common.sh"

cat >"$tmp/client.py" <<'PY'
import socket, sys
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.create_connection((host, port))
req = b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n"
buf = b""
for _ in range(n):
    s.sendall(req)
    while True:
        h = buf.find(b"\r\n\r\n")
        if h >= 0:
            head = buf[:h].decode()
            assert head.startswith("HTTP/1.1 200"), head
            cl = next(int(l.split(":")[1]) for l in head.split("\r\n")
                      if l.lower().startswith("content-length"))
            if len(buf) >= h + 4 + cl:
                buf = buf[h + 4 + cl:]
                break
        d = s.recv(65536)
        assert d, "connection closed"
        buf += d
PY

oport="$(free_port)"
"$bench_bin" origin --bind "127.0.0.1:$oport" --body-bytes 64 >"$tmp/origin.log" 2>&1 &
pids+=($!)
wait_line "$tmp/origin.log" "listening"
rport="$(free_port)"
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no >/dev/null 2>&1 &
pids+=($!)
for _ in $(seq 100); do
    [ "$(redis-cli -p "$rport" PING 2>/dev/null)" = PONG ] && break
    sleep 0.1
done

# One run: config kind, request count -> instructions of the busiest thread
# (the shard; the fleet sync thread and the process's main thread are apart).
run() {
    local kind="$1" count="$2" lport rate="" fleet=""
    lport="$(free_port)"
    case "$kind" in
        off) ;;
        box) rate=', "rate_limit": {"requests": 1000000, "window_ms": 1000, "burst": 1000000}' ;;
        fleet)
            rate=', "rate_limit": {"requests": 1000000, "window_ms": 1000, "burst": 1000000, "scope": "fleet"}'
            fleet="\"fleet\": {\"redis\": \"127.0.0.1:$rport\", \"sync_ms\": 100},"
            ;;
    esac
    local dir="$tmp/$kind-$count"
    mkdir -p "$dir"
    cat >"$dir/zgix.json" <<JSON
{"cpus": [0], "io": {"driver": "epoll"}, $fleet
 "listeners": [{"bind": "127.0.0.1:$lport", "http": {"cluster": "api"$rate}}],
 "clusters": {"api": {"endpoints": ["127.0.0.1:$oport"]}}}
JSON
    (cd "$dir" && RUNTIME_DIRECTORY="$dir" exec valgrind --tool=callgrind --separate-threads=yes \
        "$zgix_bin" --config "$dir/zgix.json" >"$dir/zgix.log" 2>&1) &
    local vpid=$!
    wait_line "$dir/zgix.log" "ready ("
    python3 "$tmp/client.py" 127.0.0.1 "$lport" "$count"
    kill -TERM "$vpid" 2>/dev/null || true
    wait "$vpid" 2>/dev/null || true
    local best=0 v
    for f in "$dir"/callgrind.out.*; do
        v="$(awk '/^(summary|totals):/ {print $2; exit}' "$f")"
        [ -n "$v" ] && [ "$v" -gt "$best" ] && best="$v"
    done
    echo "$best"
}

checks() { # mode count -> instructions of the whole program
    valgrind --tool=callgrind --callgrind-out-file="$tmp/cost.out" "$cost_bin" "$1" "$2" \
        2>&1 >/dev/null | awk '/Collected :/ {print $NF}'
}
cn=$((100 * n))
printf 'callgrind-admission: the rate check alone, %d and %d checks (1,000 identities, 65,536 slots)\n' "$cn" $((5 * cn))
declare -A check
for mode in box fleet; do
    a="$(checks "$mode" "$cn")"
    b="$(checks "$mode" $((5 * cn)))"
    check[$mode]="$(awk -v a="$a" -v b="$b" -v n="$cn" 'BEGIN {printf "%.1f", (b - a) / (4 * n)}')"
    printf '%-8s %10s instr/check\n' "$mode" "${check[$mode]}"
done
awk -v b="${check[box]}" -v f="${check[fleet]}" 'BEGIN {printf "fleet adds %.1f instructions per check\n", f - b}'

printf 'callgrind-admission: %d and %d requests per configuration, one keep-alive connection, 64-byte responses, %d interleaved rounds\n' "$n" $((5 * n)) "$rounds"
declare -A all
for r in $(seq "$rounds"); do
    for kind in off box fleet; do
        a="$(run "$kind" "$n")"
        b="$(run "$kind" $((5 * n)))"
        v=$(( (b - a) / (4 * n) ))
        all[$kind]="${all[$kind]:-} $v"
        printf 'round %d %-6s %8d instr/request\n' "$r" "$kind" "$v"
    done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
declare -A per
printf '%-8s %16s   %s\n' config median rounds
for kind in off box fleet; do
    per[$kind]="$(echo "${all[$kind]}" | median)"
    printf '%-8s %16d  %s\n' "$kind" "${per[$kind]}" "${all[$kind]}"
done
awk -v b="${per[box]}" -v f="${per[fleet]}" -v o="${per[off]}" -v cb="${check[box]}" -v cf="${check[fleet]}" 'BEGIN {
    printf "medians: rate limit (box) over off: %+.1f%%   fleet over box: %+.2f%% (timing-dependent)\n", (b - o) * 100 / o, (f - b) * 100 / b
    printf "the fleet check'"'"'s extra instructions over a box request: %.3f%%\n", (cf - cb) * 100 / b }'
