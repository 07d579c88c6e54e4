#!/usr/bin/env bash
# Counts the requests a series of `zgix --upgrade` hand-offs (and reloads) fails under a wrk keep-alive load.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/bench-upgrade.sh [options]

Starts a zgix-bench origin (CPU 1) and zgix (2 shards) on 127.0.0.1:P+1, runs
`wrk -t2 -c --connections` against it, and every --every seconds hands the
sockets to a new process (`zgix --upgrade`, same config), then sends the new
one a SIGHUP; --upgrades times. Prints wrk's totals: socket errors are
requests the hand-offs failed.

  --zgix PATH        the zgix binary (default $CARGO_TARGET_DIR/release/zgix)
  --bench PATH       the zgix-bench binary (default next to zgix)
  --upgrades N       (default 10)
  --every S          seconds between hand-offs (default 2)
  --connections N    (default 50)
  --base-port P      P (origin), P+1 (zgix) (default 19180)
USAGE
}

target=${CARGO_TARGET_DIR:-target}
zgix="$target/release/zgix" bench="" upgrades=10 every=2 conns=50 base=19180
while [ $# -gt 0 ]; do
    case "$1" in
        --zgix) zgix="$2"; shift 2 ;;
        --bench) bench="$2"; shift 2 ;;
        --upgrades) upgrades="$2"; shift 2 ;;
        --every) every="$2"; shift 2 ;;
        --connections) conns="$2"; shift 2 ;;
        --base-port) base="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
[ -n "$bench" ] || bench="$(dirname "$zgix")/zgix-bench"
origin_port=$base port=$((base + 1))
dir=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT

cat >"$dir/zgix.json" <<JSON
{"cpus": [0, 1],
 "listeners": [{"bind": "127.0.0.1:$port", "http": {"cluster": "c"}}],
 "clusters": {"c": {"endpoints": ["127.0.0.1:$origin_port"]}}}
JSON

taskset -c 1 "$bench" origin --bind "127.0.0.1:$origin_port" >/dev/null 2>&1 &
pids+=($!)
wait_ready() { # log file
    for _ in $(seq 400); do grep -q "ready (" "$1" && return 0; sleep 0.05; done
    cat "$1" >&2
    return 1
}
"$zgix" --config "$dir/zgix.json" 2>"$dir/zgix-0.log" &
cur=$!
pids+=($cur)
wait_ready "$dir/zgix-0.log"
wrk -t2 -c"$conns" -d$((upgrades * every + 4))s "http://127.0.0.1:$port/" >"$dir/wrk.txt" 2>&1 &
wrk_pid=$!
pids+=($wrk_pid)
sleep 2
for i in $(seq "$upgrades"); do
    "$zgix" --config "$dir/zgix.json" --upgrade 2>"$dir/zgix-$i.log" &
    new=$!
    pids+=($new)
    wait_ready "$dir/zgix-$i.log"
    # The old process drains and exits on its own.
    for _ in $(seq 400); do kill -0 "$cur" 2>/dev/null || break; sleep 0.05; done
    cur=$new
    sleep "$(echo "$every / 2" | bc -l)"
    kill -HUP "$cur"
    sleep "$(echo "$every / 2" | bc -l)"
done
wait "$wrk_pid" || true
echo "$upgrades upgrades and $upgrades reloads under wrk -c$conns:"
grep -E "requests in|Socket errors|Non-2xx|Requests/sec" "$dir/wrk.txt" || true
grep -q "Socket errors" "$dir/wrk.txt" || echo "  Socket errors: none"
