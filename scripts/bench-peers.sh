#!/usr/bin/env bash
# Benchmarks zgix (io_uring and epoll drivers) against nginx and HAProxy in
# front of the same zgix-bench origin, plus a bare TCP relay and a direct run
# to the origin, with admission controls off and on: requests/s, latency, the
# proxy process's CPU per request and (--syscalls) syscalls per request.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/bench-peers.sh [options]

Puts one zgix-bench origin behind zgix (1 shard, io_uring driver), the same
zgix config on the epoll driver (zgix-epoll), nginx (1 worker) and HAProxy
(1 thread), all on 127.0.0.1, plus a bare TCP relay and a direct run, and
loads each with `wrk -t1 -cN --latency` in interleaved rounds (zgix
zgix-epoll nginx haproxy relay direct, zgix ...). Prints, per admission mode,
the median requests/s, p50 and p99 of each target, the proxy process's CPU
microseconds per request (user and system apart, every thread, from
/proc/PID/stat), the ratios to zgix, the median of the per-round ratios of
zgix to each target, and zgix's CPU per request against the better of nginx
and HAProxy.

  --rounds N        rounds per mode (default 5)
  --duration S      seconds per wrk run (default 5)
  --connections N   wrk connections (default 64)
  --modes LIST      off,on (default both): admission controls off / on
                    (on = rate limit set high enough never to refuse, connection
                    limit, WAF deny list; nginx limit_req/limit_conn/if, HAProxy
                    stick-table + http-request deny)
  --targets LIST    any of zgix,zgix-epoll,zgix-base,nginx,haproxy,
                    haproxy-splice,relay,direct (default all but zgix-base
                    and haproxy-splice; haproxy-splice joins for bodies, and
                    zgix-base with --baseline-bin). zgix-epoll is zgix's
                    config with io.driver epoll; haproxy-splice is HAProxy's
                    config with `option splice-auto`.
                    relay is HAProxy in TCP mode (1 thread): it copies
                    bytes between a client connection and its own upstream
                    connection and parses nothing, so it marks what any proxy
                    can reach on this CPU plan; it runs without admission
                    controls in both modes and is not counted as a peer
  --body-bytes N    origin response body size (default 64). Above 64 (or
                    with --upload-bytes) the tables add MB/s (body bytes
                    moved, both directions, per second) and the proxy's CPU
                    microseconds per MB, the default targets add
                    haproxy-splice, and --fixed-rate defaults to 0
  --chunked         the origin sends its body chunked (--chunk-bytes N: in
                    chunks of N bytes; default 0, the whole body in one)
  --upload-bytes N  every request is a POST with an N-byte Content-Length
                    body (wrk script scripts/wrk/upload.lua); the origin
                    reads it and answers with --body-bytes bytes (default 0:
                    GET)
  --upload-chunk-bytes K  with --upload-bytes, the body is sent with
                    Transfer-Encoding: chunked in chunks of K bytes
                    (scripts/wrk/upload-chunked.lua; default 0: Content-Length)
  --baseline-bin P  also run target zgix-base: zgix's uring config on the
                    binary P (a build from before a change), interleaved with
                    the others, so before and after come from one run
  --fixed-rate R    after the wrk rounds, offer R requests/s open loop
                    (zgix-bench load, --connections connections) to each proxy
                    and report the proxy's CPU time per request and p99; zgix
                    runs with busy polling off for this part so its CPU time is
                    its work (default 10000; 0 skips it)
  --rate-rounds N   interleaved rounds of the fixed-rate part (default 3)
  --busy-poll-us N  zgix's limits.busy_poll_us in the wrk rounds (default 0:
                    busy polling off, so the CPU per request at saturation is
                    work, not polling; the fixed-rate and syscall parts always
                    use 0)
  --syscalls        after the fixed-rate part, count each proxy's syscalls per
                    request: strace -c -f -p on its serving processes over one
                    wrk run of --duration seconds per round; and, when perf
                    is installed, perf stat's count of the raw_syscalls:sys_enter
                    tracepoint (no stop per call) over a wrk run and a
                    --fixed-rate run
  --syscall-rounds N  interleaved rounds of the syscall part (default 1)
  --quiet-wait S    before each measured run, wait up to S seconds for CPUs
                    0 and 1 to be under 10 % busy over half a second (another
                    program's compile or test run would otherwise land in the
                    run); default 0 (no wait)
  --base-port P     first of the local ports used (default 18080; uses P..P+10)
  --no-install      do not apt-get install missing wrk/nginx/haproxy (python3
                    for --fixed-rate, strace for --syscalls)
  --no-build        do not cargo build; use $ZGIX_BIN / $ZGIX_BENCH_BIN or the
                    release binaries under $CARGO_TARGET_DIR (default ./target)
  -h, --help        this text

CPU plan: the proxies are pinned to CPU 0 (zgix "cpus":[0], nginx
worker_cpu_affinity, HAProxy cpu-map), the origin to CPU 1 and wrk to CPU 2
(on a 2-CPU box wrk shares CPU 1 with the origin, so compare ratios, not
absolute numbers). Needs root only to install packages. Everything started is
stopped on exit.

