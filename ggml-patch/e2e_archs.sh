#!/usr/bin/env bash
# The MoE architectures of the pinned llama.cpp end to end through the plugin (run by e2e.sh, or alone).
#
#   ggml-patch/e2e_archs.sh [path/to/libork_moe.so]   (or ORK_MOE_LIB=...; default target/release/libork_moe.so)
#
# Per architecture: a synthetic model with the real model's per-layer shapes (tools/make_tiny_moe.py: its
# leading dense layers and 2 MoE layers, quantized to Q4_0, gpt-oss to MXFP4_MOE; cached), then
# 1. one prompt batch (-n 1) with the plugin and ORK_MIN_ROWS=0: its stats must show every call it saw
#    handled (routed experts and dense projections), none declined, and at least 6 calls;
# 2. 16 greedy tokens with the plugin (ORK_MIN_ROWS=0, so decode steps go to it too) and without, both must
#    run; how many bytes of text agree is printed, as e2e.sh does for its models (random weights give flat
#    logits, so the int8 activations of the plugin may flip a near-tie: a difference is reported, not failed);
# 3. llama-perplexity --kl-divergence on the generator's embedded text against the F16 model the quantized one
#    was made from (its logits cached beside it): the plugin run's mean KLD (the prompt batches go to it) may
#    exceed the plain run's, Q4's own error, by at most ORK_E2E_KLD_RATIO (default 1.10: the library adds at
#    most 10 %, docs/ACCURACY.md). On random weights Q4's own KLD is mostly large (to 0.7), so the KLD of the
#    plugin run against the plain one is measured too and must stay below ORK_E2E_KLD_MAX (default 0.05,
#    about twice the largest measured): it catches a growth of the int8 error that Q4's own error hides.
# ORK_E2E_ARCHS selects: "fast" (default, the CI subset: granitemoe with its 40 experts, qwen2moe's shared
# expert, gpt-oss's K = 2880 with per-expert biases and gemma4's fused gate+up experts beside a dense
# MLP, each with fewer experts than the real model), "all" (every architecture with its real expert
# count: several GB of F16 while generating), or a space-separated list of architecture names.
# gpt-oss's experts are MXFP4 as in its released files (ggml repacks them to mxfp4_8x8 on x86 with AVX2).
# Logs: ggml-patch/work/e2e-archs/. Env: ORK_CACHE, ORK_E2E_THREADS, ORK_LLAMA_BUILD.
set -euo pipefail
# The checks count the calls the library handled: it takes every call here (measured dispatch, the default,
# leaves some to ggml to time its path) unless the caller chooses another ORK_DISPATCH.
export ORK_DISPATCH=${ORK_DISPATCH:-always}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
lib=${1:-${ORK_MOE_LIB:-$repo/target/release/libork_moe.so}}
threads=${ORK_E2E_THREADS:-$(nproc)}
out=$here/work/e2e-archs
failures=0

die() { echo "e2e_archs.sh: error: $*" >&2; exit 1; }
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }
log() { echo "e2e_archs.sh: $*" >&2; }
# shellcheck source=common.sh
source "$here/common.sh"

[[ -f $lib ]] || die "plugin library not found: $lib (cargo build --release, or pass its path)"
lib=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")
rm -rf "$out"
mkdir -p "$out"
bin=${ORK_LLAMA_BUILD:-$("$here/build.sh" | tail -1)}/bin

# name -> the generator's arguments after the name
declare -A fast=([granitemoe]="" [qwen2moe]="--experts 16" [gpt-oss]="--experts 8" [gemma4]="--experts 16")
all=(qwen3moe qwen35moe qwen2moe olmoe gpt-oss granitemoe ernie4_5-moe deepseek2 lfm2moe gemma4)
case ${ORK_E2E_ARCHS:-fast} in
fast) archs=(granitemoe qwen2moe gpt-oss gemma4) ;;
all) archs=("${all[@]}") ;;
*) read -ra archs <<<"$ORK_E2E_ARCHS" ;;
esac

kld_ratio=${ORK_E2E_KLD_RATIO:-1.10}
kld_max=${ORK_E2E_KLD_MAX:-0.05}

