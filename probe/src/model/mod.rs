//! `ork-probe model`: whole forward passes' MUL_MAT_ID calls of a named MoE configuration through
//! the engine on this machine, and the modelled RK3588 timeline of the same work
//! (`ork_probe::timeline`).
//!
//! Per layer the probe makes the calls ggml makes: the dense matmuls the engine takes (q, k, v, o;
//! a shared expert's after the routed experts; none with `ORK_DENSE=0`), then gate and up (the
//! layer input) and down (the SiLU·mul output, one row per token and slot), with synthetic
//! weights at their real sizes
//! ([`weights`]) and routing from [`routing`]. It measures what the engine does here, then builds
//! the board model's work graph of the whole model from the counts of each call (rows per used
//! expert, cache hits and misses, submits): the layers it ran stand for all of the model's
//! layers, repeated in turn (`modelled_layers_from` in the JSON says so).

mod chart;
mod options;
mod routing;
mod weights;

pub use options::Options;
use ork_moe::moe::cache::Policy;
use ork_moe::moe::desc::{TensorDesc, DENSE_IDS, GGML_TYPE_I32};
use ork_moe::moe::{Config, Engine, Inputs, Stages, Stats};
use ork_moe::quant::GgmlType;
use ork_moe::testutil::Rng;
use ork_probe::timeline::{
    self, CallWork, ContextCache, CpuRates, EngineModel, ExpertCall, ModelShape, Proj, Settings,
    Stage, Timeline, UbatchModel, UbatchWork,
};
use serde_json::{Map, Value};
use std::process::ExitCode;
use std::sync::atomic::AtomicU32;
use std::time::Instant;

/// Bytes of one layer's dense matmuls inflated to int8.
fn dense_weight_bytes_per_layer(shape: &ModelShape) -> u64 {
    shape.dense_matmul_macs_per_token_layer() as u64
}

/// Bytes of all of `shape`'s experts inflated to int8, and with `dense` of its dense matmuls.
fn full_weight_bytes(shape: &ModelShape, dense: bool) -> u64 {
    let experts = (3 * shape.n_expert * shape.hidden * shape.expert_ff) as u64;
    let matmuls = if dense {
        dense_weight_bytes_per_layer(shape)
    } else {
        0
    };
    (experts + matmuls) * shape.layers as u64
}

/// The weight type of an expert tensor with rows of `k`: `ty`, unless `k` is not whole blocks
/// of it (Q4_K at K = 1408), then Q5_0 as llama-quantize chooses.
fn type_for(ty: GgmlType, k: usize) -> GgmlType {
    if k.is_multiple_of(ty.block_elems()) {
        ty
    } else {
        GgmlType::Q5_0
    }
}

/// What the engine did in one ubatch here.
#[derive(Clone, Default)]
struct Measured {
    stages: Stages,
    wall_us: f64,
    hits: u64,
    misses: u64,
    evictions: u64,
    bytes_inflated: u64,
    submits: u64,
    /// Device buffers the engine created (the board model takes them as recycled).
    buffers: u64,
}

/// One ubatch: measured here, and modelled under each engine model.
struct UbatchResult {
    index: usize,
    measured: Measured,
    models: Vec<UbatchModel>,
    /// Cache hits and lookups of the whole model's calls as modelled (`run_case`).
    full_hits: u64,
    full_lookups: u64,
}

struct Case {
    shape: ModelShape,
    ty: GgmlType,
    tokens: usize,
    backend: &'static str,
    ubatches: Vec<UbatchResult>,
    cpu_only_tokps: f64,
    dense_us: f64,
    /// Dense matmuls the library takes per ubatch, all layers (0 with `ORK_DENSE=0`).
    dense_calls: usize,
}

const ENGINES: usize = 4;

/// Indexed as `UbatchResult::models`: the engine, pipelined, fused, the engine with its prefetch
/// threads.
fn engines() -> [EngineModel; ENGINES] {
    [
        EngineModel::without_prefetch(),
        EngineModel::pipelined(),
        EngineModel::pipelined_fused(),
        EngineModel::with_prefetch(),
    ]
}

fn add_stages(a: &mut Stages, b: Stages) {
    a.route += b.route;
    a.quant += b.quant;
    a.inflate += b.inflate;
    a.gemm += b.gemm;
    a.scatter += b.scatter;
}

fn delta(after: &Stats, before: &Stats, m: &mut Measured) {
    m.hits += after.cache_hits - before.cache_hits;
    m.misses += after.cache_misses - before.cache_misses;
    m.evictions += after.cache_evictions - before.cache_evictions;
    m.bytes_inflated += after.bytes_inflated - before.bytes_inflated;
    m.submits += (after.submits_run_i8 + after.submits_stream + after.submits_chain)
        - (before.submits_run_i8 + before.submits_stream + before.submits_chain);
    m.buffers += after.buffers_created - before.buffers_created;
}

