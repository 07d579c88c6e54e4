#!/usr/bin/env bash
# Server CPU per TLS handshake and per keep-alive HTTPS request: zgix vs nginx
# vs HAProxy terminating the same throw-away certificate (ECDSA P-256 by
# default, --rsa for RSA-2048), each pinned to CPU 0 with one worker/thread/
# shard, the clients and the origin on CPU 1, in interleaved rounds.
#
#   full handshakes   `openssl s_time -new -www /` (TLS 1.3, a new session each
#                     time; each connection then asks for / once and reads it)
#   resumed           `openssl s_time -reuse -www /` (TLS 1.3 tickets, read with
#                     the answer; zgix counts the resumptions: zgix_tls_resumed_total)
#   keep-alive HTTPS  wrk --latency over https:// (64-byte bodies; --body-bytes N): CPU per request and p99
#                     at saturation; then `zgix-bench load --rate R` over https:// (open loop,
#                     16 connections, R = --fixed-rate, default 10000 req/s, coordinated
#                     omission corrected): p99 at a fixed rate, the same for every server
#   --rows            the three rows in turn, each its own run of the above with
#                     fresh processes: ECDSA P-256 / 64 B, RSA-2048 / 64 B and
#                     ECDSA P-256 / 16 KiB bodies; one table of the three.
#   --idle N          instead of the above: RSS per idle TLS connection. For each
#                     target, a fresh process; N TLS 1.3 connections opened by
#                     scripts/lib/tls-idle-client.py (full handshakes, nothing
#                     sent), VmRSS read (nginx: its worker); then one keep-alive
#                     request on each, VmRSS again. (RSS - RSS at start) / N.
#
# The figure is the server process's CPU time (user + system, /proc/PID/stat,
# every thread and nginx's worker counted) divided by the handshakes or
# requests the client completed, so a client that cannot saturate the server
# slows the run but does not change the figure; the client's own CPU share is
# printed beside it; the handshake columns also give it as user/system µs apart
# (u/s columns). Medians of the rounds; ratios to the better peer. Every
# server prefers TLS_AES_128_GCM_SHA256 (zgix's own order; set on the peers).
#
# --clients N: N `s_time` processes at once for the handshake columns (default
# 1: one serial client, whose pace leaves the server idle between steps, so
# each handshake also pays the server's wake-ups; with several the server is
# kept busy). The client CPU's busy share over each handshake run is printed
# (client% columns): near 100 % means the client set the pace.
#
# Usage: scripts/bench-tls.sh [--rounds N] [--duration S] [--rsa] [--body-bytes N] [--rows] [--idle N] [--clients N] [--fixed-rate R] [--base-port P] [--no-build]
# (--no-build: use the release binaries under $CARGO_TARGET_DIR, else target/, as they are)
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=3 duration=5 rsa=0 base=19400 build=1 idle=0 body=64 rows=0 clients=1 rate=10000 args=()
while [ "$#" -gt 0 ]; do
    case "$1" in
        --body-bytes) body="$2"; shift 2 ;;
        --rows) rows=1; shift ;;
        --rounds) rounds="$2"; args+=("$1" "$2"); shift 2 ;;
        --duration) duration="$2"; args+=("$1" "$2"); shift 2 ;;
        --rsa) rsa=1; shift ;;
        --idle) idle="$2"; shift 2 ;;
        --clients) clients="$2"; args+=("$1" "$2"); shift 2 ;;
        --fixed-rate) rate="$2"; args+=("$1" "$2"); shift 2 ;;
        --base-port) base="$2"; args+=("$1" "$2"); shift 2 ;;
        --no-build) build=0; shift ;;
        *) echo "bench-tls: unknown option $1" >&2; exit 2 ;;
    esac
done

bench_name=bench-tls
# shellcheck source=scripts/lib/bench-common.sh
. scripts/lib/bench-common.sh

