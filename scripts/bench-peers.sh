#!/usr/bin/env bash
# Benchmarks zgix against nginx and HAProxy in front of the same zgix-bench
# origin, plus a bare TCP relay and a direct run to the origin, with admission
# controls off and on.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/bench-peers.sh [options]

Puts one zgix-bench origin behind zgix (1 shard), nginx (1 worker) and HAProxy
(1 thread), all on 127.0.0.1, plus a bare TCP relay and a direct run, and
loads each with `wrk -t1 -cN --latency` in interleaved rounds (zgix nginx
haproxy relay direct, zgix nginx ...). Prints, per admission mode, the median
requests/s, p50 and p99 of each target, its ratio to zgix, and the median of
the per-round ratios of zgix to each target.

  --rounds N        rounds per mode (default 5)
  --duration S      seconds per wrk run (default 5)
  --connections N   wrk connections (default 64)
  --modes LIST      off,on (default both): admission controls off / on
                    (on = rate limit set high enough never to refuse, connection
                    limit, WAF deny list; nginx limit_req/limit_conn/if, HAProxy
                    stick-table + http-request deny)
  --targets LIST    any of zgix,nginx,haproxy,relay,direct (default all five).
                    relay is HAProxy in TCP mode (1 thread): it copies
                    bytes between a client connection and its own upstream
                    connection and parses nothing, so it marks what any proxy
                    can reach on this CPU plan; it runs without admission
                    controls in both modes and is not counted as a peer
  --body-bytes N    origin response body size (default 64)
  --fixed-rate R    after the wrk rounds, offer R requests/s open loop
                    (zgix-bench load, --connections connections) to each proxy
                    and report the proxy core's CPU time per request; zgix runs
                    with busy polling off for this part so its CPU share is its
                    work (default 10000; 0 skips it)
  --rate-rounds N   interleaved rounds of the fixed-rate part (default 3)
  --base-port P     first of the local ports used (default 18080; uses P..P+9)
  --no-install      do not apt-get install missing wrk/nginx/haproxy (python3
                    for --fixed-rate)
  --no-build        do not cargo build; use $ZGIX_BIN / $ZGIX_BENCH_BIN or the
                    release binaries under $CARGO_TARGET_DIR (default ./target)
  -h, --help        this text

CPU plan: the proxies are pinned to CPU 0 (zgix "cpus":[0], nginx
worker_cpu_affinity, HAProxy cpu-map), the origin to CPU 1 and wrk to CPU 2
(on a 2-CPU box wrk shares CPU 1 with the origin, so compare ratios, not
absolute numbers). Needs root only to install packages. Everything started is
stopped on exit.
USAGE
}

rounds=5 duration=5 connections=64 modes="off,on" targets="zgix,nginx,haproxy,relay,direct"
body_bytes=64 base_port=18080 install=1 build=1 fixed_rate=10000 rate_rounds=3
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds="$2"; shift 2 ;;
        --duration) duration="$2"; shift 2 ;;
        --connections) connections="$2"; shift 2 ;;
        --modes) modes="$2"; shift 2 ;;
        --targets) targets="$2"; shift 2 ;;
        --body-bytes) body_bytes="$2"; shift 2 ;;
        --base-port) base_port="$2"; shift 2 ;;
        --fixed-rate) fixed_rate="$2"; shift 2 ;;
        --rate-rounds) rate_rounds="$2"; shift 2 ;;
        --no-install) install=0; shift ;;
        --no-build) build=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench-peers: unknown option $1 (try --help)" >&2; exit 2 ;;
    esac
done
for n in "$rounds" "$duration" "$connections" "$body_bytes" "$base_port" "$fixed_rate" "$rate_rounds"; do
    [[ "$n" =~ ^[0-9]+$ ]] || { echo "bench-peers: $n is not a number" >&2; exit 2; }
done
IFS=, read -r -a target_list <<<"$targets"
for t in "${target_list[@]}"; do
    case "$t" in zgix|nginx|haproxy|direct|relay) ;; *) echo "bench-peers: unknown target $t" >&2; exit 2 ;; esac
