# shellcheck shell=bash
# The targets of the side-by-side benchmarks (bench-peers.sh, bench-conns.sh),
# configured alike in every script that measures them: one zgix-bench origin,
# zgix on its io_uring driver and on its epoll driver, nginx (1 worker),
# HAProxy (1 thread) and a bare TCP relay (HAProxy in TCP mode), all on
# 127.0.0.1 with the proxies pinned to $proxy_cpu.
#
# Source it after bench-common.sh, with these set: $proxy_cpu, $origin_cpu,
# $bench_bin, $zgix_bin, $body_bytes, $rate_limit, $conn_limit (admission "on"),
# and call bench_ports BASE. Each start_* records the PID in tpid[TARGET].

declare -A tpid=()

# bench_ports BASE: the ports of every target (BASE..BASE+11).
bench_ports() {
    origin_port=$1 zgix_port=$(($1 + 1)) nginx_port=$(($1 + 2)) haproxy_port=$(($1 + 3))
    relay_port=$(($1 + 4)) zgix_epoll_port=$(($1 + 5)) admin_epoll_port=$(($1 + 8)) admin_port=$(($1 + 9))
    haproxy_splice_port=$(($1 + 6)) zgix_base_port=$(($1 + 7)) admin_base_port=$(($1 + 10))
    nginx_mask=$(printf '%x' $(( 1 << proxy_cpu )))
    # HAProxy refuses to start when maxconn needs more descriptors than it may
    # open (two per proxied connection plus its own).
    local fd_limit
    fd_limit="$(ulimit -n)"
    [ "$fd_limit" = unlimited ] && fd_limit=1048576
    haproxy_maxconn=$(( fd_limit / 2 - 100 )) haproxy_limits=""
    # zgix's own cap (limits.max_connections) defaults to half the descriptor
    # limit as well; bench_capacity raises both.
    zgix_limits=""
}

# bench_capacity N: let every proxy hold N client connections whose
# upstream side stays small (idle and windowed kept-alive connections need
# one descriptor each plus the upstream pool, not two): zgix's
# limits.max_connections and HAProxy's maxconn become N; HAProxy then runs
# with `no strict-limits`, since it sizes for two descriptors per connection
# and would otherwise refuse to start under this descriptor limit.
bench_capacity() {
    zgix_limits=", \"max_connections\": $1"
    if [ "$1" -gt "$haproxy_maxconn" ]; then
        haproxy_maxconn=$1 haproxy_limits="no strict-limits"
    fi
}

# check_ports_free NAME: exits when one of the ports is taken.
check_ports_free() {
    local p
    for p in $origin_port $zgix_port $nginx_port $haproxy_port $relay_port $zgix_epoll_port \
        $admin_epoll_port $admin_port $haproxy_splice_port $zgix_base_port $admin_base_port; do
        if ss -ltnH "( sport = :$p )" 2>/dev/null | grep -q .; then
            echo "$1: port $p is in use; pick another --base-port" >&2; exit 1
        fi
    done
}

port_of() {
    case "$1" in
        zgix) echo "$zgix_port" ;; zgix-epoll) echo "$zgix_epoll_port" ;;
        nginx) echo "$nginx_port" ;; haproxy) echo "$haproxy_port" ;;
        direct) echo "$origin_port" ;; relay) echo "$relay_port" ;;
        haproxy-splice) echo "$haproxy_splice_port" ;; zgix-base) echo "$zgix_base_port" ;;
    esac
}

start_origin() {
    taskset -c "$origin_cpu" "$bench_bin" origin --bind "127.0.0.1:$origin_port" \
        --cpus "$origin_cpu" --body-bytes "$body_bytes" \
        ${origin_chunked:+--chunked --chunk-bytes "${chunk_bytes:-0}"} >"$tmp/origin.log" 2>&1 &
    pids+=($!); tpid[direct]=$!
    wait_http "127.0.0.1:$origin_port" origin "$tmp/origin.log"
}

