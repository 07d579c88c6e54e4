#!/usr/bin/env bash
# One 1 GiB download and one 1 GiB upload through each proxy (zgix on both
# drivers, nginx, HAProxy with and without splice-auto) and straight to the
# origin: MB/s from curl, and the proxy's resident memory sampled every
# 0.1 s (VmRSS of its serving processes) before and during the transfer.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/bench-bodies-gib.sh [--bytes N] [--targets LIST] [--base-port P] [--no-build]

  --bytes N       body size (default 1073741824)
  --targets LIST  any of zgix,zgix-epoll,nginx,haproxy,haproxy-splice,direct
                  (default all)
  --base-port P   first local port (default 18280; uses P..P+10)
  --no-build      use $ZGIX_BIN / $ZGIX_BENCH_BIN, or the release binaries under
                  $CARGO_TARGET_DIR (or ./target)

Same CPU plan as bench-peers.sh: proxies on CPU 0, origin and curl on CPU 1.
The origin holds the whole response body in memory (N bytes); for the
uploads it is restarted answering 64 bytes. The upload is curl -T of a
sparse file (no disk traffic). Prints, per target and
direction, MB/s and the RSS before, its peak during the transfer and the
growth; "flat" when the growth is under 10 MB.
USAGE
}

bytes=1073741824 targets="zgix,zgix-epoll,nginx,haproxy,haproxy-splice,direct" base_port=18280 build=1
while [ $# -gt 0 ]; do
    case "$1" in
        --bytes) bytes="$2"; shift 2 ;;
        --targets) targets="$2"; shift 2 ;;
        --base-port) base_port="$2"; shift 2 ;;
        --no-build) build=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench-bodies-gib: unknown option $1" >&2; exit 2 ;;
    esac
done
root="$(cd "$(dirname "$0")/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
[ "$build" = 1 ] && (cd "$root" && cargo build --release -q -p zgix -p zgix-bench)
bench_bin="${ZGIX_BENCH_BIN:-$target_dir/release/zgix-bench}" zgix_bin="${ZGIX_BIN:-$target_dir/release/zgix}" zgix_base_bin=""
PATH="$PATH:/usr/sbin:/sbin"
ulimit -l unlimited 2>/dev/null || true
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
proxy_cpu=0 origin_cpu=$(( $(nproc) > 1 ? 1 : 0 ))
body_bytes=$bytes rate_limit=10000000 conn_limit=1024
bench_name=bench-bodies-gib
# shellcheck source=lib/bench-common.sh
. "$root/scripts/lib/bench-common.sh"
# shellcheck source=lib/bench-proxies.sh
. "$root/scripts/lib/bench-proxies.sh"
# Every GET / here answers N bytes: wait for listeners with HEAD instead.
wait_http() {
    local addr="$1" name="$2" i
    shift 2
    for i in $(seq 600); do
        curl -s -I -o /dev/null --max-time 2 "http://$addr/" && return 0
        sleep 0.1
    done
    echo "$bench_name: $name did not come up on $addr; its log:" >&2
    cat "$@" >&2 || true
    exit 1
}
bench_ports "$base_port"
check_ports_free bench-bodies-gib
truncate -s "$bytes" "$tmp/upload"

# peak_rss TARGET PID_OF_CURL: the largest VmRSS (KiB) of the target's
# serving processes while the curl runs.
peak_rss() {
    local peak=0 r
    while kill -0 "$2" 2>/dev/null; do
        r="$(rss_of "$1")"
        [ "$r" -gt "$peak" ] && peak=$r
        sleep 0.1
    done
    echo "$peak"
}

# transfer TARGET DIRECTION: one curl run; prints the row.
transfer() {
    local t="$1" dir="$2" url before peak out cpid speed
    url="http://127.0.0.1:$(port_of "$t")/"
    before="-" peak="-"
    [ "$t" = direct ] || before="$(rss_of "$t")"
    if [ "$dir" = down ]; then
        taskset -c "$origin_cpu" curl -sS -o /dev/null -w '%{speed_download} %{size_download}' "$url" >"$tmp/curl.out" &
    else
        taskset -c "$origin_cpu" curl -sS -o /dev/null -H 'Expect:' -T "$tmp/upload" -w '%{speed_upload} %{size_upload}' "$url" >"$tmp/curl.out" &
    fi
    cpid=$!; pids+=("$cpid")
    [ "$t" = direct ] || peak="$(peak_rss "$t" "$cpid")"
    wait "$cpid" || { echo "bench-bodies-gib: curl failed against $t ($dir)" >&2; return 1; }
    read -r speed out <"$tmp/curl.out" || true # curl ends it without a newline
    awk -v t="$t" -v d="$dir" -v s="$speed" -v n="$out" -v b="$before" -v p="$peak" 'BEGIN {
        g = (b == "-" ? "-" : sprintf("%.1f", (p - b) / 1024))
        printf "%-14s %-4s %12d %9.0f %10s %10s %8s %s\n", t, d, n, s / 1e6, b, p, g,
            (b == "-" ? "" : ((p - b) / 1024 < 10 ? "flat" : "GROWS")) }'
}

printf '%-14s %-4s %12s %9s %10s %10s %8s\n' target dir bytes MB/s "rss KiB" "peak KiB" "+MB"
IFS=, read -r -a list <<<"$targets"
# Downloads from an origin answering N bytes, then uploads to one answering
# 64 bytes (so an upload is not also a download).
# start_big_origin: the origin builds its answers (N bytes each) before it
# listens; give it a minute rather than 10 s.
start_big_origin() {
    local i
    taskset -c "$origin_cpu" "$bench_bin" origin --bind "127.0.0.1:$origin_port" \
        --cpus "$origin_cpu" --body-bytes "$body_bytes" >"$tmp/origin.log" 2>&1 &
    pids+=($!); tpid[direct]=$!
    for i in $(seq 600); do
        curl -s -I -o /dev/null --max-time 2 "http://127.0.0.1:$origin_port/" && return 0
        sleep 0.1
    done
    echo "bench-bodies-gib: the origin did not come up; its log:" >&2; cat "$tmp/origin.log" >&2; exit 1
}

for dir in down up; do
    [ "$dir" = up ] && body_bytes=64
    start_big_origin
    for t in "${list[@]}"; do
        [ "$t" = direct ] || start_target "$t" off 0
        transfer "$t" "$dir"
        [ "$t" = direct ] || stop_target "$t"
    done
    stop_target direct
done