done

root="$(cd "$(dirname "$0")/.." && pwd)"
has() { [[ ",$targets," == *",$1,"* ]]; }

# --- packages ------------------------------------------------------------
missing=()
command -v wrk >/dev/null || missing+=(wrk)
# The fixed-rate phase reads zgix-bench load's JSON report with python3.
if [ "$fixed_rate" -gt 0 ]; then command -v python3 >/dev/null || missing+=(python3); fi
if has nginx; then command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx); fi
if has haproxy || has relay; then command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || missing+=(haproxy); fi
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$install" = 0 ]; then
        echo "bench-peers: missing ${missing[*]} and --no-install given" >&2; exit 1
    fi
    if [ "$(id -u)" != 0 ]; then
        echo "bench-peers: missing ${missing[*]}; run as root to install them, or install them yourself" >&2
        exit 1
    fi
    echo "bench-peers: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q "${missing[@]}"
    # Debian starts the packaged services; they are not the ones measured here.
    for svc in nginx haproxy; do
        if [[ " ${missing[*]} " == *" $svc "* ]] && command -v systemctl >/dev/null; then
            systemctl stop "$svc" 2>/dev/null || true
        fi
    done
fi
PATH="$PATH:/usr/sbin:/sbin"

# --- binaries ------------------------------------------------------------
target_dir="${CARGO_TARGET_DIR:-$root/target}"
if [ "$build" = 1 ]; then
    pkgs=(-p zgix-bench)
    has zgix && pkgs+=(-p zgix)
    (cd "$root" && cargo build --release -q "${pkgs[@]}")
fi
bench_bin="${ZGIX_BENCH_BIN:-$target_dir/release/zgix-bench}"
zgix_bin="${ZGIX_BIN:-$target_dir/release/zgix}"
[ -x "$bench_bin" ] || { echo "bench-peers: no zgix-bench at $bench_bin" >&2; exit 1; }
if has zgix && [ ! -x "$zgix_bin" ]; then
    echo "bench-peers: no zgix at $zgix_bin (build it or leave zgix out of --targets)" >&2; exit 1
fi
# io_uring needs locked memory (zgix and the origin are glommio programs).
ulimit -l unlimited 2>/dev/null || ulimit -l "$(ulimit -Hl)" 2>/dev/null || true
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
# HAProxy refuses to start when maxconn needs more descriptors than it may
# open (two per proxied connection plus its own).
fd_limit="$(ulimit -n)"
[ "$fd_limit" = unlimited ] && fd_limit=1048576
haproxy_maxconn=$(( fd_limit / 2 - 100 ))

# --- CPU plan ------------------------------------------------------------
ncpu="$(nproc)"
proxy_cpu=0
origin_cpu=$(( ncpu > 1 ? 1 : 0 ))
wrk_cpu=$(( ncpu > 2 ? 2 : ncpu - 1 ))
echo "bench-peers: $ncpu CPUs; proxies on CPU $proxy_cpu, origin on CPU $origin_cpu, wrk on CPU $wrk_cpu"
nginx_mask=$(printf '%x' $(( 1 << proxy_cpu )))

# --- processes and cleanup -----------------------------------------------
bench_name=bench-peers
# shellcheck source=lib/bench-common.sh
. "$root/scripts/lib/bench-common.sh"

# wait_port PORT NAME LOG: up to 10 s for a listener on 127.0.0.1:PORT.
wait_port() { wait_http "127.0.0.1:$1" "$2" "$3"; }

port_free() { ! ss -ltnH "( sport = :$1 )" 2>/dev/null | grep -q .; }
origin_port=$base_port zgix_port=$((base_port + 1)) nginx_port=$((base_port + 2))
haproxy_port=$((base_port + 3)) relay_port=$((base_port + 4)) admin_port=$((base_port + 9))
for p in $origin_port $zgix_port $nginx_port $haproxy_port $relay_port $admin_port; do
    port_free "$p" || { echo "bench-peers: port $p is in use; pick another --base-port" >&2; exit 1; }
