#!/usr/bin/env bash
# What one HTTP/2 request costs zgix's shard, in user-space instructions
# counted by valgrind's callgrind (repeatable on a loaded machine, unlike
# CPU time): zgix (one shard, epoll driver: valgrind does not model
# io_uring's shared rings) with a prior-knowledge h2c listener in front of a
# zgix-bench origin (64-byte bodies), loaded by `h2load -c 4 -m 100` (100
# streams per connection, as bench-h2.sh's second row) for N and 5N
# requests; (instructions(5N) - instructions(N)) / 4N of the shard thread,
# so start-up and the connections' set-up cancel out. With --baseline-bin
# the two binaries run in interleaved rounds; medians. With --h1 the same
# for HTTP/1.1 (`h2load --h1 -c 4 -m 1`: four keep-alive connections, one
# request at a time each, on a plain listener), the path an h2 change must
# not make slower; those counts move by a few per cent from run to run with
# how requests fall into event-loop turns (more idle turns and waits when
# they arrive one by one), so compare the request path's subtree in --keep
# files (`Conn::run`) as well.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/callgrind-h2.sh [--requests N] [--rounds R] [--baseline-bin PATH]
                               [--keep DIR] [--no-build] [--h1]

Needs valgrind, h2load and python3. Prints instructions per request of the
shard thread for this tree's release zgix (and the baseline binary, if
given). Everything started is stopped on exit; only 127.0.0.1 is used.

  --requests N        N of the two runs (default 2000; the second is 5N)
  --rounds R          interleaved rounds (default 3)
  --baseline-bin P    a second zgix binary to compare (e.g. built from main)
  --keep DIR          keep the 5N runs' callgrind files there (for
                      callgrind_annotate --inclusive=yes)
  --no-build          use the release binaries already built
  --h1                HTTP/1.1 keep-alive requests instead of h2c streams
USAGE
}

n=2000 rounds=3 base="" keep="" build=1 h1=0
while [ $# -gt 0 ]; do
    case "$1" in
        --requests) n="$2"; shift 2 ;;
        --rounds) rounds="$2"; shift 2 ;;
        --baseline-bin) base="$2"; shift 2 ;;
        --keep) keep="$2"; shift 2 ;;
        --no-build) build=0; shift ;;
        --h1) h1=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "callgrind-h2: unknown option $1 (try --help)" >&2; exit 2 ;;
    esac
done
for v in "$n" "$rounds"; do
    [[ "$v" =~ ^[0-9]+$ ]] || { echo "callgrind-h2: $v is not a number" >&2; exit 2; }
done
for t in valgrind h2load python3; do
    command -v "$t" >/dev/null || { echo "callgrind-h2: $t is missing" >&2; exit 1; }
done

root="$(cd "$(dirname "$0")/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
[ "$build" = 1 ] && (cd "$root" && cargo build --release -q -p zgix -p zgix-bench)
zgix_bin="$target_dir/release/zgix" bench_bin="$target_dir/release/zgix-bench"
[ -n "$keep" ] && mkdir -p "$keep"

bench_name=callgrind-h2
# shellcheck source=lib/bench-common.sh
. "$root/scripts/lib/bench-common.sh"


oport="$(free_port)"
"$bench_bin" origin --bind "127.0.0.1:$oport" --body-bytes 64 >"$tmp/origin.log" 2>&1 &
pids+=($!)
wait_http "127.0.0.1:$oport" origin "$tmp/origin.log"

# run BIN COUNT TAG -> instructions of the busiest thread (the shard).
run() {
    local bin="$1" count="$2" tag="$3" lport dir vpid best=0 bestf="" v f
    lport="$(free_port)"
    dir="$tmp/$tag-$count"
    mkdir -p "$dir"
    local h2cfg='"http2": {"prior_knowledge": true},' load=(-c 4 -m 100)
    [ "$h1" = 1 ] && h2cfg="" load=(--h1 -c 4 -m 1)
    cat >"$dir/zgix.json" <<JSON
{"cpus": [0], "io": {"driver": "epoll"},
 "listeners": [{"bind": "127.0.0.1:$lport", $h2cfg
   "http": {"cluster": "o"}}],
 "clusters": {"o": {"endpoints": ["127.0.0.1:$oport"]}}}
JSON
    (cd "$dir" && RUNTIME_DIRECTORY="$dir" exec valgrind --tool=callgrind --separate-threads=yes \
        "$bin" --config "$dir/zgix.json" >"$dir/zgix.log" 2>&1) &
    vpid=$!
    wait_line "$dir/zgix.log" "ready ("
    local out ok
    out="$(h2load -n "$count" "${load[@]}" "http://127.0.0.1:$lport/" 2>&1)"
    ok="$(awk '/^status codes:/ {print $3}' <<<"$out")"
    [ "$ok" = "$count" ] || { echo "callgrind-h2: $tag answered $ok of $count with 2xx:" >&2; echo "$out" >&2; exit 1; }
    kill -TERM "$vpid" 2>/dev/null || true
    wait "$vpid" 2>/dev/null || true
    for f in "$dir"/callgrind.out.*; do
        v="$(awk '/^(summary|totals):/ {print $2; exit}' "$f")"
        if [ -n "$v" ] && [ "$v" -gt "$best" ]; then best="$v" bestf="$f"; fi
    done
    [ -n "$keep" ] && [ "$count" != "$n" ] && cp "$bestf" "$keep/callgrind.$tag.out"
    echo "$best"
}

tags=(zgix)
[ -n "$base" ] && tags=(base zgix)
bin_of() { case "$1" in base) echo "$base" ;; zgix) echo "$zgix_bin" ;; esac; }
if [ "$h1" = 1 ]; then what="h2load --h1 -c 4 -m 1, HTTP/1.1 keep-alive"; else what="h2load -c 4 -m 100, h2c prior knowledge"; fi
printf 'callgrind-h2: %d and %d requests, %s, 64-byte answers, %d interleaved rounds\n' \
    "$n" $((5 * n)) "$what" "$rounds"
declare -A all
for r in $(seq "$rounds"); do
    for t in "${tags[@]}"; do
        a="$(run "$(bin_of "$t")" "$n" "$t")"
        b="$(run "$(bin_of "$t")" $((5 * n)) "$t")"
        v=$(( (b - a) / (4 * n) ))
        all[$t]="${all[$t]:-} $v"
        printf 'round %d %-5s %8d instr/request\n' "$r" "$t" "$v"
    done
done
declare -A per
for t in "${tags[@]}"; do
    per[$t]="$(echo "${all[$t]}" | tr ' ' '\n' | grep . | median)"
    printf '%-5s median %8s instr/request  (rounds:%s)\n' "$t" "${per[$t]}" "${all[$t]}"
done
if [ -n "$base" ]; then
    awk -v b="${per[base]}" -v z="${per[zgix]}" 'BEGIN {printf "zgix / base: %.3f\n", z / b}'
fi
