#!/usr/bin/env bash
# Measures the proxies' resident memory per client connection: zgix on its
# io_uring and epoll drivers, nginx (1 worker) and HAProxy (1 thread), with N
# connections idle, then kept alive after one request each, then closed.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/bench-conns.sh [options]

Starts one zgix-bench origin (CPU 1) and, on CPU 0, zgix (1 shard, io_uring
driver), zgix-epoll (the same config, io.driver epoll), nginx (1 worker) and
HAProxy (1 thread), configured as scripts/bench-peers.sh configures them
(keep-alive to the origin, admission controls off, zgix busy polling off).
Then, per connection count and round, for each target in turn (interleaved):

  1. start: the serving process's VmRSS (/proc/PID/status; nginx: its worker);
  2. idle: N client connections opened (and accepted: the listener's accept
     queue empty), no byte sent; wait --settle seconds, read VmRSS;
  3. kept alive: one GET on each connection (--window in flight at a time, so
     the upstream side stays at about --window connections), every response
     read, the connections kept open; wait --settle seconds, read VmRSS;
  4. closed: every client connection closed; wait --close-wait seconds (zgix
     hands freed memory back once a second), read VmRSS.

Every round starts each target afresh (nginx and HAProxy keep freed memory
for reuse, so a second wave in one process would read 0 KiB per connection).
Prints, per connection count, the medians over the rounds of (idle - start)/N
and (kept alive - start)/N in KiB per connection, the peak and closed - start
in MB, and how many of the N connections were still open at each reading.

  --connections LIST  connection counts, comma-separated (default 5000); the
                      client needs N descriptors and the proxy N plus its
                      upstream ones, under `ulimit -Hn`; zgix's
                      limits.max_connections and HAProxy's maxconn are set
                      to the largest N + 100 (HAProxy with `no strict-limits`
                      when that needs more than half the descriptor limit)
  --rounds N          rounds per connection count (default 3)
  --targets LIST      any of zgix,zgix-epoll,nginx,haproxy (default all four)
  --window N          requests in flight at once in step 3 (default 64; 0: all N
                      at once, so the proxy opens up to N upstream connections)
  --settle S          seconds to wait before the idle and kept-alive readings
                      (default 2)
  --close-wait S      seconds to wait after closing (default 4)
  --body-bytes N      origin response body size (default 64)
  --base-port P       first of the local ports used (default 18080; P..P+9)
  --no-build          do not cargo build; use $ZGIX_BIN / $ZGIX_BENCH_BIN or
                      the release binaries under $CARGO_TARGET_DIR
  -h, --help          this text

Needs python3 (the client), nginx and haproxy (apt-get install nginx haproxy).
Everything started is stopped on exit.
USAGE
}

conn_counts=5000 rounds=3 targets="zgix,zgix-epoll,nginx,haproxy" window=64 settle=2 close_wait=4
body_bytes=64 base_port=18080 build=1
while [ $# -gt 0 ]; do
    case "$1" in
        --connections) conn_counts="$2"; shift 2 ;;
        --rounds) rounds="$2"; shift 2 ;;
        --targets) targets="$2"; shift 2 ;;
        --window) window="$2"; shift 2 ;;
        --settle) settle="$2"; shift 2 ;;
        --close-wait) close_wait="$2"; shift 2 ;;
        --body-bytes) body_bytes="$2"; shift 2 ;;
        --base-port) base_port="$2"; shift 2 ;;
        --no-build) build=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench-conns: unknown option $1 (try --help)" >&2; exit 2 ;;
    esac
done
IFS=, read -r -a count_list <<<"$conn_counts"
for n in "$rounds" "$window" "$settle" "$close_wait" "$body_bytes" "$base_port" "${count_list[@]}"; do
    [[ "$n" =~ ^[0-9]+$ ]] || { echo "bench-conns: $n is not a number" >&2; exit 2; }
done
IFS=, read -r -a target_list <<<"$targets"
for t in "${target_list[@]}"; do
    case "$t" in zgix|zgix-epoll|nginx|haproxy) ;; *) echo "bench-conns: unknown target $t" >&2; exit 2 ;; esac
done
root="$(cd "$(dirname "$0")/.." && pwd)"
PATH="$PATH:/usr/sbin:/sbin"
for c in python3 ss; do
    command -v "$c" >/dev/null || { echo "bench-conns: $c is missing" >&2; exit 1; }
done
for t in nginx haproxy; do
    if [[ ",$targets," == *",$t,"* ]] && ! command -v "$t" >/dev/null; then
        echo "bench-conns: $t is missing (apt-get install $t, or leave it out of --targets)" >&2; exit 1
    fi
