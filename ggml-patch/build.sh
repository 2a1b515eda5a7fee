#!/usr/bin/env bash
# Build the ork-moe-patched llama.cpp pinned by PyPI's llama-cpp-python==0.3.36 sdist
# (vendor/llama.cpp = ggml-org/llama.cpp@0c1e57098, ggml 0.25.3).
#
# Everything lands outside the clone, keyed by the hash of the patch series and build flags, so a fresh
# clone on the same machine (CI) reuses it:  ${ORK_CACHE:-$HOME/.cache/ork-moe}/llama.cpp-<hash>/{src,build}
# Idempotent: a second run only re-checks; an interrupted run resumes. The last stdout line is the build
# directory (binaries in <it>/bin).
#
# Env: ORK_CACHE (cache root), ORK_BUILD_JOBS (ninja -j, default nproc), ORK_LLAMA_TARGETS (override targets).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${ORK_CACHE:-$HOME/.cache/ork-moe}
sdist_version=0.3.36
sdist_name=llama_cpp_python-$sdist_version.tar.gz
sdist_sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
targets=${ORK_LLAMA_TARGETS:-llama-completion llama-perplexity llama-bench llama-quantize test-backend-ops ggml-rpc-server}
cmake_flags=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=ON -DLLAMA_CURL=OFF -DGGML_RPC=ON)

# Instruction sets. On x86-64, GGML_NATIVE=ON also turns on ggml's AMX matmul wherever /proc/cpuinfo lists
# amx_tile/amx_int8, and on some such VMs that path dies of SIGILL (tileloadd in ggml_backend_amx_mul_mat)
# although AMX programs of our own run there. So x86-64 builds name every instruction set the CPU lists,
# AMX never; the list is part of the cache key, so a machine with other flags gets its own build.
# aarch64 (the RK3588 board) has no AMX: -mcpu=native as usual.
x86_isa_flags() {
    local f
    f=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
    has() { local x; for x; do [[ $f == *" $x "* ]] || return 1; done; }
    printf '%s\n' -DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
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
case $(uname -m) in
x86_64) mapfile -t isa_flags < <(x86_isa_flags) ;;
*) isa_flags=(-DGGML_NATIVE=ON) ;;
esac
cmake_flags+=("${isa_flags[@]}")

die() { echo "build.sh: error: $*" >&2; exit 1; }
log() { echo "build.sh: $*" >&2; }