A run that measured a stall, not a speed (no request completed, timeouts on
half the connections, or no answer to one request right after the run),
stops the benchmark with exit status 1 and no
figures, naming the target and whether the origin still answers directly.
USAGE
}

rounds=5 duration=5 connections=64 modes="off,on" targets=""
body_bytes=64 base_port=18080 install=1 build=1 fixed_rate="" rate_rounds=3 busy_poll=0
syscalls=0 syscall_rounds=1 quiet_wait=0 upload_bytes=0 upload_chunk=0 zgix_base_bin=""
origin_chunked="" chunk_bytes=0
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds="$2"; shift 2 ;;
        --duration) duration="$2"; shift 2 ;;
        --connections) connections="$2"; shift 2 ;;
        --modes) modes="$2"; shift 2 ;;
        --targets) targets="$2"; shift 2 ;;
        --body-bytes) body_bytes="$2"; shift 2 ;;
        --upload-bytes) upload_bytes="$2"; shift 2 ;;
        --upload-chunk-bytes) upload_chunk="$2"; shift 2 ;;
        --chunked) origin_chunked=1; shift ;;
        --chunk-bytes) chunk_bytes="$2"; shift 2 ;;
        --baseline-bin) zgix_base_bin="$2"; shift 2 ;;
        --base-port) base_port="$2"; shift 2 ;;
        --fixed-rate) fixed_rate="$2"; shift 2 ;;
        --rate-rounds) rate_rounds="$2"; shift 2 ;;
        --busy-poll-us) busy_poll="$2"; shift 2 ;;
        --syscalls) syscalls=1; shift ;;
        --syscall-rounds) syscall_rounds="$2"; shift 2 ;;
        --quiet-wait) quiet_wait="$2"; shift 2 ;;
        --no-install) install=0; shift ;;
        --no-build) build=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench-peers: unknown option $1 (try --help)" >&2; exit 2 ;;
    esac
done
# Bodies: the tables add MB/s and CPU per MB, HAProxy with splice joins the
# default targets, and the fixed-rate part (sized for small requests) is off
# unless asked for.
bodies=0
{ [ "$body_bytes" -gt 64 ] || [ "$upload_bytes" -gt 0 ]; } 2>/dev/null && bodies=1
if [ -z "$targets" ]; then
    targets="zgix,zgix-epoll"
    [ -n "$zgix_base_bin" ] && targets+=",zgix-base"
    targets+=",nginx,haproxy"
    [ "$bodies" = 1 ] && targets+=",haproxy-splice"
    targets+=",relay,direct"
fi
if [ -z "$fixed_rate" ]; then fixed_rate=10000; [ "$bodies" = 1 ] && fixed_rate=0; fi
for n in "$rounds" "$duration" "$connections" "$body_bytes" "$chunk_bytes" "$upload_bytes" "$upload_chunk" "$base_port" "$fixed_rate" "$rate_rounds" "$busy_poll" "$syscall_rounds" "$quiet_wait"; do
    [[ "$n" =~ ^[0-9]+$ ]] || { echo "bench-peers: $n is not a number" >&2; exit 2; }
done
IFS=, read -r -a target_list <<<"$targets"
for t in "${target_list[@]}"; do
    case "$t" in zgix|zgix-epoll|zgix-base|nginx|haproxy|haproxy-splice|direct|relay) ;; *) echo "bench-peers: unknown target $t" >&2; exit 2 ;; esac
done
if [[ ",$targets," == *",zgix-base,"* ]] && [ ! -x "$zgix_base_bin" ]; then
    echo "bench-peers: target zgix-base needs --baseline-bin PATH (an executable zgix)" >&2; exit 2
fi

root="$(cd "$(dirname "$0")/.." && pwd)"
has() { [[ ",$targets," == *",$1,"* ]]; }

# --- packages ------------------------------------------------------------
missing=()
command -v wrk >/dev/null || missing+=(wrk)
# The fixed-rate phase reads zgix-bench load's JSON report with python3.
if [ "$fixed_rate" -gt 0 ]; then command -v python3 >/dev/null || missing+=(python3); fi
if [ "$syscalls" = 1 ]; then command -v strace >/dev/null || missing+=(strace); fi
if has nginx; then command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx); fi
if has haproxy || has haproxy-splice || has relay; then command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || missing+=(haproxy); fi
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$install" = 0 ]; then
        echo "bench-peers: missing ${missing[*]} and --no-install given" >&2; exit 1
    fi
    if [ "$(id -u)" != 0 ]; then
        echo "bench-peers: missing ${missing[*]}; run as root to install them, or install them yourself" >&2
        exit 1
    fi
    echo "bench-peers: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q "${missing[@]}"
    # Debian starts the packaged services; they are not the ones measured here.
    for svc in nginx haproxy; do
        if [[ " ${missing[*]} " == *" $svc "* ]] && command -v systemctl >/dev/null; then
            systemctl stop "$svc" 2>/dev/null || true
        fi
    done
fi
PATH="$PATH:/usr/sbin:/sbin"

