# Sourced by build.sh, python.sh and e2e.sh: the pinned sdist and its download, the cmake flags that pick
# the CPU's instruction sets, and the tiny test models. The caller defines die() and log().

ork_cache=${ORK_CACHE:-$HOME/.cache/ork-moe}
sdist_version=0.3.36
sdist_name=llama_cpp_python-$sdist_version.tar.gz
sdist_sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
ork_patch_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# Instruction sets, one cmake flag per line. On x86-64, GGML_NATIVE=ON also turns on ggml's AMX matmul
# wherever /proc/cpuinfo lists amx_tile/amx_int8, and on some such VMs that path dies of SIGILL (tileloadd in
# ggml_backend_amx_mul_mat) although AMX programs of our own run there. So x86-64 builds name every
# instruction set the CPU lists, AMX never; callers put the list in their cache keys, so a machine with
# other flags gets its own build. aarch64 (the RK3588 board) has no AMX: -mcpu=native as usual.
ork_isa_flags() {
    if [[ $(uname -m) != x86_64 ]]; then
        echo -DGGML_NATIVE=ON
        return
    fi
    local f
    f=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
    has() { local x; for x; do [[ $f == *" $x "* ]] || return 1; done; }
    echo -DGGML_NATIVE=OFF
    echo -DGGML_AMX_TILE=OFF
    echo -DGGML_AMX_INT8=OFF
    echo -DGGML_AMX_BF16=OFF
    has sse4_2 && echo -DGGML_SSE42=ON || echo -DGGML_SSE42=OFF
    has avx && echo -DGGML_AVX=ON || echo -DGGML_AVX=OFF
    has avx2 && echo -DGGML_AVX2=ON || echo -DGGML_AVX2=OFF
    has fma && echo -DGGML_FMA=ON || echo -DGGML_FMA=OFF
    has f16c && echo -DGGML_F16C=ON || echo -DGGML_F16C=OFF
    has bmi2 && echo -DGGML_BMI2=ON || echo -DGGML_BMI2=OFF
    has avx_vnni && echo -DGGML_AVX_VNNI=ON || echo -DGGML_AVX_VNNI=OFF
    has avx512f avx512cd avx512vl avx512dq avx512bw && echo -DGGML_AVX512=ON || echo -DGGML_AVX512=OFF
    has avx512vbmi && echo -DGGML_AVX512_VBMI=ON || echo -DGGML_AVX512_VBMI=OFF
    has avx512_vnni && echo -DGGML_AVX512_VNNI=ON || echo -DGGML_AVX512_VNNI=OFF
    has avx512_bf16 && echo -DGGML_AVX512_BF16=ON || echo -DGGML_AVX512_BF16=OFF
}

# The patch series, in order.
ork_patches() {
    local p
    for p in "$ork_patch_dir"/*.patch; do [[ -f $p ]] && echo "$p"; done
}

# Makes sure the pinned sdist is in the cache (checksum verified) and prints its path.
ork_fetch_sdist() {
    local sdist=$ork_cache/sdist/$sdist_name
    mkdir -p "$ork_cache/sdist"
    if [[ ! -f $sdist ]] || ! echo "$sdist_sha256  $sdist" | sha256sum -c --status; then
        log "downloading $sdist_name from PyPI"
        rm -f "$sdist"
        # The file's address from the simple index (what pip reads). `pip download --no-binary :all:` would
        # also prepare the sdist's metadata, building cmake and ninja from source first where no wheel is at
        # hand.
        local index=${PIP_INDEX_URL:-https://pypi.org/simple} url
        url=$(curl -fsSL "${index%/}/llama-cpp-python/" | grep -o "href=\"[^\"]*/$sdist_name[^\"]*\"" | head -1 |
            sed 's/^href="//; s/"$//; s/&amp;/\&/g') || true
        if [[ -n $url ]]; then
            curl -fsSL -o "$sdist" "$url" || rm -f "$sdist"
        fi
        [[ -f $sdist ]] || python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$sdist_version" \
            -d "$ork_cache/sdist" >&2 || die "cannot download llama-cpp-python==$sdist_version from PyPI (network? index?)"
        echo "$sdist_sha256  $sdist" | sha256sum -c --status || die "$sdist: sha256 mismatch"
    fi
    echo "$sdist"
}