need_tools() {
    local missing=()
    command -v cmake >/dev/null || missing+=(cmake)
    command -v ninja >/dev/null || missing+=(ninja-build)
    command -v c++ >/dev/null || missing+=(g++)
    command -v patch >/dev/null || missing+=(patch)
    command -v curl >/dev/null || missing+=(curl)
    if ((${#missing[@]})); then
        if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
            log "installing ${missing[*]}"
            apt-get install -y "${missing[@]}" >&2 || { apt-get update >&2 && apt-get install -y "${missing[@]}" >&2; } ||
                die "apt-get install ${missing[*]} failed"
        else
            die "missing ${missing[*]}: install them (e.g. sudo apt-get install -y ${missing[*]})"
        fi
    fi
    python3 -m pip --version >/dev/null 2>&1 || die "python3 with pip is required (to download the sdist)"
    # The tiny-model generator (tools/make_tiny_qwen3moe.py) runs next to this build in e2e.sh.
    python3 -c 'from importlib.metadata import version; import numpy; assert version("gguf") == "0.19.0"' 2>/dev/null ||
        python3 -m pip install -q gguf==0.19.0 numpy >&2 || die "pip install gguf==0.19.0 numpy failed"
}

need_tools
shopt -s nullglob
patches=("$here"/*.patch)
((${#patches[@]})) || die "no patches in $here"
# The tree and build are keyed by the sdist and the cmake flags; a changed patch series is swapped in
# place (reverse the applied one, apply the new one) so ninja rebuilds only the files it touches.
key=$(echo "$sdist_sha256 ${cmake_flags[*]}" | sha256sum | cut -c1-12)
root=$cache/llama.cpp-$key
src=$root/src
build=$root/build
applied=$root/applied.patch
mkdir -p "$cache/sdist" "$root"

# One builder per key at a time (CI and a developer may share the cache).
exec 9>"$root/.lock"
flock 9

sdist=$cache/sdist/$sdist_name
if [[ ! -f $sdist ]] || ! echo "$sdist_sha256  $sdist" | sha256sum -c --status; then
    log "downloading $sdist_name from PyPI"
    rm -f "$sdist"
    # The file's address from the simple index (what pip reads). `pip download --no-binary :all:` would
    # also prepare the sdist's metadata, building cmake and ninja from source first where no wheel is at hand.
    index=${PIP_INDEX_URL:-https://pypi.org/simple}
    url=$(curl -fsSL "${index%/}/llama-cpp-python/" | grep -o "href=\"[^\"]*/$sdist_name[^\"]*\"" | head -1 |
        sed 's/^href="//; s/"$//; s/&amp;/\&/g') || true
    if [[ -n $url ]]; then
        curl -fsSL -o "$sdist" "$url" || rm -f "$sdist"
    fi
    [[ -f $sdist ]] || python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$sdist_version" -d "$cache/sdist" >&2 ||
        die "cannot download llama-cpp-python==$sdist_version from PyPI (network? index?)"
    echo "$sdist_sha256  $sdist" | sha256sum -c --status || die "$sdist: sha256 mismatch"
fi

if [[ -f $src/.ork-extracted && -f $applied ]] && ! cat "${patches[@]}" | cmp -s - "$applied"; then
    log "patch series changed: reverting the applied one"
    patch -d "$src" -p1 -R --quiet <"$applied" >&2 && rm "$applied" || rm -f "$src/.ork-extracted"
fi
if [[ ! -f $src/.ork-extracted ]]; then
    log "extracting vendor/llama.cpp into $src"
    rm -rf "$src" "$build" "$root/tmp" "$applied"
    mkdir -p "$root/tmp"
    tar -xzf "$sdist" -C "$root/tmp" "llama_cpp_python-$sdist_version/vendor/llama.cpp" ||
        die "cannot extract vendor/llama.cpp from $sdist"
    mv "$root/tmp/llama_cpp_python-$sdist_version/vendor/llama.cpp" "$src"
    rm -rf "$root/tmp"
    rm -f "$src/.git" # a dangling gitlink in the sdist; without it cmake reports the commit as unknown
    touch "$src/.ork-extracted"
fi
if [[ ! -f $applied ]]; then
    for p in "${patches[@]}"; do
        log "applying $(basename "$p")"
        patch -d "$src" -p1 --forward --quiet <"$p" >&2 ||
            { rm -f "$src/.ork-extracted"; die "patch $(basename "$p") does not apply"; }
    done
    cat "${patches[@]}" >"$applied"
fi

# Configured with exactly these flags, one per line (a cache written by other flags is configured again).
configured=$root/configured-flags
if [[ ! -f $build/build.ninja ]] || ! printf '%s\n' "${cmake_flags[@]}" | cmp -s - "$configured"; then
    log "configuring $build"
    rm -f "$configured"
    cmake -S "$src" -B "$build" "${cmake_flags[@]}" >"$root/configure.log" 2>&1 ||
        { tail -30 "$root/configure.log" >&2; die "cmake configure failed (log: $root/configure.log)"; }
    printf '%s\n' "${cmake_flags[@]}" >"$configured"
fi

log "building $targets (log: $root/build.log)"
# shellcheck disable=SC2086 # targets is a word list
ninja -C "$build" -j "${ORK_BUILD_JOBS:-$(nproc)}" $targets >"$root/build.log" 2>&1 ||
    { tail -30 "$root/build.log" >&2; die "ninja build failed (log: $root/build.log)"; }
for t in $targets; do
    [[ -x $build/bin/$t ]] || die "$build/bin/$t missing after the build"
done
echo "$build"
