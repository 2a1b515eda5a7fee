#!/usr/bin/env bash
# llama.cpp end to end at real scale: a synthetic qwen3moe whose inflated experts exceed
# the library's cache, llama-bench pp512 and tg128 plain against the library, interleaved.
#
#   ggml-patch/realscale.sh [path/to/libork_moe.so]   (or ORK_MOE_LIB=...; default target/release/libork_moe.so)
#
# The model: tools/make_tiny_qwen3moe.py --layers 4 --experts 128 --embd-std 1 (Qwen3-30B-A3B's expert
# shapes, 8 of 128 used, every layer routing to all of them), quantized by the pinned llama-quantize, cached
# outside the clone in ${ORK_CACHE:-~/.cache/ork-moe}/realscale-<hash of the generator and its arguments>/
# (first run: about 6 minutes and 4.9 GB of temporary F16 on this 2-core machine; then 1.4-1.5 GB per
# type). With the model cached the whole script takes about 2 minutes on a quiet machine. Its int8 experts
# are 4 × 128 × 3 × 1.5 MiB = 2.3 GiB; llama.cpp runs the last layer's FFN on the output token only, so a
# pp512 ubatch inflates 3 layers' experts (1.7 GiB) through the 1 GiB cache: the default `pin` policy keeps
# what fits, the rest streams, every ubatch.
#
# Per round and type, each mode runs llama-bench -p 512 -n 128 -t THREADS -r REPS, modes interleaved:
#   plain     ORK_MOE=0: ggml alone, its repack on (the experts in CPU_REPACK)
#   norepack  ORK_MOE=0, --repack 0: ggml on the plain blocks. On x86 its tiled K-quant kernels
#             (ggml-cpu/tiled, AVX2/AVX-512 VNNI) then run Q4_K/Q6_K prefill, faster than the repacked path;
#             for Q4_0 and for decode repack is faster. ggml's best is the better of the two per test.
#   library   ORK_MOE_PLUGIN=<lib>, the library's defaults (ORK_CACHE_MB 1024 unless set)
#   library0  the library with --repack 0: it inflates from the plain blocks and ggml's dense matmuls
#             take the tiled kernels; against norepack it is the like-for-like pair of the x86 tiled
#             setting (those kernels are x86-only: on aarch64 ggml's best is repack on)
#   dense0    the library with ORK_DENSE=0: it takes the MUL_MAT_IDs only, ggml runs the attention projections
#   stream    the library with ORK_CACHE_MB=$ORK_REALSCALE_STREAM_MB (default 64): the share of the experts
#             that stays resident is then that of the whole Qwen3-30B-A3B in 1 GiB (47 layers' 27 GB)
#   auto      the library with ORK_DISPATCH=auto (per class of op, the faster of its path and ggml's, as
#             measured in the run; ORK_DISPATCH_CACHE=off so every run starts undecided)
#   slow      the library with ORK_DISPATCH=always and ORK_EMU_SLOW_US=$ORK_REALSCALE_SLOW_US µs added to
#             every emulator submit: a library slower than ggml, as a board that disagrees with the model
#             would be. A pp512 ubatch makes about 540 submits, so the default 4000 adds about 2.2 s, about
#             twice ggml's time on a quiet 2-core machine (slow / plain in the ratios shows what it was)
#   autoslow  the same slowdown under ORK_DISPATCH=auto: what measured dispatch saves of it
# and prints tokens/s and library/ggml ratios, then the library's counters (calls handled; cache hits and
# misses from its debug log) per pp512 ubatch; it fails if an ubatch after the first has no misses (the
# experts did not stream). Logs: ggml-patch/work/realscale/ (git-ignored).
#
# Env: ORK_CACHE, ORK_LLAMA_BUILD (a llama.cpp build dir instead of build.sh's), ORK_REALSCALE_THREADS
# (default nproc), ORK_REALSCALE_ROUNDS (3), ORK_REALSCALE_REPS (3), ORK_REALSCALE_TYPES ("Q4_0 Q4_K_M"),
# ORK_REALSCALE_MODES ("plain norepack library library0 stream"), ORK_REALSCALE_STREAM_MB (64),
# ORK_REALSCALE_SLOW_US (4000), ORK_REALSCALE_PROMPT (512: llama-bench -p). The measured-dispatch comparison:
#   ORK_REALSCALE_MODES="plain library auto slow autoslow" ggml-patch/realscale.sh
# and on a short prompt (64 tokens: 4 rows per expert, which `always` takes only with ORK_MIN_ROWS=2):
#   ORK_MIN_ROWS=2 ORK_REALSCALE_PROMPT=64 ORK_REALSCALE_MODES="plain library auto" ggml-patch/realscale.sh
set -euo pipefail
# `library` and its variants are the library's path on every call; auto and autoslow set measured dispatch.
export ORK_DISPATCH=${ORK_DISPATCH:-always}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
lib=${1:-${ORK_MOE_LIB:-$repo/target/release/libork_moe.so}}
threads=${ORK_REALSCALE_THREADS:-$(nproc)}
rounds=${ORK_REALSCALE_ROUNDS:-3}
reps=${ORK_REALSCALE_REPS:-3}
types=${ORK_REALSCALE_TYPES:-Q4_0 Q4_K_M}
modes=${ORK_REALSCALE_MODES:-plain norepack library library0 stream}
stream_mb=${ORK_REALSCALE_STREAM_MB:-64}
slow_us=${ORK_REALSCALE_SLOW_US:-4000}
prompt=${ORK_REALSCALE_PROMPT:-512}
pp=pp$prompt
layers=4
gen_args=(--layers $layers --experts 128 --embd-std 1)
out=$here/work/realscale
start=$SECONDS