done

# --- origin --------------------------------------------------------------
taskset -c "$origin_cpu" "$bench_bin" origin --bind "127.0.0.1:$origin_port" \
    --cpus "$origin_cpu" --body-bytes "$body_bytes" >"$tmp/origin.log" 2>&1 &
pids+=($!)
wait_port "$origin_port" origin "$tmp/origin.log"

# Admission settings, the same intent in all three proxies: a per-client rate
# limit far above what one box can send (so it is evaluated but never refuses),
# a per-client connection cap above --connections, and a deny list.
rate_limit=10000000
conn_limit=$(( connections * 4 > 1024 ? connections * 4 : 1024 ))

start_zgix() { # MODE [BUSY_POLL_US]
    local http='"cluster": "origin"' limits=""
    [ -n "${2:-}" ] && limits="\"limits\": {\"busy_poll_us\": $2},"
    if [ "$1" = on ]; then
        http+=", \"rate_limit\": {\"requests\": $rate_limit, \"window_ms\": 1000, \"burst\": $rate_limit}"
        http+=", \"conn_limit\": {\"max\": $conn_limit}"
        http+=', "waf": {"deny": ["union select", "<script", "../"], "status": 403}'
    fi
    cat >"$tmp/zgix-$1.json" <<JSON
{
  "cpus": [$proxy_cpu], $limits
  "admin": {"bind": "127.0.0.1:$admin_port"},
  "listeners": [{"bind": "127.0.0.1:$zgix_port", "http": {$http}}],
  "clusters": {"origin": {"endpoints": ["127.0.0.1:$origin_port"], "lb": "round_robin"}}
}
JSON
    "$zgix_bin" --config "$tmp/zgix-$1.json" >"$tmp/zgix.log" 2>&1 &
    pids+=($!); zgix_pid=$!
    wait_port "$zgix_port" zgix "$tmp/zgix.log"
}

start_nginx() { # MODE
    local d="$tmp/nginx-$1" zones="" limits=""
    mkdir -p "$d/logs"
    if [ "$1" = on ]; then
        zones="limit_req_zone \$binary_remote_addr zone=rl:10m rate=${rate_limit}r/s;
    limit_conn_zone \$binary_remote_addr zone=cl:10m;"
        limits="limit_req zone=rl burst=$rate_limit nodelay;
        limit_conn cl $conn_limit;
        if (\$request_uri ~* \"(union(%20|\\+| )select|<script|%3Cscript|\\.\\./)\") { return 403; }"
    fi
    cat >"$d/nginx.conf" <<CONF
daemon off;
worker_processes 1;
worker_cpu_affinity $nginx_mask;
pid $d/nginx.pid;
error_log $d/logs/error.log warn;
events { worker_connections 16384; }
http {
    access_log off;
    $zones
    upstream origin {
        server 127.0.0.1:$origin_port;
        keepalive 256;
    }
    server {
        listen 127.0.0.1:$nginx_port;
        $limits
        location / {
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
CONF
    nginx -p "$d" -c "$d/nginx.conf" -e "$d/logs/error.log" >"$d/logs/stderr.log" 2>&1 &
    pids+=($!); nginx_pid=$!
    wait_port "$nginx_port" nginx "$d/logs/error.log"
}

start_haproxy() { # MODE
    local f="$tmp/haproxy-$1.cfg" rules=""
    if [ "$1" = on ]; then
        rules="stick-table type ip size 1m expire 30s store http_req_rate(1s),conn_cur
    tcp-request connection track-sc0 src
    tcp-request connection reject if { sc0_conn_cur gt $conn_limit }
    http-request deny deny_status 429 if { sc0_http_req_rate gt $rate_limit }
    http-request deny deny_status 403 if { url_sub -i \"union select\" } || { url_sub -i union%20select } || { url_sub -i <script } || { url_sub -i %3Cscript } || { url_sub ../ }"
    fi
    cat >"$f" <<CFG
global
    nbthread 1
    cpu-map 1/1 $proxy_cpu
    maxconn $haproxy_maxconn
defaults
    mode http
    option http-keep-alive
    http-reuse always
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend fe
    bind 127.0.0.1:$haproxy_port
    $rules
    default_backend be
backend be
    server origin 127.0.0.1:$origin_port
CFG
    haproxy -f "$f" -db >"$tmp/haproxy.log" 2>&1 &
    pids+=($!); haproxy_pid=$!
    wait_port "$haproxy_port" haproxy "$tmp/haproxy.log"
}

# start_relay: HAProxy in TCP mode, one upstream connection per client
# connection, no HTTP parsing and no admission controls.
start_relay() {
    local f="$tmp/relay.cfg"
    cat >"$f" <<CFG
global
    nbthread 1
    cpu-map 1/1 $proxy_cpu
    maxconn $haproxy_maxconn
defaults
    mode tcp
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend relay
    bind 127.0.0.1:$relay_port
    default_backend origin
backend origin
    server origin 127.0.0.1:$origin_port
CFG
    haproxy -f "$f" -db >"$tmp/relay.log" 2>&1 &
    pids+=($!); relay_pid=$!
    wait_port "$relay_port" relay "$tmp/relay.log"
}

port_of() {
    case "$1" in
        zgix) echo "$zgix_port" ;; nginx) echo "$nginx_port" ;;
        haproxy) echo "$haproxy_port" ;; direct) echo "$origin_port" ;;
        relay) echo "$relay_port" ;;
    esac
}