# start_zgix TARGET MODE BUSY_POLL_US: TARGET zgix (io_uring driver),
# zgix-epoll (the same config on the epoll driver) or zgix-base (the uring
# config on the binary $zgix_base_bin, a baseline build); MODE off|on (admission).
start_zgix() {
    local t="$1" mode="$2" http='"cluster": "origin"' driver=uring port=$zgix_port admin=$admin_port
    local bin="$zgix_bin"
    if [ "$t" = zgix-epoll ]; then driver=epoll port=$zgix_epoll_port admin=$admin_epoll_port; fi
    if [ "$t" = zgix-base ]; then port=$zgix_base_port admin=$admin_base_port bin="$zgix_base_bin"; fi
    if [ "$mode" = on ]; then
        http+=", \"rate_limit\": {\"requests\": $rate_limit, \"window_ms\": 1000, \"burst\": $rate_limit}"
        http+=", \"conn_limit\": {\"max\": $conn_limit}"
        http+=', "waf": {"deny": ["union select", "<script", "../"], "status": 403}'
    fi
    cat >"$tmp/$t-$mode.json" <<JSON
{
  "cpus": [$proxy_cpu],
  "io": {"driver": "$driver"},
  "limits": {"busy_poll_us": $3$zgix_limits},
  "admin": {"bind": "127.0.0.1:$admin"},
  "listeners": [{"bind": "127.0.0.1:$port", "http": {$http}}],
  "clusters": {"origin": {"endpoints": ["127.0.0.1:$origin_port"], "lb": "round_robin"}}
}
JSON
    "$bin" --config "$tmp/$t-$mode.json" >"$tmp/$t.log" 2>&1 &
    pids+=($!); tpid[$t]=$!
    wait_http "127.0.0.1:$port" "$t" "$tmp/$t.log"
    # A refused ring falls back to epoll with one log line: then the "uring"
    # figures would be epoll's. The start-up line names the driver in use.
    local _i
    for _i in $(seq 20); do grep -q "ready (" "$tmp/$t.log" && break; sleep 0.1; done
    if ! grep -q "ready (.*, $driver)" "$tmp/$t.log"; then
        echo "$bench_name: warning: $t did not report the $driver driver:" >&2
        cat "$tmp/$t.log" >&2
    fi
}

