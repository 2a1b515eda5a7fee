#!/usr/bin/env bash
# Instructions per 32-weight run of the direct inflate, per type and shape: load-independent figures for
# docs/PERFORMANCE.md.
#   x86:     callgrind over the AVX2 path (valgrind hides AVX-512), collecting only inside
#            inflate_expert_with; total Ir / (calls × runs).
#   aarch64: qemu-aarch64 -cpu cortex-a76 -singlestep (one log line per executed instruction), the count
#            with --calls 3 minus the one with --calls 1, halved, per run, at N = 64.
#
#   tools/inflate_counts.sh x86|aarch64 [TYPES] [KS]
#
# TYPES: comma-separated (default: every type `ork-probe inflate` takes); KS: the K values (default
# "2048 768 4096 1408"; a type whose block does not divide K is skipped). x86 uses N = 768/2048/1408/4096
# as the expert shapes pair them; aarch64 uses N = 64 (qemu is slow). Needs valgrind, or
# qemu-aarch64(-static) and the aarch64 probe (built here into CARGO_TARGET_DIR_ARM, as
# .ci/aarch64-test.sh does).
set -euo pipefail
cd "$(dirname "$0")/.."
arch=${1:?x86 or aarch64}
types=${2:-q4_0,q4_1,q5_0,q5_1,q8_0,q2_K,q3_K,q4_K,q5_K,q6_K,iq4_nl,iq4_xs,mxfp4,iq2_xxs,iq2_xs,iq2_s,iq3_xxs,iq3_s,iq1_s,iq1_m}
ks=${3:-2048 768 4096 1408}
declare -A n_of=([2048]=768 [768]=2048 [4096]=1408 [1408]=4096)
block_of() { case $1 in q4_0|q4_1|q5_0|q5_1|q8_0|iq4_nl|mxfp4) echo 32 ;; *) echo 256 ;; esac; }

printf '%-8s' type; for k in $ks; do printf '%10s' "K=$k"; done; echo
for t in ${types//,/ }; do
    printf '%-8s' "$t"
    for k in $ks; do
        if (( k % $(block_of "$t") )); then printf '%10s' -; continue; fi
        if [ "$arch" = x86 ]; then
            n=${n_of[$k]:-768}
            out=$(mktemp)
            valgrind --tool=callgrind --callgrind-out-file="$out" \
                --toggle-collect='ork_moe::inflate::inflate_expert_with*' \
                target/release/ork-probe inflate --calls 4 --types "$t" --shapes "${k}x$n" >/dev/null 2>&1
            ir=$(callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
            rm -f "$out"
            awk -v ir="$ir" -v k="$k" -v n="$n" 'BEGIN { printf "%10.1f", ir / (4 * k * n / 32) }'
        else
            probe=${CARGO_TARGET_DIR_ARM:-$HOME/.cache/ork-moe/target-arm}/aarch64-unknown-linux-gnu/release/ork-probe
            qemu=$(command -v qemu-aarch64-static || command -v qemu-aarch64)
            count() {
                "$qemu" -cpu cortex-a76 -singlestep -d exec,nochain -D /dev/stdout \
                    "$probe" inflate --calls "$1" --types "$t" --shapes "${k}x64" 2>/dev/null | grep -c '^Trace'
            }
            c3=$(count 3); c1=$(count 1)
            awk -v a="$c3" -v b="$c1" -v k="$k" 'BEGIN { printf "%10.1f", (a - b) / 2 / (k * 64 / 32) }'
        fi
    done
    echo
done
