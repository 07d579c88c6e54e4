# shellcheck shell=bash
# Helpers shared by the benchmark scripts: a scratch directory, the processes
# started (stopped on exit), waiting for a listener, medians, wrk latencies.
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
