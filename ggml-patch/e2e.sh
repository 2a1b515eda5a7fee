#!/usr/bin/env bash
# End-to-end check of libork_moe inside the patched llama.cpp (run by .ci/run).
#
#   ggml-patch/e2e.sh [path/to/libork_moe.so]      (or ORK_MOE_LIB=...; default target/release/libork_moe.so)
#
# 1. builds the patched llama.cpp (build.sh, cached) and the tiny qwen3moe models (cached);
# 2. test-backend-ops -b CPU -o MUL_MAT_ID with the plugin, every case (945): those of the weight types the
#    library takes (every quantized type llama-quantize writes: q4_0 ... iq1_m, the list below) with
#    ORK_MIN_ROWS=0, where its own counters must show that it handled every one; all the others with the default settings (the library declines them and
#    ggml runs them). Every case must pass.
#    Then -o MUL_MAT for the same types, every weight buffer offered (ORK_MOE_DENSE_ANY_BUFFER=1): the library
#    must handle every case its dense path takes, and every case must pass.
# 3. discovery: LD_PRELOAD and ORK_MOE_PLUGIN both activate it, ORK_MOE=0 disables it; ggml repacks the
#    routed experts into CPU_REPACK as without the plugin (same buffer size), and the plugin reads them there
#    (its log names the repacked layout of every call it handled);
# 4. per model (Q4_0, Q4_K_M): 32 greedy tokens with and without the plugin (token agreement), and
#    llama-perplexity --kl-divergence of the plugin run against the plain run (2 threads; the prompt batches go
#    to the plugin, from the repacked experts), with both runs' max RSS: the plugin's may exceed plain's by the
#    expert cache's budget (ORK_CACHE_MB) at most, i.e. no second copy of the experts; the same perplexity
#    with the prefetch threads (ORK_PREFETCH=1) and on the rknn backend through the stand-in runtime of the
#    Rust tests (tests/standin, built here with cc) must give the plugin run's values exactly, the latter
#    with routed and dense calls (the attention projections, ORK_DENSE) in its log;
# 5. llama-bench pp512/tg128 with and without the plugin, same threads; pp512 also with ORK_MT_MODE=leader
#    (thread 0 runs the library's pool while ggml's other threads wait) against the cooperative default;
#    then decode alone (-p 0 -n 128 -r 5), plain and plugin interleaved, two rounds, with their ratio (the
#    plugin declines every decode call and ggml runs its repacked kernels: the ratio should be about 1).
# 6. measured dispatch (ORK_DISPATCH=auto): with the library's path made slower for real (ORK_EMU_SLOW_US) its
#    calls must be declined once measured, every verdict ggml; without, the verdicts are printed;
# 7. the MoE architectures of the pinned llama.cpp with their real expert shapes (e2e_archs.sh: a fast
#    subset by default, every architecture with ORK_E2E_ARCHS=all).
# Logs: ggml-patch/work/e2e/ (git-ignored). Env: ORK_CACHE, ORK_E2E_BENCH=0 skips step 5,
# ORK_E2E_THREADS (default nproc), ORK_E2E_TBO_ALL=0 skips the cases of the other types,
# ORK_E2E_TBO_TYPES (default: the six supported types), ORK_LLAMA_BUILD (use this llama.cpp build dir
# instead of build.sh's).
set -euo pipefail
# The checks count the calls the library handled, and measured dispatch (ORK_DISPATCH=auto, the default)
# leaves some to ggml to time its path: the library takes every call here unless the caller says otherwise
# (the measured-dispatch step sets auto itself).
export ORK_DISPATCH=${ORK_DISPATCH:-always}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
lib=${1:-${ORK_MOE_LIB:-$repo/target/release/libork_moe.so}}
threads=${ORK_E2E_THREADS:-$(nproc)}
out=$here/work/e2e
failures=0

