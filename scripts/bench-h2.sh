#!/usr/bin/env bash
# HTTP/2 from clients: zgix vs nginx (`http2 on`) vs HAProxy (`alpn h2`) in
# front of the same zgix-bench origin, all over TLS with the same
# certificate, loaded by h2load in interleaved rounds: requests/s and the
# proxy's CPU per request at 1 and 100 streams per connection, and the RSS an
# idle h2 connection costs each proxy.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/bench-h2.sh [options]

  --rounds N      interleaved rounds (zgix nginx haproxy, zgix ...), default 3
  --requests N    requests per h2load run (default 20000)
  --idle N        idle h2 connections held for the RSS figure (default 500)
  --base-port P   first local port (default 19080; uses P..P+3)
  --no-build      use the release binaries under $CARGO_TARGET_DIR (or ./target)
  --rapid-reset S instead of the rows above: each proxy's p99 for a probe
                  client (sequential GETs on one h2 connection) for S seconds
                  alone, then S seconds beside one client that opens and
                  resets streams (CVE-2023-44487) as fast as it can write,
                  reconnecting whenever it is sent away; and the proxy's CPU
                  during each window
  -h, --help      this text

CPU plan: every proxy runs one worker/thread/shard pinned to CPU 0 (zgix
with busy polling off, limits.busy_poll_us 0, as in bench-peers); the
origin and h2load run on CPU 1. Two loads per round and target:
"1 stream/conn" = h2load -c 16 -m 1, "100 streams/conn" = h2load -c 4
-m 100. CPU per request = the proxy process's utime+stime (every thread,
/proc/PID/stat, 10 ms ticks) over the run ÷ requests; medians over rounds.
RSS per idle connection: N TLS connections that negotiate h2, send the
preface and SETTINGS and then idle; (RSS with them − RSS before) ÷ N, of the
serving process (nginx: the worker), measured first, before any load, so no
proxy serves them from memory its load rows freed.
USAGE
}

rounds=3 requests=20000 idle=500 base_port=19080 build=1 rapid=0
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds="$2"; shift 2 ;;
        --requests) requests="$2"; shift 2 ;;
        --idle) idle="$2"; shift 2 ;;
        --base-port) base_port="$2"; shift 2 ;;
        --no-build) build=0; shift ;;
        --rapid-reset) rapid="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench-h2: unknown option $1 (try --help)" >&2; exit 2 ;;
    esac
done
for n in "$rounds" "$requests" "$idle" "$base_port" "$rapid"; do
    [[ "$n" =~ ^[0-9]+$ ]] || { echo "bench-h2: $n is not a number" >&2; exit 2; }
done
PATH="$PATH:/usr/sbin:/sbin"
for tool in h2load nginx haproxy openssl python3 taskset; do
    command -v "$tool" >/dev/null || { echo "bench-h2: needs $tool (apt-get install nghttp2-client nginx haproxy openssl python3 util-linux)" >&2; exit 1; }
done

root="$(cd "$(dirname "$0")/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
[ "$build" = 1 ] && (cd "$root" && cargo build --release -q -p zgix -p zgix-bench)
zgix_bin="$target_dir/release/zgix" bench_bin="$target_dir/release/zgix-bench"

tmp="$(mktemp -d)"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT

origin_port=$base_port zgix_port=$((base_port + 1)) nginx_port=$((base_port + 2)) haproxy_port=$((base_port + 3))
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$tmp/k.pem" \
    -out "$tmp/c.pem" -days 2 -subj /CN=bench.example -addext subjectAltName=DNS:bench.example 2>/dev/null
cat "$tmp/c.pem" "$tmp/k.pem" >"$tmp/both.pem"

wait_port() { # PORT
    for _ in $(seq 200); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.05
    done
    echo "bench-h2: nothing listens on $1" >&2; exit 1
}

taskset -c 1 "$bench_bin" origin --bind "127.0.0.1:$origin_port" --body-bytes 64 >"$tmp/origin.log" 2>&1 &
pids+=($!)
cat >"$tmp/zgix.json" <<JSON
{"cpus": [0], "limits": {"busy_poll_us": 0},
 "listeners": [{"bind": "127.0.0.1:$zgix_port",
   "tls": {"certificates": [{"cert": "$tmp/c.pem", "key": "$tmp/k.pem"}], "alpn": ["h2", "http/1.1"]},
   "http": {"cluster": "o"}}],
 "clusters": {"o": {"endpoints": ["127.0.0.1:$origin_port"]}}}