/// The engine, its inputs, and what one ubatch's calls did.
struct Runner<'a> {
    engine: &'a Engine,
    dst: &'a [AtomicU32],
    m: Measured,
    calls: Vec<CallWork>,
}

impl Runner<'_> {
    /// Runs one call (`dense`: planned by [`Engine::plan_dense`], which ignores `descs[2]`) and
    /// records it as `proj` of `layer`.
    fn call(
        &mut self,
        layer: usize,
        proj: Proj,
        descs: &[TensorDesc; 4],
        io: Inputs,
        dense: bool,
    ) -> Result<(), String> {
        let [w, b, ids, dst] = descs;
        let before = self.engine.stats();
        let start = Instant::now();
        let plan = if dense {
            self.engine.plan_dense(w, b, dst)
        } else {
            self.engine.plan(w, b, ids, dst)
        }
        .map_err(|e| e.to_string())?;
        let p = plan.problem.clone();
        let (stages, runs) = self
            .engine
            .run_traced(plan, &io)
            .map_err(|e| e.to_string())?;
        self.m.wall_us += start.elapsed().as_secs_f64() * 1e6;
        add_stages(&mut self.m.stages, stages);
        delta(&self.engine.stats(), &before, &mut self.m);
        self.calls.push(CallWork {
            layer: layer as u32,
            proj,
            k: p.k,
            n: p.n,
            ty: p.wtype,
            act_rows: p.act_rows() as u64,
            n_expert: p.n_expert,
            experts: runs
                .iter()
                .map(|r| ExpertCall {
                    rows: r.rows as u32,
                    hit: r.hit,
                })
                .collect(),
        });
        Ok(())
    }

    /// A dense matmul of `t` on the first `k` channels of `b` (one row per token).
    fn dense(
        &mut self,
        layer: usize,
        proj: Proj,
        t: weights::Tensor,
        weights: &[u8],
        b: &[f32],
        tokens: usize,
    ) -> Result<(), String> {
        let descs = dense_descs(t, weights, b, self.dst, tokens, proj);
        let io = Inputs {
            weights,
            name: descs[0].name,
            b,
            ids: &DENSE_IDS,
            dst: &self.dst[..t.n * tokens],
            pair: None,
        };
        self.call(layer, proj, &descs, io, true)
    }
}

