//! `ork-probe moe`: one whole MUL_MAT_ID call of the qwen3-30b-a3b test-backend-ops case
//! (128 experts, 8 used, N=768, K=2048) at n_tokens 1, 64 and 512, cold and warm expert cache,
//! with the time split by stage.
//!
//! Runs the engine directly (the same code the C entry `ork_mul_mat_id` runs) on the backend of
//! `ORK_BACKEND` with `ORK_THREADS` threads (default 1, to compare with ggml's 1-thread numbers).
//! Routing is uniform top-8 without repeats per token, like test-backend-ops; activations are
//! uniform in [-1, 1]. Stage times are summed over the call's threads; with one thread they add up
//! to the total (minus the call's fixed overhead).

use super::json::{self, fixed};
use super::options::Options;
use ork_moe::moe::desc::{TensorDesc, GGML_TYPE_I32};
use ork_moe::moe::{Config, Engine, Inputs, Stages};
use ork_moe::quant::GgmlType;
use ork_moe::testutil::Rng;
use serde_json::json;
use std::process::ExitCode;
use std::sync::atomic::AtomicU32;
use std::time::Instant;

const N_EXPERT: usize = 128;
pub const N_USED: usize = 8;
pub const K: usize = 2048;
pub const N: usize = 768;
const TOKENS: [usize; 3] = [1, 64, 512];
const TYPES: [GgmlType; 2] = [GgmlType::Q4_0, GgmlType::Q4_K];

/// One call's stage split, wall time, and the emulator's modelled RK3588 time of its submits.
#[derive(Clone, Copy)]
pub struct Measured {
    pub stages: Stages,
    pub total_us: f64,
    pub modelled_us: f64,
}

struct Row {
    ty: GgmlType,
    n_tokens: usize,
    warm: bool,
    m: Measured,
}

/// One gate-projection call: `n_expert` experts of K × N, `N_USED` used per token.
pub struct Case {
    weights: Vec<u8>,
    pub b: Vec<f32>,
    ids: Vec<i32>,
    dst: Vec<AtomicU32>,
    pub n_tokens: usize,
    pub n_expert: usize,
    ty: GgmlType,
}

impl Case {
    /// The qwen3-30b-a3b case: 128 experts.
    fn new(ty: GgmlType, n_tokens: usize, rng: &mut Rng) -> Case {
        Case::with_experts(ty, n_tokens, N_EXPERT, rng)
    }

    /// The same shapes with `n_expert` experts (fewer: less to generate, more rows per expert).
    pub fn with_experts(ty: GgmlType, n_tokens: usize, n_expert: usize, rng: &mut Rng) -> Case {
        let weights = rng.blocks(ty, n_expert * N * K / ty.block_elems(), 0.02);
        let b = (0..K * n_tokens).map(|_| rng.uniform(-1.0, 1.0)).collect();
        let mut ids = Vec::with_capacity(N_USED * n_tokens);
        for _ in 0..n_tokens {
            let mut chosen: Vec<i32> = Vec::with_capacity(N_USED);
            while chosen.len() < N_USED {
                let e = rng.below(n_expert) as i32;
                if !chosen.contains(&e) {
                    chosen.push(e);
                }
            }
            ids.extend(chosen);
        }
        let dst = (0..N * N_USED * n_tokens)
            .map(|_| AtomicU32::new(0))
            .collect();
        Case {
            weights,
            b,
            ids,
            dst,
            n_tokens,
            n_expert,
            ty,
        }
    }

    fn descs(&self) -> [TensorDesc<'_>; 4] {
        let row = self.ty.row_bytes(K).expect("K is whole blocks");
        let t = self.n_tokens as i64;
        let u = N_USED as i64;
        [
            TensorDesc {
                ty: self.ty.id(),
                ne: [K as i64, N as i64, self.n_expert as i64, 1],
                nb: [self.ty.block_bytes(), row, row * N, row * N * self.n_expert],
                addr: self.weights.as_ptr() as usize,
                name: Some("blk.0.ffn_gate_exps.weight"),
            },
            TensorDesc {
                ty: GgmlType::F32.id(),
                ne: [K as i64, 1, t, 1],
                nb: [4, 4 * K, 4 * K, 4 * K * self.n_tokens],
                addr: self.b.as_ptr() as usize,
                name: None,
            },
            TensorDesc {
                ty: GGML_TYPE_I32,
                ne: [u, t, 1, 1],
                nb: [4, 4 * N_USED, self.ids.len() * 4, self.ids.len() * 4],
                addr: self.ids.as_ptr() as usize,
                name: None,
            },
            TensorDesc {
                ty: GgmlType::F32.id(),
                ne: [N as i64, u, t, 1],
                nb: [4, 4 * N, 4 * N * N_USED, self.dst.len() * 4],
                addr: self.dst.as_ptr() as usize,
                name: None,
            },
        ]
    }