# cpu_ticks CPU: "busy total" jiffies of one CPU from /proc/stat.
cpu_ticks() {
    awk -v c="cpu$1" '$1 == c { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t }' /proc/stat
}

# busy_pct BEFORE AFTER: busy share of the CPU between two cpu_ticks samples.
busy_pct() {
    awk -v a="$1" -v b="$2" 'BEGIN { split(a, x, " "); split(b, y, " ")
        dt = y[2] - x[2]; printf "%.0f", (dt > 0 ? 100 * (y[1] - x[1]) / dt : 0) }'
}

# run_wrk TARGET MODE SECONDS [record]
run_wrk() {
    local t="$1" mode="$2" secs="$3" out p0 o0
    p0="$(cpu_ticks "$proxy_cpu")" o0="$(cpu_ticks "$origin_cpu")"
    out="$(taskset -c "$wrk_cpu" wrk -t1 -c"$connections" -d"${secs}s" --latency \
        "http://127.0.0.1:$(port_of "$t")/" 2>&1)" || { echo "$out" >&2; return 1; }
    [ "${4:-}" = record ] || return 0
    local rps p50 p99 bad pcpu ocpu
    pcpu="$(busy_pct "$p0" "$(cpu_ticks "$proxy_cpu")")"
    ocpu="$(busy_pct "$o0" "$(cpu_ticks "$origin_cpu")")"
    rps="$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")"
    p50="$(to_us "$(awk '$1 == "50%" {print $2}' <<<"$out")")"
    p99="$(to_us "$(awk '$1 == "99%" {print $2}' <<<"$out")")"
    bad="$(awk '/Non-2xx/ {n += $NF} /Socket errors/ {gsub(/,/, ""); n += $4 + $6 + $8 + $10} END {print n + 0}' <<<"$out")"
    echo "$t $rps $p50 $p99 $bad $pcpu $ocpu ${round:-0}" >>"$tmp/results-$mode"
    printf '  %-8s %10.0f req/s  p50 %6s us  p99 %6s us  errors/non-2xx %s  CPU%s %3s%%  CPU%s %3s%%\n' \
        "$t" "$rps" "$p50" "$p99" "$bad" "$proxy_cpu" "$pcpu" "$origin_cpu" "$ocpu"
}