die() { echo "e2e.sh: error: $*" >&2; exit 1; }
step() { echo; echo "== $*"; }
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }
log() { echo "e2e.sh: $*" >&2; }
# shellcheck source=common.sh
source "$here/common.sh"

[[ -f $lib ]] || die "plugin library not found: $lib (cargo build --release, or pass its path)"
[[ ${ORK_E2E_BENCH:-1} == 0 ]] || command -v jq >/dev/null || die "jq is required for the benches (apt-get install jq; or ORK_E2E_BENCH=0)"
lib=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")
rm -rf "$out"
mkdir -p "$out"

step "build (ggml-patch/build.sh)"
t0=$SECONDS
build=${ORK_LLAMA_BUILD:-$("$here/build.sh" | tail -1)}
bin=$build/bin
echo "build dir: $build ($((SECONDS - t0)) s)"

step "tiny qwen3moe models"
models=$(ork_tiny_models "$bin")
ls -l "$models"/*.gguf
grep -h "ffn_down_exps" "$models/quantize-Q4_K_M.log" | head -2 || true

# Plugin run environment: ORK_MOE_PLUGIN (dlopen) unless a caller passes another discovery.
with_plugin=(env ORK_MOE_PLUGIN="$lib" ORK_MOE_STATS=1)
without_plugin=(env ORK_MOE=0)

handled() { sed -n 's/^ork-moe stats: .* handled \([0-9]*\) .*/\1/p' "$1" | tail -1; }

step "test-backend-ops -b CPU -o MUL_MAT_ID (plugin active)"
tbo_types=${ORK_E2E_TBO_TYPES:-q4_0 q4_1 q5_0 q5_1 q8_0 q2_K q3_K q4_K q5_K q6_K iq4_nl iq4_xs mxfp4 iq2_xxs iq2_xs iq2_s iq3_xxs iq3_s iq1_s iq1_m}
tbo_cases=0
passed_of() { grep -oE '[0-9]+/[0-9]+ tests passed' "$1" | tail -1; }
# ORK_MIN_ROWS=0: the library takes every case of its types, including the decode-sized ones it leaves to
# ggml by default.
for type in $tbo_types; do
    log=$out/tbo-$type.log
    t0=$SECONDS
    "${with_plugin[@]}" ORK_MIN_ROWS=0 "$bin/test-backend-ops" test -b CPU -o MUL_MAT_ID -p "type_a=$type," >"$log" 2>&1 ||
        fail "test-backend-ops MUL_MAT_ID type_a=$type (log: $log)"
    n=$(handled "$log")
    cases=$(passed_of "$log" | cut -d/ -f2 | cut -d' ' -f1)
    tbo_cases=$((tbo_cases + ${cases:-0}))
    summary="$(passed_of "$log"); $(grep '^ork-moe stats' "$log") ($((SECONDS - t0)) s)"
    if [[ ${n:-0} -ge ${cases:-1} ]]; then pass "type_a=$type: $summary"; else fail "type_a=$type: not every case handled: $summary"; fi
done
if [[ ${ORK_E2E_TBO_ALL:-1} == 0 ]]; then
    echo "the other types' cases: skipped (ORK_E2E_TBO_ALL=0)"
else
    log=$out/tbo-others.log
    t0=$SECONDS
    # Every case whose weight type is not one of the above (ECMAScript negative lookahead on the params).
    others="^(?!type_a=($(echo $tbo_types | tr ' ' '|')),)"
    if "${with_plugin[@]}" "$bin/test-backend-ops" test -b CPU -o MUL_MAT_ID -p "$others" >"$log" 2>&1; then
        pass "other types: $(passed_of "$log"); $(grep '^ork-moe stats' "$log") ($((SECONDS - t0)) s)"
    else
        grep -E 'FAIL|tests passed' "$log" | head -20
        fail "test-backend-ops MUL_MAT_ID, other types (log: $log)"
    fi
    grep -q '^ork-moe: plugin active' "$log" || fail "plugin not active in test-backend-ops"
    cases=$(passed_of "$log" | cut -d/ -f2 | cut -d' ' -f1)
    tbo_cases=$((tbo_cases + ${cases:-0}))
    echo "test-backend-ops MUL_MAT_ID: $tbo_cases cases in all"