JSON
"$zgix_bin" --config "$tmp/zgix.json" >"$tmp/zgix.log" 2>&1 &
zgix_pid=$!; pids+=("$zgix_pid")
# `http2 on` is nginx 1.25.1 and later; before, `listen ... http2` (Debian 12 has 1.22).
nginx_version="$(nginx -v 2>&1 | sed -n 's|.*nginx/\([0-9.]*\).*|\1|p')"
if printf '%s\n1.25.1\n' "$nginx_version" | sort -V -C; then
    nginx_listen="listen 127.0.0.1:$nginx_port ssl http2;" nginx_h2=""
else
    nginx_listen="listen 127.0.0.1:$nginx_port ssl;" nginx_h2="http2 on;"
fi
cat >"$tmp/nginx.conf" <<CONF
daemon off; master_process on; worker_processes 1; worker_cpu_affinity 01;
pid $tmp/nginx.pid; error_log $tmp/nginx.err warn;
events { worker_connections 4096; }
http {
  access_log off;
  upstream o { server 127.0.0.1:$origin_port; keepalive 64; }
  server {
    $nginx_listen $nginx_h2
    ssl_certificate $tmp/c.pem; ssl_certificate_key $tmp/k.pem;
    http2_max_concurrent_streams 128;
    keepalive_requests 1000000;
    location / { proxy_pass http://o; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
CONF
nginx -c "$tmp/nginx.conf" -e "$tmp/nginx.err" &
pids+=($!)
cat >"$tmp/haproxy.cfg" <<CONF
global
  nbthread 1
  cpu-map 1/1 0
  maxconn 8192
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  http-reuse always
frontend f
  bind 127.0.0.1:$haproxy_port ssl crt $tmp/both.pem alpn h2,http/1.1
  default_backend o
backend o
  server o 127.0.0.1:$origin_port
CONF
haproxy -f "$tmp/haproxy.cfg" -db >"$tmp/haproxy.log" 2>&1 &
haproxy_pid=$!; pids+=("$haproxy_pid")
for p in $origin_port $zgix_port $nginx_port $haproxy_port; do wait_port "$p"; done
nginx_worker() { pgrep -P "$(cat "$tmp/nginx.pid")" | head -1; }
pid_of() {
    case "$1" in zgix) echo "$zgix_pid" ;; nginx) nginx_worker ;; haproxy) echo "$haproxy_pid" ;; esac
}
port_of() {
    case "$1" in zgix) echo "$zgix_port" ;; nginx) echo "$nginx_port" ;; haproxy) echo "$haproxy_port" ;; esac
}
cpu_ticks() { awk '{print $14, $15}' "/proc/$1/stat"; }
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }

# run TARGET CONNS STREAMS: one h2load run; prints "req/s cpu_us_per_req
# user_us_per_req sys_us_per_req".
run() {
    local t="$1" c="$2" m="$3" pid out t0 t1 ok
    pid="$(pid_of "$t")"
    t0="$(cpu_ticks "$pid")"
    out="$(taskset -c 1 timeout 120 h2load -n "$requests" -c "$c" -m "$m" "https://127.0.0.1:$(port_of "$t")/" 2>&1)" ||
        { echo "bench-h2: h2load failed on $t:" >&2; echo "$out" >&2; exit 1; }
    t1="$(cpu_ticks "$pid")"
    ok="$(awk '/^status codes:/ {print $3}' <<<"$out")"
    [ "$ok" = "$requests" ] || { echo "bench-h2: $t answered $ok of $requests with 2xx:" >&2; echo "$out" >&2; exit 1; }
    awk -v t0="$t0" -v t1="$t1" -v n="$requests" 'BEGIN { split(t0, a, " "); split(t1, b, " ") }
        /^finished in/ { r = $4; sub(/,/, "", r); u = (b[1] - a[1]) * 10000 / n; k = (b[2] - a[2]) * 10000 / n
        printf "%s %.2f %.2f %.2f\n", r, u + k, u, k }' <<<"$out"
}

