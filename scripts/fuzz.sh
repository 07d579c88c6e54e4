#!/usr/bin/env bash
# Builds and runs every cargo-fuzz target for N seconds each (default 30) and
# fails on the first crash. Needs a nightly toolchain and cargo-fuzz
# (`cargo install cargo-fuzz`). Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
# A crash leaves its input in <crate>/fuzz/artifacts/<target>/; replay it with
# `cargo +nightly fuzz run <target> <file>` from the crate directory.
set -euo pipefail
cd "$(dirname "$0")/.."

secs="${1:-30}"
shift || true
only=("$@")

# crate directory, then its targets
targets=(
    "parser request_head"
    "parser response_head"
    "parser chunked"
    "parser proxy_protocol"
    "parser canonical_path"
    "config config_load"
    "h2 hpack_decode"
    "h2 hpack_round_trip"
)

for entry in "${targets[@]}"; do
    read -r crate target <<<"$entry"
    if [ "${#only[@]}" -gt 0 ] && [[ ! " ${only[*]} " == *" $target "* ]]; then
        continue
    fi
    # The committed seeds stay untouched: new finds go to a scratch corpus.
    scratch="$(mktemp -d)"
    echo "fuzz: $crate/$target for ${secs}s"
    log="$scratch/log"
    mkdir "$scratch/corpus"
    if ! (cd "$crate" && cargo +nightly fuzz run "$target" "$scratch/corpus" "fuzz/corpus/$target" -- \
        -max_total_time="$secs" -max_len=2048 -timeout=10 -print_final_stats=1) >"$log" 2>&1; then
        tail -n 60 "$log"
        echo "fuzz: $crate/$target failed (input in $crate/fuzz/artifacts/$target/)"
        rm -rf "$scratch"
        exit 1
    fi
    grep -E "^Done|stat::number_of_executed_units" "$log" || true
    rm -rf "$scratch"
done
echo "fuzz: no crash"