done

target_dir="${CARGO_TARGET_DIR:-$root/target}"
if [ "$build" = 1 ]; then
    (cd "$root" && cargo build --release -q -p zgix -p zgix-bench)
fi
bench_bin="${ZGIX_BENCH_BIN:-$target_dir/release/zgix-bench}"
zgix_bin="${ZGIX_BIN:-$target_dir/release/zgix}"
for b in "$bench_bin" "$zgix_bin"; do [ -x "$b" ] || { echo "bench-conns: no binary at $b" >&2; exit 1; }; done
ulimit -l unlimited 2>/dev/null || ulimit -l "$(ulimit -Hl)" 2>/dev/null || true
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
max_n=0
for n in "${count_list[@]}"; do [ "$n" -gt "$max_n" ] && max_n=$n; done
fd_soft="$(ulimit -n)"
if [ "$fd_soft" != unlimited ] && [ $(( max_n + window + 200 )) -gt "$fd_soft" ]; then
    echo "bench-conns: $max_n connections need more descriptors than ulimit -n ($fd_soft) allows" >&2; exit 1
fi

ncpu="$(nproc)"
proxy_cpu=0
origin_cpu=$(( ncpu > 1 ? 1 : 0 ))
client_cpu=$(( ncpu > 2 ? 2 : ncpu - 1 ))
echo "bench-conns: $ncpu CPUs; proxies on CPU $proxy_cpu, origin on CPU $origin_cpu, client on CPU $client_cpu"

bench_name=bench-conns
# shellcheck source=lib/bench-common.sh
. "$root/scripts/lib/bench-common.sh"
# shellcheck source=lib/bench-proxies.sh
. "$root/scripts/lib/bench-proxies.sh"
bench_ports "$base_port"
bench_capacity $(( max_n + 100 ))
check_ports_free bench-conns
rate_limit=0 conn_limit=0 # admission controls stay off here

# The client: opens, uses and closes the connections, and reads the proxy's
# RSS at each step (so no step waits on the shell). One JSON line out.
cat >"$tmp/client.py" <<'PY'
import json, select, socket, subprocess, sys, time

port, n, window, settle, close_wait = (int(x) for x in sys.argv[1:6])
window = window or n
pids = [int(p) for p in sys.argv[6].split(",")]
REQ = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n"

