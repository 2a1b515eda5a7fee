#!/usr/bin/env bash
# Runs every cargo-fuzz target (or those named as arguments: bash fuzz/run.sh dense pair) for a
# bounded time (FUZZ_SECONDS each, default 60) from the committed seeds (fuzz/seeds/<target>)
# plus a scratch corpus (fuzz/target/corpus/<target>), under
# AddressSanitizer with debug assertions (cargo fuzz's defaults). Fails on any crash, panic, hang
# (-timeout per input), sanitizer or leak report, or RSS above -rss_limit_mb; a failing input is
# left in fuzz/artifacts/<target>/ (reproduce: cargo +nightly fuzz run <target> <file>).
set -euo pipefail
cd "$(dirname "$0")"
seconds=${FUZZ_SECONDS:-60}
# The instrumented build lives outside the clone, so CI reuses it.
export CARGO_TARGET_DIR=${ORK_FUZZ_TARGET:-$HOME/.cache/ork-moe/target-fuzz}
start=$(date +%s)

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi
cargo fuzz --version
cargo +nightly fuzz build
echo "build: $(( $(date +%s) - start )) s"

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(validate decode call profile dense pair verdicts)
for target in "${targets[@]}"; do
    corpus=target/corpus/$target
    mkdir -p "$corpus"
    t0=$(date +%s)
    log=target/fuzz-$target.log
    # The outer timeout is a backstop for a fuzzer that would not stop by itself.
    if ! timeout $(( seconds + 120 )) cargo +nightly fuzz run "$target" "$corpus" "seeds/$target" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
        -print_final_stats=1 >"$log" 2>&1; then
        grep -v -E '^"|Uses: ' "$log" | tail -60
        echo "fuzz target $target FAILED; the input is in fuzz/artifacts/$target/"
        exit 1
    fi
    grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb)' "$log"
    echo "$target: $(( $(date +%s) - t0 )) s, no failure"
done
echo "fuzz: all targets clean in $(( $(date +%s) - start )) s"
