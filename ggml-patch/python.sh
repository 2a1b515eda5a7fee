#!/usr/bin/env bash
# llama-cpp-python with the ork-moe patch: installs PyPI's llama-cpp-python==0.3.36 sdist (the same one whose
# vendor/llama.cpp build.sh builds) with the patch series applied to its vendor/llama.cpp, into a venv
# cached outside the clone, then checks that `from llama_cpp import Llama` runs the hook.
#
#   ggml-patch/python.sh [path/to/libork_moe.so]      (default target/release/libork_moe.so)
#
# Install: ${ORK_CACHE:-$HOME/.cache/ork-moe}/python-<key>/venv, keyed by the sdist, the patch series, the
# cmake flags (CMAKE_ARGS, which llama-cpp-python passes to cmake: common.sh's instruction sets, AMX never
# on x86-64, -DLLAVA_BUILD=OFF, then the caller's own CMAKE_ARGS) and the Python version. Idempotent; one
# installer per key at a time. Compiles llama.cpp the first time (several minutes).
# Check (skipped with ORK_PY_CHECK=0): on the tiny qwen3moe models (Q4_0, Q4_K_M; common.sh, cached),
# 32 greedy token ids with ORK_MOE_PLUGIN=<lib> ORK_MOE_STATS=1 ORK_MIN_ROWS=0 (prefill and decode calls
# both go to the library) must equal those with ORK_MOE=0, the plugin must report itself active and its
# counters must show handled calls.
# The last stdout line is the venv's python. Env: ORK_CACHE, ORK_PY_CHECK, ORK_PY_THREADS (default 2),
# CMAKE_ARGS (extra cmake flags), ORK_BUILD_JOBS (parallel compile jobs, default nproc).
#
# ORK_PY_LLAMA_BUILD=<dir> (a build.sh build directory, e.g. `$(bash ggml-patch/build.sh | tail -1)`)
# installs only the Python package (-DLLAMA_BUILD=OFF: nothing compiled, seconds) and has it load that
# build's patched libllama.so (llama-cpp-python's LLAMA_CPP_LIB_PATH): one patched llama.cpp for the
# command-line tools and Python alike. CI uses this; the default compiles a second copy into the venv.
set -euo pipefail
# Its check counts the calls the library handled: every call, unless the caller chooses another ORK_DISPATCH
# (auto, the default, leaves some to ggml to time its path).
export ORK_DISPATCH=${ORK_DISPATCH:-always}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
die() { echo "python.sh: error: $*" >&2; exit 1; }
log() { echo "python.sh: $*" >&2; }
# shellcheck source=common.sh
source "$here/common.sh"

lib=${1:-$repo/target/release/libork_moe.so}
threads=${ORK_PY_THREADS:-2}
mapfile -t isa_flags < <(ork_isa_flags)
cmake_args="${isa_flags[*]} -DLLAVA_BUILD=OFF${CMAKE_ARGS:+ $CMAKE_ARGS}"
if [[ -n ${ORK_PY_LLAMA_BUILD:-} ]]; then
    shared=$(cd "$ORK_PY_LLAMA_BUILD" && pwd)/bin
    [[ -f $shared/libllama.so ]] || die "$shared/libllama.so missing (ORK_PY_LLAMA_BUILD must be a build.sh build)"
    # The Python package only: its C library is the patched build's.
    cmake_args="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF"
    export LLAMA_CPP_LIB_PATH=$shared
