#!/usr/bin/env bash
# Remakes tests/data/repack/: the pinned ggml (llama-cpp-python==0.3.36's vendor/llama.cpp, unpatched)
# repacks the same plain blocks once per instruction-set variant, and the repacked bytes are kept.
#
# Each variant builds ggml-base + ggml-cpu (static, GGML_NATIVE=OFF, AMX off) with the flags that make
# ggml choose one family of layouts, links tools/repack_vectors/repack_vectors.cpp against it and runs it:
#   x86-avx2     AVX2                         natively
#   x86-avx512   AVX2 + AVX-512               natively (skipped when this CPU has no AVX-512)
#   arm-dotprod  armv8.2-a+dotprod+fp16       qemu-aarch64-static -cpu cortex-a76 (RK3588's big core)
#   arm-i8mm     armv8.6-a+dotprod+i8mm+fp16  qemu-aarch64-static -cpu max
#   arm-sve256   the above +sve               qemu-aarch64-static -cpu max with 256-bit vectors
# The program reports the layout ggml attached to each tensor; a layout two variants both produce must
# come out byte-identical (checked here). SOURCES.txt records which variant made what.
#
# Needs cmake, ninja, g++, and for the aarch64 variants g++-aarch64-linux-gnu and qemu-user-static.
# Env: LLAMA_SRC (a pinned llama.cpp tree; default: extracted from the sdist ggml-patch/build.sh caches),
#      ORK_REPACK_BUILD (scratch dir, default /tmp/repack-build), ORK_CACHE (as for build.sh).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=${ORK_REPACK_BUILD:-/tmp/repack-build}
out=$repo/tests/data/repack
tool=$repo/tools/repack_vectors/repack_vectors.cpp
sdist_name=llama_cpp_python-0.3.36.tar.gz
sdist_sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

die() { echo "make.sh: error: $*" >&2; exit 1; }
log() { echo "make.sh: $*" >&2; }
mkdir -p "$work"

src=${LLAMA_SRC:-}
if [[ -z $src ]]; then
    sdist=${ORK_CACHE:-$HOME/.cache/ork-moe}/sdist/$sdist_name
    [[ -f $sdist ]] || die "$sdist missing: run ggml-patch/build.sh once (it downloads it) or set LLAMA_SRC"
    echo "$sdist_sha256  $sdist" | sha256sum -c --status || die "$sdist: sha256 mismatch"
    src=$work/llama.cpp
    if [[ ! -f $src/.extracted ]]; then
        log "extracting the pinned llama.cpp into $src"
        rm -rf "$src" "$work/tmp" && mkdir -p "$work/tmp"
        tar -xzf "$sdist" -C "$work/tmp" "llama_cpp_python-0.3.36/vendor/llama.cpp"
        mv "$work/tmp/llama_cpp_python-0.3.36/vendor/llama.cpp" "$src" && rm -rf "$work/tmp"
        touch "$src/.extracted"
    fi
fi
ggml=$src/ggml

common=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF
        -DGGML_LLAMAFILE=OFF -DGGML_CPU_KLEIDIAI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
        -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF)
x86=(-DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
     -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
arm=(-DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc
     -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++)

# variant name | C++ compiler | cmake flags | runner (empty: native)
variant() {
    local name=$1 cxx=$2 flags=$3 runner=$4 dir=$work/$1
    log "== $name"
    if [[ ! -f $dir/build.ninja ]]; then
        # shellcheck disable=SC2086 # flags is a word list
        cmake -S "$src" -B "$dir" "${common[@]}" $flags >"$dir.configure.log" 2>&1 ||
            { tail -20 "$dir.configure.log" >&2; die "$name: cmake configure failed"; }
    fi
    ninja -C "$dir" ggml-base ggml-cpu >"$dir.build.log" 2>&1 ||
        { tail -20 "$dir.build.log" >&2; die "$name: build failed"; }
    # The internal headers give the tool ggml::cpu::tensor_traits (what ggml stores in tensor->extra).
    "$cxx" -std=c++17 -O2 -Wall -Wextra -Werror -I"$ggml/include" -isystem "$ggml/src" -isystem "$ggml/src/ggml-cpu" \
        "$tool" "$dir/ggml/src/libggml-cpu.a" "$dir/ggml/src/libggml-base.a" -static -pthread -lm \
        -o "$dir/repack_vectors" || die "$name: cannot build the tool"
    rm -rf "$dir/out" && mkdir -p "$dir/out"
    # shellcheck disable=SC2086 # runner is a command line
    $runner "$dir/repack_vectors" "$dir/out" >"$dir/out/report.txt" 2>/dev/null || die "$name: the tool failed"
    {
        echo "## $name"
        echo "cmake: $flags"
        echo "run:   ${runner:-native}"
        cat "$dir/out/report.txt"
        echo
    } >>"$work/SOURCES.txt"
    variants+=("$dir/out")
}

variants=()
: >"$work/SOURCES.txt"
variant x86-avx2 g++ "${x86[*]} -DGGML_AVX512=OFF" ""
if grep -qw avx512f /proc/cpuinfo; then
    variant x86-avx512 g++ "${x86[*]} -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON" ""
else
    log "this CPU has no AVX-512: skipping x86-avx512"
fi
command -v aarch64-linux-gnu-g++ >/dev/null || die "aarch64-linux-gnu-g++ missing (apt-get install g++-aarch64-linux-gnu)"
command -v qemu-aarch64-static >/dev/null || die "qemu-aarch64-static missing (apt-get install qemu-user-static)"
variant arm-dotprod aarch64-linux-gnu-g++ "${arm[*]} -DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod+fp16" \
    "qemu-aarch64-static -cpu cortex-a76"
variant arm-i8mm aarch64-linux-gnu-g++ "${arm[*]} -DGGML_CPU_ARM_ARCH=armv8.6-a+dotprod+i8mm+fp16" \
    "qemu-aarch64-static -cpu max"
variant arm-sve256 aarch64-linux-gnu-g++ "${arm[*]} -DGGML_CPU_ARM_ARCH=armv8.6-a+dotprod+i8mm+fp16+sve" \
    "qemu-aarch64-static -cpu max,sve-default-vector-length=32"

# Merge: one copy of each file; a file two variants wrote must be the same bytes.
rm -rf "$work/merged" && mkdir -p "$work/merged"
for dir in "${variants[@]}"; do
    for f in "$dir"/*.bin; do
        dst=$work/merged/$(basename "$f")
        if [[ -f $dst ]]; then
            cmp -s "$f" "$dst" || die "$(basename "$f") differs between variants ($f)"
        else
            cp "$f" "$dst"
        fi
    done
done
mkdir -p "$out"
rm -f "$out"/*.bin
cp "$work/merged"/*.bin "$out/"
cp "$work/SOURCES.txt" "$out/SOURCES.txt"
log "wrote $(ls "$out"/*.bin | wc -l) files ($(du -sh "$out" | cut -f1)) to $out"
