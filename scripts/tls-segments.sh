#!/usr/bin/env bash
# Per full TLS 1.3 handshake (`openssl s_time -new -www /`, one serial client):
# the server's user and system µs apart (/proc/PID/stat) and the TCP data and
# control segments on loopback per handshake (nstat TcpOutSegs, both
# directions and the origin's), for zgix on each driver — and, with
# --base-bin, a second zgix build beside it — and nginx and HAProxy; rounds
# interleaved. Servers on CPU 0, the client and the origin on CPU 1.
#
# Usage: scripts/tls-segments.sh [--rounds N] [--duration S] [--drivers "uring epoll"]
#        [--base-bin PATH] [--no-peers]   (release binaries under $CARGO_TARGET_DIR or target/)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3 dur=4 drivers="uring epoll" base="" peers=1
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds="$2"; shift 2 ;;
        --duration) dur="$2"; shift 2 ;;
        --drivers) drivers="$2"; shift 2 ;;
        --base-bin) base="$2"; shift 2 ;;
        --no-peers) peers=0; shift ;;
        *) echo "tls-segments: unknown option $1" >&2; exit 2 ;;
    esac
done
target_dir="${CARGO_TARGET_DIR:-target}"
zb="$target_dir/release/zgix" bb="$target_dir/release/zgix-bench"
PATH="$PATH:/usr/sbin:/sbin"
for t in openssl nstat taskset curl; do command -v "$t" >/dev/null || { echo "tls-segments: needs $t" >&2; exit 1; }; done
tmp="$(mktemp -d)"; pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$tmp"' EXIT
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$tmp/key.pem" -out "$tmp/cert.pem" \
    -days 30 -subj /CN=bench.example -addext subjectAltName=DNS:bench.example 2>/dev/null
cat "$tmp/cert.pem" "$tmp/key.pem" >"$tmp/comb.pem"
taskset -c 1 "$bb" origin --bind 127.0.0.1:19800 --cpus 1 --body-bytes 64 >"$tmp/o.log" 2>&1 & pids+=($!)
declare -A pid port
targets=() pn=19801
builds=(zgix); [ -n "$base" ] && builds+=(zgix-base)
for b in "${builds[@]}"; do for drv in $drivers; do
    t="$b-$drv"; targets+=("$t")
    bin="$zb"; [ "$b" = zgix-base ] && bin="$base"
    cat >"$tmp/$t.json" <<JSON
{"cpus": [0], "io": {"driver": "$drv"}, "limits": {"busy_poll_us": 0},
 "listeners": [{"bind": "127.0.0.1:$pn", "tls": {"certificates": [{"cert": "$tmp/cert.pem", "key": "$tmp/key.pem"}]}, "http": {"cluster": "o"}}],
 "clusters": {"o": {"endpoints": ["127.0.0.1:19800"]}}}
JSON
    RUNTIME_DIRECTORY="$tmp/r-$t" "$bin" --config "$tmp/$t.json" >"$tmp/$t.log" 2>&1 & pids+=($!)
    pid[$t]=$! port[$t]=$pn; pn=$((pn + 1))
done; done
if [ "$peers" = 1 ]; then
    mkdir -p "$tmp/ng/logs"
    cat >"$tmp/ng/nginx.conf" <<CONF
daemon off; worker_processes 1; worker_cpu_affinity 01; pid $tmp/ng/nginx.pid; error_log $tmp/ng/logs/e.log warn;
events { worker_connections 16384; }
http { access_log off; upstream o { server 127.0.0.1:19800; keepalive 64; }
 server { listen 127.0.0.1:19890 ssl; ssl_certificate $tmp/cert.pem; ssl_certificate_key $tmp/key.pem;
  ssl_protocols TLSv1.2 TLSv1.3; ssl_session_tickets on; ssl_prefer_server_ciphers on;
  ssl_conf_command Ciphersuites TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384;
  location / { proxy_pass http://o; proxy_http_version 1.1; proxy_set_header Connection ""; } } }
CONF
    nginx -p "$tmp/ng" -c "$tmp/ng/nginx.conf" -e "$tmp/ng/logs/e.log" >"$tmp/ng.out" 2>&1 & pids+=($!)
    cat >"$tmp/h.cfg" <<CFG
global
    nbthread 1
    cpu-map 1/1 0
    ssl-default-bind-ciphersuites TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    http-reuse always
frontend f
    bind 127.0.0.1:19891 ssl crt $tmp/comb.pem
    default_backend b
backend b
    server o 127.0.0.1:19800
CFG
    taskset -c 0 haproxy -f "$tmp/h.cfg" -db >"$tmp/h.log" 2>&1 & pids+=($!)
    pid[haproxy]=$! port[nginx]=19890 port[haproxy]=19891
    targets+=(nginx haproxy)
fi
for t in "${targets[@]}"; do
    for _ in $(seq 100); do curl -sk -o /dev/null --max-time 1 "https://127.0.0.1:${port[$t]}/" && break; sleep 0.1; done
done
[ "$peers" = 1 ] && pid[nginx]="$(pgrep -P "$(cat "$tmp/ng/nginx.pid")" | head -1)"
tck="$(getconf CLK_TCK)"
ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12, $13}'; }
echo "round target handshakes user_us system_us total_us segments_per_handshake"
for r in $(seq "$rounds"); do
    for t in "${targets[@]}"; do
        nstat -n >/dev/null
        read -r u0 s0 < <(ticks "${pid[$t]}")
        n="$(taskset -c 1 openssl s_time -connect "127.0.0.1:${port[$t]}" -new -www / -time "$dur" -tls1_3 2>/dev/null |
            awk '/connections in [0-9.]+ real/ {print $1; exit}' || true)"
        read -r u1 s1 < <(ticks "${pid[$t]}")
        [ -n "$n" ] && [ "$n" -gt 0 ] || { echo "tls-segments: $t made no handshake" >&2; exit 1; }
        segs="$(nstat | awk '$1 == "TcpOutSegs" {print $2}')"
        awk -v r="$r" -v t="$t" -v n="$n" -v u=$((u1 - u0)) -v s=$((s1 - s0)) -v k="$tck" -v g="${segs:-0}" \
            'BEGIN {printf "%d %-12s %6d %7.1f %7.1f %7.1f %6.2f\n", r, t, n, u*1e6/k/n, s*1e6/k/n, (u+s)*1e6/k/n, g/n}'
    done
done
