#!/usr/bin/env bash
# End-to-end demo on an embedded default: builds zgix and zgix-bench, then
# `zgix-bench demo` starts a built-in origin and zgix (examples/demo.json with
# ephemeral ports), sends traffic through it and prints what happened.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--help" ]; then
    echo "usage: scripts/demo.sh   (no options; set CARGO_TARGET_DIR to build elsewhere)"
    exit 0
fi
ulimit -l unlimited 2>/dev/null || true
cargo build --release -q -p zgix -p zgix-bench
target_dir="${CARGO_TARGET_DIR:-target}"
ZGIX_BIN="$target_dir/release/zgix" exec "$target_dir/release/zgix-bench" demo