def rss():
    k = 0
    for p in pids:
        with open(f"/proc/{p}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    k += int(line.split()[1])
    return k

def accept_queue():
    out = subprocess.run(["ss", "-ltnH", f"( sport = :{port} )"], capture_output=True, text=True).stdout
    return sum(int(l.split()[1]) for l in out.splitlines() if l.split())

def drain_accepts(limit=10.0):
    end = time.time() + limit
    while accept_queue() > 0 and time.time() < end:
        time.sleep(0.01)

def still_open(socks):
    # A connection the proxy closed reads as EOF; an idle one has nothing.
    ep = select.epoll()
    for s in socks:
        ep.register(s.fileno(), select.EPOLLIN | select.EPOLLRDHUP)
    closed = len(ep.poll(0, maxevents=len(socks) + 1))
    ep.close()
    return len(socks) - closed

start = rss()
socks, failed = [], 0
for lo in range(0, n, 256):
    batch = []
    for _ in range(min(256, n - lo)):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        batch.append(s)
    ep = select.epoll()
    for s in batch:
        ep.register(s.fileno(), select.EPOLLOUT)
    pending, end = len(batch), time.time() + 30
    while pending and time.time() < end:
        pending -= len(ep.poll(1.0, maxevents=pending))
    ep.close()
    for s in batch:
        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
            socks.append(s)
        else:
            failed += 1
            s.close()
    drain_accepts()
drain_accepts()
time.sleep(settle)
idle, open_idle = rss(), still_open(socks)

# One request on each, `window` in flight; read each response whole
# (Content-Length framing: the origin sends it) and keep the connection.
by_fd = {s.fileno(): s for s in socks}
bufs, ok, bad = {}, 0, 0
ep = select.epoll()
todo = list(by_fd)
inflight = 0
def launch():
    global inflight
    while todo and inflight < window:
        fd = todo.pop()
        try:
            by_fd[fd].send(REQ)
        except OSError:
            global bad
            bad += 1
            continue
        bufs[fd] = b""
        ep.register(fd, select.EPOLLIN)
        inflight += 1
launch()
deadline = time.time() + 60
while inflight and time.time() < deadline:
    for fd, _ in ep.poll(1.0):
        try:
            data = by_fd[fd].recv(65536)
        except OSError:
            data = b""
        done = False
        if not data:
            bad += 1
            done = True
        else:
            b = bufs[fd] + data
            bufs[fd] = b
            head_end = b.find(b"\r\n\r\n")
            if head_end >= 0:
                head = b[:head_end].decode("latin-1").split("\r\n")
                length = 0
                for h in head[1:]:
                    k, _, v = h.partition(":")
                    if k.strip().lower() == "content-length":
                        length = int(v.strip())
                if len(b) >= head_end + 4 + length:
                    if head[0].split(" ")[1] == "200":
                        ok += 1
                    else:
                        bad += 1
                    done = True
        if done:
            ep.unregister(fd)
            del bufs[fd]
            inflight -= 1
    launch()
ep.close()
time.sleep(settle)
kept, open_kept = rss(), still_open(socks)

for s in socks:
    s.close()
time.sleep(close_wait)
closed = rss()
print(json.dumps({"start": start, "idle": idle, "kept": kept, "closed": closed, "connected": len(socks),
                  "failed": failed, "open_idle": open_idle, "open_kept": open_kept, "ok": ok, "bad": bad}))
PY

start_origin

# measure TARGET N: one round against TARGET; appends a result line.
measure() {
    local t="$1" n="$2" out
    out="$(taskset -c "$client_cpu" python3 "$tmp/client.py" "$(port_of "$t")" "$n" "$window" "$settle" \
        "$close_wait" "$(work_pids "$t" | paste -sd,)")" || { echo "bench-conns: the client failed against $t" >&2; return 1; }
    python3 -c '
import json, sys
r = json.loads(sys.argv[1]); t, n, rnd = sys.argv[2], int(sys.argv[3]), sys.argv[4]
print(t, n, rnd, r["start"], r["idle"], r["kept"], r["closed"], "%.2f %.2f %.1f %.1f" % (
    (r["idle"] - r["start"]) / n, (r["kept"] - r["start"]) / n, (r["closed"] - r["start"]) / 1024,
    (max(r["idle"], r["kept"]) - r["start"]) / 1024), r["open_idle"], r["open_kept"], r["ok"], r["bad"] + r["failed"])
' "$out" "$t" "$n" "$round" >>"$tmp/results"
    tail -1 "$tmp/results" | awk '{printf "  %-10s start %6.1f MB  idle %6.2f KiB/conn  kept alive %6.2f KiB/conn  peak %+6.1f MB  closed %+6.1f MB  open %d/%d, %d ok, %d errors\n",
        $1, $4 / 1024, $8, $9, $11, $10, $12, $13, $14, $15}'
}

: >"$tmp/results"
for n in "${count_list[@]}"; do
    echo
    echo "== $n connections =="
    for r in $(seq "$rounds"); do
        echo "round $r/$rounds"
        round=$r
        # A fresh process each round: nginx and HAProxy keep freed memory for
        # reuse, so a second wave in the same process would read 0 KiB.
        for t in "${target_list[@]}"; do
            start_target "$t" off 0
            measure "$t" "$n"
            stop_target "$t"
        done
    done
done

echo
echo "RSS per client connection (VmRSS of the serving process; nginx: its worker; a fresh process each"
echo "round), medians over $rounds rounds; idle = no byte sent, kept alive = after one request each"
echo "($window in flight at a time), connection open; peak = the larger of those two readings, closed ="
echo "after every client closed and ${close_wait}s, both against the process's RSS at its start (MB);"
echo "open = connections still open at the idle / kept-alive reading"
printf '%-10s %6s %9s %10s %10s %9s %10s %13s\n' target conns "start MB" "idle KiB" "kept KiB" "peak MB" \
    "closed MB" "open idle/kept"
for n in "${count_list[@]}"; do
    for t in "${target_list[@]}"; do
        m() { awk -v t="$t" -v n="$n" -v c="$1" '$1 == t && $2 == n {print $c}' "$tmp/results" | median; }
        awk -v t="$t" -v n="$n" -v s="$(m 4)" -v i="$(m 8)" -v k="$(m 9)" -v c="$(m 10)" -v f="$(m 11)" \
            -v oi="$(m 12)" -v ok="$(m 13)" 'BEGIN {
            printf "%-10s %6d %9.1f %10.2f %10.2f %+9.1f %+10.1f %8d/%d\n", t, n, s / 1024, i, k, f, c, oi, ok }'
    done
done
errors="$(awk '{n += $15} END {print n + 0}' "$tmp/results")"
[ "$errors" = 0 ] || echo "bench-conns: $errors failed connections or requests (see the round lines)" >&2