# idle_rss TARGET: KiB of RSS per idle h2 connection.
idle_rss() {
    local t="$1" pid before after
    pid="$(pid_of "$t")"
    before="$(rss_kib "$pid")"
    python3 - "$(port_of "$t")" "$idle" "$tmp/held-$t" <<'PY' &
import socket, ssl, sys, time
port, n, flag = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
ctx.set_alpn_protocols(["h2"])
held = []
for _ in range(n):
    s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="bench.example")
    assert s.selected_alpn_protocol() == "h2", s.selected_alpn_protocol()
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
    held.append(s)
time.sleep(1.5)  # let every server read the preface and answer
open(flag, "w").close()
time.sleep(3)
PY
    local py=$!
    for _ in $(seq 400); do [ -e "$tmp/held-$t" ] && break; sleep 0.05; done
    after="$(rss_kib "$pid")"
    wait "$py" || true
    awk -v a="$after" -v b="$before" -v n="$idle" 'BEGIN {printf "%.2f\n", (a - b) / n}'
}

# rapid_reset TARGET: "p99_alone_ms cpu_alone_% p99_flood_ms cpu_flood_% flood_streams flood_conns
# cpu_flood_only_% flood_only_streams flood_only_conns".
rapid_reset() {
    local t="$1" pid port
    pid="$(pid_of "$t")" port="$(port_of "$t")"
    python3 - "$port" "$rapid" "$pid" <<'PY'
import os, socket, ssl, struct, sys, time
port, secs, pid = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
os.sched_setaffinity(0, {1})
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
ctx.set_alpn_protocols(["h2"])
def lit(n, v): return bytes([0, len(n)]) + n + bytes([len(v)]) + v
BLOCK = lit(b":method", b"GET") + lit(b":scheme", b"https") + lit(b":path", b"/") + lit(b":authority", b"bench.example")
def frame(kind, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", sid) + payload
def connect():
    # Nagle off: the probe's WINDOW_UPDATE and its next HEADERS are two small
    # writes, and with Nagle the second waits for the server's delayed ACK
    # (about 40 ms), which would be every proxy's p99.
    t = socket.create_connection(("127.0.0.1", port))
    t.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s = ctx.wrap_socket(t, server_hostname="bench.example")
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0))
    return s
class Reader:
    def __init__(self, s): self.s, self.buf = s, b""
    def frame(self):
        while True:
            if len(self.buf) >= 9:
                n = int.from_bytes(self.buf[:3], "big")
                if len(self.buf) >= 9 + n:
                    h, self.buf = self.buf[:9 + n], self.buf[9 + n:]
                    return h[3], h[4], int.from_bytes(h[5:9], "big") & 0x7FFFFFFF, h[9:]
            b = self.s.recv(65536)
            if not b: return None
            self.buf += b
def probe(until, out):
    s = connect(); r = Reader(s); sid = 1
    while time.monotonic() < until:
        t0 = time.monotonic()
        s.sendall(frame(1, 5, sid, BLOCK))
        while True:
            f = r.frame()
            if f is None: raise SystemExit("probe: connection closed")
            kind, flags, fid, p = f
            if kind == 4 and not flags & 1: s.sendall(frame(4, 1, 0))
            if kind == 0 and p: s.sendall(frame(8, 0, 0, struct.pack(">I", len(p))))
            if fid == sid and kind in (0, 1) and flags & 1: break
            if fid == sid and kind == 3: raise SystemExit("probe: stream reset")
        out.append(time.monotonic() - t0); sid += 2
def flood(until, stats):
    while time.monotonic() < until:
        try:
            s = connect(); stats[1] += 1; sid = 1
            s.settimeout(5)
            while time.monotonic() < until and sid < 2**31 - 400:
                batch = b"".join(frame(1, 5, sid + 2 * i, BLOCK) + frame(3, 0, sid + 2 * i, struct.pack(">I", 8)) for i in range(100))
                s.sendall(batch); sid += 200; stats[0] += 100
            s.close()
        except OSError:
            pass
