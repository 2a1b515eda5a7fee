#!/usr/bin/env bash
# ggml's reference dequantization and quantizers for the quant layer's tests: builds tools/ggml_quants.c
# against ggml/src/ggml-quants.c of the pinned sdist alone (a few seconds; no llama.cpp build) and runs it.
#
#   bash tools/ggml_quants.sh check      # tests/data/quant/<type>.f32 (gguf's) == ggml's C dequantization
#   bash tools/ggml_quants.sh weights    # tests/data/quant/ggml/<type>.blocks: weights quantized by ggml
#   bash tools/ggml_quants.sh run ARGS   # the program itself (see tools/ggml_quants.c)
#
# Env: ORK_CACHE (cache root, as ggml-patch/build.sh).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
die() { echo "ggml_quants.sh: error: $*" >&2; exit 1; }
log() { echo "ggml_quants.sh: $*" >&2; }
# shellcheck source=../ggml-patch/common.sh
source "$repo/ggml-patch/common.sh"

root=$ork_cache/ggml-quants-${sdist_sha256:0:12}
exe=$root/ggml_quants
if [[ ! -x $exe || $here/ggml_quants.c -nt $exe ]]; then
    sdist=$(ork_fetch_sdist)
    mkdir -p "$root"
    tar -xzf "$sdist" -C "$root" --strip-components=4 \
        "llama_cpp_python-$sdist_version/vendor/llama.cpp/ggml/src" \
        "llama_cpp_python-$sdist_version/vendor/llama.cpp/ggml/include"
    # -ffp-contract=off: the source's IEEE semantics, which the Rust reference follows.
    cc -O2 -std=gnu11 -ffp-contract=off -w -I"$root/include" -I"$root/src" -o "$exe" \
        "$here/ggml_quants.c" "$root/src/ggml-quants.c" -lm
fi

data=$repo/tests/data/quant
case ${1:-} in
check)
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    status=0
    for blocks in "$data"/*.blocks; do
        name=$(basename "$blocks" .blocks)
        "$exe" dequantize "$name" "$blocks" "$tmp/$name.f32"
        if cmp -s "$tmp/$name.f32" "$data/$name.f32"; then
            echo "$name: gguf's vectors equal ggml's dequantization"
        else
            echo "$name: DIFFERS from ggml's dequantization" && status=1
        fi
    done
    exit $status
    ;;
weights)
    # 16 rows of K = 1024 per type, half N(0, 1), half U(-1, 1).
    mkdir -p "$data/ggml"
    for name in q4_0 q4_1 q5_0 q5_1 q8_0 q2_K q3_K q4_K q5_K q6_K iq2_xxs iq2_xs iq2_s iq3_xxs iq3_s iq1_s iq1_m \
                iq4_nl iq4_xs mxfp4; do
        "$exe" weights "$name" 1024 16 20261204 "$data/ggml/$name.blocks"
        echo "$name: $(stat -c %s "$data/ggml/$name.blocks") bytes"
    done
    ;;
run)
    shift
    exec "$exe" "$@"
    ;;
*)
    die "usage: ggml_quants.sh check | weights | run ARGS"
    ;;
esac