# check TARGET PATH WANT: one request, warn if the status is not WANT.
check() {
    local got
    got="$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 --path-as-is "http://127.0.0.1:$(port_of "$1")$2")" || true
    [ "$got" = "$3" ] || echo "bench-peers: warning: $1 answered $2 with $got, expected $3" >&2
}

report() { # MODE
    local mode="$1" t zr z50 z99
    echo
    echo "admission $mode: medians over $rounds rounds of ${duration}s, wrk -t1 -c$connections (latency in us)"
    echo "(CPU$proxy_cpu: the proxies' core, CPU$origin_cpu: origin and wrk; busy share of each, median)"
    printf '%-8s %12s %8s %8s %10s %10s %10s %8s %6s %6s\n' target req/s p50 p99 "rps/zgix" "p50/zgix" "p99/zgix" errors \
        "CPU$proxy_cpu%" "CPU$origin_cpu%"
    col() { awk -v t="$1" -v c="$2" '$1 == t {print $c}' "$tmp/results-$mode" | median; }
    zr="$(col zgix 2)" z50="$(col zgix 3)" z99="$(col zgix 4)"
    for t in zgix nginx haproxy relay direct; do
        has "$t" || continue
        awk -v t="$t" -v r="$(col "$t" 2)" -v p50="$(col "$t" 3)" -v p99="$(col "$t" 4)" \
            -v e="$(awk -v t="$t" '$1 == t {n += $5} END {print n + 0}' "$tmp/results-$mode")" \
            -v pc="$(col "$t" 6)" -v oc="$(col "$t" 7)" \
            -v zr="$zr" -v z50="$z50" -v z99="$z99" 'BEGIN {
            printf "%-8s %12.0f %8.0f %8.0f %10s %10s %10s %8d %6.0f %6.0f\n", t, r, p50, p99,
                (zr > 0 ? sprintf("%.2f", r / zr) : "-"),
                (z50 > 0 ? sprintf("%.2f", p50 / z50) : "-"),
                (z99 > 0 ? sprintf("%.2f", p99 / z99) : "-"), e, pc, oc }'
    done
    # The host's speed drifts between rounds; targets within one round ran
    # seconds apart, so per-round ratios are steadier than ratios of medians.
    # Each is taken against one target throughout (not the best of two per
    # round, which would favour whichever peer had the luckier seconds).
    if has zgix; then
        for t in nginx haproxy relay direct; do
            has "$t" || continue
            awk -v t="$t" '$1 == "zgix" { z[$8] = $2 } $1 == t { p[$8] = $2 }
                END { n = 0; for (r in z) if (p[r] > 0) v[++n] = z[r] / p[r]
                      if (n == 0) exit
                      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { x = v[i]; v[i] = v[j]; v[j] = x }
                      m = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
                      printf "zgix req/s ÷ %s'"'"'s in the same round: median %.2f (min %.2f, max %.2f, %d rounds)\n", t, m, v[1], v[n], n }' \
                "$tmp/results-$mode"
        done
    fi
}

# run_rate TARGET MODE: one open-loop run at --fixed-rate; records the proxy
# core's busy share and CPU microseconds per request.
run_rate() {
    local t="$1" mode="$2" out p0 pcpu
    p0="$(cpu_ticks "$proxy_cpu")"
    out="$("$bench_bin" load --url "http://127.0.0.1:$(port_of "$t")/" --connections "$connections" \
        --duration "$duration" --rate "$fixed_rate" --cpus "$wrk_cpu" --json 2>/dev/null)" ||
        { echo "bench-peers: zgix-bench load failed against $t" >&2; return 1; }
    pcpu="$(busy_pct "$p0" "$(cpu_ticks "$proxy_cpu")")"
    python3 -c '