die() { echo "realscale.sh: error: $*" >&2; exit 1; }
log() { echo "realscale.sh: $*" >&2; }
# shellcheck source=common.sh
source "$here/common.sh"
step() { echo; echo "== $* ($((SECONDS - start)) s)"; }
load() { cut -d' ' -f1-3 /proc/loadavg; }

[[ -f $lib ]] || die "plugin library not found: $lib (cargo build --release, or pass its path)"
lib=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")
command -v jq >/dev/null || die "jq is required (apt-get install jq)"
rm -rf "$out"
mkdir -p "$out"

step "build (ggml-patch/build.sh)"
build=${ORK_LLAMA_BUILD:-$("$here/build.sh" | tail -1)}
bin=$build/bin
echo "build dir: $build"

step "real-scale qwen3moe (${gen_args[*]})"
models=$(ork_qwen3moe_models "$bin" realscale "${gen_args[@]}")
ls -l "$models"/*.gguf

# One llama-bench run: $1 = mode, $2 = type, $3 = round. JSON to <name>.json, stderr to <name>.log.
bench() {
    local mode=$1 q=$2 round=$3 name run args=()
    name=$out/$q-$mode-$round
    case $mode in
    plain) run=(env ORK_MOE=0) ;;
    norepack) run=(env ORK_MOE=0) args=(--repack 0) ;;
    library) run=(env ORK_MOE_PLUGIN="$lib" ORK_MOE_STATS=1 ORK_LOG=debug) ;;
    library0) run=(env ORK_MOE_PLUGIN="$lib" ORK_MOE_STATS=1 ORK_LOG=debug) args=(--repack 0) ;;
    dense0) run=(env ORK_MOE_PLUGIN="$lib" ORK_MOE_STATS=1 ORK_LOG=debug ORK_DENSE=0) ;;
    stream) run=(env ORK_MOE_PLUGIN="$lib" ORK_MOE_STATS=1 ORK_LOG=debug ORK_CACHE_MB="$stream_mb") ;;
    auto) run=(env ORK_MOE_PLUGIN="$lib" ORK_MOE_STATS=1 ORK_LOG=debug ORK_DISPATCH=auto ORK_DISPATCH_CACHE=off) ;;
    slow) run=(env ORK_MOE_PLUGIN="$lib" ORK_MOE_STATS=1 ORK_LOG=debug ORK_DISPATCH=always ORK_EMU_SLOW_US="$slow_us") ;;
    autoslow) run=(env ORK_MOE_PLUGIN="$lib" ORK_MOE_STATS=1 ORK_LOG=debug ORK_DISPATCH=auto ORK_DISPATCH_CACHE=off
        ORK_EMU_SLOW_US="$slow_us") ;;
    *) die "unknown mode $mode (plain, norepack, library, library0, dense0, stream, auto, slow, autoslow)" ;;
    esac
    # -v: llama-bench passes the library's log lines (through the patch into ggml's log) to stderr
    "${run[@]}" "$bin/llama-bench" -m "$models/$q.gguf" -p "$prompt" -n 128 -t "$threads" -r "$reps" "${args[@]}" \
        -o json -v >"$name.json" 2>"$name.log" || { tail -20 "$name.log"; die "llama-bench $q $mode failed (log: $name.log)"; }
}
# Tokens/s of test $2 (pp512, tg128) in run file $1: "median mean sd" of the repetitions. Ratios use the
# medians: on a shared machine one disturbed repetition moves a mean a long way.
tps() {
    jq -r --arg t "$2" '.[] | select((if .n_gen > 0 then "tg\(.n_gen)" else "pp\(.n_prompt)" end) == $t)
        | (.samples_ts | sort) as $s | "\($s[($s | length) / 2 | floor]) \(.avg_ts) \(.stddev_ts)"' "$1"
}
median() { tps "$@" | cut -d' ' -f1; }

step "llama-bench -p $prompt -n 128 -t $threads -r $reps: ${modes// /, } interleaved, $rounds round(s)"
echo "(tokens/s: median of the $reps repetitions, then llama-bench's mean ± sd)"
for round in $(seq "$rounds"); do
    for q in $types; do
        for mode in $modes; do
            l0=$(load)
            t0=$SECONDS
            bench "$mode" "$q" "$round"
            printf "%-7s round %s %-9s $pp %7.1f (%7.1f ± %5.1f)  tg128 %6.1f (%6.1f ± %5.1f)  %3d s, load %s\n" \
                "$q" "$round" "$mode" $(tps "$out/$q-$mode-$round.json" "$pp") $(tps "$out/$q-$mode-$round.json" tg128) \
                $((SECONDS - t0)) "$l0"
        done
    done
done

step "library / ggml: per round, then the median over rounds (plain: repack on; norepack: --repack 0)"
for q in $types; do
    for mode in $modes; do
        [[ $mode == plain || $mode == norepack ]] && continue
        for base in $modes; do
            [[ $base == plain || $base == norepack ]] || continue
            for t in "$pp" tg128; do
                ratios=()
                for round in $(seq "$rounds"); do
                    ratios+=("$(awk -v l="$(median "$out/$q-$mode-$round.json" $t)" \
                        -v p="$(median "$out/$q-$base-$round.json" $t)" 'BEGIN { printf "%.2f", l / p }')")
                done
                printf '%-7s %-8s / %-9s %s: %s  | %s\n' "$q" "$mode" "$base" $t "${ratios[*]}" \
                    "$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{ r[NR] = $1 } END { printf "%.2f\n", (NR % 2) ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2 }')"
            done
        done
    done
done

# The last layer's FFN runs on the output token alone (declined: one row per expert), so a pp512 ubatch is
# (layers - 1) × (the gate+up pair call, the down call), 128 experts each; the dense calls (one expert) are not counted.
calls_per_ubatch=$(((layers - 1) * 2))
step "library counters (last round; per pp512 ubatch: $calls_per_ubatch calls of 128 experts)"
for q in $types; do
    for mode in $modes; do
        [[ $mode == plain || $mode == norepack ]] && continue
        log=$out/$q-$mode-$rounds.log
        grep '^ork-moe stats' "$log" | sed "s/^/$q $mode: /" || die "no library stats in $log"
        if [[ $mode == auto || $mode == autoslow ]]; then
            # measured dispatch declines some calls (to time ggml's path, or for good): cache counters do not
            # add up per ubatch, so show the verdicts instead
            grep -E 'dispatch: ' "$log" | sed "s/^.*dispatch: /$q $mode: /" | sort | uniq -c || true
            continue
        fi
        # The debug line of every handled call ends with the cache's running totals.
        awk -v q="$q" -v mode="$mode" -v per="$calls_per_ubatch" '
            /^ork-moe: handled / && / of 128 experts / && /cache hits/ {
                n++
                for (i = 1; i <= NF; i++) { if ($i == "hits") h = $(i + 1); if ($i == "misses") m = $(i + 1) }
                if (n % per == 0) { ub++; printf "%s %s ubatch %d: cache hits %d misses %d\n", q, mode, ub, h - h0, m - m0; h0 = h; m0 = m }
            }
            END { if (!n) { print q " " mode ": no per-call cache counters in the log"; exit 1 } }' "$log" \
            >"$out/counters.txt" || { cat "$out/counters.txt"; die "no library counters in $log"; }
        cat "$out/counters.txt"
        # ubatch 1 is llama-bench's warm-up, which fills the cache
        awk '($4 + 0) > 1 && $NF == 0 { bad = 1 } END { exit bad }' "$out/counters.txt" ||
            die "$q $mode: an ubatch without cache misses: the experts fit the cache, nothing streamed"
    done
done
echo
echo "realscale.sh: done in $((SECONDS - start)) s (logs: $out)"
