#!/usr/bin/env bash
# README's coverage table: a synthetic qwen3moe with Qwen3-30B-A3B's per-layer shapes
# (tools/make_tiny_qwen3moe.py: 2 layers, 16 experts) quantized by the pinned llama-quantize to each
# preset, then `ork-probe coverage` over the results: per preset, the share of expert and attention
# bytes whose type the library takes (ork_supports_type of the build it runs).
#
#   tools/coverage_table.sh [PRESET ...]      (default: the presets below)
#
# Env: ORK_LLAMA_BUILD (a build.sh build dir; default: build.sh's), ORK_CACHE. Quantized files are kept in
# ${ORK_CACHE:-~/.cache/ork-moe}/coverage-<generator hash>/ (about 2 GB for all presets).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
die() { echo "coverage_table.sh: error: $*" >&2; exit 1; }
log() { echo "coverage_table.sh: $*" >&2; }
# shellcheck source=../ggml-patch/common.sh
source "$repo/ggml-patch/common.sh"

presets=("$@")
((${#presets[@]})) || presets=(Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M Q5_K_S Q5_K_M Q6_K
    IQ4_NL IQ4_XS IQ3_S IQ3_M MXFP4_MOE)
bin=${ORK_LLAMA_BUILD:-$("$repo/ggml-patch/build.sh" | tail -1)}/bin
dir=$ork_cache/coverage-$(sha256sum <"$repo/tools/make_tiny_qwen3moe.py" | cut -c1-12)
mkdir -p "$dir"
[[ -f $dir/F16.gguf ]] || python3 "$repo/tools/make_tiny_qwen3moe.py" "$dir/F16.gguf" --heads 32 >&2
files=()
for p in "${presets[@]}"; do
    if [[ ! -f $dir/$p.gguf ]]; then
        "$bin/llama-quantize" "$dir/F16.gguf" "$dir/$p.tmp" "$p" >"$dir/$p.log" 2>&1 ||
            { tail -5 "$dir/$p.log" >&2; die "llama-quantize $p failed (log: $dir/$p.log)"; }
        mv "$dir/$p.tmp" "$dir/$p.gguf"
        log "$p quantized"
    fi
    files+=("$dir/$p.gguf")
done
cargo run --quiet --release --manifest-path "$repo/Cargo.toml" -p ork-probe -- coverage "${files[@]}"