fi

step "test-backend-ops -b CPU -o MUL_MAT (plugin active, every weight buffer offered)"
# The patch offers the library a MUL_MAT only when its weights are in a buffer llama.cpp marks as weights, which
# test-backend-ops's are not: ORK_MOE_DENSE_ANY_BUFFER=1 (for tests) lifts that, ORK_CACHE_VERIFY=full re-reads
# every cached weight, since each case writes new weights where the last case's were. The library must handle
# exactly the cases its dense path takes (2-D, F32 activations, unbatched, unpermuted, no views: counted from
# the case names), and every case must pass.
for type in $tbo_types; do
    log=$out/tbo-mul-mat-$type.log
    t0=$SECONDS
    "${with_plugin[@]}" ORK_MIN_ROWS=0 ORK_CACHE_VERIFY=full ORK_MOE_DENSE_ANY_BUFFER=1 \
        "$bin/test-backend-ops" test -b CPU -o MUL_MAT -p "type_a=$type," >"$log" 2>&1 ||
        fail "test-backend-ops MUL_MAT type_a=$type (log: $log)"
    n=$(handled "$log")
    taken=$(grep -F 'MUL_MAT(' "$log" | grep -F 'type_b=f32' | grep -F 'bs=[1,1],nr=[1,1],per=[0,1,2,3]' |
        grep -cv '_v=1' || true)
    summary="$(passed_of "$log"); the dense path's $taken handled: $(grep '^ork-moe stats' "$log") ($((SECONDS - t0)) s)"
    if [[ ${n:-0} -eq $taken && $taken -gt 0 ]]; then pass "type_a=$type: $summary"; else fail "type_a=$type: $summary"; fi
done

step "discovery"
probe() { # $1 = log name, rest = env assignments; a 1-token run is enough to resolve and call the plugin
    local name=$1
    shift
    env "$@" ORK_MOE_STATS=1 ORK_MIN_ROWS=0 "$bin/llama-completion" -m "$models/Q4_0.gguf" -p "The quick brown fox" -n 1 \
        -no-cnv --temp 0 -t "$threads" -v </dev/null >"$out/$name.log" 2>&1
}
probe disc-preload LD_PRELOAD="$lib"
probe disc-plugin ORK_MOE_PLUGIN="$lib" ORK_LOG=debug
probe disc-off LD_PRELOAD="$lib" ORK_MOE=0
grep -q 'ork-moe: plugin active (symbol in process)' "$out/disc-preload.log" && [[ $(handled "$out/disc-preload.log") -gt 0 ]] &&
    pass "LD_PRELOAD: $(grep '^ork-moe stats' "$out/disc-preload.log")" || fail "LD_PRELOAD discovery"
grep -q "ork-moe: plugin active ($lib)" "$out/disc-plugin.log" && [[ $(handled "$out/disc-plugin.log") -gt 0 ]] &&
    pass "ORK_MOE_PLUGIN: $(grep '^ork-moe stats' "$out/disc-plugin.log")" || fail "ORK_MOE_PLUGIN discovery"
! grep -q '^ork-moe' "$out/disc-off.log" && pass "ORK_MOE=0 disables it" || fail "ORK_MOE=0 did not disable"
repack() { sed -n 's/.*- CPU_REPACK *| *\([0-9]*\) = .*/\1/p' "$1" | head -1; }
repacked_experts() { grep -c 'repack: repack tensor blk\.[0-9]*\.ffn_[a-z]*_exps\.weight' "$1" || true; }
summary="CPU_REPACK buffer, Q4_0 model: plain $(repack "$out/disc-off.log") MiB ($(repacked_experts "$out/disc-off.log") \
expert tensors), plugin $(repack "$out/disc-plugin.log") MiB ($(repacked_experts "$out/disc-plugin.log"))"
[[ $(repack "$out/disc-off.log") == "$(repack "$out/disc-plugin.log")" && $(repacked_experts "$out/disc-plugin.log") -gt 0 ]] &&
    pass "$summary" || fail "$summary: the experts are not repacked as without the plugin"