fn run_case(
    o: &Options,
    settings: &Settings,
    shape: ModelShape,
    ty: GgmlType,
    tokens: usize,
    cfg: &Config,
) -> Result<Case, String> {
    let (h, ff, ne, nu) = (shape.hidden, shape.expert_ff, shape.n_expert, shape.n_used);
    let projs = [
        (Proj::Gate, type_for(ty, h), h, ff),
        (Proj::Up, type_for(ty, h), h, ff),
        (Proj::Down, type_for(ty, ff), ff, h),
    ];
    let shapes: Vec<_> = projs.iter().map(|&(_, t, k, n)| (t, k, n)).collect();
    let tensors = weights::layout(&shapes, ne);
    let file = format!("{}-{}-v1", shape.name, ty.name());
    let maps = weights::map_layers(&file, &tensors, o.layers)?;
    // The dense matmuls the library takes (none with ORK_DENSE=0), in the case's type.
    let matmuls = if cfg.dense {
        shape.dense_matmuls()
    } else {
        Vec::new()
    };
    let dense_shapes: Vec<_> = matmuls
        .iter()
        .map(|&(_, k, n)| (type_for(ty, k), k, n))
        .collect();
    let dense_tensors = weights::layout(&dense_shapes, 1);
    let dense_maps = if matmuls.is_empty() {
        Vec::new()
    } else {
        let file = format!("{}-{}-dense-v1", shape.name, ty.name());
        weights::map_layers(&file, &dense_tensors, o.layers)?
    };
    let engine = Engine::new(cfg.clone()).map_err(|e| e.to_string())?;
    let backend = engine.device().backend().name();
    let mut rng = Rng::new(0x6d6f_6465 ^ tokens as u64);
    let b_up: Vec<f32> = (0..h * tokens).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let b_down: Vec<f32> = (0..ff * nu * tokens)
        .map(|_| rng.uniform(-1.0, 1.0))
        .collect();
    // The inputs of o and a shared expert's down: as wide as the widest K.
    let dense_k = matmuls.iter().map(|&(_, k, _)| k).max().unwrap_or(0);
    let b_wide: Vec<f32> = (0..dense_k * tokens)
        .map(|_| rng.uniform(-1.0, 1.0))
        .collect();
    let dense_n = matmuls.iter().map(|&(_, _, n)| n).max().unwrap_or(0);
    let dst: Vec<AtomicU32> = (0..(h.max(ff) * nu).max(dense_n) * tokens)
        .map(|_| AtomicU32::new(0))
        .collect();
    let params = &settings.params;
    let rates = CpuRates::from_reference(params);
    let dense = rates.dense_layer(&shape, tokens, params, !matmuls.is_empty());
    let mut contexts: Vec<ContextCache> = (0..ENGINES).map(|_| ContextCache::default()).collect();
    let mut ubatches = Vec::new();
    for u in 0..o.ubatches {
        let mut run = Runner {
            engine: &engine,
            dst: &dst,
            m: Measured::default(),
            calls: Vec::new(),
        };
        for (layer, map) in maps.iter().enumerate() {
            // In ggml's order: q, k, v, o, the routed experts, a shared expert.
            let dense_of = |proj: Proj| {
                matmuls
                    .iter()
                    .zip(&dense_tensors)
                    .filter(move |((p, ..), _)| *p == proj)
                    .map(|(_, &t)| t)
            };
            let dense_input = |t: weights::Tensor| if t.k == h { &b_up } else { &b_wide };
            for proj in [Proj::AttnIn, Proj::AttnOut] {
                for t in dense_of(proj) {
                    let w = &dense_maps[layer][t.offset..t.offset + t.bytes()];
                    run.dense(layer, proj, t, w, dense_input(t), tokens)?;
                }
            }
            let ids = o.routing.ids(layer, u, tokens, ne, nu, &mut rng);
            for (i, &(proj, ..)) in projs.iter().enumerate() {
                let t = tensors[i];
                let weights = &map[t.offset..t.offset + t.bytes()];
                let (b, b_rows) = if proj == Proj::Down {
                    (&b_down, nu)
                } else {
                    (&b_up, 1)
                };
                let descs = descs(t, weights, b, b_rows, &ids, &dst, tokens, nu, proj);
                let io = Inputs {
                    weights,
                    name: descs[0].name,
                    b,
                    ids: &ids,
                    dst: &dst[..t.n * nu * tokens],
                    pair: None,
                };
                run.call(layer, proj, &descs, io, false)?;
            }
            for t in dense_of(Proj::Shared) {
                let w = &dense_maps[layer][t.offset..t.offset + t.bytes()];
                run.dense(layer, Proj::Shared, t, w, dense_input(t), tokens)?;
            }
        }
        let Runner { m, calls, .. } = run;
        // The layers run here stand for all of the model's, in turn. Their hits repeat only if
        // every layer's weights fit the cache; otherwise the layers run here already fill the
        // budget (checked in `run`), so whatever the policy keeps, the full model hits no more
        // experts per ubatch than were hit here. Under `pin` the dense matrices are priority
        // entries, which displace routed experts: those of the first layers that fit stay.
        let repeat_hits = full_weight_bytes(&shape, cfg.dense) <= cfg.cache_bytes;
        let dense_layers_held = match cfg.cache_policy {
            Policy::Pin => (cfg.cache_bytes / dense_weight_bytes_per_layer(&shape).max(1)) as usize,
            Policy::Lru if repeat_hits => shape.layers,
            Policy::Lru => 0,
        };
        let mut full = Vec::new();
        for l in 0..shape.layers {
            for c in calls.iter().filter(|c| c.layer as usize == l % o.layers) {
                let mut c = CallWork {
                    layer: l as u32,
                    ..c.clone()
                };
                let held = if c.proj.routed() {
                    repeat_hits
                } else {
                    l < dense_layers_held
                };
                if l >= o.layers && !held {
                    c.experts.iter_mut().for_each(|x| x.hit = false);
                }
                full.push(c);
            }
        }
        let lookups: Vec<&ExpertCall> = full.iter().flat_map(|c| &c.experts).collect();
        let full_hits = lookups.iter().filter(|x| x.hit).count() as u64;
        let full_lookups = lookups.len() as u64;
        let work = UbatchWork {
            tokens,
            calls: full,
            dense: vec![dense; shape.layers],
        };
        let cache_bytes = cfg.cache_bytes;
        let models = engines()
            .iter()
            .zip(contexts.iter_mut())
            .map(|(e, ctx)| timeline::model_ubatch(&work, e, params, cache_bytes, ctx))
            .collect::<Result<Vec<_>, _>>()?;
        eprintln!(
            "model: {} {} ub{tokens} ubatch {}/{}: {:.0} ms here for {} layers; modelled RK3588 \
             prefill {:.1} tok/s engine, {:.1} with prefetch, {:.1} pipelined",
            shape.name,
            ty.name(),
            u + 1,
            o.ubatches,
            m.wall_us / 1e3,
            o.layers,
            models[0].prefill_tokps(tokens),
            models[3].prefill_tokps(tokens),
            models[1].prefill_tokps(tokens),
        );
        ubatches.push(UbatchResult {
            index: u,
            measured: m,
            models,
            full_hits,
            full_lookups,
        });
    }
    let cpu_only_tokps = rates.cpu_only_tokps(&shape, tokens);
    let dense_us = (dense.before_us
        + rates.elementwise_us(dense.act_elems + dense.combine_elems, params))
        * shape.layers as f64;
    Ok(Case {
        shape,
        ty,
        tokens,
        backend,
        ubatches,
        cpu_only_tokps,
        dense_us,
        dense_calls: matmuls.len() * shape.layers,
    })
}

