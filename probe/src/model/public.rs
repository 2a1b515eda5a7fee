//! The model against every public measurement it can reproduce: single `rknn_matmul_run`s at
//! published shapes, RKLLM's whole-model prefill, the CPU-only figures it is built or calibrated
//! on. Each is modelled under the range's low, mid and high parameter sets.

use super::range::params_at;
use ork_moe::npu::Primitive;
use ork_probe::timeline::price::{price, Core};
use ork_probe::timeline::{CpuRates, ModelShape, Params, Settings, Work};

/// One public figure and the model's at the three sets.
pub struct Comparison {
    pub figure: &'static str,
    pub unit: &'static str,
    pub measured: f64,
    pub modelled: [f64; 3],
    /// Where the figure comes from, and how the model relates to it.
    pub source: &'static str,
}

/// One `rknn_matmul_run` of `m × k × n` on one NPU core (µs).
fn run_us(p: &Params, m: usize, k: usize, n: usize) -> f64 {
    let (m, k, n) = (m as u32, k as u32, n as u32);
    let run = Work::Run {
        primitive: Primitive::RunI8,
        m,
        k,
        n,
    };
    price(&run, Core::Npu, &p.at_dmc()).0
}

/// A dense transformer's prefill of `tokens` on the NPU's 3 cores, its projections only (each
/// weight's N split in three), in ms: `matmuls` is one layer's (K, N).
fn prefill_ms(p: &Params, tokens: usize, layers: usize, matmuls: &[(usize, usize)]) -> f64 {
    let per_layer: f64 = matmuls
        .iter()
        .map(|&(k, n)| run_us(p, tokens, k, (n / 3).div_ceil(32) * 32))
        .sum();
    per_layer * layers as f64 / 1e3
}

/// A published whole-model figure: its name, its value, the model's layers and one layer's
/// projections (K, N).
type WholeModel = (&'static str, f64, usize, &'static [(usize, usize)]);

/// RKLLM w8a8 time to first token for a 128-token prompt (airockchip/rknn-llm benchmark.md,
/// RKLLM 1.3.0): name, ms, layers, one layer's projections (K, N) from each model's config.
const RKLLM: [WholeModel; 3] = [
    (
        "RKLLM TTFT Qwen3-0.6B, 128 tokens (ms)",
        199.0,
        28,
        &[
            (1024, 2048),
            (1024, 1024),
            (1024, 1024),
            (2048, 1024),
            (1024, 6144),
            (3072, 1024),
        ],
    ),
    (
        "RKLLM TTFT Phi-3-mini 3.8B, 128 tokens (ms)",
        1017.0,
        32,
        &[(3072, 9216), (3072, 3072), (3072, 16384), (8192, 3072)],
    ),
    (
        "RKLLM TTFT ChatGLM3-6B, 128 tokens (ms)",
        1353.0,
        28,
        &[(4096, 4608), (4096, 4096), (4096, 27392), (13696, 4096)],
    ),
];

/// Every comparison, at the range's sets of `settings`.
pub fn comparisons(settings: &Settings) -> Vec<Comparison> {
    let sets = [0, 1, 2].map(|at| params_at(settings, at));
    let each = |f: &dyn Fn(&Params) -> f64| [f(&sets[0]), f(&sets[1]), f(&sets[2])];
    let run = |figure, measured, source, (m, k, n)| Comparison {
        figure,
        unit: "us",
        measured,
        modelled: each(&|p| run_us(p, m, k, n)),
        source,
    };
    let qwen3 = ModelShape::QWEN3_30B_A3B;
    let cpu_only =
        |p: &Params, tokens| CpuRates::from_reference(p).cpu_only_tokps(&qwen3, tokens, p);
    let q = &settings.params;
    let mut rows = vec![
        run(
            "rknn_matmul_run, tiny int8 (32x32x32), one core",
            33.5,
            "30-37 us median (wtwver/rk3588-matmul-bench result.csv); 32.9 us fixed per run \
             (unimatrix099/rk-llama.cpp RKNPU2-deployment-guide.md): run_us_floor",
            (32, 32, 32),
        ),
        run(
            "rknn_matmul_run M=128 K=2048 N=512, one core",
            488.0,
            "wtwver/rk3588-matmul-bench result.csv, int8, native layout",
            (128, 2048, 512),
        ),
        run(
            "rknn_matmul_run M=128 K=2048 N=1024, one core",
            855.0,
            "same source",
            (128, 2048, 1024),
        ),
        run(
            "rknn_matmul_run M=128 K=4096 N=4096, one core",
            6480.0,
            "same source",
            (128, 4096, 4096),
        ),
    ];
    for (figure, ms, layers, matmuls) in RKLLM {
        rows.push(Comparison {
            figure,
            unit: "ms",
            measured: ms,
            modelled: each(&|p| prefill_ms(p, 128, layers, matmuls)),
            source: "airockchip/rknn-llm benchmark.md; modelled: the projections alone on 3 \
                     cores (attention, norms, lm_head left out), so a lower bound",
        });
    }
    rows.extend([
        Comparison {
            figure: "CPU-only reference, RK3588 (tok/s)",
            unit: "tok/s",
            measured: q.cpu_only_reference_tokps,
            modelled: each(&|p| cpu_only(p, p.reference_context as usize)),
            source: "cpu_only_reference_tokps at reference_context (default: Qwen3.6-35B-A3B \
                     pp64, oRKLLM/ork-driver MOE_LAYER_BLOCK_WIP.md); reproduced by construction",
        },
        Comparison {
            figure: "CPU-only pp512 / pp4096, Pi 5 Qwen3-30B-A3B Q3_K_S",
            unit: "x",
            measured: q.pi5_pp512_tokps / q.pi5_pp4096_tokps,
            modelled: each(&|p| cpu_only(p, 512) / cpu_only(p, 4096)),
            source: "geerlingguy/ai-benchmarks#47; reproduced by calibration (the attention \
                     factor)",
        },
        Comparison {
            figure: "CPU-only pp512, Pi 5 x 0.978 clock (tok/s)",
            unit: "tok/s",
            measured: q.pi5_pp512_tokps * q.pi5_clock_scale,
            modelled: each(&|p| cpu_only(p, 512)),
            source: "geerlingguy/ai-benchmarks#47 scaled by pi5_clock_scale; not fitted: the \
                     two CPU-only references disagree by this ratio",
        },
    ]);
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_runs_are_modelled_within_a_factor_of_two_and_in_order() {
        let settings = Settings::default();
        for c in comparisons(&settings) {
            let [low, mid, high] = c.modelled;
            // The low set is the slow one: more time, fewer tok/s.
            match c.unit {
                "us" | "ms" => assert!(low >= mid && mid >= high, "{}: {:?}", c.figure, c.modelled),
                _ => {}
            }
            if c.unit == "us" {
                let ratio = mid / c.measured;
                assert!(
                    (0.5..2.0).contains(&ratio),
                    "{}: {mid} vs {}",
                    c.figure,
                    c.measured
                );
            }
        }
    }
}