start_nginx() { # MODE
    local d="$tmp/nginx-$1" zones="" limits=""
    mkdir -p "$d/logs"
    if [ "$1" = on ]; then
        zones="limit_req_zone \$binary_remote_addr zone=rl:10m rate=${rate_limit}r/s;
    limit_conn_zone \$binary_remote_addr zone=cl:10m;"
        limits="limit_req zone=rl burst=$rate_limit nodelay;
        limit_conn cl $conn_limit;
        if (\$request_uri ~* \"(union(%20|\\+| )select|<script|%3Cscript|\\.\\./)\") { return 403; }"
    fi
    cat >"$d/nginx.conf" <<CONF
daemon off;
worker_processes 1;
worker_cpu_affinity $nginx_mask;
pid $d/nginx.pid;
error_log $d/logs/error.log warn;
events { worker_connections 16384; }
http {
    access_log off;
    $zones
    upstream origin {
        server 127.0.0.1:$origin_port;
        keepalive 256;
    }
    server {
        listen 127.0.0.1:$nginx_port;
        $limits
        ${nginx_body_opts:-}
        location / {
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
CONF
    nginx -p "$d" -c "$d/nginx.conf" -e "$d/logs/error.log" >"$d/logs/stderr.log" 2>&1 &
    pids+=($!); tpid[nginx]=$!
    wait_http "127.0.0.1:$nginx_port" nginx "$d/logs/error.log"
}

# start_haproxy MODE [splice]: HAProxy in HTTP mode; with "splice" as the
# target haproxy-splice, which relays bodies with `option splice-auto`
# (splice(2) through a pipe when the buffer alone would not hold the body).
start_haproxy() { # MODE [splice]
    local f="$tmp/haproxy-$1${2:+-$2}.cfg" rules="" t=haproxy port=$haproxy_port opts="" maxconn=$haproxy_maxconn pipes=""
    if [ "${2:-}" = splice ]; then
        # Each pipe is two descriptors: a fixed pool, and room for it under the limit.
        t=haproxy-splice port=$haproxy_splice_port opts="option splice-auto"
        pipes="maxpipes 256" maxconn=$(( haproxy_maxconn > 1024 ? haproxy_maxconn - 600 : haproxy_maxconn ))
    fi
    if [ "$1" = on ]; then
        rules="stick-table type ip size 1m expire 30s store http_req_rate(1s),conn_cur
    tcp-request connection track-sc0 src
    tcp-request connection reject if { sc0_conn_cur gt $conn_limit }
    http-request deny deny_status 429 if { sc0_http_req_rate gt $rate_limit }
    http-request deny deny_status 403 if { url_sub -i \"union select\" } || { url_sub -i union%20select } || { url_sub -i <script } || { url_sub -i %3Cscript } || { url_sub ../ }"
    fi
    cat >"$f" <<CFG
global
    nbthread 1
    cpu-map 1/1 $proxy_cpu
    maxconn $maxconn
    $pipes
    $haproxy_limits
defaults
    mode http
    option http-keep-alive
    $opts
    http-reuse always
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend fe
    bind 127.0.0.1:$port
    $rules
    default_backend be
backend be
    server origin 127.0.0.1:$origin_port
CFG
    # HAProxy 2.6 applies cpu-map to no thread when it runs in the foreground
    # with one thread (taskset showed it on both CPUs): pin the process.
    taskset -c "$proxy_cpu" haproxy -f "$f" -db >"$tmp/$t.log" 2>&1 &
    pids+=($!); tpid[$t]=$!
    wait_http "127.0.0.1:$port" "$t" "$tmp/$t.log"
}

# start_relay: HAProxy in TCP mode, one upstream connection per client
# connection, no HTTP parsing and no admission controls.
start_relay() {
    local f="$tmp/relay.cfg"
    cat >"$f" <<CFG
global
    nbthread 1
    cpu-map 1/1 $proxy_cpu
    maxconn $haproxy_maxconn
defaults
    mode tcp
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend relay
    bind 127.0.0.1:$relay_port
    default_backend origin
backend origin
    server origin 127.0.0.1:$origin_port
CFG
    taskset -c "$proxy_cpu" haproxy -f "$f" -db >"$tmp/relay.log" 2>&1 &
    pids+=($!); tpid[relay]=$!
    wait_http "127.0.0.1:$relay_port" relay "$tmp/relay.log"
}

# start_target TARGET MODE BUSY_POLL_US (the last only for zgix targets).
start_target() {
    case "$1" in
        zgix|zgix-epoll|zgix-base) start_zgix "$1" "$2" "$3" ;;
        nginx) start_nginx "$2" ;; haproxy) start_haproxy "$2" ;; relay) start_relay ;;
        haproxy-splice) start_haproxy "$2" splice ;;
    esac
}

stop_target() {
    [ -n "${tpid[$1]:-}" ] || return 0
    stop_pid "${tpid[$1]}"
    unset "tpid[$1]"
}

# work_pids TARGET: the processes that serve the target's traffic: nginx's
# workers (children of the master started here), else the process itself.
work_pids() {
    local pid="${tpid[$1]}"
    if [ "$1" = nginx ]; then pgrep -P "$pid" || echo "$pid"; else echo "$pid"; fi
}

# cpu_of TARGET: "user system" clock ticks used so far by the target's
# processes, every thread counted (/proc/PID/stat fields 14 and 15).
cpu_of() {
    local p
    for p in ${tpid[$1]} $(pgrep -P "${tpid[$1]}"); do
        # The command name (field 2) may hold spaces; count from after it.
        sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null || true
    done | awk '{u += $12; s += $13} END {print u + 0, s + 0}'
}

# rss_of TARGET: resident KiB of the target's serving processes (VmRSS).
rss_of() {
    local p
    for p in $(work_pids "$1"); do cat "/proc/$p/status"; done | awk '/^VmRSS:/ {k += $2} END {print k + 0}'
}

clk_tck="$(getconf CLK_TCK 2>/dev/null || echo 100)"

# cpu_us_per_req BEFORE AFTER REQUESTS: "user system" microseconds per request
# between two cpu_of samples.
cpu_us_per_req() {
    awk -v a="$1" -v b="$2" -v n="$3" -v hz="$clk_tck" 'BEGIN { split(a, x, " "); split(b, y, " ")
        if (n <= 0) n = 1
        printf "%.2f %.2f", (y[1] - x[1]) * 1e6 / hz / n, (y[2] - x[2]) * 1e6 / hz / n }'
}