/// The four descriptors of one call (`b` has `b_rows` rows per token: 1, or n_used for down).
#[allow(clippy::too_many_arguments)]
fn descs<'a>(
    t: weights::Tensor,
    weights: &'a [u8],
    b: &'a [f32],
    b_rows: usize,
    ids: &'a [i32],
    dst: &'a [AtomicU32],
    tokens: usize,
    n_used: usize,
    proj: Proj,
) -> [TensorDesc<'a>; 4] {
    let (k, n, row) = (t.k, t.n, t.row_bytes());
    let name = match proj {
        Proj::Gate => "blk.0.ffn_gate_exps.weight",
        Proj::Up => "blk.0.ffn_up_exps.weight",
        Proj::GateUp => "blk.0.ffn_gate_up_exps.weight",
        Proj::Down => "blk.0.ffn_down_exps.weight",
        Proj::AttnIn => "blk.0.attn_qkv.weight",
        Proj::AttnOut => "blk.0.attn_output.weight",
        Proj::Shared => "blk.0.ffn_shexp.weight",
    };
    let (tk, u) = (tokens as i64, n_used as i64);
    [
        TensorDesc {
            ty: t.ty.id(),
            ne: [k as i64, n as i64, t.n_expert as i64, 1],
            nb: [t.ty.block_bytes(), row, row * n, row * n * t.n_expert],
            addr: weights.as_ptr() as usize,
            name: Some(name),
        },
        TensorDesc {
            ty: GgmlType::F32.id(),
            ne: [k as i64, b_rows as i64, tk, 1],
            nb: [4, 4 * k, 4 * k * b_rows, 4 * k * b_rows * tokens],
            addr: b.as_ptr() as usize,
            name: None,
        },
        TensorDesc {
            ty: GGML_TYPE_I32,
            ne: [u, tk, 1, 1],
            nb: [4, 4 * n_used, ids.len() * 4, ids.len() * 4],
            addr: ids.as_ptr() as usize,
            name: None,
        },
        TensorDesc {
            ty: GgmlType::F32.id(),
            ne: [n as i64, u, tk, 1],
            nb: [4, 4 * n, 4 * n * n_used, 4 * n * n_used * tokens],
            addr: dst.as_ptr() as usize,
            name: None,
        },
    ]
}

/// The descriptors of a dense matmul as ggml gives them (2-D; `ids` unused): `b` [K, tokens] and
/// `dst` [N, tokens], contiguous.
fn dense_descs<'a>(
    t: weights::Tensor,
    weights: &'a [u8],
    b: &'a [f32],
    dst: &'a [AtomicU32],
    tokens: usize,
    proj: Proj,
) -> [TensorDesc<'a>; 4] {
    let mut d = descs(t, weights, b, 1, &DENSE_IDS, dst, tokens, 1, proj);
    let tk = tokens as i64;
    d[1].ne = [t.k as i64, tk, 1, 1];
    d[1].nb = [4, 4 * t.k, 4 * t.k * tokens, 4 * t.k * tokens];
    d[3].ne = [t.n as i64, tk, 1, 1];
    d[3].nb = [4, 4 * t.n, 4 * t.n * tokens, 4 * t.n * tokens];
    d
}

fn ms(us: f64) -> f64 {
    us / 1e3
}

fn stage_us(t: &Timeline, s: Stage) -> f64 {
    let i = Stage::REPORTED
        .iter()
        .position(|&x| x == s)
        .expect("reported");
    t.stage_us[i]
}

