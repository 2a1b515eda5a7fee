#!/usr/bin/env bash
# The same-build CPU-only baseline of a GGUF file, written into a board profile: plain llama.cpp
# (ORK_MOE=0) on the A76s, llama-bench pp512, pp2048 and tg128, and a perf split of a pp512 run into
# MUL_MAT_ID (ggml's repacked gemv kernels, which run it row by row), MUL_MAT (the repacked gemm
# kernels and ggml_compute_forward_mul_mat: the projections, the router and, without flash attention,
# attention's two matmuls), attention's softmax / flash-attention ops, and the rest of graph compute.
#
#   ggml-patch/cpu-baseline.sh MODEL.gguf [board-profile.json]
#
# Sets in the profile (docs/BOARD.md section 5): cpu_only_reference_tokps (the pp512 rate),
# reference_context (512), mul_mat_id_share (MUL_MAT_ID over graph compute, from perf), each listed in
# `measured` with how; and `cpu_only_baseline` {model, pp512, pp2048, tg128, perf_split}. Without perf
# (or without permission for it: kernel.perf_event_paranoid) the rates are written and the share is
# left as it was, with the reason.
#
# Env: LLAMA_BIN (folder of llama-bench; default: what ggml-patch/build.sh prints, + /bin),
# ORK_BASELINE_CPUS (taskset list, default 4-7: the A76s of an RK3588), ORK_BASELINE_THREADS (default
# 4), ORK_BASELINE_REPS (llama-bench -r, default 3).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
die() { echo "cpu-baseline.sh: error: $*" >&2; exit 1; }
log() { echo "cpu-baseline.sh: $*" >&2; }

model=${1:?usage: cpu-baseline.sh MODEL.gguf [board-profile.json]}
profile=${2:-board-profile.json}
[[ -f $model ]] || die "no model file $model"
[[ -f $profile ]] || die "no profile $profile: run ork-probe board first (docs/BOARD.md section 5)"
cpus=${ORK_BASELINE_CPUS:-4-7}
threads=${ORK_BASELINE_THREADS:-4}
reps=${ORK_BASELINE_REPS:-3}
bin=${LLAMA_BIN:-$(bash "$here/build.sh" | tail -1)/bin}
[[ -x $bin/llama-bench ]] || die "no llama-bench in $bin (set LLAMA_BIN)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

bench=(env ORK_MOE=0 taskset -c "$cpus" "$bin/llama-bench" -m "$model" -t "$threads")
log "llama-bench pp512, pp2048, tg128 on cpus $cpus, $threads threads, $reps repeats"
"${bench[@]}" -p 512,2048 -n 128 -r "$reps" -o json >"$work/bench.json"

split="$work/none"
if ! command -v perf >/dev/null; then
    echo "perf not installed (linux-perf / linux-tools)" >"$split"
elif ! perf record -F 199 --call-graph dwarf,16384 -o "$work/perf.data" -- \
    "${bench[@]}" -p 512 -n 0 -r 1 >/dev/null 2>"$work/perf.err"; then
    echo "perf record failed: $(tail -1 "$work/perf.err")" >"$split"
else
    split="$work/perf.txt"
    log "perf report (cumulative per symbol)"
    perf report -i "$work/perf.data" --children --sort symbol --stdio 2>/dev/null >"$split"
fi

python3 - "$profile" "$model" "$work/bench.json" "$split" <<'EOF'
import json, re, sys

profile_path, model, bench_path, split_path = sys.argv[1:]
profile = json.load(open(profile_path))
rates = {}
for r in json.load(open(bench_path)):
    name = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
    rates[name] = r["avg_ts"]


def children(text, pattern):
    """The cumulative (children) percentage of the symbols matching `pattern` in `perf report
    --children`, summed; inlined copies are inside their callers' and are skipped."""
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+([\d.]+)%\s+\[\.\]\s+(.+?)\s*(-\s+-)?\s*$", line)
        if m and "(inlined)" not in m.group(3) and re.match(pattern, m.group(3)):
            total += float(m.group(1))
    return total


baseline = {"model": model, **rates}
measured = set(profile.get("measured", []))
how = profile.setdefault("how_measured", {})
kept = profile.setdefault("not_measured", {})


def record(name, value, why):
    profile[name] = value
    measured.add(name)
    how[name] = why
    kept.pop(name, None)


command = "ORK_MOE=0 taskset -c CPUS llama-bench -t THREADS"
record("cpu_only_reference_tokps", rates["pp512"], f"{command} -p 512 on {model}")
record("reference_context", 512.0, "the prompt length of cpu_only_reference_tokps")
text = open(split_path).read() if split_path.endswith(".txt") else ""
# ggml's repacked weights (the A76's q4_0_4x4, q4_K_8x4, ...) run MUL_MAT_ID row by row through the
# gemv kernels and a prefill's MUL_MAT through the gemm kernels; the rest of MUL_MAT (the F32 router)
# through ggml_compute_forward_mul_mat.
total = children(text, r"ggml_graph_compute_thread")
ops = {
    "mul_mat_id": children(text, r"(ggml_)?gemv_"),
    "mul_mat": children(text, r"(ggml_)?gemm_") + children(text, r"ggml_compute_forward_mul_mat$"),
    "attention": children(text, r"ggml_compute_forward_(soft_max|flash_attn_ext)$"),
}
share = ops["mul_mat_id"] / total if total > 0 else 0.0
if 0.0 < share < 1.0:
    split = {k: v / total for k, v in ops.items()}
    split["rest"] = max(0.0, 1.0 - sum(split.values()))
    baseline["perf_split"] = split
    record("mul_mat_id_share", split["mul_mat_id"],
           "perf --children: the repacked gemv kernels over ggml_graph_compute_thread, "
           f"{command} -p 512 -n 0 on {model}")
else:
    reason = open(split_path).read().strip() if not split_path.endswith(".txt") else \
        "no gemv kernel under ggml_graph_compute_thread in perf's report (no symbols?)"
    baseline["perf_split"] = None
    kept["mul_mat_id_share"] = f"cpu-baseline.sh could not split the run: {reason}"
profile["measured"] = sorted(measured)
profile["cpu_only_baseline"] = baseline
json.dump(profile, open(profile_path, "w"), indent=1)
print(json.dumps(baseline, indent=1))
EOF
log "wrote $profile"
