#!/usr/bin/env bash
# Measures what reloads cost in memory and descriptors: zgix under a wrk load, with one idle keep-alive client held open, read after 1 reload and after N reloads at R per second.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/bench-reload-memory.sh [options]

Starts a zgix-bench origin on 0.0.0.0:P (CPU 1) and zgix (1 shard, CPU 0) with
one listener, a cluster of --endpoints endpoints (127.0.0.1..127.0.0.N, all the
same origin) and --filters request filters, plus an admin endpoint. Then:

  1. one idle keep-alive client connects, sends one request and stays open;
  2. wrk -c --connections runs for the whole measurement;
  3. one reload (SIGHUP); after --settle seconds: VmRSS, zgix_heap_in_use_bytes
     (the whole process), zgix_generations_live, descriptors (/proc/PID/fd);
  4. --reloads more reloads, --rate per second; after --settle seconds, the
     same readings; wrk's totals (socket errors, non-2xx); upstream connects
     and errors (zgix_upstream_connects_total, zgix_upstream_errors_total).

  --zgix PATH        the zgix binary (default $CARGO_TARGET_DIR/release/zgix)
  --bench PATH       the zgix-bench binary (default next to zgix)
  --reloads N        (default 300)
  --rate R           reloads per second (default 10)
  --connections N    wrk connections (default 20)
  --endpoints N      (default 16, at most 200)
  --filters N        (default 60)
  --settle S         (default 3)
  --base-port P      P (origin), P+1 (zgix), P+2 (admin) (default 19080)
USAGE
}

target=${CARGO_TARGET_DIR:-target}
zgix="$target/release/zgix" bench="" reloads=300 rate=10 conns=20 endpoints=16 filters=60 settle=3 base=19080
while [ $# -gt 0 ]; do
    case "$1" in
        --zgix) zgix="$2"; shift 2 ;;
        --bench) bench="$2"; shift 2 ;;
        --reloads) reloads="$2"; shift 2 ;;
        --rate) rate="$2"; shift 2 ;;
        --connections) conns="$2"; shift 2 ;;
        --endpoints) endpoints="$2"; shift 2 ;;
        --filters) filters="$2"; shift 2 ;;
        --settle) settle="$2"; shift 2 ;;
        --base-port) base="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
[ -n "$bench" ] || bench="$(dirname "$zgix")/zgix-bench"
origin_port=$base port=$((base + 1)) admin=$((base + 2))
dir=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT

eps=$(for i in $(seq 1 "$endpoints"); do printf '"127.0.0.%d:%d"' "$i" "$origin_port"; if [ "$i" -lt "$endpoints" ]; then printf ','; fi; done)
rules=$(for i in $(seq 1 "$filters"); do printf '{"name":"r%d","match":{"path":{"exact":"/f%d"}},"action":{"respond":{"status":200,"body":"f%d\\n"}}}' "$i" "$i" "$i"; if [ "$i" -lt "$filters" ]; then printf ','; fi; done)
cat >"$dir/zgix.json" <<JSON
{"cpus": [0],
 "listeners": [{"bind": "127.0.0.1:$port", "http": {"cluster": "c", "request_filters": [$rules]}}],
 "admin": {"bind": "127.0.0.1:$admin"},
 "clusters": {"c": {"endpoints": [$eps]}}}
JSON

taskset -c 1 "$bench" origin --bind "0.0.0.0:$origin_port" >/dev/null 2>&1 &
pids+=($!)
"$zgix" --config "$dir/zgix.json" 2>"$dir/zgix.log" &
zpid=$!
pids+=($zpid)
for _ in $(seq 200); do grep -q "ready (" "$dir/zgix.log" && break; sleep 0.05; done
grep -q "ready (" "$dir/zgix.log" || { cat "$dir/zgix.log" >&2; exit 1; }

metric() { # sum of a series' values
    curl -s "http://127.0.0.1:$admin/metrics" | awk -v n="$1" '$1 == n || index($1, n "{") == 1 { s += $2 } END { printf "%d", s }'
}
reading() {
    local rss fds
    rss=$(awk '/VmRSS/ {print $2}' "/proc/$zpid/status")
    fds=$(ls "/proc/$zpid/fd" | wc -l)
    printf '%-18s RSS %6.1f MB  heap %6.1f MB  generations %s  fds %s\n' "$1" \
        "$(echo "$rss / 1024" | bc -l)" "$(echo "$(metric zgix_heap_in_use_bytes) / 1048576" | bc -l)" \
        "$(metric zgix_generations_live)" "$fds"
}

# The idle keep-alive client: one request, then held open.
exec 3<>"/dev/tcp/127.0.0.1/$port"
printf 'GET / HTTP/1.1\r\nHost: b\r\n\r\n' >&3
wrk -t2 -c"$conns" -d3600s "http://127.0.0.1:$port/" >"$dir/wrk.txt" 2>&1 &
wrk_pid=$!
pids+=($wrk_pid)
sleep 1
reading "start"
kill -HUP "$zpid"
sleep "$settle"
reading "after 1 reload"
gap=$(echo "1 / $rate" | bc -l)
for _ in $(seq "$reloads"); do kill -HUP "$zpid"; sleep "$gap"; done
sleep "$settle"
reading "after $((reloads + 1)) reloads"
kill -INT "$wrk_pid"
wait "$wrk_pid" 2>/dev/null || true
grep -E "requests in|Socket errors|Non-2xx|Requests/sec" "$dir/wrk.txt" || true
echo "upstream connects: $(metric zgix_upstream_connects_total), upstream errors: $(metric zgix_upstream_errors_total)"
echo "reload lines logged: $(grep -c "reload applied" "$dir/zgix.log"), generation $(metric zgix_config_generation)"
exec 3>&-