pub fn run(o: Options) -> Result<ExitCode, String> {
    let settings = o.settings()?;
    let mut cfg = ork_moe::config::from_env()?;
    if let Some(mb) = o.cache_mb {
        cfg.cache_bytes = mb << 20;
    }
    if let Some(t) = o.threads {
        cfg.device.host.threads = ork_moe::config::threads(t);
    }
    if let Some(b) = o.backend {
        cfg.device.backend = b;
    }
    ork_moe::ffi::log_install(cfg.log_level);
    if let Some(info) = &settings.profile {
        // `ork-probe board` off a board (emulator, stand-in runtime) measures this machine.
        if info.backend != "rknn" || info.runtime_version.contains("stand-in") {
            eprintln!(
                "model: warning: {} was written on backend {} ({}): its NPU figures are not a board's",
                info.path, info.backend, info.runtime_version
            );
        }
    }
    for shape in &o.configs {
        o.routing.check(shape.n_expert, shape.n_used)?;
        let full_bytes = full_weight_bytes(shape, cfg.dense);
        let run_bytes = full_bytes / shape.layers as u64 * o.layers as u64;
        if run_bytes <= cfg.cache_bytes && full_bytes > cfg.cache_bytes {
            eprintln!(
                "model: warning: the experts of {} layers ({} MB int8) fit the {} MB cache, those \
                 of all {} do not: the modelled hits are too many; raise --layers",
                o.layers,
                run_bytes >> 20,
                cfg.cache_bytes >> 20,
                shape.layers
            );
        }
    }
    let started = Instant::now();
    let mut cases = Vec::new();
    for &shape in &o.configs {
        for &ty in &o.types {
            for &tokens in &o.ubatch {
                cases.push(run_case(&o, &settings, shape, ty, tokens, &cfg)?);
            }
        }
    }
    eprintln!("model: done in {:.1} s", started.elapsed().as_secs_f64());
    if o.json {
        print_json(&o, &settings, &cfg, &cases);
    } else {
        print_tables(&o, &settings, &cfg, &cases);
    }
    if let Some(path) = &o.svg {
        std::fs::write(path, svg(&cases)).map_err(|e| format!("{}: {e}", path.display()))?;
        eprintln!("model: wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// The published CPU-only figure this case compares against, and where it comes from.
fn reference(case: &Case, settings: &Settings) -> (f64, String) {
    let p = &settings.params;
    if case.shape == ModelShape::QWEN3_30B_A3B {
        let src = timeline::SPECS
            .iter()
            .find(|s| s.name == "cpu_only_reference_tokps")
            .expect("a parameter");
        (p.cpu_only_reference_tokps, src.source.to_string())
    } else {
        (
            case.cpu_only_tokps,
            format!(
                "no published RK3588 figure: the {} tok/s reference scaled by this model's dense \
                 and expert MACs (CpuRates::cpu_only_tokps)",
                p.cpu_only_reference_tokps
            ),
        )
    }
}

fn print_tables(o: &Options, settings: &Settings, cfg: &Config, cases: &[Case]) {
    let threads = cfg.device.host.threads;
    println!(
        "ork-probe model: routing {}, cache {} MiB, {} layer(s) run here per ubatch ({} thread(s) of \
         this machine, backend {}); the RK3588 figures are MODELLED for all layers of the model",
        o.routing.name(),
        cfg.cache_bytes >> 20,
        o.layers,
        threads,
        cases.first().map_or("-", |c| c.backend)
    );
    for c in cases.iter().take(1) {
        println!(
            "dense matmuls in the library (ORK_DENSE): {} per ubatch of {} ({} per layer: the \
             attention projections, and a shared expert's where the model has one{})",
            c.dense_calls,
            c.shape.name,
            c.dense_calls / c.shape.layers,
            if c.dense_calls == 0 { ", off" } else { "" }
        );
    }
    println!();
    println!("measured here, per ubatch, the layers run here (quant includes the gather into native A; ms):");
    println!(
        "{:<18} {:<5} {:>5} {:>2} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>6} {:>6} {:>6} {:>7} {:>7} {:>5} {:>10}",
        "config", "type", "ub", "#", "route", "quant", "inflate", "gemm", "scatter", "wall", "hits",
        "misses", "evict", "GB infl", "submits", "bufs", "tok/s(all)"
    );
    for c in cases {
        for u in &c.ubatches {
            let m = &u.measured;
            let s = m.stages;
            let scale = c.shape.layers as f64 / o.layers as f64;
            println!(
                "{:<18} {:<5} {:>5} {:>2} {:>7.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>6} {:>6} {:>6} {:>7.2} {:>7} {:>5} {:>10.1}",
                c.shape.name,
                c.ty.name(),
                c.tokens,
                u.index,
                s.route as f64 / 1e6,
                s.quant as f64 / 1e6,
                s.inflate as f64 / 1e6,
                s.gemm as f64 / 1e6,
                s.scatter as f64 / 1e6,
                ms(m.wall_us),
                m.hits,
                m.misses,
                m.evictions,
                m.bytes_inflated as f64 / 1e9,
                m.submits,
                m.buffers,
                c.tokens as f64 * 1e6 / (m.wall_us * scale),
            );
        }
    }
    println!();
    println!(
        "modelled RK3588, whole model, per ubatch (expert part: serial / as scheduled / bound and \
         what sets it; ms):"
    );
    println!(
        "{:<18} {:<5} {:>5} {:>2} | {:>8} {:>8} {:>8} {:<4} | {:>8} {:>8} {:<4} | {:>8} {:>8} {:<4} | {:>8} {:>8} {:<4} | {:>6} {:>4} | {:>7} {:>7} {:>7} {:>7} {:>7} {:>6}",
        "config", "type", "ub", "#", "engine", "sched", "bound", "", "prefetch", "bound", "",
        "piped", "bound", "", "fused", "bound", "", "runs", "ctx", "engine", "prefch", "piped",
        "fused", "ref", "best×"
    );
    for c in cases {
        let (ref_tokps, _) = reference(c, settings);
        for u in &c.ubatches {
            let [t, p, f, pf] = [&u.models[0], &u.models[1], &u.models[2], &u.models[3]];
            let best = u
                .models
                .iter()
                .map(|m| m.prefill_tokps(c.tokens))
                .fold(0.0, f64::max);
            println!(
                "{:<18} {:<5} {:>5} {:>2} | {:>8.0} {:>8.0} {:>8.0} {:<4} | {:>8.0} {:>8.0} {:<4} | {:>8.0} {:>8.0} {:<4} | {:>8.0} {:>8.0} {:<4} | {:>6} {:>4} | {:>7.1} {:>7.1} {:>7.1} {:>7.1} {:>7.1} {:>5.2}×",
                c.shape.name,
                c.ty.name(),
                c.tokens,
                u.index,
                ms(t.experts.serial_us),
                ms(t.experts.scheduled_us),
                ms(t.experts.bound.us()),
                t.experts.bound.limit(),
                ms(pf.experts.scheduled_us),
                ms(pf.experts.bound.us()),
                pf.experts.bound.limit(),
                ms(p.experts.scheduled_us),
                ms(p.experts.bound.us()),
                p.experts.bound.limit(),
                ms(f.experts.scheduled_us),
                ms(f.experts.bound.us()),
                f.experts.bound.limit(),
                t.experts.runs,
                t.experts.contexts_created,
                t.prefill_tokps(c.tokens),
                pf.prefill_tokps(c.tokens),
                p.prefill_tokps(c.tokens),
                f.prefill_tokps(c.tokens),
                ref_tokps,
                best / ref_tokps,
            );
        }
    }
    println!();
    println!("modelled RK3588, last ubatch: serial time per stage of the expert part (ms), and the whole ubatch");
    let names: Vec<&str> = Stage::REPORTED[..Stage::REPORTED.len() - 1]
        .iter()
        .map(|s| s.name())
        .collect();
    println!(
        "{:<18} {:<5} {:>5} {:<16} {} {:>9} {:>8} {:>9} {:>8}",
        "config",
        "type",
        "ub",
        "engine",
        names
            .iter()
            .map(|n| format!(
                "{:>11}",
                n.replace("buffer_", "buf_").replace("context_", "ctx_")
            ))
            .collect::<String>(),
        "GB dram",
        "dense",
        "ubatch",
        "amdahl"
    );
    for c in cases {
        let last = c.ubatches.last().expect("at least one ubatch");
        for (e, m) in engines().iter().zip(&last.models) {
            let x = &m.experts;
            let cols: String = Stage::REPORTED[..Stage::REPORTED.len() - 1]
                .iter()
                .map(|&s| format!("{:>11.0}", ms(stage_us(x, s))))
                .collect();
            println!(
                "{:<18} {:<5} {:>5} {:<16} {} {:>9.1} {:>8.0} {:>9.0} {:>7.1}",
                c.shape.name,
                c.ty.name(),
                c.tokens,
                e.name,
                cols,
                x.dram_bytes as f64 / 1e9,
                ms(c.dense_us),
                ms(m.whole.scheduled_us),
                c.tokens as f64 * 1e6 / c.dense_us,
            );
        }
    }
    println!();
    println!("board model parameters (value, unit, source):");
    for line in settings.describe() {
        println!("  {line}");
    }
    for c in cases {
        let (tokps, src) = reference(c, settings);
        println!(
            "reference for {}: {:.1} tok/s CPU-only ({src}); modelled CPU-only for a {}-token prompt: {:.1} tok/s",
            c.shape.name, tokps, c.tokens, c.cpu_only_tokps
        );
    }
}

fn num(x: f64) -> Value {
    Value::from(x)
}

fn print_json(o: &Options, settings: &Settings, cfg: &Config, cases: &[Case]) {
    let params: Map<String, Value> = timeline::SPECS
        .iter()
        .map(|s| {
            let v = settings.params.get(s.name).expect("a parameter");
            (s.name.to_string(), num(v))
        })
        .collect();
    let mut rows = Vec::new();
    for c in cases {
        let u = c.ubatches.last().expect("at least one ubatch");
        let first = c.ubatches.first().expect("at least one ubatch");
        let m = &u.measured;
        let scale = c.shape.layers as f64 / o.layers as f64;
        let t = &u.models[0];
        let (ref_tokps, ref_src) = reference(c, settings);
        // Full model: the hits the modelled calls have (see `run_case`); every other lookup a miss.
        let (hits, lookups) = (u.full_hits as f64, u.full_lookups as f64);
        let misses = lookups - hits;
        let per_miss = m.bytes_inflated as f64 / m.misses.max(1) as f64;
        let mut fields: Vec<(String, Value)> = vec![
            ("config".into(), Value::from(c.shape.name)),
            ("layers".into(), num(c.shape.layers as f64)),
            ("measured_layers".into(), num(o.layers as f64)),
            (
                "modelled_layers_from".into(),
                Value::from(format!(
                    "the {} layer(s) measured here, repeated to {} (measured counts scaled by {:.1})",
                    o.layers, c.shape.layers, scale
                )),
            ),
            ("type".into(), Value::from(c.ty.name())),
            ("ubatch".into(), num(c.tokens as f64)),
            ("ubatch_index".into(), num(u.index as f64)),
            ("routing".into(), Value::from(o.routing.name())),
            ("backend_here".into(), Value::from(c.backend)),
            ("cache_mb".into(), num((cfg.cache_bytes >> 20) as f64)),
            ("hit_rate".into(), num(hits / lookups.max(1.0))),
            ("cache_hits".into(), num(hits)),
            ("cache_misses".into(), num(misses)),
            ("bytes_inflated".into(), num(misses * per_miss)),
            (
                "measured_hit_rate".into(),
                num(m.hits as f64 / (m.hits + m.misses).max(1) as f64),
            ),
            ("measured_cache_evictions".into(), num(m.evictions as f64)),
            ("measured_bytes_inflated".into(), num(m.bytes_inflated as f64)),
            ("measured_buffers_created".into(), num(m.buffers as f64)),
            ("submits".into(), num(m.submits as f64 * scale)),
            ("dense_calls".into(), num(c.dense_calls as f64)),
            ("npu_runs".into(), num(t.experts.runs as f64)),
            ("contexts_created".into(), num(t.experts.contexts_created as f64)),
            (
                "contexts_created_first_ubatch".into(),
                num(first.models[0].experts.contexts_created as f64),
            ),
            ("measured_route_us".into(), num(m.stages.route as f64 / 1e3)),
            (
                "measured_quant_gather_us".into(),
                num(m.stages.quant as f64 / 1e3),
            ),
            ("measured_inflate_us".into(), num(m.stages.inflate as f64 / 1e3)),
            ("measured_gemm_us".into(), num(m.stages.gemm as f64 / 1e3)),
            ("measured_scatter_us".into(), num(m.stages.scatter as f64 / 1e3)),
            ("measured_wall_us".into(), num(m.wall_us)),
            (
                "measured_expert_tokps".into(),
                num(c.tokens as f64 * 1e6 / (m.wall_us * scale)),
            ),
            ("modelled_serial_us".into(), num(t.experts.serial_us)),
            ("modelled_scheduled_us".into(), num(t.experts.scheduled_us)),
            ("modelled_bound_us".into(), num(t.experts.bound.us())),
            (
                "modelled_bound_limit".into(),
                Value::from(t.experts.bound.limit()),
            ),
            (
                "modelled_critical_path_us".into(),
                num(t.experts.bound.critical_path_us),
            ),
            ("modelled_dram_bytes".into(), num(t.experts.dram_bytes as f64)),
            ("modelled_dense_us".into(), num(c.dense_us)),
            ("modelled_ubatch_us".into(), num(t.whole.scheduled_us)),
            ("modelled_prefill_tokps".into(), num(t.prefill_tokps(c.tokens))),
            (
                "amdahl_ceiling_tokps".into(),
                num(c.tokens as f64 * 1e6 / c.dense_us),
            ),
            ("cpu_only_reference_tokps".into(), num(ref_tokps)),
            ("cpu_only_reference_source".into(), Value::from(ref_src)),
            ("cpu_only_modelled_tokps".into(), num(c.cpu_only_tokps)),
        ];
        for (name, i) in [("pipelined", 1), ("fused", 2), ("prefetch", 3)] {
            let x = &u.models[i];
            fields.extend([
                (format!("{name}_serial_us"), num(x.experts.serial_us)),
                (format!("{name}_scheduled_us"), num(x.experts.scheduled_us)),
                (format!("{name}_bound_us"), num(x.experts.bound.us())),
                (
                    format!("{name}_bound_limit"),
                    Value::from(x.experts.bound.limit()),
                ),
                (format!("{name}_ubatch_us"), num(x.whole.scheduled_us)),
                (
                    format!("{name}_prefill_tokps"),
                    num(x.prefill_tokps(c.tokens)),
                ),
                (format!("{name}_npu_runs"), num(x.experts.runs as f64)),
                (
                    format!("{name}_contexts_created_first_ubatch"),
                    num(first.models[i].experts.contexts_created as f64),
                ),
                // The whole ubatch's: a prefetcher gets ahead during the dense part.
                (
                    format!("{name}_peak_resident_mib"),
                    num(x.whole.peak_resident_bytes as f64 / (1u64 << 20) as f64),
                ),
            ]);
        }
        for (i, s) in Stage::REPORTED.iter().enumerate() {
            if *s != Stage::Dense {
                fields.push((
                    format!("modelled_{}_serial_us", s.name()),
                    num(t.experts.stage_us[i]),
                ));
            }
        }
        fields.push(("board_params".into(), Value::Object(params.clone())));
        if let Some(info) = &settings.profile {
            fields.push(("board_profile".into(), Value::from(info.path.clone())));
        }
        rows.push(Value::Object(fields.into_iter().collect()));
    }
    crate::json::print_rows(rows);
}

/// Per layer of the last ubatch of each case: the engine's expert part stacked by stage (serial)
/// on the dense part's wall time, the engine's as-scheduled span, with its prefetch threads, and
/// pipelined.
fn svg(cases: &[Case]) -> String {
    let panels: Vec<chart::Panel> = cases
        .iter()
        .map(|c| {
            let u = c.ubatches.last().expect("at least one ubatch");
            let experts = &u.models[0].experts;
            let [engine, piped, ahead] = [0, 1, 3].map(|i| &u.models[i].whole);
            let dense_ms = ms(c.dense_us) / c.shape.layers as f64;
            let span = |t: &Timeline, l: usize| {
                let before = if l == 0 { 0.0 } else { t.layer_end_us[l - 1] };
                ms(t.layer_end_us[l] - before)
            };
            let groups = (0..c.shape.layers)
                .map(|l| {
                    let mut segments = vec![("dense (wall)".to_string(), dense_ms)];
                    segments.extend(
                        Stage::REPORTED
                            .iter()
                            .zip(&experts.layer_stage_us[l])
                            .filter(|(s, _)| **s != Stage::Dense)
                            .map(|(s, &v)| (s.name().to_string(), ms(v))),
                    );
                    let serial = chart::Bar { segments };
                    let one = |name: &str, v: f64| chart::Bar {
                        segments: vec![(name.to_string(), v)],
                    };
                    vec![
                        serial,
                        one("engine, as scheduled", span(engine, l)),
                        one("engine+prefetch, as scheduled", span(ahead, l)),
                        one("pipelined, as scheduled", span(piped, l)),
                    ]
                })
                .collect();
            chart::Panel {
                title: format!(
                    "{} {} ub{}: per layer, dense + the engine's expert stages serial | engine as scheduled | +prefetch | pipelined",
                    c.shape.name,
                    c.ty.name(),
                    c.tokens
                ),
                groups,
            }
        })
        .collect();
    chart::render(
        "ork-probe model: modelled RK3588 time per layer (ms), dense part included",
        "layer",
        "ms",
        &panels,
        1400.0,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_k_of_partial_blocks_takes_q5_0() {
        assert_eq!(type_for(GgmlType::Q4_K, 1408), GgmlType::Q5_0);
        assert_eq!(type_for(GgmlType::Q4_0, 1408), GgmlType::Q4_0);
    }
}
