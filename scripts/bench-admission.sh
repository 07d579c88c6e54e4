#!/usr/bin/env bash
# Measures what zgix's three admission controls cost: one origin, two zgix
# instances (controls off / all three on, same CPU), wrk runs interleaved
# off, on, off, on ...; prints median requests/s and p99 of each and the cost.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/bench-admission.sh [--rounds N] [--duration S] [--connections N] [--no-build] [--fleet]

Starts a zgix-bench origin (CPU 1) and two one-shard zgix instances (CPU 0):
"off" with no admission control and "on" with rate_limit (set far above the
offered load, so it is evaluated on every request but never refuses),
conn_limit and a WAF deny list. wrk (-t1, CPU 1) alternates between them for
N rounds; the table gives medians and the throughput cost of the controls.
Only 127.0.0.1 is used. Everything started is stopped on exit.

  --rounds N        rounds (default 7)
  --duration S      seconds per wrk run (default 4)
  --connections N   wrk connections (default 64)
  --no-build        use the release binaries already built
  --fleet           compare the rate limit's scopes instead: "off" is a
                    rate_limit with "scope": "box", "on" the same with
                    "scope": "fleet" syncing every 100 ms with a redis-server
                    the script starts on 127.0.0.1 (needs redis-server)
USAGE
}

rounds=7 duration=4 connections=64 build=1 fleet=0
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds="$2"; shift 2 ;;
        --duration) duration="$2"; shift 2 ;;
        --connections) connections="$2"; shift 2 ;;
        --no-build) build=0; shift ;;
        --fleet) fleet=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench-admission: unknown option $1 (try --help)" >&2; exit 2 ;;
    esac
done

root="$(cd "$(dirname "$0")/.." && pwd)"
bench_name=bench-admission
# shellcheck source=lib/bench-common.sh
. "$root/scripts/lib/bench-common.sh"
release_bins
command -v wrk >/dev/null || { echo "bench-admission: wrk is missing (apt-get install wrk)" >&2; exit 1; }
ulimit -l unlimited 2>/dev/null || true
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

ncpu="$(nproc)"
proxy_cpu=0
load_cpu=$(( ncpu > 1 ? 1 : 0 ))

taskset -c "$load_cpu" "$bench_bin" origin --bind 127.0.0.1:0 --cpus "$load_cpu" --body-bytes 64 \
    >"$tmp/origin.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q "listening on" "$tmp/origin.log" 2>/dev/null && break; sleep 0.1; done
origin="$(grep -o 'listening on [0-9.:]*' "$tmp/origin.log" | awk '{print $3}')"
[ -n "$origin" ] || { echo "bench-admission: origin did not start" >&2; cat "$tmp/origin.log" >&2; exit 1; }

# start_zgix NAME HTTP-EXTRA [TOP-EXTRA]: sets $addr to the instance's listener.
# Not run in a command substitution: that subshell would keep the PID from
# `pids`, and the instance would outlive the script.
start_zgix() {
    cat >"$tmp/$1.json" <<JSON
{ "cpus": [$proxy_cpu],${3:-}
  "listeners": [{"bind": "127.0.0.1:0", "http": {"cluster": "origin"$2}}],
  "clusters": {"origin": {"endpoints": ["$origin"]}} }
JSON
    "$zgix_bin" --config "$tmp/$1.json" >"$tmp/$1.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do grep -q "ready" "$tmp/$1.log" 2>/dev/null && break; sleep 0.1; done
    addr="$(grep -o 'listener 0 on [0-9.:]*' "$tmp/$1.log" | awk '{print $4}')"
}
if [ "$fleet" = 1 ]; then
    command -v redis-server >/dev/null || { echo "bench-admission: redis-server is missing (apt-get install redis-server)" >&2; exit 1; }
    rport=$(( 20000 + RANDOM % 20000 ))
    taskset -c "$load_cpu" redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no \
        >"$tmp/redis.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do [ "$(redis-cli -p "$rport" ping 2>/dev/null)" = PONG ] && break; sleep 0.1; done
    rate='"rate_limit": {"requests": 1000000000, "window_ms": 1000, "burst": 1000000000'
    start_zgix off ", $rate}"
    off="$addr"
    start_zgix on ", $rate, \"scope\": \"fleet\"}" \
        " \"fleet\": {\"redis\": \"127.0.0.1:$rport\", \"sync_ms\": 100},"
    on="$addr"
    [ -n "$off" ] && [ -n "$on" ] || { echo "bench-admission: zgix did not start" >&2; cat "$tmp"/*.log >&2; exit 1; }
else
    start_zgix off ""
    off="$addr"
    start_zgix on ', "rate_limit": {"requests": 1000000000, "window_ms": 1000, "burst": 1000000000},
    "conn_limit": {"max": 100000}, "waf": {"deny": ["union select", "<script", "../"], "status": 403}'
    on="$addr"
    [ -n "$off" ] && [ -n "$on" ] || { echo "bench-admission: zgix did not start" >&2; cat "$tmp"/*.log >&2; exit 1; }
    got="$(curl -s -o /dev/null -w '%{http_code}' "http://$on/x?q=UNION%20select+../etc")"
    [ "$got" = 403 ] || { echo "bench-admission: the WAF did not refuse a probe (got $got)" >&2; exit 1; }
fi

run() { # ADDR -> "rps p99us"
    local out
    out="$(taskset -c "$load_cpu" wrk -t1 -c"$connections" -d"${duration}s" --latency "http://$1/")"
    printf '%.0f %s\n' "$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")" \
        "$(to_us "$(awk '$1 == "99%" {print $2}' <<<"$out")")"
}

echo "bench-admission: origin $origin (CPU $load_cpu), zgix off $off / on $on (CPU $proxy_cpu), wrk -t1 -c$connections ${duration}s x $rounds rounds"
run "$off" >/dev/null; run "$on" >/dev/null # warm-up
: >"$tmp/off"; : >"$tmp/on"
for r in $(seq "$rounds"); do
    a="$(run "$off")"; b="$(run "$on")"
    echo "$a" >>"$tmp/off"; echo "$b" >>"$tmp/on"
    printf 'round %d: off %s req/s (p99 %s us)   on %s req/s (p99 %s us)\n' "$r" ${a% *} ${a#* } ${b% *} ${b#* }
done
roff="$(cut -d' ' -f1 "$tmp/off" | median)"; ron="$(cut -d' ' -f1 "$tmp/on" | median)"
poff="$(cut -d' ' -f2 "$tmp/off" | median)"; pon="$(cut -d' ' -f2 "$tmp/on" | median)"
echo
if [ "$fleet" = 1 ]; then
    printf '%-16s %10s %10s\n' "zgix rate scope" "req/s" "p99 us"
    printf '%-16s %10.0f %10.0f\n' box "$roff" "$poff"
    printf '%-16s %10.0f %10.0f\n' fleet "$ron" "$pon"
    echo "redis keys the fleet instance wrote: $(redis-cli -p "$rport" dbsize)"
else
    printf '%-16s %10s %10s\n' "zgix admission" "req/s" "p99 us"
    printf '%-16s %10.0f %10.0f\n' off "$roff" "$poff"
    printf '%-16s %10.0f %10.0f\n' "on (all three)" "$ron" "$pon"
fi
awk -v a="$roff" -v b="$ron" 'BEGIN {printf "throughput cost of the controls: %.1f%% (on/off = %.3f)\n", (a - b) / a * 100, b / a}'
