#!/usr/bin/env bash
# ThreadSanitizer over the engine's cooperative and concurrent tests: the worker pool, the device
# layer's submits shared by caller threads, the engine units, cooperative calls on 1-4 threads
# with a real barrier (tests/faults.rs, tests/engine.rs, tests/dense.rs, tests/check_predicts_call.rs),
# concurrent calls on one context, contexts with prefetch threads running dense and pair calls
# side by side, and cooperative calls whose threads disagree (tests/concurrent.rs), the log
# callback replaced from inside itself and from other threads while such calls run
# (tests/logging.rs), and device faults in prefetch jobs and while a dense call helps them
# (tests/prefetch_faults.rs). Nightly, with std rebuilt instrumented (-Zbuild-std; needs the
# nightly rust-src component), so that std's own synchronization is seen. Any report fails the
# run (TSan exits 66). The C harness is left out: its C side is not instrumented.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
if ! rustup component list --toolchain nightly --installed | grep -q '^rust-src'; then
    rustup component add rust-src --toolchain nightly
fi
export RUSTFLAGS="-Zsanitizer=thread"
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
tsan() {
    # Built outside the clone (an instrumented std takes minutes): CI reuses it.
    cargo +nightly test -Zbuild-std --target x86_64-unknown-linux-gnu \
        --target-dir "${ORK_TSAN_TARGET:-$HOME/.cache/ork-moe/target-tsan}" "$@"
}
tsan --no-run --lib --test concurrent --test faults --test engine --test dense --test check_predicts_call --test npu \
    --test logging --test prefetch_faults
echo "build: $(( $(date +%s) - start )) s"
tsan --lib -- pool:: moe:: npu::
tsan --test concurrent
tsan --test logging
tsan --test prefetch_faults
tsan --test faults
tsan --test engine
tsan --test dense
tsan --test check_predicts_call
tsan --test npu -- concurrent_submits_from_several_threads caller_threads_run_the_shares
echo "tsan: no reports, $(( $(date +%s) - start )) s"
