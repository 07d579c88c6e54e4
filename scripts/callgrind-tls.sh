#!/usr/bin/env bash
# Instructions per keep-alive HTTPS request in zgix, counted by valgrind's
# callgrind (repeatable on a loaded machine, unlike CPU time): zgix (one
# shard) terminates TLS 1.3 (ECDSA P-256) on one listener per body size, each
# in front of a zgix-bench origin; per body a Python `ssl` client warms its
# keep-alive connections (one, or --conns C, each with one request
# outstanding as wrk -cC keeps them) with 20 GETs each, callgrind's counters
# are zeroed (`callgrind_control -z`), N more GETs, a dump: the figure is the dump's
# instructions (every thread) over N, so start-up and the handshake are not
# in it. Several binaries (a baseline built from another commit) run in
# interleaved rounds.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/callgrind-tls.sh [--bin LABEL=PATH]... [--driver epoll|uring]
                                [--requests N] [--conns C] [--busy-poll-us U]
                                [--rounds R] [--bodies "64 16384"]
                                [--bench PATH]

  --bin LABEL=PATH  a zgix binary to measure (repeatable; default
                    zgix=$CARGO_TARGET_DIR/release/zgix)
  --driver D        zgix's io driver (default epoll; see the note below)
  --requests N      requests counted per body size (default 500)
  --conns C         keep-alive connections per body size, each with one
                    request outstanding at a time, as wrk -cC (default 1)
  --busy-poll-us U  zgix's limits.busy_poll_us (default 0, as bench-tls.sh
                    runs it: a spinning shard's instructions depend on time)
  --rounds R        interleaved rounds, medians printed (default 3)
  --bodies LIST     response body sizes in bytes (default "64 16384")
  --bench PATH      the zgix-bench binary for the origin (default
                    $CARGO_TARGET_DIR/release/zgix-bench, else debug)

Needs valgrind (with callgrind_control), python3 and openssl. Only 127.0.0.1 is used; everything
started is stopped on exit. valgrind 3.19 runs zgix's ring (callgrind
counts instructions, it does not model the memory the kernel writes); if a
ring is refused, zgix falls back to epoll and the script says so.
USAGE
}

bins=() n=500 rounds=3 driver=epoll bodies="64 16384" bench="" conns=1 spin=0
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bins+=("$2"); shift 2 ;;
        --driver) driver="$2"; shift 2 ;;
        --requests) n="$2"; shift 2 ;;
        --conns) conns="$2"; shift 2 ;;
        --busy-poll-us) spin="$2"; shift 2 ;;
        --rounds) rounds="$2"; shift 2 ;;
        --bodies) bodies="$2"; shift 2 ;;
        --bench) bench="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "callgrind-tls: unknown option $1 (try --help)" >&2; exit 2 ;;
    esac