# The layout of the experts the plugin read, as its debug log names them (e.g. q4_0_8x8 on AVX2).
layouts=$(sed -n 's/.*ork-moe: handled \(q4_0_[0-9]*x[0-9]*\) .*/\1/p' "$out/disc-plugin.log" | sort -u | tr '\n' ' ')
[[ -n $layouts ]] && pass "the plugin read the repacked experts: $layouts" ||
    fail "no call handled from a repacked layout (log: $out/disc-plugin.log)"

step "greedy generation and KL divergence"
gen() { # $1 = output prefix; rest = env prefix. 32 greedy tokens; the text to $1.txt, the log to $1.log
    local prefix=$1
    shift
    "$@" "$bin/llama-completion" -m "$model" -p "The quick brown fox" -n 32 --ignore-eos -no-cnv --temp 0 \
        -t "$threads" -s 1 --no-display-prompt "${gen_extra[@]}" </dev/null >"$prefix.txt" 2>"$prefix.log" ||
        fail "llama-completion (log: $prefix.log)"
}
gen_extra=()
# The stand-in librknnrt of the Rust tests (tests/standin), for the rknn backend's run below.
standin=$out/librknnrt-standin.so
${CC:-cc} -std=c11 -O2 -shared -fPIC -o "$standin" "$repo/tests/standin/rknnrt_standin.c" -lpthread ||
    die "building the stand-in runtime (tests/standin/rknnrt_standin.c) failed"