# --- binaries ------------------------------------------------------------
target_dir="${CARGO_TARGET_DIR:-$root/target}"
if [ "$build" = 1 ]; then
    pkgs=(-p zgix-bench)
    { has zgix || has zgix-epoll; } && pkgs+=(-p zgix)
    (cd "$root" && cargo build --release -q "${pkgs[@]}")
fi
bench_bin="${ZGIX_BENCH_BIN:-$target_dir/release/zgix-bench}"
zgix_bin="${ZGIX_BIN:-$target_dir/release/zgix}"
[ -x "$bench_bin" ] || { echo "bench-peers: no zgix-bench at $bench_bin" >&2; exit 1; }
if { has zgix || has zgix-epoll; } && [ ! -x "$zgix_bin" ]; then
    echo "bench-peers: no zgix at $zgix_bin (build it or leave zgix out of --targets)" >&2; exit 1
fi
# io_uring needs locked memory (zgix and the origin are glommio programs).
ulimit -l unlimited 2>/dev/null || ulimit -l "$(ulimit -Hl)" 2>/dev/null || true
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# --- CPU plan ------------------------------------------------------------
ncpu="$(nproc)"
proxy_cpu=0
origin_cpu=$(( ncpu > 1 ? 1 : 0 ))
wrk_cpu=$(( ncpu > 2 ? 2 : ncpu - 1 ))
echo "bench-peers: $ncpu CPUs; proxies on CPU $proxy_cpu, origin on CPU $origin_cpu, wrk on CPU $wrk_cpu"

# --- processes and cleanup -----------------------------------------------
bench_name=bench-peers
# shellcheck source=lib/bench-common.sh
. "$root/scripts/lib/bench-common.sh"
# shellcheck source=lib/bench-proxies.sh
. "$root/scripts/lib/bench-proxies.sh"
bench_ports "$base_port"
check_ports_free bench-peers

# Admission settings, the same intent in all three proxies: a per-client rate
# limit far above what one box can send (so it is evaluated but never refuses),
# a per-client connection cap above --connections, and a deny list.
rate_limit=10000000
conn_limit=$(( connections * 4 > 1024 ? connections * 4 : 1024 ))

start_origin

# The wrk script of --upload-bytes: every request a POST of that many bytes.
wrk_script=()
if [ "$upload_bytes" -gt 0 ]; then
    wrk_script=(-s "$root/scripts/wrk/upload.lua")
    export ZGIX_UPLOAD_BYTES="$upload_bytes"
    if [ "$upload_chunk" -gt 0 ]; then
        wrk_script=(-s "$root/scripts/wrk/upload-chunked.lua")
        export ZGIX_UPLOAD_CHUNK_BYTES="$upload_chunk"
    fi
    # nginx refuses bodies over 1 MiB and spools them to disk before
    # forwarding by default; the others stream them.
    nginx_body_opts="client_max_body_size 0; proxy_request_buffering off;"
fi
# Body bytes a request moves through the proxy (both directions), for MB/s
# and CPU per MB.
payload=$(( body_bytes + upload_bytes ))

# cpu_ticks CPU: "busy total" jiffies of one CPU from /proc/stat.
cpu_ticks() {
    awk -v c="cpu$1" '$1 == c { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t }' /proc/stat
}

# busy_pct BEFORE AFTER: busy share of the CPU between two cpu_ticks samples.
busy_pct() {
    awk -v a="$1" -v b="$2" 'BEGIN { split(a, x, " "); split(b, y, " ")
        dt = y[2] - x[2]; printf "%.0f", (dt > 0 ? 100 * (y[1] - x[1]) / dt : 0) }'
}

# stalled TARGET WHY: a run against TARGET measured a stall, not a speed:
# says whether the origin itself still answers (which of the two stalled)
# and exits, since every later figure would rest on a stalled origin or
# proxy.
stalled() {
    local t="$1"
    echo "bench-peers: $t stalled: $2; no figures reported" >&2
    if [ "$t" != direct ]; then
        if answers direct; then
            echo "bench-peers: the origin still answers directly: $t is what stalled" >&2
        else
            echo "bench-peers: the origin does not answer directly either: the origin stalled; its log:" >&2
            tail -20 "$tmp/origin.log" >&2 || true
        fi
    fi
    exit 1
}

# answers TARGET: true when TARGET answers one request within 2 s.
answers() { curl -s -o /dev/null --max-time 2 "http://127.0.0.1:$(port_of "$1")/"; }

# wrk_checked TARGET OUTPUT: ends the benchmark if the wrk run against
# TARGET measured a stall. wrk does not count a request still unanswered when
# the run ends, so a target that stalled in the run's last seconds is asked
# once more.
wrk_checked() {
    local why
    if why="$(wrk_stalled "$connections" "$2")"; then echo "$2" >&2; stalled "$1" "$why"; fi
    answers "$1" || stalled "$1" "no answer within 2 s to one request after a run of $(awk '/ requests in / {print $1}' <<<"$2") requests"
}