stat() { sed -n "s/^ork-moe stats:.* $2 \([0-9]*\).*/\1/p" "$1" | tail -1; }
# perplexity NAME COMMAND...: one llama-perplexity run of the current architecture, logged to $arch-ppl-NAME.log
perplexity() {
    "${@:2}" >"$out/$arch-ppl-$1.log" 2>&1 || fail "$arch: perplexity $1 (log: $out/$arch-ppl-$1.log)"
}
kld() { sed -n 's/^Mean *KLD: *\([0-9.e+-]*\).*/\1/p' "$out/$arch-ppl-$1.log"; }
for arch in "${archs[@]}"; do
    t0=$SECONDS
    args=()
    [[ ${ORK_E2E_ARCHS:-fast} == fast ]] && read -ra args <<<"${fast[$arch]}"
    model=$(ork_arch_model "$bin" "$arch" "${args[@]}")
    run=("$bin/llama-completion" -m "$model" -p "The quick brown fox jumps over the lazy dog" -no-cnv --temp 0
        -t "$threads" -s 1 --no-display-prompt)
    plugin=(env ORK_MOE_PLUGIN="$lib" ORK_MOE_STATS=1 ORK_MIN_ROWS=0)
    "${plugin[@]}" "${run[@]}" -n 1 </dev/null >"$out/$arch-prompt.txt" 2>"$out/$arch-prompt.log" ||
        fail "$arch: prompt batch with the plugin (log: $out/$arch-prompt.log)"
    calls=$(stat "$out/$arch-prompt.log" calls) handled=$(stat "$out/$arch-prompt.log" handled)
    stats=$(grep '^ork-moe stats' "$out/$arch-prompt.log" || echo "no stats")
    # 2 MoE layers of 3 routed calls each at least
    [[ ${calls:-0} -ge 6 && ${handled:-0} == "$calls" ]] &&
        pass "$arch: prompt batch: every call handled ($stats)" ||
        fail "$arch: prompt batch: not every call handled ($stats; log: $out/$arch-prompt.log)"
    env ORK_MOE=0 "${run[@]}" -n 16 --ignore-eos </dev/null >"$out/$arch-plain.txt" 2>"$out/$arch-plain.log" ||
        fail "$arch: plain run (log: $out/$arch-plain.log)"
    "${plugin[@]}" "${run[@]}" -n 16 --ignore-eos </dev/null >"$out/$arch-plugin.txt" 2>"$out/$arch-plugin.log" ||
        fail "$arch: plugin run (log: $out/$arch-plugin.log)"
    [[ -s $out/$arch-plain.txt ]] || fail "$arch: the plain run wrote no text (log: $out/$arch-plain.log)"
    echo "$arch: 16 greedy tokens: plugin and plain texts agree on the first $(common_prefix "$out/$arch-plain.txt" \
        "$out/$arch-plugin.txt") of $(wc -c <"$out/$arch-plain.txt") bytes; $(grep '^ork-moe stats' "$out/$arch-plugin.log") ($((SECONDS - t0)) s)"
    # the F16 model's logits and the text they are over, cached with the model (common.sh)
    f16=$(dirname "$model")/f16.kld
    ppl=("$bin/llama-perplexity" -m "$model" -f "$(dirname "$model")/text.txt" "${ork_arch_ppl_args[@]}" -t "$threads")
    plain_ppl=(env ORK_MOE=0 "${ppl[@]}") plugin_ppl=(env ORK_MOE_PLUGIN="$lib" "${ppl[@]}")
    perplexity plain "${plain_ppl[@]}" --kl-divergence-base "$out/$arch-plain.kld"
    perplexity plain-vs-f16 "${plain_ppl[@]}" --kl-divergence-base "$f16" --kl-divergence
    perplexity plugin-vs-f16 "${plugin_ppl[@]}" --kl-divergence-base "$f16" --kl-divergence
    perplexity plugin-vs-plain "${plugin_ppl[@]}" --kl-divergence-base "$out/$arch-plain.kld" --kl-divergence
    q4=$(kld plain-vs-f16) lib_f16=$(kld plugin-vs-f16) lib_plain=$(kld plugin-vs-plain)
    awk -v q="${q4:-nan}" -v k="${lib_f16:-nan}" -v r="$kld_ratio" 'BEGIN { exit !(q + 0 == q && k + 0 == k && q > 0 && k <= r * q) }' &&
        pass "$arch: KLD against F16: plugin $lib_f16, plain $q4 ($(awk -v q="$q4" -v k="$lib_f16" 'BEGIN { printf "%.3f", k / q }')x, <= $kld_ratio)" ||
        fail "$arch: KLD against F16: plugin ${lib_f16:-missing}, plain ${q4:-missing} (ratio bound $kld_ratio; logs: $out/$arch-ppl-*.log)"
    awk -v k="${lib_plain:-nan}" -v m="$kld_max" 'BEGIN { exit !(k + 0 == k && k < m) }' &&
        pass "$arch: KLD plugin vs plain $lib_plain (< $kld_max) ($((SECONDS - t0)) s)" ||
        fail "$arch: KLD plugin vs plain ${lib_plain:-missing} (bound $kld_max; log: $out/$arch-ppl-plugin-vs-plain.log)"
done

((failures == 0)) || { echo "e2e_archs.sh: $failures check(s) failed (logs: $out)"; exit 1; }
echo "e2e_archs.sh: ${archs[*]}: all checks passed (logs: $out)"