for q in Q4_0 Q4_K_M; do
    model=$models/$q.gguf
    gen "$out/gen-$q-plain" "${without_plugin[@]}"
    # ORK_MIN_ROWS=0: the library also takes the decode steps (1 row per expert) it leaves to ggml by default
    gen "$out/gen-$q-plugin" "${with_plugin[@]}" ORK_MIN_ROWS=0
    echo "$q greedy 32 tokens: plugin and plain texts agree on the first $(common_prefix "$out/gen-$q-plain.txt" \
        "$out/gen-$q-plugin.txt") of $(wc -c <"$out/gen-$q-plain.txt") bytes; $(grep '^ork-moe stats' "$out/gen-$q-plugin.log")"
    cmp -s "$out/gen-$q-plain.txt" "$out/gen-$q-plugin.txt" || echo "  (texts differ: diff $out/gen-$q-plain.txt $out/gen-$q-plugin.txt)"

    ppl=("$bin/llama-perplexity" -m "$model" -f "$models/text.txt" -c 128 --chunks 4 -b 128 -t 2)
    # GNU time's max RSS (KiB) in the log's last line
    rss=(/usr/bin/time -f 'max RSS %M KiB')
    "${rss[@]}" "${without_plugin[@]}" "${ppl[@]}" --kl-divergence-base "$out/kld-$q.base" >"$out/ppl-$q-plain.log" 2>&1 ||
        fail "$q: perplexity (plain)"
    "${rss[@]}" "${with_plugin[@]}" "${ppl[@]}" --kl-divergence-base "$out/kld-$q.base" --kl-divergence \
        >"$out/ppl-$q-plugin.log" 2>&1 || fail "$q: perplexity --kl-divergence (plugin)"
    # the last chunk row holds the running means: PPL, ln(PPL ratio), KLD, delta-p RMS, same top token
    echo "$q vs plain (chunk, PPL, ln ratio, KLD, dp RMS, same top): $(grep -E '^ +[0-9]+ +[0-9.]+ ±' \
        "$out/ppl-$q-plugin.log" | tail -1 | tr -s ' ')"
    echo "$q plugin: $(grep '^ork-moe stats' "$out/ppl-$q-plugin.log")"
    # The prefetch threads (ORK_PREFETCH) move where experts are inflated, never a bit: the same values. No
    # cache, so that every expert comes from the prefetch or from its call; -lv 5 shows the library's debug log.
    "${with_plugin[@]}" ORK_PREFETCH=1 ORK_CACHE_MB=0 ORK_LOG=debug "${ppl[@]}" -lv 5 \
        --kl-divergence-base "$out/kld-$q.base" --kl-divergence >"$out/ppl-$q-prefetch.log" 2>&1 ||
        fail "$q: perplexity --kl-divergence (plugin, ORK_PREFETCH=1)"
    values() { grep -E '^ +[0-9]+ +[0-9.]+ ±' "$1" | tail -1; }
    prefetched=$(grep -o 'prefetch: [0-9]* staged, [0-9]* taken' "$out/ppl-$q-prefetch.log" | tail -1)
    [[ -n $(values "$out/ppl-$q-plugin.log") && $(values "$out/ppl-$q-plugin.log") == "$(values "$out/ppl-$q-prefetch.log")" &&
        ${prefetched:-0 taken} != *" 0 taken" ]] &&
        pass "$q: with ORK_PREFETCH=1 the same values (${prefetched})" ||
        fail "$q: ORK_PREFETCH=1 changed the values or took nothing prefetched (${prefetched:-no prefetch line}; logs: $out/ppl-$q-plugin.log, $out/ppl-$q-prefetch.log)"
    # The board's path (ORK_BACKEND=rknn: dlopen of the vendor runtime, its memory, syncs, contexts and
    # submitter threads) on the stand-in runtime of the Rust tests, with the prefetch threads: the same values.
    "${with_plugin[@]}" ORK_BACKEND=rknn ORK_RKNN_LIB="$standin" ORK_PREFETCH=1 ORK_CACHE_MB=0 ORK_LOG=debug \
        "${ppl[@]}" -lv 5 --kl-divergence-base "$out/kld-$q.base" --kl-divergence >"$out/ppl-$q-rknn.log" 2>&1 ||
        fail "$q: perplexity --kl-divergence (plugin, ORK_BACKEND=rknn on the stand-in runtime)"
    on_rknn=$(grep -c 'ork-moe: handled .* on rknn;' "$out/ppl-$q-rknn.log" || true)
    # The attention projections' MUL_MATs (ORK_DENSE, on by default) are calls of one expert and one slot.
    dense_on_rknn=$(grep -c 'ork-moe: handled .* x 1 slots of 1 experts on rknn;' "$out/ppl-$q-rknn.log" || true)
    [[ -n $(values "$out/ppl-$q-plugin.log") && $(values "$out/ppl-$q-plugin.log") == "$(values "$out/ppl-$q-rknn.log")" &&
        $on_rknn -gt $dense_on_rknn && $dense_on_rknn -gt 0 ]] &&
        pass "$q: on the rknn backend (stand-in runtime, ORK_PREFETCH=1) the same values ($on_rknn calls on rknn, $dense_on_rknn of them dense)" ||
        fail "$q: the rknn backend changed the values, or handled no routed or no dense call ($on_rknn calls on rknn, $dense_on_rknn dense; log: $out/ppl-$q-rknn.log)"
    [[ $(handled "$out/ppl-$q-plugin.log") -gt 0 ]] || fail "$q: plugin handled nothing in llama-perplexity"
    kib() { sed -n 's/^max RSS \([0-9]*\) KiB$/\1/p' "$1" | tail -1; }
    plain_kib=$(kib "$out/ppl-$q-plain.log") plugin_kib=$(kib "$out/ppl-$q-plugin.log")
    budget_kib=$((${ORK_CACHE_MB:-1024} * 1024))
    summary="$q max RSS: plain $((plain_kib / 1024)) MiB, plugin $((plugin_kib / 1024)) MiB (cache budget $((budget_kib / 1024)) MiB)"
    ((plugin_kib <= plain_kib + budget_kib)) && pass "$summary" || fail "$summary"