# load_failed TARGET: a zgix-bench load run failed (its stderr in
# $tmp/load.err): a stall (zgix-bench load names it) ends the benchmark.
load_failed() {
    local why
    why="$(grep -o ' stalled: .*' "$tmp/load.err" | head -1)" || true
    [ -z "$why" ] || stalled "$1" "${why# stalled: }"
    echo "bench-peers: zgix-bench load failed against $1:" >&2
    tail -3 "$tmp/load.err" >&2 || true
}

# The proxy targets (everything but direct), in --targets order.
proxies=()
for t in "${target_list[@]}"; do [ "$t" = direct ] || proxies+=("$t"); done

# run_wrk TARGET MODE SECONDS [record]: one wrk run; records req/s, latency,
# errors, both cores' busy share and the target's CPU time per request, user
# and system apart (all its threads, /proc/PID/stat).
run_wrk() {
    local t="$1" mode="$2" secs="$3" out p0 o0 c0="" c1=""
    p0="$(cpu_ticks "$proxy_cpu")" o0="$(cpu_ticks "$origin_cpu")"
    [ "$t" = direct ] || c0="$(cpu_of "$t")"
    out="$(taskset -c "$wrk_cpu" wrk -t1 -c"$connections" -d"${secs}s" --latency "${wrk_script[@]}" \
        "http://127.0.0.1:$(port_of "$t")/" 2>&1)" || { echo "$out" >&2; return 1; }
    [ "$t" = direct ] || c1="$(cpu_of "$t")"
    wrk_checked "$t" "$out"
    [ "${4:-}" = record ] || return 0
    local rps p50 p99 bad pcpu ocpu n us="- -"
    pcpu="$(busy_pct "$p0" "$(cpu_ticks "$proxy_cpu")")"
    ocpu="$(busy_pct "$o0" "$(cpu_ticks "$origin_cpu")")"
    rps="$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")"
    n="$(awk '/requests in/ {print $1}' <<<"$out")"
    p50="$(to_us "$(awk '$1 == "50%" {print $2}' <<<"$out")")"
    p99="$(to_us "$(awk '$1 == "99%" {print $2}' <<<"$out")")"
    bad="$(awk '/Non-2xx/ {n += $NF} /Socket errors/ {gsub(/,/, ""); n += $4 + $6 + $8 + $10} END {print n + 0}' <<<"$out")"
    [ "$t" = direct ] || us="$(cpu_us_per_req "$c0" "$c1" "$n")"
    echo "$t $rps $p50 $p99 $bad $pcpu $ocpu ${round:-0} $us" |
        awk '{print $0, ($9 == "-" ? "-" : sprintf("%.2f", $9 + $10))}' >>"$tmp/results-$mode"
    tail -1 "$tmp/results-$mode" | awk -v pc="$proxy_cpu" -v oc="$origin_cpu" '{
        printf "  %-10s %8.0f req/s  p50 %6s us  p99 %6s us  errors/non-2xx %s  CPU%s %3s%%  CPU%s %3s%%  proxy us/req user %s sys %s\n",
            $1, $2, $3, $4, $5, pc, $6, oc, $7, $9, $10 }'
}

# check TARGET PATH WANT: one request, warn if the status is not WANT.
check() {
    local got
    got="$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 --path-as-is "http://127.0.0.1:$(port_of "$1")$2")" || true
    [ "$got" = "$3" ] || echo "bench-peers: warning: $1 answered $2 with $got, expected $3" >&2
}

# col FILE TARGET COLUMN: median of one column of a target's rows.
col() { awk -v t="$2" -v c="$3" '$1 == t && $c != "-" {print $c}' "$1" | median; }

# per_round FILE VALUE_COL ROUND_COL A B WHAT: the median (min, max) over the
# rounds of A's value ÷ B's value in the same round. The host's speed drifts
# between rounds; targets within one round ran seconds apart, so per-round
# ratios are steadier than ratios of medians. Each is taken against one
# target throughout (not the best of two per round, which would favour
# whichever peer had the luckier seconds).
per_round() {
    awk -v c="$2" -v rc="$3" -v a="$4" -v b="$5" -v what="$6" '
        $1 == a && $c != "-" { x[$rc] = $c } $1 == b && $c != "-" { y[$rc] = $c }
        END { n = 0; for (r in x) if (y[r] > 0) v[++n] = x[r] / y[r]
              if (n == 0) exit
              for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
              m = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
              printf "%s ÷ %s'"'"'s in the same round: median %.2f (min %.2f, max %.2f, %d rounds)\n", what, b, m, v[1], v[n], n }' "$1"
}

# better_peer FILE COL: nginx or haproxy, whichever has the lower median of COL.
better_peer() {
    local best="" bv="" t v
    for t in nginx haproxy haproxy-splice; do
        has "$t" || continue
        v="$(col "$1" "$t" "$2")"
        if [ -z "$best" ] || awk -v a="$v" -v b="$bv" 'BEGIN {exit !(a < b)}'; then best=$t bv=$v; fi
    done
    echo "$best"
}

# goals FILE P99_COL USR_COL SYS_COL TOT_COL ROUND_COL: zgix's CPU per request
# against the better peer's (issue 10: at most 0.8× its total, at a p99 no worse).
goals() {
    local f="$1" peer t
    has zgix || return 0
    peer="$(better_peer "$f" "$5")"
    [ -n "$peer" ] || return 0
    for t in zgix zgix-epoll zgix-base; do
        has "$t" || continue
        awk -v t="$t" -v p="$peer" -v tu="$(col "$f" "$t" "$3")" -v ts="$(col "$f" "$t" "$4")" \
            -v tt="$(col "$f" "$t" "$5")" -v t99="$(col "$f" "$t" "$2")" \
            -v pu="$(col "$f" "$peer" "$3")" -v ps="$(col "$f" "$peer" "$4")" \
            -v pt="$(col "$f" "$peer" "$5")" -v p99="$(col "$f" "$peer" "$2")" 'BEGIN {
            printf "%s CPU/request ÷ the better peer'"'"'s (%s): %.2f (%s %.2f us = %.2f user + %.2f sys; %s %.2f = %.2f + %.2f); p99 %s %.0f us, %s %.0f us (%.2f)\n",
                t, p, (pt > 0 ? tt / pt : 0), t, tt, tu, ts, p, pt, pu, ps, t, t99, p, p99, (p99 > 0 ? t99 / p99 : 0) }'
        per_round "$f" "$5" "$6" "$t" "$peer" "$t CPU/request"
        if [ "$bodies" = 1 ]; then
            awk -v t="$t" -v p="$peer" -v tt="$(col "$f" "$t" "$5")" -v pt="$(col "$f" "$peer" "$5")" -v b="$payload" 'BEGIN {
                printf "%s CPU per MB: %.1f us, %s %.1f us (%.2f; %d body bytes a request)\n",
                    t, tt * 1e6 / b, p, pt * 1e6 / b, (pt > 0 ? tt / pt : 0), b }'
        fi
    done
}

