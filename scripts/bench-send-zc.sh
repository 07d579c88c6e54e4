#!/usr/bin/env bash
# io_uring SEND_ZC against SEND and send(2) on a loopback TCP pair (issue 21):
# MB/s and CPU per MB of sender and receiver, per block size, in interleaved
# rounds (`zgix-bench send-zc`, bench/src/send_zc.rs). Two passes: the
# defaults (2 sends in flight, 2 buffers) and a deep pool (32), because a
# SEND_ZC buffer is only given back once the data is acknowledged.
# About 3 minutes. Run on a quiet machine; output on stdout.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/bench-send-zc.sh [--no-build] [--rounds N] [--max-secs S] [--deep-queue Q]

  --no-build      use the release binary under $CARGO_TARGET_DIR (or ./target)
  --rounds N      rounds of the default pass (default 5; the deep pass runs 3)
  --max-secs S    cap on each run's sending (default 2; the deep pass 1.5)
  --deep-queue Q  sends in flight and buffers of the second pass (default 32)
USAGE
}

build=1 rounds=5 max_secs=2 deep=32
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) build=0 ;;
        --rounds) rounds="$2"; shift ;;
        --max-secs) max_secs="$2"; shift ;;
        --deep-queue) deep="$2"; shift ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
    shift
done

cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
if [ "$build" = 1 ]; then
    cargo build --release -p zgix-bench >&2
fi
bin="$target/release/zgix-bench"

echo "# scripts/bench-send-zc.sh, $(date -u +%Y-%m-%dT%H:%M:%SZ), $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "# pass 1: $bin send-zc --total 4G --rounds $rounds --queue 2 --max-secs $max_secs"
"$bin" send-zc --total 4G --rounds "$rounds" --queue 2 --max-secs "$max_secs"
echo
echo "# pass 2: $bin send-zc --total 4G --rounds 3 --queue $deep --max-secs 1.5"
"$bin" send-zc --total 4G --rounds 3 --queue "$deep" --max-secs 1.5