done

step "RPC backend: ggml-rpc-server with the plugin serves all layers of a client without it, measured dispatch on"
port=$((50000 + RANDOM % 10000))
# The server is killed at the end, so its exit-time stats never print: its debug log (the library's lines,
# through the patch into ggml's log) shows each handled call and each class's verdict. Under
# ORK_DISPATCH=auto each class runs the library's path on two calls, ggml's on two, then decides.
ORK_MOE_PLUGIN="$lib" ORK_MIN_ROWS=0 ORK_LOG=debug ORK_DISPATCH=auto ORK_DISPATCH_CACHE=off \
    "$bin/ggml-rpc-server" -H 127.0.0.1 -p "$port" -t "$threads" >"$out/rpc-server.log" 2>&1 &
rpc_pid=$!
trap 'kill "$rpc_pid" 2>/dev/null || true' EXIT
for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.2; done
model=$models/Q4_0.gguf
gen_extra=(--rpc "127.0.0.1:$port" -ngl 99)
gen "$out/gen-rpc" "${without_plugin[@]}"
gen_extra=()
kill "$rpc_pid" 2>/dev/null || true
wait "$rpc_pid" 2>/dev/null || true
trap - EXIT
echo "Q4_0 through RPC (plugin in the server) vs local plain: first $(common_prefix "$out/gen-Q4_0-plain.txt" \
    "$out/gen-rpc.txt") of $(wc -c <"$out/gen-Q4_0-plain.txt") bytes agree"
grep -q 'ork-moe: plugin active' "$out/rpc-server.log" && grep -q 'ork-moe: handled q4_0' "$out/rpc-server.log" &&
    pass "rpc-server ran the client's MUL_MAT_IDs through the plugin: $(grep -c 'ork-moe: handled' "$out/rpc-server.log") calls" ||
    fail "plugin not active in ggml-rpc-server (logs: $out/rpc-server.log, $out/gen-rpc.log)"
grep -q 'ork-moe: dispatch: .*: \(library\|ggml\) (library [0-9.]* µs/row of [0-9]* samples, ggml [0-9.]* µs' \
    "$out/rpc-server.log" &&
    pass "rpc-server measured both paths and decided: $(grep -c 'ork-moe: dispatch: ' "$out/rpc-server.log") verdicts" ||
    fail "no measured verdict in ggml-rpc-server (log: $out/rpc-server.log)"

if [[ ${ORK_E2E_BENCH:-1} != 0 ]]; then
    step "llama-bench pp512/tg128, $threads threads, 3 repetitions (plugin-leader: pp512, ORK_MT_MODE=leader)"
    for q in Q4_0 Q4_K_M; do
        for mode in plain plugin plugin-leader; do
            bench=(-p 512 -n 128)
            case $mode in
            plain) run=("${without_plugin[@]}") ;;
            plugin) run=("${with_plugin[@]}") ;;
            plugin-leader) run=("${with_plugin[@]}" ORK_MT_MODE=leader) bench=(-p 512 -n 0) ;;
            esac
            "${run[@]}" "$bin/llama-bench" -m "$models/$q.gguf" "${bench[@]}" -t "$threads" -r 3 -o md \
                >"$out/bench-$q-$mode.log" 2>&1 || fail "llama-bench $q $mode"
            echo "$q $mode:"
            grep -E '^\| .*(pp512|tg128)' "$out/bench-$q-$mode.log" || true
        done
    done
    step "llama-bench decode: -p 0 -n 128 -r 5, plain and plugin interleaved, four rounds (tokens/s: medians of the 5)"
    # The median of the repetitions: on a shared 2-core machine one disturbed repetition moves a mean far.
    tg() { jq -r '.[] | select(.n_gen > 0) | (.samples_ts | sort) as $s | $s[($s | length) / 2 | floor]' "$1"; }
    for q in Q4_0 Q4_K_M; do
        ratios=()
        for round in 1 2 3 4; do
            for mode in plain plugin; do
                [[ $mode == plain ]] && run=("${without_plugin[@]}") || run=("${with_plugin[@]}")
                "${run[@]}" "$bin/llama-bench" -m "$models/$q.gguf" -p 0 -n 128 -t "$threads" -r 5 -o json \
                    >"$out/decode-$q-$mode-$round.json" 2>"$out/decode-$q-$mode-$round.log" || fail "llama-bench decode $q $mode"
            done
            p=$(tg "$out/decode-$q-plain-$round.json") l=$(tg "$out/decode-$q-plugin-$round.json")
            ratios+=("$(awk -v p="$p" -v l="$l" 'BEGIN { if (p > 0) printf "%.3f", l / p; else print "?" }')")
            printf 'round %s %-6s tg128: plain %7.1f, plugin %7.1f t/s, plugin/plain %s\n' "$round" "$q" "$p" "$l" "${ratios[-1]}"
        done
        echo "$q tg128 plugin/plain, median of the rounds: $(printf '%s\n' "${ratios[@]}" | sort -n |
            awk '{ r[NR] = $1 } END { printf "%.3f", (NR % 2) ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2 }')"
    done