report() { # MODE
    local mode="$1" f="$tmp/results-$1" t zr z50 z99 zt
    echo
    echo "admission $mode: medians over $rounds rounds of ${duration}s, wrk -t1 -c$connections (latency in us)"
    echo "(CPU$proxy_cpu: the proxies' core, CPU$origin_cpu: origin and wrk; busy share of each, median;"
    echo " user/sys/cpu: the proxy process's CPU microseconds per request from /proc/PID/stat,"
    echo " zgix with limits.busy_poll_us $busy_poll)"
    [ "$bodies" = 1 ] && echo "(MB/s: $payload body bytes a request × req/s; us/MB: the proxy's cpu per 10^6 body bytes)"
    printf '%-14s %9s %7s %7s %8s %8s %8s %7s %5s %5s %7s %7s %7s %8s' target req/s p50 p99 "rps/zgix" "p50/zgix" \
        "p99/zgix" errors "CPU$proxy_cpu%" "CPU$origin_cpu%" user sys cpu "cpu/zgix"
    [ "$bodies" = 1 ] && printf ' %8s %8s %8s %8s' MB/s "usr/MB" "sys/MB" "cpu/MB"
    echo
    zr="$(col "$f" zgix 2)" z50="$(col "$f" zgix 3)" z99="$(col "$f" zgix 4)" zt="$(col "$f" zgix 11)"
    for t in zgix zgix-epoll zgix-base nginx haproxy haproxy-splice relay direct; do
        has "$t" || continue
        awk -v t="$t" -v bodies="$bodies" -v b="$payload" -v r="$(col "$f" "$t" 2)" -v p50="$(col "$f" "$t" 3)" -v p99="$(col "$f" "$t" 4)" \
            -v e="$(awk -v t="$t" '$1 == t {n += $5} END {print n + 0}' "$f")" \
            -v pc="$(col "$f" "$t" 6)" -v oc="$(col "$f" "$t" 7)" \
            -v u="$(col "$f" "$t" 9)" -v s="$(col "$f" "$t" 10)" -v tot="$(col "$f" "$t" 11)" \
            -v zr="$zr" -v z50="$z50" -v z99="$z99" -v zt="$zt" 'BEGIN {
            d = (t == "direct")
            printf "%-14s %9.0f %7.0f %7.0f %8s %8s %8s %7d %5.0f %5.0f %7s %7s %7s %8s", t, r, p50, p99,
                (zr > 0 ? sprintf("%.2f", r / zr) : "-"),
                (z50 > 0 ? sprintf("%.2f", p50 / z50) : "-"),
                (z99 > 0 ? sprintf("%.2f", p99 / z99) : "-"), e, pc, oc,
                (d ? "-" : sprintf("%.2f", u)), (d ? "-" : sprintf("%.2f", s)), (d ? "-" : sprintf("%.2f", tot)),
                (d || zt <= 0 ? "-" : sprintf("%.2f", tot / zt))
            if (bodies) printf " %8.0f %8s %8s %8s", r * b / 1e6, (d ? "-" : sprintf("%.1f", u * 1e6 / b)),
                (d ? "-" : sprintf("%.1f", s * 1e6 / b)), (d ? "-" : sprintf("%.1f", tot * 1e6 / b))
            printf "\n" }'
    done
    if has zgix; then
        for t in zgix-epoll zgix-base nginx haproxy haproxy-splice relay direct; do
            has "$t" && per_round "$f" 2 8 zgix "$t" "zgix req/s"
        done
    fi
    goals "$f" 4 9 10 11 8
}

