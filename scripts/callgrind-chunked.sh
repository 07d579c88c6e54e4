#!/usr/bin/env bash
# Instructions per chunked upload through zgix, counted by valgrind's
# callgrind (repeatable on a loaded machine, unlike CPU time): zgix (one
# shard, plaintext both sides) in front of a zgix-bench origin that reads the
# body and answers 2 bytes; a Python client on one keep-alive connection
# sends 20 warm POSTs with a Transfer-Encoding: chunked body of --body-bytes
# in chunks of --chunk-bytes (each chunk's size line with an extension, so
# zgix re-encodes it), callgrind's counters are zeroed, N more POSTs, a dump:
# the figure is the dump's instructions (every thread) over N. Several
# binaries (a baseline built from another commit) run in interleaved rounds.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/callgrind-chunked.sh [--bin LABEL=PATH]... [--driver epoll|uring]
                                    [--requests N] [--body-bytes B]
                                    [--chunk-bytes K] [--rounds R] [--bench PATH]

  --bin LABEL=PATH  a zgix binary to measure (repeatable; default
                    zgix=$CARGO_TARGET_DIR/release/zgix)
  --driver D        zgix's io driver (default epoll)
  --requests N      uploads counted (default 200)
  --body-bytes B    bytes of chunk-data per upload (default 65536)
  --chunk-bytes K   bytes per chunk (default 4096; under the bulk path's 256 KiB)
  --rounds R        interleaved rounds, medians printed (default 1)
  --bench PATH      the zgix-bench binary for the origin (default
                    $CARGO_TARGET_DIR/release/zgix-bench)

Needs valgrind (with callgrind_control) and python3. Only 127.0.0.1 is used;
everything started is stopped on exit.
USAGE
}

bins=() n=200 rounds=1 driver=epoll body=65536 chunk=4096 bench=""
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bins+=("$2"); shift 2 ;;
        --driver) driver="$2"; shift 2 ;;
        --requests) n="$2"; shift 2 ;;
        --body-bytes) body="$2"; shift 2 ;;
        --chunk-bytes) chunk="$2"; shift 2 ;;
        --rounds) rounds="$2"; shift 2 ;;
        --bench) bench="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "callgrind-chunked: unknown option $1 (try --help)" >&2; exit 2 ;;
    esac
done
root="$(cd "$(dirname "$0")/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
[ ${#bins[@]} -gt 0 ] || bins=("zgix=$target_dir/release/zgix")
[ -n "$bench" ] || bench="$target_dir/release/zgix-bench"
for t in valgrind callgrind_control python3; do
    command -v "$t" >/dev/null || { echo "callgrind-chunked: $t is missing" >&2; exit 1; }
done

bench_name=callgrind-chunked
# shellcheck source=lib/bench-common.sh
. "$root/scripts/lib/bench-common.sh"

cat >"$tmp/client.py" <<'PY'
import os, socket, sys, time
host, port, n, sync = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
body, chunk = int(sys.argv[5]), int(sys.argv[6])
parts = [b"POST /up HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"]
at = 0
while at < body:
    k = min(chunk, body - at)
    parts.append(b"%x;i=%d\r\n" % (k, at) + b"x" * k + b"\r\n")
    at += k
parts.append(b"0\r\n\r\n")
req = b"".join(parts)
s = socket.create_connection((host, port))
buf = b""
def post():
    global buf
    s.sendall(req)
    while True:
        h = buf.find(b"\r\n\r\n")
        if h >= 0:
            head = buf[:h].decode()
            assert head.startswith("HTTP/1.1 200"), head
            cl = next(int(l.split(":")[1]) for l in head.split("\r\n")
                      if l.lower().startswith("content-length"))
            if len(buf) >= h + 4 + cl:
                buf = buf[h + 4 + cl:]
                return
        d = s.recv(65536)
        assert d, "connection closed"
        buf += d
for _ in range(20):
    post()
open(sync + ".warm", "w").close()
def wait(name):
    while not os.path.exists(sync + "." + name):
        time.sleep(0.05)
wait("go")
for _ in range(n):
    post()
open(sync + ".done", "w").close()
wait("end")
PY

oport="$(free_port)"
"$bench" origin --bind "127.0.0.1:$oport" --body-bytes 2 >"$tmp/origin.log" 2>&1 &
pids+=($!)
wait_line "$tmp/origin.log" "listening" 600

wait_file() { # path
    for _ in $(seq 12000); do
        [ -e "$1" ] && return 0
        sleep 0.05
    done
    echo "callgrind-chunked: $1 never appeared" >&2
    exit 1
}

# One zgix under callgrind: warm, zero, N uploads, dump; prints instr/upload.
run() {
    local bin="$1" dir lport
    dir="$tmp/run-$RANDOM$RANDOM"
    mkdir -p "$dir"
    lport="$(free_port)"
    cat >"$dir/zgix.json" <<JSON
{"cpus": [0], "io": {"driver": "$driver"}, "listeners": [{"bind": "127.0.0.1:$lport", "name": "up", "http": {"cluster": "o"}}],
 "clusters": {"o": {"endpoints": ["127.0.0.1:$oport"]}}}
JSON
    (cd "$dir" && RUNTIME_DIRECTORY="$dir" exec valgrind --tool=callgrind --separate-threads=yes \
        "$bin" --config "$dir/zgix.json" >"$dir/zgix.log" 2>&1) &
    local vpid=$!
    pids+=("$vpid")
    wait_line "$dir/zgix.log" "ready (" 600
    if [ "$driver" = uring ] && ! grep -q "shards, uring)" "$dir/zgix.log"; then
        echo "callgrind-chunked: note: the shard runs on epoll under valgrind" >&2
    fi
    local sync="$dir/sync"
    python3 "$tmp/client.py" 127.0.0.1 "$lport" "$n" "$sync" "$body" "$chunk" &
    local cpid=$!
    wait_file "$sync.warm"
    callgrind_control -z "$vpid" >/dev/null
    touch "$sync.go"
    wait_file "$sync.done"
    ls "$dir" | grep '^callgrind.out' >"$dir/before" || true
    callgrind_control -d "$vpid" >/dev/null
    local sum=0 v f
    for f in $(ls "$dir" | grep '^callgrind.out' | grep -vxF -f "$dir/before"); do
        v="$(awk '/^(summary|totals):/ {print $2; exit}' "$dir/$f")"
        [ -n "$v" ] && sum=$((sum + v))
    done
    touch "$sync.end"
    wait "$cpid"
    echo "$((sum / n))"
    kill -TERM "$vpid" 2>/dev/null || true
    local i
    for i in $(seq 300); do
        kill -0 "$vpid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$vpid" 2>/dev/null || true
    wait "$vpid" 2>/dev/null || true
    rm -rf "$dir"
}

printf 'callgrind-chunked: %d chunked uploads of %d B in %d B chunks after 20 warm ones, driver %s, %d rounds\n' \
    "$n" "$body" "$chunk" "$driver" "$rounds"
declare -A all
for r in $(seq "$rounds"); do
    for b in "${bins[@]}"; do
        label="${b%%=*}" bin="${b#*=}"
        v="$(run "$bin")"
        all[$label]="${all[$label]:-} $v"
        printf 'round %d %-10s %10d instr/upload %8d instr/MB\n' "$r" "$label" "$v" "$((v * 1048576 / body))"
    done
done
for b in "${bins[@]}"; do
    label="${b%%=*}"
    printf '%-10s median %10d instr/upload  rounds:%s\n' "$label" \
        "$(echo "${all[$label]}" | tr ' ' '\n' | grep . | median)" "${all[$label]}"
done