def ticks(): return sum(int(x) for x in open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[11:13])
def window(with_flood, with_probe=True):
    # The flood runs in a child process of its own: the probe never waits on it.
    lat, stats = [], [0, 0]
    until = time.monotonic() + secs
    c0, w0 = ticks(), time.monotonic()
    child = None
    if with_flood:
        rd, wr = os.pipe()
        child = os.fork()
        if child == 0:
            # The flooder shares CPU 1 with the probe: at nice 19 it takes
            # what the probe leaves, so the probe's latency is the proxy's,
            # not its wait for CPU 1 behind the flooder.
            os.nice(19)
            flood(until, stats)
            os.write(wr, f"{stats[0]} {stats[1]}".encode()); os._exit(0)
    if with_probe:
        probe(until, lat)
    if child:
        os.waitpid(child, 0)
        stats = [int(x) for x in os.read(rd, 100).split()]
    cpu = (ticks() - c0) / (time.monotonic() - w0)  # ticks of 10 ms per second = %
    lat.sort()
    return (lat[int(len(lat) * 0.99)] * 1000 if lat else 0), cpu, stats
a, ca, _ = window(False)
b, cb, st = window(True)
# The flood alone: the proxy's CPU for it, without the probe's share.
_, cf, sf = window(True, with_probe=False)
print(f"{a:.2f} {ca:.0f} {b:.2f} {cb:.0f} {st[0]} {st[1]} {cf:.0f} {sf[0]} {sf[1]}")
PY
}

median() { sort -n | awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }

targets=(zgix nginx haproxy)
if [ "$rapid" != 0 ]; then
    for t in "${targets[@]}"; do run "$t" 4 10 >/dev/null; done # warm up: TLS, pools
    echo "Rapid reset: a probe's p99 over ${rapid} s alone, then ${rapid} s beside a client opening and resetting streams as fast as it writes (at nice 19), then ${rapid} s of the flood alone; proxy on CPU 0, clients and origin on CPU 1"
    printf '%-8s %13s %11s %13s %11s %13s %11s %11s %13s %11s\n' target "p99 alone ms" "CPU alone%" "p99 flood ms" "CPU flood%" "flood streams" "flood conns" "CPU fl.only%" "streams" "conns"
    for t in "${targets[@]}"; do
        # shellcheck disable=SC2046
        printf '%-8s %13s %11s %13s %11s %13s %11s %11s %13s %11s\n' "$t" $(rapid_reset "$t")
    done
    exit 0
fi
# The idle row first, on processes that have served nothing yet: after the load
# rows every proxy's allocator (HAProxy's pools above all) holds freed memory that
# idle connections take again without growing RSS, which made HAProxy's figure
# read 0.25 KiB (2026-12-03) against the 15 KiB bench-tls --idle measured for an
# idle TLS connection on a fresh HAProxy.
for t in "${targets[@]}"; do echo "$t $(idle_rss "$t")" >>"$tmp/rss"; done
for t in "${targets[@]}"; do run "$t" 4 10 >/dev/null; done # warm up: TLS, pools
for r in $(seq "$rounds"); do
    for t in "${targets[@]}"; do
        echo "$t $(run "$t" 16 1)" >>"$tmp/m1"
        echo "$t $(run "$t" 4 100)" >>"$tmp/m100"
    done
done

echo "Each round (target, streams per connection: req/s, CPU us per request = user + sys):"
paste -d' ' <(awk '{print $1, "m=1:", $2, $3, "=", $4, "+", $5}' "$tmp/m1") \
    <(awk '{print "  m=100:", $2, $3, "=", $4, "+", $5}' "$tmp/m100")
echo "HTTP/2 over TLS, $requests requests per run, medians over $rounds interleaved rounds; proxy on CPU 0, origin and h2load on CPU 1"
printf '%-8s %12s %12s %14s %14s %12s\n' target "req/s m=1" "us/req m=1" "req/s m=100" "us/req m=100" "KiB/idle"
for t in "${targets[@]}"; do
    printf '%-8s %12.0f %12.2f %14.0f %14.2f %12s\n' "$t" \
        "$(awk -v t="$t" '$1 == t {print $2}' "$tmp/m1" | median)" \
        "$(awk -v t="$t" '$1 == t {print $3}' "$tmp/m1" | median)" \
        "$(awk -v t="$t" '$1 == t {print $2}' "$tmp/m100" | median)" \
        "$(awk -v t="$t" '$1 == t {print $3}' "$tmp/m100" | median)" \
        "$(awk -v t="$t" '$1 == t {print $2}' "$tmp/rss")"
done