# run_rate TARGET MODE: one open-loop run at --fixed-rate; records the proxy
# core's busy share, its busy time per request and the proxy process's user
# and system CPU per request.
run_rate() {
    local t="$1" mode="$2" out p0 pcpu c0 c1
    p0="$(cpu_ticks "$proxy_cpu")" c0="$(cpu_of "$t")"
    out="$("$bench_bin" load --url "http://127.0.0.1:$(port_of "$t")/" --connections "$connections" \
        --duration "$duration" --rate "$fixed_rate" --cpus "$wrk_cpu" --json 2>"$tmp/load.err")" ||
        { load_failed "$t"; return 1; }
    c1="$(cpu_of "$t")"
    pcpu="$(busy_pct "$p0" "$(cpu_ticks "$proxy_cpu")")"
    python3 -c '
import json, sys
r = json.loads(sys.argv[1]); t, pc, rnd, hz = sys.argv[2], float(sys.argv[3]), sys.argv[4], float(sys.argv[7])
c0, c1 = [float(x) for x in sys.argv[5].split()], [float(x) for x in sys.argv[6].split()]
n = max(r["requests"], 1)
ok = r["status"].get("200", 0); bad = r["requests"] - ok + sum(r["errors"].values())
us = pc / 100 * r["duration_s"] * 1e6 / n
usr, sys_ = (c1[0] - c0[0]) * 1e6 / hz / n, (c1[1] - c0[1]) * 1e6 / hz / n
print(t, round(r["requests_per_sec"]), r["latency_us"]["p50"], r["latency_us"]["p99"], bad, round(pc),
      "%.2f %.2f %.2f %.2f" % (us, usr, sys_, usr + sys_), rnd)
' "$out" "$t" "$pcpu" "${round:-0}" "$c0" "$c1" "$clk_tck" >>"$tmp/rate-$mode"
    tail -1 "$tmp/rate-$mode" | awk '{printf "  %-10s %8.0f req/s  p50 %6s us  p99 %6s us  errors/non-2xx %s  CPU'"$proxy_cpu"' %3s%% (%.2f us/req)  proxy us/req user %s sys %s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9}'
}

report_rate() { # MODE
    local mode="$1" f="$tmp/rate-$1" t zt
    echo
    echo "admission $mode, open loop at $fixed_rate req/s: medians over $rate_rounds rounds of ${duration}s,"
    echo "$connections connections (zgix-bench load, latency from the scheduled send time, in us);"
    echo "core us/req = the proxy core's busy time ÷ requests; user/sys/cpu = the proxy process's"
    echo "CPU microseconds per request from /proc/PID/stat (zgix with busy polling off)"
    printf '%-10s %9s %7s %7s %7s %5s %8s %7s %7s %7s %8s\n' target req/s p50 p99 errors "CPU$proxy_cpu%" "core/req" \
        user sys cpu "cpu/zgix"
    zt="$(col "$f" zgix 10)"
    for t in "${proxies[@]}"; do
        awk -v t="$t" -v r="$(col "$f" "$t" 2)" -v p50="$(col "$f" "$t" 3)" -v p99="$(col "$f" "$t" 4)" \
            -v e="$(awk -v t="$t" '$1 == t {n += $5} END {print n + 0}' "$f")" \
            -v pc="$(col "$f" "$t" 6)" -v us="$(col "$f" "$t" 7)" -v u="$(col "$f" "$t" 8)" \
            -v s="$(col "$f" "$t" 9)" -v tot="$(col "$f" "$t" 10)" -v zt="$zt" 'BEGIN {
            printf "%-10s %9.0f %7.0f %7.0f %7d %5.0f %8.2f %7.2f %7.2f %7.2f %8s\n", t, r, p50, p99, e, pc, us,
                u, s, tot, (zt > 0 ? sprintf("%.2f", tot / zt) : "-") }'
    done
    goals "$f" 4 8 9 10 11
}