fi
mapfile -t patches < <(ork_patches)
((${#patches[@]})) || die "no patches in $here"
python3 -c 'import venv' 2>/dev/null || die "python3 with the venv module is required (Debian: apt-get install python3-venv)"

py_version=$(python3 -c 'import sys; print(sys.implementation.name, sys.version)')
key=$( (echo "$sdist_sha256 $cmake_args $py_version"; cat "${patches[@]}") | sha256sum | cut -c1-12)
root=$ork_cache/python-$key
venv=$root/venv
mkdir -p "$root"
exec 9>"$root/.lock"
flock 9

if [[ ! -f $venv/.ork-installed ]]; then
    sdist=$(ork_fetch_sdist)
    rm -rf "$venv" "$root/tmp"
    mkdir -p "$root/tmp"
    log "extracting $sdist_name and applying the patch series to its vendor/llama.cpp"
    tar -xzf "$sdist" -C "$root/tmp"
    pkg=$root/tmp/llama_cpp_python-$sdist_version
    rm -f "$pkg/vendor/llama.cpp/.git" # a dangling gitlink, as in build.sh
    for p in "${patches[@]}"; do
        patch -d "$pkg/vendor/llama.cpp" -p1 --forward --quiet <"$p" >&2 || die "patch $(basename "$p") does not apply"
    done
    python3 -m venv "$venv"
    log "pip install (CMAKE_ARGS=$cmake_args; log: $root/install.log)"
    t0=$SECONDS
    CMAKE_ARGS=$cmake_args CMAKE_BUILD_PARALLEL_LEVEL=${ORK_BUILD_JOBS:-$(nproc)} \
        "$venv/bin/python" -m pip install --no-cache-dir "$pkg" >"$root/install.log" 2>&1 ||
        { tail -30 "$root/install.log" >&2; die "pip install failed (log: $root/install.log)"; }
    log "installed in $((SECONDS - t0)) s"
    rm -rf "$root/tmp"
    touch "$venv/.ork-installed"
fi
"$venv/bin/python" -c 'import llama_cpp; print("llama_cpp", llama_cpp.__version__)' >&2 ||
    die "the installed llama_cpp does not import"

if [[ ${ORK_PY_CHECK:-1} != 0 ]]; then
    [[ -f $lib ]] || die "plugin library not found: $lib (cargo build --release, or pass its path)"
    lib=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")
    models=$(ork_tiny_models "")
    out=$here/work/python
    rm -rf "$out"
    mkdir -p "$out"
    failures=0
    for q in Q4_0 Q4_K_M; do
        t0=$SECONDS
        run=("$venv/bin/python" "$here/python_check.py" "$models/$q.gguf" 32 "$threads")
        env ORK_MOE=0 "${run[@]}" >"$out/$q-plain.json" 2>"$out/$q-plain.log" ||
            { tail -20 "$out/$q-plain.log" >&2; die "$q: plain run failed"; }
        env ORK_MOE_PLUGIN="$lib" ORK_MOE_STATS=1 ORK_MIN_ROWS=0 "${run[@]}" >"$out/$q-plugin.json" 2>"$out/$q-plugin.log" ||
            { tail -20 "$out/$q-plugin.log" >&2; die "$q: plugin run failed"; }
        stats=$(grep '^ork-moe stats' "$out/$q-plugin.log" || true)
        handled=$(sed -n 's/^ork-moe stats: .* handled \([0-9]*\) .*/\1/p' <<<"$stats")
        if ! grep -q "^ork-moe: plugin active ($lib)" "$out/$q-plugin.log"; then
            echo "FAIL: $q: plugin not active (log: $out/$q-plugin.log)"; failures=$((failures + 1))
        elif [[ ${handled:-0} -eq 0 ]]; then
            echo "FAIL: $q: the plugin handled no call: $stats"; failures=$((failures + 1))
        elif grep -q '^ork-moe' "$out/$q-plain.log"; then
            echo "FAIL: $q: ORK_MOE=0 did not disable the hook (log: $out/$q-plain.log)"; failures=$((failures + 1))
        elif ! verdict=$("$venv/bin/python" "$here/python_check.py" --compare "$out/$q-plain.json" "$out/$q-plugin.json"); then
            echo "FAIL: $q: $verdict (token ids in $out/$q-*.json)"
            failures=$((failures + 1))
        else
            echo "ok: $q: from llama_cpp import Llama: $verdict; $stats ($((SECONDS - t0)) s)"
        fi
    done
    ((failures == 0)) || die "$failures check(s) failed (logs: $out)"
fi
echo "$venv/bin/python"