need=()
for c in nginx haproxy wrk openssl curl; do command -v "$c" >/dev/null 2>&1 || need+=("$c"); done
if [ "${#need[@]}" -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    else
        echo "bench-tls: install ${need[*]}" >&2; exit 1
    fi
fi

[ "$build" = 0 ] || cargo build --release -q -p zgix -p zgix-bench
if [ "$rows" = 1 ]; then
    # Each row a run of its own (fresh processes); their tables, then the ratios.
    row() { # LABEL ARGS...
        local label="$1" out
        shift
        out="$("$0" --no-build "${args[@]}" "$@")"
        printf '== %s\n%s\n' "$label" "$out" >&2
        printf '%s\n' "$out" | awk -v l="$label" '
            /^(zgix|nginx|haproxy) +[0-9]/ {printf "%-12s %-9s %14s %14s %14s %14s %14s %12s %12s %13s %13s %13s\n", l, $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11}
            /^zgix \/ better/ {r = r " " $NF}
            END {printf "%-12s ratios to the better peer (full, resumed, request, p99, p99 at the fixed rate):%s\n", l, r}'
    }
    printf '%-12s %-9s %14s %14s %14s %14s %14s %12s %12s %13s %13s %13s\n' row target "full/s(client)" "us/full" "us/resumed" "us/request" "p99(ka) us" "client% full" "client% res" "u/s full" "u/s resumed" "p99@rate us"
    row ecdsa-64B
    row rsa2048-64B --rsa
    row ecdsa-16KiB --body-bytes 16384
    echo "(each row: its own run, fresh processes, medians of $rounds rounds; each run's own table is on stderr)"
    exit 0
fi
target_dir="${CARGO_TARGET_DIR:-target}"
zgix_bin="$target_dir/release/zgix" bench_bin="$target_dir/release/zgix-bench"
proxy_cpu=0 client_cpu=1
origin_port=$base zgix_port=$((base + 1)) nginx_port=$((base + 2)) haproxy_port=$((base + 3))
zgix_admin_port=$((base + 9))
clk_tck="$(getconf CLK_TCK)"
# TLS 1.3 suites in zgix's order, set on the peers too (HAProxy and nginx
# with ssl_prefer_server_ciphers take the server's order).
suites13=TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256

# Every server waits 120 s for a request on an open connection (the idle
# mode's connections are opened over some 20 s and must all stay open).
# The certificate: made here, kept in the scratch directory only.
if [ "$rsa" = 1 ]; then
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$tmp/key.pem" -out "$tmp/cert.pem" \
        -days 30 -subj /CN=bench.example -addext subjectAltName=DNS:bench.example 2>/dev/null
else
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$tmp/key.pem" \
        -out "$tmp/cert.pem" -days 30 -subj /CN=bench.example \
        -addext subjectAltName=DNS:bench.example 2>/dev/null
fi
cat "$tmp/cert.pem" "$tmp/key.pem" >"$tmp/combined.pem"

taskset -c "$client_cpu" "$bench_bin" origin --bind "127.0.0.1:$origin_port" --cpus "$client_cpu" \
    --body-bytes "$body" >"$tmp/origin.log" 2>&1 &
pids+=($!)
wait_http "127.0.0.1:$origin_port" origin "$tmp/origin.log"

declare -A tpid=()
start_zgix() {
    cat >"$tmp/zgix.json" <<JSON
{"cpus": [$proxy_cpu], "limits": {"busy_poll_us": 0, "client_header_timeout_ms": 120000, "client_idle_timeout_ms": 120000},
 "admin": {"bind": "127.0.0.1:$zgix_admin_port"},
 "listeners": [{"bind": "127.0.0.1:$zgix_port", "tls": {"certificates": [{"cert": "$tmp/cert.pem", "key": "$tmp/key.pem"}]},
                "http": {"cluster": "origin"}}],
 "clusters": {"origin": {"endpoints": ["127.0.0.1:$origin_port"]}}}
JSON
    RUNTIME_DIRECTORY="$tmp/run" "$zgix_bin" --config "$tmp/zgix.json" >"$tmp/zgix.log" 2>&1 &
    pids+=($!); tpid[zgix]=$!
}
start_nginx() {
    mkdir -p "$tmp/nginx/logs"
    cat >"$tmp/nginx/nginx.conf" <<CONF
daemon off;
worker_processes 1;
worker_cpu_affinity $(printf '%x' $((1 << proxy_cpu)));
pid $tmp/nginx/nginx.pid;
error_log $tmp/nginx/logs/error.log warn;
events { worker_connections 16384; }
http {
    access_log off;
    client_header_timeout 120s;
    keepalive_timeout 120s;
    upstream origin { server 127.0.0.1:$origin_port; keepalive 256; }
    server {
        listen 127.0.0.1:$nginx_port ssl;
        ssl_certificate $tmp/cert.pem;
        ssl_certificate_key $tmp/key.pem;
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_session_tickets on;
        # The same suite preference as zgix's (AES-128-GCM first, server order).
        ssl_prefer_server_ciphers on;
        ssl_conf_command Ciphersuites $suites13;
        location / { proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection ""; }
    }
}
CONF
    nginx -p "$tmp/nginx" -c "$tmp/nginx/nginx.conf" -e "$tmp/nginx/logs/error.log" >"$tmp/nginx/logs/stderr.log" 2>&1 &
    pids+=($!); tpid[nginx]=$!
}
start_haproxy() {
    cat >"$tmp/haproxy.cfg" <<CFG
global
    nbthread 1
    cpu-map 1/1 $proxy_cpu
    maxconn 9000
    ssl-default-bind-ciphersuites $suites13
defaults
    mode http
    timeout connect 5s
    timeout client 120s
    timeout http-request 120s
    timeout http-keep-alive 120s
    timeout server 30s
    http-reuse always
frontend f
    bind 127.0.0.1:$haproxy_port ssl crt $tmp/combined.pem
    default_backend b
backend b
    server o 127.0.0.1:$origin_port
CFG
    taskset -c "$proxy_cpu" haproxy -f "$tmp/haproxy.cfg" -db >"$tmp/haproxy.log" 2>&1 &
    pids+=($!); tpid[haproxy]=$!
}
port_of() { case "$1" in zgix) echo $zgix_port ;; nginx) echo $nginx_port ;; haproxy) echo $haproxy_port ;; esac; }