fi

step "measured dispatch: ORK_DISPATCH=auto with the library's path made slower for real (ORK_EMU_SLOW_US) and as it is"
# llama-bench -p 512 -n 0 -r 5 (six prompt batches with the warm-up): each class of call runs ggml's path
# (reported through ork_observe) twice, the library's four times (two warm-up calls), then the faster. 50 ms per emulator submit makes
# the library's path several times slower than ggml's on most classes (a large dense projection may still
# win): most calls must then be declined, with at least one ggml verdict logged. Without the slowdown the
# verdicts are printed, not checked (the winner on a loaded 2-core machine may vary).
for slow in 50000 0; do
    name=$out/dispatch-slow$slow
    "${with_plugin[@]}" ORK_DISPATCH=auto ORK_DISPATCH_CACHE=off ORK_EMU_SLOW_US=$slow ORK_LOG=info \
        "$bin/llama-bench" -m "$models/Q4_0.gguf" -p 512 -n 0 -t "$threads" -r 5 -o md -v >"$name.log" 2>&1 ||
        fail "llama-bench with ORK_DISPATCH=auto, ORK_EMU_SLOW_US=$slow (log: $name.log)"
    stats=$(grep '^ork-moe stats' "$name.log" | tail -1)
    verdicts=$(sed -n 's/.*dispatch: \(.*\): \(library\|ggml\) (.*/\2/p' "$name.log" | sort | uniq -c | xargs)
    echo "ORK_EMU_SLOW_US=$slow: $(grep -E '^\| .*pp512' "$name.log" | awk -F'|' '{ print $(NF - 1) }' | xargs) t/s; ${stats:-no stats}; verdicts: ${verdicts:-none}"
    [[ $slow != 0 ]] || continue
    declined=$(sed -n 's/^ork-moe stats: .* declined \([0-9]*\) .*/\1/p' <<<"$stats")
    taken=$(handled "$name.log")
    if ((${declined:-0} > ${taken:-0})) && grep -q 'dispatch: .*: ggml (' "$name.log"; then
        pass "a slower library path is declined after measuring it: $taken calls taken, $declined declined"
    else
        fail "ORK_DISPATCH=auto kept a slower library path (${stats:-no stats}; log: $name.log)"
    fi
done

step "MoE architectures (e2e_archs.sh, ORK_E2E_ARCHS=${ORK_E2E_ARCHS:-fast})"
ORK_LLAMA_BUILD=$build "$here/e2e_archs.sh" "$lib" || fail "e2e_archs.sh"

echo
if ((failures)); then
    echo "e2e.sh: $failures check(s) failed (logs: $out)"
    exit 1
fi
echo "e2e.sh: all checks passed (logs: $out)"
