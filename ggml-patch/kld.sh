#!/usr/bin/env bash
# KL divergence against an F16 baseline: for the tiny qwen3moe model and its
# --outliers variant (tools/make_tiny_qwen3moe.py), llama-perplexity --kl-divergence of plain ggml
# (Q4_0, Q4_K_M) and of the library on the same files, each against the F16 model's logits.
#
#   ggml-patch/kld.sh [path/to/libork_moe.so] [-- ENV=VALUE ...]
#
# Settings after `--` are passed to the library runs only (e.g. a lever's ORK_* variable once the
# engine has one), so plain ggml, the default library and a lever can be compared on one table.
# Prints one line per (model, quant, path): PPL, KLD mean, delta-p RMS, same-top-token %.
# Models are cached in ${ORK_CACHE:-~/.cache/ork-moe}/tiny-qwen3moe-kld-<script hash>/; logs in
# ggml-patch/work/kld/.
set -euo pipefail
# The library's path on every call it takes (not ggml's for some, as measured dispatch, the default, would).
export ORK_DISPATCH=${ORK_DISPATCH:-always}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
cache=${ORK_CACHE:-$HOME/.cache/ork-moe}
lib=$repo/target/release/libork_moe.so
if [[ $# -gt 0 && $1 != -- ]]; then lib=$1; shift; fi
[[ ${1:-} == -- ]] && shift
lever_env=("$@")
[[ -f $lib ]] || { echo "kld.sh: $lib not found (cargo build --release)" >&2; exit 1; }
lib=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")
build=${ORK_LLAMA_BUILD:-$("$here/build.sh" | tail -1)}
bin=$build/bin
out=$here/work/kld
mkdir -p "$out"
models=$cache/tiny-qwen3moe-kld-$(sha256sum <"$repo/tools/make_tiny_qwen3moe.py" | cut -c1-12)
if [[ ! -f $models/done ]]; then
    rm -rf "$models"
    mkdir -p "$models"
    for variant in plain outliers; do
        flag=(); [[ $variant == outliers ]] && flag=(--outliers)
        python3 "$repo/tools/make_tiny_qwen3moe.py" "$models/$variant-F16.gguf" --text-out "$models/text.txt" "${flag[@]}"
        for q in Q4_0 Q4_K_M; do
            "$bin/llama-quantize" "$models/$variant-F16.gguf" "$models/$variant-$q.gguf" "$q" >"$models/quantize-$variant-$q.log" 2>&1
        done
    done
    touch "$models/done"
fi
ppl=("$bin/llama-perplexity" -f "$models/text.txt" -c 128 --chunks 8 -b 128 -t "${ORK_E2E_THREADS:-2}")
row() { # the last chunk row holds the running means: chunk, PPL, ln ratio, KLD, dp RMS, same top
    grep -E '^ +[0-9]+ +[0-9.]+ ±' "$1" | tail -1 | tr -s ' '
}
printf '%-9s %-7s %-8s %s\n' model quant path "chunk PPL ln(PPL/PPL_f16) KLD dp_RMS same_top"
for variant in plain outliers; do
    base=$out/$variant-F16.kld
    ORK_MOE=0 "${ppl[@]}" -m "$models/$variant-F16.gguf" --kl-divergence-base "$base" >"$out/$variant-F16.log" 2>&1
    for q in Q4_0 Q4_K_M; do
        m=$models/$variant-$q.gguf
        ORK_MOE=0 "${ppl[@]}" -m "$m" --kl-divergence-base "$base" --kl-divergence >"$out/$variant-$q-ggml.log" 2>&1
        printf '%-9s %-7s %-8s %s\n' "$variant" "$q" ggml "$(row "$out/$variant-$q-ggml.log")"
        env ORK_MOE_PLUGIN="$lib" ORK_MOE_STATS=1 "${lever_env[@]}" "${ppl[@]}" -m "$m" --kl-divergence-base "$base" \
            --kl-divergence >"$out/$variant-$q-library.log" 2>&1
        printf '%-9s %-7s %-8s %s   [%s]\n' "$variant" "$q" library "$(row "$out/$variant-$q-library.log")" \
            "$(grep '^ork-moe stats' "$out/$variant-$q-library.log" | sed 's/ork-moe stats: //')"
    done
done