# cpu_split TARGET: "user system" ticks of the target's processes (all threads).
cpu_split() {
    local p
    for p in ${tpid[$1]} $(pgrep -P "${tpid[$1]}" || true); do
        sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null || true
    done | awk '{u += $12; s += $13} END {print u + 0, s + 0}'
}
# cpu_ticks TARGET: user+system ticks of the target's processes (all threads).
cpu_ticks() { cpu_split "$1" | awk '{print $1 + $2}'; }

wait_tls() { # TARGET
    local i
    for i in $(seq 100); do
        if curl -sk -o /dev/null --max-time 1 "https://127.0.0.1:$(port_of "$1")/"; then return 0; fi
        sleep 0.1
    done
    echo "bench-tls: $1 did not come up" >&2; cat "$tmp"/*.log >&2 || true; exit 1
}

if [ "$idle" -gt 0 ]; then
    ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
    # rss_pids TARGET: the processes holding the connections (nginx: its worker).
    rss_pids() {
        if [ "$1" = nginx ]; then pgrep -P "${tpid[nginx]}"; else echo "${tpid[$1]}"; fi
    }
    declare -A idle_kib=() kept_kib=()
    for r in $(seq "$rounds"); do
        for t in zgix nginx haproxy; do
            "start_$t"; wait_tls "$t"
            # shellcheck disable=SC2046
            out="$(taskset -c "$client_cpu" python3 scripts/lib/tls-idle-client.py "$(port_of "$t")" "$idle" \
                $(rss_pids "$t"))"
            kill "${tpid[$t]}"; wait "${tpid[$t]}" 2>/dev/null || true
            read -r i k c ok <<<"$(printf '%s' "$out" | python3 -c '
import json, sys
r = json.load(sys.stdin)
n = max(r["connected"], 1)
print("%.2f %.2f %d %d" % ((r["idle"] - r["start"]) / n, (r["kept"] - r["start"]) / n, r["connected"], r["ok"]))')"
            [ "$c" = "$idle" ] && [ "$ok" = "$idle" ] || { echo "bench-tls: $t held $c of $idle, $ok answered: $out" >&2; exit 1; }
            idle_kib[$t]+="$i " kept_kib[$t]+="$k "
            echo "round $r $t: idle $i KiB/conn, after one request $k KiB/conn" >&2
        done
    done
    med() { tr ' ' '\n' | grep -v '^$' | median; }
    printf '\n%-9s %18s %22s\n' target "idle KiB/conn" "kept-alive KiB/conn"
    for t in zgix nginx haproxy; do
        printf '%-9s %18s %22s\n' "$t" "$(echo "${idle_kib[$t]}" | med)" "$(echo "${kept_kib[$t]}" | med)"
    done
    echo "(VmRSS growth / $idle TLS 1.3 connections, medians of $rounds rounds, a fresh process each; nginx: its worker)"
    exit 0
fi

for t in zgix nginx haproxy; do "start_$t"; wait_tls "$t"; done

# cpu_jiffies CPU: "busy total" jiffies of one CPU from /proc/stat.
cpu_jiffies() {
    awk -v c="cpu$1" '$1 == c { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t }' /proc/stat
}

# handshakes TARGET new|reuse: "handshakes us_per_handshake client_cpu_busy% user_us/system_us"
handshakes() {
    local t="$1" how="$2" port n u0 s0 u1 s1 i b0 t0 b1 t1
    port="$(port_of "$t")"
    read -r u0 s0 <<<"$(cpu_split "$t")"
    read -r b0 t0 <<<"$(cpu_jiffies "$client_cpu")"
    # -www /: each connection asks for / and reads the answer before it
    # closes, so the client reads the TLS 1.3 tickets that come after the
    # handshake (without it s_time closes first: no ticket is ever read,
    # -reuse resumes nothing, and the server's ticket write meets a reset).
    for i in $(seq "$clients"); do
        taskset -c "$client_cpu" openssl s_time -connect "127.0.0.1:$port" "-$how" -tls1_3 \
            -www / -time "$duration" >"$tmp/s_time.$i" 2>/dev/null &
    done
    wait
    read -r u1 s1 <<<"$(cpu_split "$t")"
    read -r b1 t1 <<<"$(cpu_jiffies "$client_cpu")"
    n="$(cat "$tmp"/s_time.* | awk '/connections in [0-9.]+ real seconds/ {n += $1} END {print n + 0}')"
    rm -f "$tmp"/s_time.*
    [ "$n" -gt 0 ] || { echo "bench-tls: $t completed no handshake ($how)" >&2; exit 1; }
    awk -v n="$n" -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v hz="$clk_tck" -v cb=$((b1 - b0)) -v ct=$((t1 - t0)) \
        'BEGIN {printf "%d %.1f %d %.0f/%.0f\n", n, (u + s) * 1e6 / hz / n, ct ? cb * 100 / ct : 0, u * 1e6 / hz / n, s * 1e6 / hz / n}'
}

# zgix_resumed: zgix's zgix_tls_resumed_total so far.
zgix_resumed() {
    curl -s "http://127.0.0.1:$zgix_admin_port/metrics" | awk '/^zgix_tls_resumed_total/ {n += $NF} END {print n + 0}'
}

# keepalive TARGET: "requests us_per_request p99_us"
keepalive() {
    local t="$1" port out n c0 c1 p99
    port="$(port_of "$t")"
    c0="$(cpu_ticks "$t")"
    out="$(taskset -c "$client_cpu" wrk -t1 -c16 -d"${duration}s" --latency "https://127.0.0.1:$port/" 2>&1)"
    c1="$(cpu_ticks "$t")"
    n="$(printf '%s\n' "$out" | awk '/requests in/ {print $1; exit}')"
    [ -n "$n" ] && [ "$n" -gt 0 ] || { echo "bench-tls: $t answered no request: $out" >&2; exit 1; }
    p99="$(to_us "$(printf '%s\n' "$out" | awk '$1 == "99%" {print $2; exit}')")"
    awk -v n="$n" -v a="$c0" -v b="$c1" -v hz="$clk_tck" -v p="$p99" 'BEGIN {printf "%d %.1f %s\n", n, (b - a) * 1e6 / hz / n, p}'
}

# keepalive_rate TARGET: p99 µs of keep-alive HTTPS requests offered at --fixed-rate,
# open loop (zgix-bench load over rustls, 16 connections).
keepalive_rate() {
    local out
    out="$(taskset -c "$client_cpu" "$bench_bin" load --url "https://127.0.0.1:$(port_of "$1")/" \
        --connections 16 --rate "$rate" --duration "$duration" --cpus "$client_cpu" --json 2>"$tmp/load.err")" ||
        { echo "bench-tls: zgix-bench load failed on $1: $(cat "$tmp/load.err")" >&2; exit 1; }
    python3 -c 'import json, sys; r = json.loads(sys.argv[1]); print(r["latency_us"]["p99"] if r["status"].get("200", 0) == r["requests"] else "bad")' "$out"
}

declare -A full=() resumed=() ka=() fullrate=() kap99=() fullcli=() rescli=() fullus=() resus=() ratep99=()
for r in $(seq "$rounds"); do
    for t in zgix nginx haproxy; do
        read -r n us cli us2 <<<"$(handshakes "$t" new)"; full[$t]+="$us "; fullrate[$t]+="$((n / duration)) "; fullcli[$t]+="$cli "; fullus[$t]+="$us2 "
        [ "$t" = zgix ] && r0="$(zgix_resumed)"
        read -r n us cli us2 <<<"$(handshakes "$t" reuse)"; resumed[$t]+="$us "; rescli[$t]+="$cli "; resus[$t]+="$us2 "
        if [ "$t" = zgix ]; then
            # s_time's -reuse must resume: else the column is full handshakes.
            got=$(( $(zgix_resumed) - r0 ))
            echo "round $r: zgix resumed $got of $n -reuse handshakes" >&2
            [ $(( got * 10 )) -ge $(( n * 9 )) ] || { echo "bench-tls: s_time -reuse did not resume on zgix ($got of $n)" >&2; exit 1; }
        fi
        read -r n us p99 <<<"$(keepalive "$t")"; ka[$t]+="$us "; kap99[$t]+="$p99 "
        p99="$(keepalive_rate "$t")"
        [ "$p99" != bad ] || { echo "bench-tls: $t answered a request at the fixed rate with a status other than 200" >&2; exit 1; }
        ratep99[$t]+="$p99 "
    done
    echo "round $r done" >&2
done

med() { tr ' ' '\n' | grep -v '^$' | median; }
# medsplit: the user/system pair of the round whose total is the median.
medsplit() { tr ' ' '\n' | grep -v '^$' | awk -F/ '{print $1 + $2, $0}' | sort -n | awk '{v[NR] = $2} END {print v[int((NR + 1) / 2)]}'; }
printf '\n%-9s %14s %14s %14s %14s %14s %12s %12s %13s %13s %13s\n' target "full/s(client)" "us/full" "us/resumed" "us/request" "p99(ka) us" "client% full" "client% res" "u/s full" "u/s resumed" "p99@rate us"
for t in zgix nginx haproxy; do
    printf '%-9s %14s %14s %14s %14s %14s %12s %12s %13s %13s %13s\n' "$t" "$(echo "${fullrate[$t]}" | med)" \
        "$(echo "${full[$t]}" | med)" "$(echo "${resumed[$t]}" | med)" "$(echo "${ka[$t]}" | med)" \
        "$(echo "${kap99[$t]}" | med)" "$(echo "${fullcli[$t]}" | med)" "$(echo "${rescli[$t]}" | med)" \
        "$(echo "${fullus[$t]}" | medsplit)" "$(echo "${resus[$t]}" | medsplit)" "$(echo "${ratep99[$t]}" | med)"
done
ratio() { # KIND
    local -n m="$1"
    local z n h best
    z="$(echo "${m[zgix]}" | med)" n="$(echo "${m[nginx]}" | med)" h="$(echo "${m[haproxy]}" | med)"
    best="$(awk -v a="$n" -v b="$h" 'BEGIN {print (a < b) ? a : b}')"
    awk -v z="$z" -v b="$best" -v k="$1" 'BEGIN {printf "zgix / better peer, %s: %.2f\n", k, z / b}'
}
echo
ratio full; ratio resumed; ratio ka; ratio kap99; ratio ratep99
echo "(server CPU per handshake or request; $([ "$rsa" = 1 ] && echo RSA-2048 || echo ECDSA P-256), $body-byte bodies; $clients s_time client(s) on CPU $client_cpu, whose busy share is client%: near 100, the client set the pace, full/s; u/s = user/system µs of the round with the median total; p99@rate: open loop at $rate req/s, 16 connections)"