import json, sys
r = json.loads(sys.argv[1]); t, pc, d = sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
ok = r["status"].get("200", 0); bad = r["requests"] - ok + sum(r["errors"].values())
us = pc / 100 * r["duration_s"] * 1e6 / max(r["requests"], 1)
print(t, round(r["requests_per_sec"]), r["latency_us"]["p50"], r["latency_us"]["p99"], bad, round(pc), round(us, 2))
' "$out" "$t" "$pcpu" "$duration" >>"$tmp/rate-$mode"
    tail -1 "$tmp/rate-$mode" | awk '{printf "  %-8s %8.0f req/s  p50 %6s us  p99 %6s us  errors/non-2xx %s  CPU'"$proxy_cpu"' %3s%%  %6.2f us CPU per request\n", $1, $2, $3, $4, $5, $6, $7}'
}

report_rate() { # MODE
    local mode="$1" t zus
    echo
    echo "admission $mode, open loop at $fixed_rate req/s: medians over $rate_rounds rounds of ${duration}s,"
    echo "$connections connections (zgix-bench load, latency from the scheduled send time, in us);"
    echo "CPU$proxy_cpu us/req = the proxy core's busy time divided by requests (zgix with busy polling off)"
    printf '%-8s %12s %8s %8s %8s %6s %12s %14s\n' target req/s p50 p99 errors "CPU$proxy_cpu%" "CPU$proxy_cpu us/req" "us/req÷zgix"
    rcol() { awk -v t="$1" -v c="$2" '$1 == t {print $c}' "$tmp/rate-$mode" | median; }
    zus="$(rcol zgix 7)"
    for t in zgix nginx haproxy relay; do
        has "$t" || continue
        awk -v t="$t" -v r="$(rcol "$t" 2)" -v p50="$(rcol "$t" 3)" -v p99="$(rcol "$t" 4)" \
            -v e="$(awk -v t="$t" '$1 == t {n += $5} END {print n + 0}' "$tmp/rate-$mode")" \
            -v pc="$(rcol "$t" 6)" -v us="$(rcol "$t" 7)" -v zus="$zus" 'BEGIN {
            printf "%-8s %12.0f %8.0f %8.0f %8d %6.0f %12.2f %14s\n", t, r, p50, p99, e, pc, us,
                (zus > 0 ? sprintf("%.2f", us / zus) : "-") }'
    done
}

IFS=, read -r -a mode_list <<<"$modes"
for mode in "${mode_list[@]}"; do
    case "$mode" in off|on) ;; *) echo "bench-peers: unknown mode $mode" >&2; exit 2 ;; esac
    echo
    echo "== admission $mode =="
    : >"$tmp/results-$mode"
    has zgix && start_zgix "$mode"
    has nginx && start_nginx "$mode"
    has haproxy && start_haproxy "$mode"
    has relay && start_relay
    for t in "${target_list[@]}"; do
        check "$t" / 200
        if [ "$mode" = on ] && [ "$t" != direct ] && [ "$t" != relay ]; then
            check "$t" "/download?file=../../etc/passwd" 403
        fi
        run_wrk "$t" "$mode" 1 # warm-up: connection pools, caches
    done
    for r in $(seq "$rounds"); do
        echo "round $r/$rounds"
        round=$r
        for t in "${target_list[@]}"; do run_wrk "$t" "$mode" "$duration" record; done
    done
    report "$mode"
    if [ "$fixed_rate" -gt 0 ] && { has zgix || has nginx || has haproxy || has relay; }; then
        echo
        echo "-- admission $mode: fixed rate $fixed_rate req/s --"
        : >"$tmp/rate-$mode"
        if has zgix; then stop_pid "$zgix_pid"; start_zgix "$mode" 0; fi
        for r in $(seq "$rate_rounds"); do
            echo "rate round $r/$rate_rounds"
            for t in "${target_list[@]}"; do
                [ "$t" = direct ] || run_rate "$t" "$mode"
            done
        done
        report_rate "$mode"
    fi
    has zgix && stop_pid "$zgix_pid"
    has nginx && stop_pid "$nginx_pid"
    has haproxy && stop_pid "$haproxy_pid"
    has relay && stop_pid "$relay_pid"
done
