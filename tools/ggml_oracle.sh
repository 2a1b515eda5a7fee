#!/usr/bin/env bash
# Builds tools/ggml_oracle.c against the pinned, patched llama.cpp's ggml (ggml-patch/build.sh,
# cached) and runs it with the given arguments (see the comment at the top of ggml_oracle.c).
# ggml-cpu's generic dot products (ggml/src/ggml-cpu/quants.c) are compiled into the oracle again
# with -ffp-contract=off: the shared library's copy is built with GCC's default contraction, which
# fuses some of their multiply-adds (seen in Q4_1), so it is one compilation of the source, not
# the source's IEEE semantics that src/quant/vec_dot.rs follows.
#
#   bash tools/ggml_oracle.sh vectors tests/data/accuracy/oracle
#   bash tools/ggml_oracle.sh quantize q4_K 1536 in.f32 out.blocks
#
# Env: ORK_LLAMA_BUILD (a llama.cpp build dir instead of build.sh's).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${ORK_LLAMA_BUILD:-$("$here/../ggml-patch/build.sh" | tail -1)}
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
exe=$build/bin/ork-ggml-oracle
if [[ ! -x $exe || $here/ggml_oracle.c -nt $exe || $0 -nt $exe ]]; then
    cc -c -O2 -std=gnu11 -ffp-contract=off -o "$exe-quants.o" "$src/ggml/src/ggml-cpu/quants.c" \
        -I"$src/ggml/include" -I"$src/ggml/src" -I"$src/ggml/src/ggml-cpu"
    cc -O2 -std=c11 -Wall -Wextra -Werror -o "$exe" "$here/ggml_oracle.c" "$exe-quants.o" \
        -I"$src/ggml/include" -L"$build/bin" -lggml-cpu -lggml-base -lm -Wl,-rpath,"$build/bin"
fi
[[ ${1:-} == vectors && -n ${2:-} ]] && mkdir -p "$2"
exec "$exe" "$@"