# wait_traced TARGET: up to 5 s for strace to have attached every thread.
wait_traced() {
    local i p st all
    for i in $(seq 100); do
        all=1
        for p in $(work_pids "$1"); do
            for st in /proc/"$p"/task/*/status; do
                awk '/^TracerPid:/ {exit !($2 > 0)}' "$st" 2>/dev/null || all=0
            done
        done
        [ "$all" = 1 ] && return 0
        sleep 0.05
    done
    return 1
}

# run_syscalls TARGET MODE: strace -c -f on the target's serving processes
# over one wrk run; records each syscall's count and the requests served.
run_syscalls() {
    local t="$1" mode="$2" f="$tmp/strace-$1-$2" args=() p spid out n
    for p in $(work_pids "$t"); do args+=(-p "$p"); done
    taskset -c "$wrk_cpu" strace -c -f -o "$f" "${args[@]}" 2>"$tmp/strace.err" &
    spid=$!; pids+=("$spid")
    wait_traced "$t" || { echo "bench-peers: strace did not attach to $t:" >&2; cat "$tmp/strace.err" >&2; return 1; }
    out="$(taskset -c "$wrk_cpu" wrk -t1 -c"$connections" -d"${duration}s" "http://127.0.0.1:$(port_of "$t")/" 2>&1)" ||
        { echo "$out" >&2; return 1; }
    stop_pid "$spid" # strace detaches on TERM and writes its summary
    wrk_checked "$t" "$out"
    n="$(awk '/requests in/ {print $1}' <<<"$out")"
    awk -v t="$t" -v r="${round:-0}" -v n="$n" '/^-----/ {rows = 1; next}
        rows && NF >= 5 && $4 ~ /^[0-9]+$/ {print t, r, n, $NF, $4}' "$f" >>"$tmp/sys-$mode"
    awk -v t="$t" -v r="${round:-0}" '$1 == t && $2 == r && $4 == "total" {
        printf "  %-10s %8d requests under strace  %6.2f syscalls per request\n", t, $3, $5 / ($3 > 0 ? $3 : 1) }' "$tmp/sys-$mode"
}

# The syscalls perf counts one by one (besides the total): the data path of
# each proxy and what a loop or an allocator adds.
sys_events="$(printf 'syscalls:sys_enter_%s,' io_uring_enter recvfrom sendto writev readv read write \
    epoll_wait epoll_pwait epoll_ctl getsockopt setsockopt accept4 connect close futex mmap munmap madvise \
    brk sched_yield clock_gettime | sed 's/,$//')"

# run_sysperf TARGET MODE KIND: syscalls per request counted by the
# raw_syscalls:sys_enter tracepoint (perf stat -p on the serving processes),
# which does not stop the process at every call as strace does, over one run
# of KIND: wrk (closed loop, saturation) or rate (--fixed-rate open loop).
run_sysperf() {
    local t="$1" mode="$2" kind="$3" f="$tmp/perf-$1-$2" pp ppid out n
    pp="$(work_pids "$t" | paste -sd,)"
    # perf counts for as long as its command runs: the load run and a little
    # on either side (a background perf would ignore the SIGINT that stops it).
    perf stat -e "raw_syscalls:sys_enter,$sys_events" -x, -o "$f" -p "$pp" -- sleep "$((duration + 1)).6" 2>"$tmp/perf.err" &
    ppid=$!; pids+=("$ppid")
    sleep 0.3
    if [ "$kind" = wrk ]; then
        out="$(taskset -c "$wrk_cpu" wrk -t1 -c"$connections" -d"${duration}s" "http://127.0.0.1:$(port_of "$t")/" 2>&1)" ||
            { echo "$out" >&2; return 1; }
        wrk_checked "$t" "$out"
        n="$(awk '/requests in/ {print $1}' <<<"$out")"
    else
        out="$("$bench_bin" load --url "http://127.0.0.1:$(port_of "$t")/" --connections "$connections" \
            --duration "$duration" --rate "$fixed_rate" --cpus "$wrk_cpu" --json 2>"$tmp/load.err")" ||
            { load_failed "$t"; return 1; }
        n="$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["requests"])' "$out")"
    fi
    wait "$ppid" || { echo "bench-peers: perf stat failed on $t:" >&2; cat "$tmp/perf.err" >&2; }
    stop_pid "$ppid"
    awk -F, -v t="$t" -v k="$kind" -v r="${round:-0}" -v n="$n" '$1 ~ /^[0-9]+$/ {
            name = $3; if (name == "raw_syscalls:sys_enter") name = "total"; else sub(/^syscalls:sys_enter_/, "", name)
            c[name] += $1 }
        END {for (x in c) print t, k, r, n, x, c[x]}' "$f" >>"$tmp/sysperf-$mode"
    awk -v t="$t" -v k="$kind" -v r="${round:-0}" '$1 == t && $2 == k && $3 == r && $5 == "total" {
        printf "  %-10s %8d requests (%s)  %6.2f syscalls per request (perf)\n", $1, $4, $2, $6 / ($4 > 0 ? $4 : 1)}' "$tmp/sysperf-$mode"
}

report_syscalls() { # MODE
    local mode="$1" f="$tmp/sys-$1" t
    echo
    echo "admission $mode, syscalls per request: strace -c -f -p over wrk -t1 -c$connections for ${duration}s,"
    echo "$syscall_rounds round(s); total = median over the rounds; the breakdown pools the rounds"
    echo "(strace slows the proxy several times over, so only counts per request mean anything)"
    printf '%-10s %10s %9s  %s\n' target requests total "per request, by syscall (largest first)"
    for t in "${proxies[@]}"; do
        awk -v t="$t" '$1 == t && $4 == "total" {print $5 / ($3 > 0 ? $3 : 1)}' "$f" | median |
            awk -v t="$t" -v n="$(awk -v t="$t" '$1 == t && $4 == "total" {n += $3} END {print n + 0}' "$f")" \
                -v parts="$(awk -v t="$t" '$1 == t && $4 != "total" {c[$4] += $5; if (!(($2) in seen)) {seen[$2] = 1; n += $3}}
                    END {for (s in c) printf "%s %.3f\n", s, c[s] / (n > 0 ? n : 1)}' "$f" | sort -k2,2nr |
                    awk '$2 >= 0.005 {printf "%s%s %.2f", (NR > 1 ? ", " : ""), $1, $2}')" \
                '{printf "%-10s %10d %9.2f  %s\n", t, n, $1, parts}'
    done
    [ -s "$tmp/sysperf-$mode" ] || return 0
    echo
    echo "admission $mode, syscalls per request counted by perf (raw_syscalls:sys_enter, perf stat -p on"
    echo "the serving processes, every thread), median of $syscall_rounds round(s) of ${duration}s, $connections connections:"
    echo "at saturation (wrk) and at $fixed_rate req/s open loop (zgix-bench load); the breakdown pools the"
    echo "rounds and counts only the syscalls named in \$sys_events (the total counts every one)"
    printf '%-10s %-4s %10s %7s  %s\n' target load requests total "per request, by syscall (largest first)"
    for t in "${proxies[@]}"; do
        for k in wrk rate; do
            awk -v t="$t" -v k="$k" '$1 == t && $2 == k && $5 == "total" {print $6 / ($4 > 0 ? $4 : 1)}' "$tmp/sysperf-$mode" |
                median | awk -v t="$t" -v k="$k" \
                -v n="$(awk -v t="$t" -v k="$k" '$1 == t && $2 == k && $5 == "total" {n += $4} END {print n + 0}' "$tmp/sysperf-$mode")" \
                -v parts="$(awk -v t="$t" -v k="$k" '$1 == t && $2 == k && $5 != "total" {c[$5] += $6}
                    $1 == t && $2 == k && $5 == "total" {n += $4}
                    END {for (s in c) printf "%s %.3f\n", s, c[s] / (n > 0 ? n : 1)}' "$tmp/sysperf-$mode" | sort -k2,2nr |
                    awk '$2 >= 0.005 {printf "%s%s %.2f", (NR > 1 ? ", " : ""), $1, $2}')" \
                '$1 != "" && n > 0 {printf "%-10s %-4s %10d %7.2f  %s\n", t, k, n, $1, parts}'
        done
    done
}

quiet() { wait_quiet "$quiet_wait" "$proxy_cpu" "$origin_cpu"; }

IFS=, read -r -a mode_list <<<"$modes"
for mode in "${mode_list[@]}"; do
    case "$mode" in off|on) ;; *) echo "bench-peers: unknown mode $mode" >&2; exit 2 ;; esac
    echo
    echo "== admission $mode =="
    : >"$tmp/results-$mode"
    for t in "${proxies[@]}"; do start_target "$t" "$mode" "$busy_poll"; done
    for t in "${target_list[@]}"; do
        check "$t" / 200
        if [ "$mode" = on ] && [ "$t" != direct ] && [ "$t" != relay ]; then
            check "$t" "/download?file=../../etc/passwd" 403
        fi
        run_wrk "$t" "$mode" 1 # warm-up: connection pools, caches
    done
    for r in $(seq "$rounds"); do
        echo "round $r/$rounds"
        round=$r
        for t in "${target_list[@]}"; do quiet; run_wrk "$t" "$mode" "$duration" record; done
    done
    report "$mode"
    # The fixed-rate and syscall parts run zgix with busy polling off.
    if [ "$busy_poll" != 0 ] && { [ "$fixed_rate" -gt 0 ] || [ "$syscalls" = 1 ]; }; then
        for t in zgix zgix-epoll zgix-base; do
            if has "$t"; then stop_target "$t"; start_target "$t" "$mode" 0; fi
        done
    fi
    if [ "$fixed_rate" -gt 0 ] && [ ${#proxies[@]} -gt 0 ]; then
        echo
        echo "-- admission $mode: fixed rate $fixed_rate req/s --"
        : >"$tmp/rate-$mode"
        for r in $(seq "$rate_rounds"); do
            echo "rate round $r/$rate_rounds"
            round=$r
            for t in "${proxies[@]}"; do quiet; run_rate "$t" "$mode"; done
        done
        report_rate "$mode"
    fi
    if [ "$syscalls" = 1 ] && [ ${#proxies[@]} -gt 0 ]; then
        echo
        echo "-- admission $mode: syscalls per request (strace) --"
        : >"$tmp/sys-$mode"
        : >"$tmp/sysperf-$mode"
        for r in $(seq "$syscall_rounds"); do
            echo "syscall round $r/$syscall_rounds"
            round=$r
            for t in "${proxies[@]}"; do quiet; run_syscalls "$t" "$mode"; done
            if command -v perf >/dev/null; then
                for t in "${proxies[@]}"; do quiet; run_sysperf "$t" "$mode" wrk; done
                if [ "$fixed_rate" -gt 0 ]; then
                    for t in "${proxies[@]}"; do quiet; run_sysperf "$t" "$mode" rate; done
                fi
            fi
        done
        report_syscalls "$mode"
    fi
    for t in "${proxies[@]}"; do stop_target "$t"; done
done
if [ "$quiet_wait" -gt 0 ]; then
    echo
    echo "waited ${quiet_waited}s in all for quiet CPUs before the measured runs (--quiet-wait $quiet_wait)"
fi
