# shellcheck shell=bash
# Helpers shared by the benchmark scripts: a scratch directory, the processes
# started (stopped on exit), waiting for a listener, medians, wrk latencies,
# telling a stalled run from a slow one.
# Source it after setting $bench_name (used in messages and the scratch path).

tmp="$(mktemp -d "/tmp/$bench_name.XXXXXX")"
pids=()
bench_cleanup() {
    local pid
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap bench_cleanup EXIT
trap 'exit 130' INT TERM

# release_bins: builds zgix and zgix-bench in release unless $build is 0
# (run from $root), and sets $target_dir, $zgix_bin and $bench_bin
# ($ZGIX_BIN and $ZGIX_BENCH_BIN override the last two).
release_bins() {
    target_dir="${CARGO_TARGET_DIR:-$root/target}"
    if [ "$build" = 1 ]; then
        (cd "$root" && cargo build --release -q -p zgix -p zgix-bench)
    fi
    zgix_bin="${ZGIX_BIN:-$target_dir/release/zgix}"
    bench_bin="${ZGIX_BENCH_BIN:-$target_dir/release/zgix-bench}"
}

# free_port: a TCP port on 127.0.0.1 that was free a moment ago.
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# wait_line FILE NEEDLE [SECONDS]: waits (default 60 s; valgrind starts
# slowly) until FILE has a line with NEEDLE; else prints FILE and exits.
wait_line() {
    local i
    for i in $(seq "$(( ${3:-60} * 10 ))"); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "$bench_name: no \"$2\" in $1:" >&2
    cat "$1" >&2
    exit 1
}

# stop_pid PID: TERM one process we started and wait for it.
stop_pid() {
    local pid="$1" p keep=()
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    for p in "${pids[@]}"; do [ "$p" = "$pid" ] || keep+=("$p"); done
    pids=("${keep[@]+"${keep[@]}"}")
}

# wait_http HOST:PORT NAME LOG...: up to 10 s for an HTTP answer there; else
# prints the logs and exits.
wait_http() {
    local addr="$1" name="$2" i
    shift 2
    for i in $(seq 100); do
        if curl -s -o /dev/null --max-time 1 "http://$addr/"; then return 0; fi
        sleep 0.1
    done
    echo "$bench_name: $name did not come up on $addr; its log:" >&2
    cat "$@" >&2 || true
    exit 1
}

# median: of the numbers on stdin, one a line (0 when there are none).
median() {
    sort -n | awk '{a[NR] = $1} END { if (NR == 0) print 0; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

# to_us VALUE: wrk latency (e.g. 512.00us, 1.23ms, 1.01s) in microseconds.
to_us() {
    awk -v v="$1" 'BEGIN {
        n = v + 0; u = v; sub(/^[0-9.]+/, "", u)
        if (u == "ms") n *= 1000; else if (u == "s") n *= 1000000; else if (u == "m") n *= 60000000
        printf "%.0f", n }'
}

# wait_quiet MAX_S CPU...: waits (up to MAX_S seconds, 0: not at all) until
# the given CPUs were each under 10 % busy over half a second, so that a run
# does not start while something else (a compiler, a test suite) holds the
# cores. Call it between runs, when every process started here is idle.
# Adds the seconds waited to $quiet_waited.
quiet_waited=0
wait_quiet() {
    local max="$1" start now busy
    shift
    [ "$max" -gt 0 ] || return 0
    start="$(date +%s)"
    while :; do
        busy="$(cpus_busy_pct 0.5 "$@")"
        [ "$busy" -lt 10 ] && break
        now="$(date +%s)"
        if [ $(( now - start )) -ge "$max" ]; then
            echo "$bench_name: note: CPUs $* still ${busy}% busy after ${max}s of waiting; going on" >&2
            break
        fi
        sleep 1
    done
    now="$(date +%s)"
    quiet_waited=$(( quiet_waited + now - start ))
}

# cpus_busy_pct SECONDS CPU...: the highest busy share (%) of the given CPUs
# over SECONDS (/proc/stat).
cpus_busy_pct() {
    local secs="$1" a b
    shift
    a="$(cat /proc/stat)"
    sleep "$secs"
    b="$(cat /proc/stat)"
    awk -v list="$*" 'BEGIN { n = split(list, c, " "); for (i = 1; i <= n; i++) want["cpu" c[i]] = 1 }
        FNR == 1 { f++ }
        ($1 in want) { t = 0; for (i = 2; i <= NF; i++) t += $i; busy = t - $5 - $6
                       if (f == 1) { t0[$1] = t; b0[$1] = busy } else { dt = t - t0[$1]
                       p = dt > 0 ? 100 * (busy - b0[$1]) / dt : 0; if (p > m) m = p } }
        END { printf "%d", m }' <(echo "$a") <(echo "$b")
}

# wrk_stalled CONNECTIONS OUTPUT: true, printing why, when a wrk run measured
# a stalled target rather than its speed: no request completed, or timeouts
# (wrk counts each response later than its 2 s timeout) reached half the
# connections. A slow target times out a few; a hung one, all of them.
wrk_stalled() {
    local n t
    n="$(awk '/ requests in / {print $1}' <<<"$2")"
    t="$(awk '/Socket errors/ {gsub(/,/, ""); print $NF}' <<<"$2")"
    n="${n:-0}" t="${t:-0}"
    if [ "$n" -eq 0 ] || [ $(( t * 2 )) -ge "$1" ]; then
        echo "$n requests completed, $t timed out, over $1 connections"
        return 0
    fi
    return 1
}
