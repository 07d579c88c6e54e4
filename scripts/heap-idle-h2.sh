#!/usr/bin/env bash
# Heap per idle HTTP/2 connection, from zgix's counting allocator
# (`zgix_heap_live_bytes` of its one shard, repeatable to a few bytes,
# unlike RSS): N h2c (prior knowledge) and N TLS h2 connections that send the
# preface and SETTINGS, wait for the server's SETTINGS ACK and idle, beside
# N idle HTTP/1.1 connections for scale; (live bytes with them − before) ÷ N,
# and the process's VmRSS the same way (a rougher figure: it depends on
# which freed pages the allocator hands out again).
# Each figure is read after a tick that follows the last ACK (the tick
# publishes the counter every 100 ms; the scrape itself allocates on the
# shard, so a changed allocation count means a tick came after it).
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/heap-idle-h2.sh [--conns N] [--bin PATH]... [--no-build]

Needs python3 and openssl. Prints KiB of heap per idle connection for each
zgix binary (default: this tree's release build). Only 127.0.0.1 is used.
USAGE
}

conns=200 build=1 bins=()
while [ $# -gt 0 ]; do
    case "$1" in
        --conns) conns="$2"; shift 2 ;;
        --bin) bins+=("$2"); shift 2 ;;
        --no-build) build=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "heap-idle-h2: unknown option $1 (try --help)" >&2; exit 2 ;;
    esac
done
[[ "$conns" =~ ^[0-9]+$ ]] || { echo "heap-idle-h2: $conns is not a number" >&2; exit 2; }
root="$(cd "$(dirname "$0")/.." && pwd)"
bench_name=heap-idle-h2
# shellcheck source=lib/bench-common.sh
. "$root/scripts/lib/bench-common.sh"
release_bins
[ ${#bins[@]} -eq 0 ] && bins=("$zgix_bin")

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$tmp/k.pem" \
    -out "$tmp/c.pem" -days 2 -subj /CN=bench.example -addext subjectAltName=DNS:bench.example 2>/dev/null
oport="$(free_port)"
"$bench_bin" origin --bind "127.0.0.1:$oport" --body-bytes 64 >"$tmp/origin.log" 2>&1 &
pids+=($!)
wait_http "127.0.0.1:$oport" origin "$tmp/origin.log"

for bin in "${bins[@]}"; do
    hport="$(free_port)" tport="$(free_port)" aport="$(free_port)"
    cat >"$tmp/zgix.json" <<JSON
{"cpus": [0], "admin": {"bind": "127.0.0.1:$aport"},
 "listeners": [{"bind": "127.0.0.1:$hport", "http2": {"prior_knowledge": true}, "http": {"cluster": "o"}},
   {"bind": "127.0.0.1:$tport", "http": {"cluster": "o"},
    "tls": {"certificates": [{"cert": "$tmp/c.pem", "key": "$tmp/k.pem"}], "alpn": ["h2", "http/1.1"]}}],
 "clusters": {"o": {"endpoints": ["127.0.0.1:$oport"]}}}
JSON
    (cd "$tmp" && RUNTIME_DIRECTORY="$tmp" exec "$bin" --config "$tmp/zgix.json" >"$tmp/zgix.log" 2>&1) &
    zpid=$!
    pids+=("$zpid")
    wait_line "$tmp/zgix.log" "ready ("
    python3 - "$hport" "$tport" "$aport" "$conns" "$bin" "$zpid" <<'PY'
import re, socket, ssl, sys, urllib.request
hport, tport, aport, n, name = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
zpid = sys.argv[6]

def rss_kib():
    for l in open(f"/proc/{zpid}/status"):
        if l.startswith("VmRSS:"):
            return int(l.split()[1])
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])

def scrape():
    t = urllib.request.urlopen(f"http://127.0.0.1:{aport}/metrics", timeout=10).read().decode()
    get = lambda k: float(re.search(r"^" + re.escape(k) + r" (\S+)$", t, re.M).group(1))
    return get('zgix_heap_allocations_total{shard="0"}'), get("zgix_heap_live_bytes")

def live():
    # A value the tick published after this call began (see the header).
    a0, _ = scrape()
    while True:
        a, v = scrape()
        if a != a0:
            return v

def settled(s):
    # The server's SETTINGS ACK: it read our preface and SETTINGS.
    buf = b""
    s.settimeout(10)
    while True:
        while len(buf) >= 9:
            ln = int.from_bytes(buf[:3], "big")
            if len(buf) < 9 + ln:
                break
            kind, flags = buf[3], buf[4]
            buf = buf[9 + ln:]
            if kind == 4 and flags & 1:
                return
        d = s.recv(4096)
        assert d, "closed before the SETTINGS ACK"
        buf += d

ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
ctx.set_alpn_protocols(["h2"])
def h2c():
    s = socket.create_connection(("127.0.0.1", hport)); s.sendall(PREFACE); settled(s); return s
def tls():
    s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", tport)), server_hostname="bench.example")
    assert s.selected_alpn_protocol() == "h2"
    s.sendall(PREFACE); settled(s); return s
def h1():
    s = socket.create_connection(("127.0.0.1", hport))
    s.sendall(b"GET / HTTP/1.1\r\nHost: o\r\n\r\n"); s.settimeout(10)
    got = b""
    while b"\r\n\r\n" not in got or len(got.split(b"\r\n\r\n", 1)[1]) < 64:
        got += s.recv(4096)
    return s
# Warm-up: the shard's buffer pools and caches exist before the baseline.
for f in (h2c, tls, h1):
    w = [f() for _ in range(4)]
    for s in w: s.close()
out, rss = [], []
for tag, f in (("h2c", h2c), ("h2 TLS", tls), ("http/1.1", h1)):
    before, r0 = live(), rss_kib()
    held = [f() for _ in range(n)]
    after, r1 = live(), rss_kib()
    out.append(f"{tag} {(after - before) / n / 1024:.2f}")
    rss.append(f"{tag} {(r1 - r0) / n:.2f}")
    for s in held: s.close()
print(f"{name}: KiB of heap per idle connection ({n} each): " + ", ".join(out))
print(f"{name}: KiB of RSS per idle connection (the same; pages the allocator reused count nothing): " + ", ".join(rss))
PY
    stop_pid "$zpid"
done