# Synthetic qwen3moe models (Q4_0 and Q4_K_M GGUFs, tools/make_tiny_qwen3moe.py quantized by llama-quantize,
# plus the generator's text for llama-perplexity), cached by the hash of the generator and its arguments;
# prints their folder. $1 = a folder holding llama-quantize, or empty to get it from build.sh (built only
# when the models are not cached yet); $2 = the cache folder's name; the rest: the generator's arguments.
ork_qwen3moe_models() {
    local repo models bin=${1:-} name=$2 q t0
    shift 2
    repo=$(cd "$ork_patch_dir/.." && pwd)
    # No arguments: the generator's hash alone (the tiny models' key since before there were arguments)
    models=$ork_cache/$name-$( (cat "$repo/tools/make_tiny_qwen3moe.py"; if (($#)); then echo "$*"; fi) | sha256sum | cut -c1-12)
    mkdir -p "$models"
    (
        flock 8
        if [[ ! -f $models/done ]]; then
            [[ -n $bin ]] || bin=$("$ork_patch_dir/build.sh" | tail -1)/bin
            rm -f "$models"/*.gguf "$models"/*.log "$models/text.txt"
            t0=$SECONDS
            python3 "$repo/tools/make_tiny_qwen3moe.py" "$models/f16.gguf" --text-out "$models/text.txt" "$@" >&2
            log "$name: F16 generated ($(du -h "$models/f16.gguf" | cut -f1)) in $((SECONDS - t0)) s"
            for q in Q4_0 Q4_K_M; do
                t0=$SECONDS
                "$bin/llama-quantize" "$models/f16.gguf" "$models/$q.gguf" "$q" >"$models/quantize-$q.log" 2>&1 ||
                    { tail -20 "$models/quantize-$q.log" >&2; die "llama-quantize $q failed"; }
                log "$name: $q quantized in $((SECONDS - t0)) s"
            done
            rm "$models/f16.gguf"
            touch "$models/done"
        fi
    ) 8>"$models.lock" || exit 1
    echo "$models"
}

# The tiny qwen3moe models (2 layers, 16 experts) of e2e.sh.
ork_tiny_models() {
    ork_qwen3moe_models "${1:-}" tiny-qwen3moe
}

# Characters two files agree on from the start (cmp's exit status 1 on a difference is not a failure here).
common_prefix() {
    { cmp "$1" "$2" 2>/dev/null || true; } | sed -n 's/.* byte \([0-9]*\),.*/\1/p' | awk '{ print $1 - 1 }' | grep . ||
        wc -c <"$1"
}

# llama-perplexity's settings for the runs of e2e_archs.sh's KLD check.
ork_arch_ppl_args=(-c 128 --chunks 4 -b 128)

# A synthetic model of one MoE architecture (tools/make_tiny_moe.py, quantized by llama-quantize to Q4_0, or
# gpt-oss to MXFP4_MOE), cached by the hash of the generators, the arguments and the perplexity settings;
# prints the GGUF's path. Beside it: text.txt (the generator's text) and f16.kld, the F16 model's logits over that
# text (llama-perplexity --kl-divergence-base with ork_arch_ppl_args: the reference of e2e_archs.sh's KLD
# check); the F16 model itself is not kept (several GB over all architectures, the logits 0.3 MB each).
# $1 = a folder holding llama-quantize and llama-perplexity; the rest: the generator's arguments (the
# architecture first).
ork_arch_model() {
    local repo models bin=$1 t0 quant=Q4_0
    shift
    # gpt-oss ships its experts in MXFP4 (llama-quantize's MXFP4_MOE preset); the others are tried as Q4_0
    [[ $1 == gpt-oss ]] && quant=MXFP4_MOE
    repo=$(cd "$ork_patch_dir/.." && pwd)
    models=$ork_cache/tiny-$1-$( (cat "$repo/tools/make_tiny_moe.py" "$repo/tools/make_tiny_qwen3moe.py"
        echo "$* $quant ${ork_arch_ppl_args[*]}") | sha256sum | cut -c1-12)
    mkdir -p "$models"
    (
        flock 8
        if [[ ! -f $models/done ]]; then
            rm -f "$models"/*.gguf "$models"/*.log "$models"/*.kld
            t0=$SECONDS
            python3 "$repo/tools/make_tiny_moe.py" "$1" "$models/f16.gguf" --text-out "$models/text.txt" "${@:2}" >&2
            "$bin/llama-quantize" "$models/f16.gguf" "$models/$quant.gguf" $quant >"$models/quantize-$quant.log" 2>&1 ||
                { tail -20 "$models/quantize-$quant.log" >&2; die "llama-quantize $1 $quant failed"; }
            ORK_MOE=0 "$bin/llama-perplexity" -m "$models/f16.gguf" -f "$models/text.txt" "${ork_arch_ppl_args[@]}" \
                -t "${ORK_E2E_THREADS:-$(nproc)}" --kl-divergence-base "$models/f16.kld" >"$models/f16-logits.log" 2>&1 ||
                { tail -20 "$models/f16-logits.log" >&2; die "llama-perplexity on the F16 $1 failed"; }
            log "$1: generated, quantized to $quant ($(du -h "$models/$quant.gguf" | cut -f1)) and its F16 logits saved in $((SECONDS - t0)) s"
            rm "$models/f16.gguf"
            touch "$models/done"
        fi
    ) 8>"$models.lock" || exit 1
    echo "$models/$quant.gguf"
}
