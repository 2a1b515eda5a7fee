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
targets=${ORK_LLAMA_TARGETS:-llama-completion llama-perplexity llama-bench llama-quantize test-backend-ops ggml-rpc-server}
cmake_flags=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=ON -DLLAMA_CURL=OFF -DGGML_RPC=ON)

die() { echo "build.sh: error: $*" >&2; exit 1; }
log() { echo "build.sh: $*" >&2; }
# shellcheck source=common.sh
source "$here/common.sh"
cache=$ork_cache
# Instruction sets (common.sh: on x86-64 every set the CPU lists, AMX never).
mapfile -t isa_flags < <(ork_isa_flags)
cmake_flags+=("${isa_flags[@]}")

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
mapfile -t patches < <(ork_patches)
((${#patches[@]})) || die "no patches in $here"
# The tree and build are keyed by the sdist and the cmake flags; a changed patch series is swapped in
# place (reverse the applied one, apply the new one) so ninja rebuilds only the files it touches.
key=$(echo "$sdist_sha256 ${cmake_flags[*]}" | sha256sum | cut -c1-12)
root=$cache/llama.cpp-$key
src=$root/src
build=$root/build
applied=$root/applied.patch
mkdir -p "$root"

# One builder per key at a time (CI and a developer may share the cache).
exec 9>"$root/.lock"
flock 9

sdist=$(ork_fetch_sdist)

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