done
root="$(cd "$(dirname "$0")/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
[ ${#bins[@]} -gt 0 ] || bins=("zgix=$target_dir/release/zgix")
if [ -z "$bench" ]; then
    bench="$target_dir/release/zgix-bench"
    [ -x "$bench" ] || bench="$target_dir/debug/zgix-bench"
fi
for t in valgrind python3 openssl; do
    command -v "$t" >/dev/null || { echo "callgrind-tls: $t is missing" >&2; exit 1; }
done

bench_name=callgrind-tls
# shellcheck source=lib/bench-common.sh
. "$root/scripts/lib/bench-common.sh"

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
    -subj /CN=bench.example -addext subjectAltName=DNS:bench.example \
    -keyout "$tmp/k.pem" -out "$tmp/c.pem" 2>/dev/null

cat >"$tmp/client.py" <<'PY'
import os, selectors, socket, ssl, sys, time
host, port, n, sync, conns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
req = b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n"
socks = [ctx.wrap_socket(socket.create_connection((host, port)), server_hostname="bench.example")
         for _ in range(conns)]
bufs = {s: b"" for s in socks}
def answered(s):
    """Consumes one whole answer from s's buffer, if there is one."""
    buf = bufs[s]
    h = buf.find(b"\r\n\r\n")
    if h < 0:
        return False
    head = buf[:h].decode()
    assert head.startswith("HTTP/1.1 200"), head
    cl = next(int(l.split(":")[1]) for l in head.split("\r\n")
              if l.lower().startswith("content-length"))
    if len(buf) < h + 4 + cl:
        return False
    bufs[s] = buf[h + 4 + cl:]
    return True
def get(k):
    """k requests in all, one outstanding per connection at a time (as wrk -cN)."""
    sel = selectors.DefaultSelector()
    sent = 0
    for s in socks[:k]:
        s.sendall(req)
        sent += 1
        sel.register(s, selectors.EVENT_READ)
    done = 0
    while done < k:
        for key, _ in sel.select():
            s = key.fileobj
            while True:
                try:
                    d = s.recv(65536)
                except ssl.SSLWantReadError:
                    break
                assert d, "connection closed"
                bufs[s] += d
                if s.pending() == 0:
                    break
            while answered(s):
                done += 1
                if sent < k:
                    s.sendall(req)
                    sent += 1
    sel.close()
for s in socks:
    s.setblocking(False)
get(20 * conns)  # warm: the handshakes, the connections' buffers, the shard's pools
open(sync + ".warm", "w").close()
def wait(name):
    while not os.path.exists(sync + "." + name):
        time.sleep(0.05)
wait("go")
get(n)
open(sync + ".done", "w").close()
wait("end")
PY

declare -A oport
for body in $bodies; do
    oport[$body]="$(free_port)"
    "$bench" origin --bind "127.0.0.1:${oport[$body]}" --body-bytes "$body" \
        >"$tmp/origin-$body.log" 2>&1 &
    pids+=($!)
    wait_line "$tmp/origin-$body.log" "listening" 600
done

wait_file() { # path
    for _ in $(seq 12000); do
        [ -e "$1" ] && return 0
        sleep 0.05
    done
    echo "callgrind-tls: $1 never appeared" >&2
    exit 1
}

# One zgix under callgrind per binary and round, one TLS listener per body
# size (each to its own origin): per body, a client warms its connection,
# the counters are zeroed, N requests, a dump; prints "body instr/request"
# (every thread's instructions in the dump over N).
run() {
    local bin="$1" dir listeners="" clusters="" sep="" body
    dir="$tmp/run-$RANDOM$RANDOM"
    mkdir -p "$dir"
    declare -A lport
    for body in $bodies; do
        lport[$body]="$(free_port)"
        listeners="$listeners$sep{\"bind\": \"127.0.0.1:${lport[$body]}\", \"name\": \"b$body\",
   \"tls\": {\"certificates\": [{\"cert\": \"$tmp/c.pem\", \"key\": \"$tmp/k.pem\"}]},
   \"http\": {\"cluster\": \"o$body\"}}"
        clusters="$clusters$sep\"o$body\": {\"endpoints\": [\"127.0.0.1:${oport[$body]}\"]}"
        sep=", "
    done
    cat >"$dir/zgix.json" <<JSON
{"cpus": [0], "io": {"driver": "$driver"}, "limits": {"busy_poll_us": $spin}, "listeners": [$listeners], "clusters": {$clusters}}
JSON
    (cd "$dir" && RUNTIME_DIRECTORY="$dir" exec valgrind --tool=callgrind --separate-threads=yes \
        "$bin" --config "$dir/zgix.json" >"$dir/zgix.log" 2>&1) &
    local vpid=$!
    pids+=("$vpid")
    wait_line "$dir/zgix.log" "ready (" 600
    if [ "$driver" = uring ] && ! grep -q "shards, uring)" "$dir/zgix.log"; then
        echo "callgrind-tls: note: the shard runs on epoll under valgrind" >&2
    fi
    local vg="$vpid" # the subshell execs valgrind, which keeps its pid
    for body in $bodies; do
        local sync="$dir/sync-$body"
        python3 "$tmp/client.py" 127.0.0.1 "${lport[$body]}" "$n" "$sync" "$conns" &
        local cpid=$!
        wait_file "$sync.warm"
        callgrind_control -z "$vg" >/dev/null
        touch "$sync.go"
        wait_file "$sync.done"
        mkdir -p "$dir/before-$body"
        ls "$dir" | grep '^callgrind.out' >"$dir/before-$body/list" || true
        callgrind_control -d "$vg" >/dev/null
        local sum=0 v f
        for f in $(ls "$dir" | grep '^callgrind.out' | grep -vxF -f "$dir/before-$body/list"); do
            v="$(awk '/^(summary|totals):/ {print $2; exit}' "$dir/$f")"
            [ -n "$v" ] && sum=$((sum + v))
        done
        touch "$sync.end"
        wait "$cpid"
        echo "$body $((sum / n))"
    done
    kill -TERM "$vpid" 2>/dev/null || true
    # A ring shard under valgrind can take minutes to drain: the counts are
    # dumped already, so it gets 30 s.
    local i
    for i in $(seq 300); do
        kill -0 "$vpid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$vpid" 2>/dev/null || true
    wait "$vpid" 2>/dev/null || true
    rm -rf "$dir"
}

median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf 'callgrind-tls: %d keep-alive HTTPS requests after 20 warm ones, %d connection(s) per body size, driver %s, busy_poll_us %d, %d interleaved rounds\n' \
    "$n" "$conns" "$driver" "$spin" "$rounds"
declare -A all
for r in $(seq "$rounds"); do
    for b in "${bins[@]}"; do
        label="${b%%=*}" bin="${b#*=}"
        while read -r body v; do
            all[$label/$body]="${all[$label/$body]:-} $v"
            printf 'round %d %-10s %6d B %9d instr/request\n' "$r" "$label" "$body" "$v"
        done < <(run "$bin")
    done
done
printf '%-10s %8s %12s   %s\n' binary body median rounds
for body in $bodies; do
    for b in "${bins[@]}"; do
        label="${b%%=*}"
        printf '%-10s %6d B %12d  %s\n' "$label" "$body" "$(echo "${all[$label/$body]}" | median)" "${all[$label/$body]}"
    done
done