    /// Distinct experts the routing uses.
    pub fn used_experts(&self) -> usize {
        let mut ids = self.ids.clone();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    }

    /// One timed call.
    pub fn call(&self, engine: &Engine) -> Result<Measured, String> {
        let d = self.descs();
        let modelled_before = engine.stats().modelled_npu_us;
        let start = Instant::now();
        let plan = engine
            .plan(&d[0], &d[1], &d[2], &d[3])
            .map_err(|e| e.to_string())?;
        let io = Inputs {
            weights: &self.weights,
            name: d[0].name,
            b: &self.b,
            ids: &self.ids,
            dst: &self.dst,
            pair: None,
        };
        let stages = engine.run(plan, &io).map_err(|e| e.to_string())?;
        let total_us = start.elapsed().as_secs_f64() * 1e6;
        Ok(Measured {
            stages,
            total_us,
            modelled_us: engine.stats().modelled_npu_us - modelled_before,
        })
    }
}

/// Median (by total) of `repeats` runs of `f`.
fn median(
    repeats: usize,
    mut f: impl FnMut() -> Result<Measured, String>,
) -> Result<Measured, String> {
    let mut runs = (0..repeats).map(|_| f()).collect::<Result<Vec<_>, _>>()?;
    runs.sort_by(|a, b| a.total_us.total_cmp(&b.total_us));
    Ok(runs[runs.len() / 2])
}

pub fn run(opts: &Options, cfg: &Config) -> Result<ExitCode, String> {
    // Every size through the device path: this measures the path, not the small-batch policy;
    // one thread unless --threads says otherwise.
    let mut cfg = cfg.clone();
    cfg.min_rows = 0;
    cfg.device.host.threads = ork_moe::config::threads(opts.threads.unwrap_or(1));
    let mut rng = Rng::new(0x5eed_a3b0);
    let mut rows = Vec::new();
    let mut backend = "";
    for ty in TYPES {
        for n_tokens in TOKENS {
            let case = Case::new(ty, n_tokens, &mut rng);
            let repeats = if n_tokens >= 512 { 3 } else { 5 };
            let cold = median(repeats, || {
                let engine = Engine::new(cfg.clone()).map_err(|e| e.to_string())?;
                case.call(&engine)
            })?;
            let engine = Engine::new(cfg.clone()).map_err(|e| e.to_string())?;
            backend = engine.device().backend().name();
            case.call(&engine)?;
            let warm = median(repeats, || case.call(&engine))?;
            for (warm, m) in [(false, cold), (true, warm)] {
                rows.push(Row {
                    ty,
                    n_tokens,
                    warm,
                    m,
                });
            }
            eprintln!("moe: {} n_tokens={n_tokens} done", ty.name());
        }
    }
    let us = |ns: u64| ns as f64 / 1e3;
    if opts.json {
        json::print_rows(
            rows.iter()
                .map(|r| {
                    json!({
                        "type": r.ty.name(),
                        "n_tokens": r.n_tokens,
                        "cache": if r.warm { "warm" } else { "cold" },
                        "route_us": fixed(us(r.m.stages.route)),
                        "quant_us": fixed(us(r.m.stages.quant)),
                        "inflate_us": fixed(us(r.m.stages.inflate)),
                        "gemm_us": fixed(us(r.m.stages.gemm)),
                        "scatter_us": fixed(us(r.m.stages.scatter)),
                        "total_us": fixed(r.m.total_us),
                    })
                })
                .collect(),
        );
    } else {
        println!(
            "MUL_MAT_ID qwen3-30b-a3b case: {N_EXPERT} experts, {N_USED} used, N={N}, K={K}; backend {backend}, \
             {} thread(s); medians, µs (stages summed over threads; npu_modelled: the emulator's \
             RK3588 cost model for the call's submits, not a measurement)",
            cfg.device.host.threads
        );
        println!(
            "{:<5} {:>8} {:<5} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10} {:>7} {:>8} {:>13}",
            "type",
            "n_tokens",
            "cache",
            "route",
            "quant",
            "inflate",
            "gemm",
            "scatter",
            "total",
            "host%",
            "GFLOPS",
            "npu_modelled"
        );
        for r in &rows {
            let s = r.m.stages;
            let host = us(s.route + s.quant + s.scatter);
            let flops = 2.0 * (N * K * N_USED * r.n_tokens) as f64;
            println!(
                "{:<5} {:>8} {:<5} {:>9.1} {:>9.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>6.1}% {:>8.1} {:>13.1}",
                r.ty.name(),
                r.n_tokens,
                if r.warm { "warm" } else { "cold" },
                us(s.route),
                us(s.quant),
                us(s.inflate),
                us(s.gemm),
                us(s.scatter),
                r.m.total_us,
                100.0 * host / r.m.total_us,
                flops / r.m.total_us / 1e3,
                r.m.modelled_us
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
