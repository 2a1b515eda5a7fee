//! Running the engine: per layer the calls ggml makes, with synthetic weights at their real sizes
//! ([`super::weights`]) and routing from [`super::routing`], measured here and recorded as the
//! board model's work.

use super::routing::Routing;
use super::weights::{self, Tensor};
use memmap2::Mmap;
use ork_moe::moe::desc::{TensorDesc, DENSE_IDS, GGML_TYPE_I32};
use ork_moe::moe::{Config, Engine, Inputs, Stages, Stats};
use ork_moe::quant::GgmlType;
use ork_moe::testutil::Rng;
use ork_probe::timeline::{CallWork, ExpertCall, ModelShape, Proj};
use std::sync::atomic::AtomicU32;
use std::time::Instant;

/// What the engine did in one ubatch here.
#[derive(Clone, Default)]
pub struct Measured {
    pub stages: Stages,
    pub wall_us: f64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub bytes_inflated: u64,
    pub submits: u64,
    /// Device buffers the engine created (the board model takes them as recycled).
    pub buffers: u64,
}

/// One case's layers as the engine sees them: the weights of the layers run here, mapped, the
/// inputs and the engine.
pub struct Layers {
    shape: ModelShape,
    tokens: usize,
    /// Gate, up and down, each its projection and tensor.
    experts: [(Proj, Tensor); 3],
    /// Per layer run here, the experts' weights.
    maps: Vec<Mmap>,
    /// The dense matmuls the library takes (none with ORK_DENSE=0), in the case's type.
    dense: Vec<(Proj, Tensor)>,
    /// Per layer run here, the dense matmuls' weights.
    dense_maps: Vec<Mmap>,
    engine: Engine,
    /// The layer input (gate, up, and the dense matmuls of K = hidden).
    b_up: Vec<f32>,
    /// The SiLU·mul output, one row per token and slot.
    b_down: Vec<f32>,
    /// The inputs of o and a shared expert's down: as wide as the widest K.
    b_wide: Vec<f32>,
    dst: Vec<AtomicU32>,
    /// The inputs' stream, which the routing draws from next.
    rng: Rng,
}

impl Layers {
    /// `layers` layers of `shape` in weight type `ty`, for ubatches of `tokens`.
    pub fn new(
        shape: ModelShape,
        ty: GgmlType,
        tokens: usize,
        layers: usize,
        cfg: &Config,
    ) -> Result<Layers, String> {
        let (h, ff, nu) = (shape.hidden, shape.expert_ff, shape.n_used);
        let projs = [
            (Proj::Gate, type_for(ty, h), h, ff),
            (Proj::Up, type_for(ty, h), h, ff),
            (Proj::Down, type_for(ty, ff), ff, h),
        ];
        let shapes: Vec<_> = projs.iter().map(|&(_, t, k, n)| (t, k, n)).collect();
        let tensors = weights::layout(&shapes, shape.n_expert);
        let file = format!("{}-{}-v1", shape.name, ty.name());
        let maps = weights::map_layers(&file, &tensors, layers)?;
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
            weights::map_layers(&file, &dense_tensors, layers)?
        };
        let engine = Engine::new(cfg.clone()).map_err(|e| e.to_string())?;
        let mut rng = Rng::new(0x6d6f_6465 ^ tokens as u64);
        let mut inputs = |len: usize| -> Vec<f32> {
            (0..len * tokens).map(|_| rng.uniform(-1.0, 1.0)).collect()
        };
        let b_up = inputs(h);
        let b_down = inputs(ff * nu);
        let dense_k = matmuls.iter().map(|&(_, k, _)| k).max().unwrap_or(0);
        let b_wide = inputs(dense_k);
        let dense_n = matmuls.iter().map(|&(_, _, n)| n).max().unwrap_or(0);
        let dst = (0..(h.max(ff) * nu).max(dense_n) * tokens)
            .map(|_| AtomicU32::new(0))
            .collect();
        Ok(Layers {
            shape,
            tokens,
            experts: [0, 1, 2].map(|i| (projs[i].0, tensors[i])),
            maps,
            dense: matmuls
                .iter()
                .zip(dense_tensors)
                .map(|(&(proj, ..), t)| (proj, t))
                .collect(),
            dense_maps,
            engine,
            b_up,
            b_down,
            b_wide,
            dst,
            rng,
        })
    }

    /// The backend the engine runs on here.
    pub fn backend(&self) -> &'static str {
        self.engine.device().backend().name()
    }

    /// The dense matmuls the library takes per layer.
    pub fn dense_per_layer(&self) -> usize {
        self.dense.len()
    }

    /// Runs ubatch `u` through the layers, each in ggml's order: q, k, v, o, the routed experts,
    /// a shared expert. Returns what the engine did and the calls' work.
    pub fn run(
        &mut self,
        u: usize,
        routing: &Routing,
    ) -> Result<(Measured, Vec<CallWork>), String> {
        let (tokens, ne, nu) = (self.tokens, self.shape.n_expert, self.shape.n_used);
        let mut run = Runner {
            engine: &self.engine,
            dst: &self.dst,
            m: Measured::default(),
            calls: Vec::new(),
        };
        let dense_call = |run: &mut Runner, layer: usize, proj: Proj| {
            for &(_, t) in self.dense.iter().filter(|d| d.0 == proj) {
                let w = &self.dense_maps[layer][t.offset..t.offset + t.bytes()];
                let b = if t.k == self.shape.hidden {
                    &self.b_up
                } else {
                    &self.b_wide
                };
                run.dense(layer, proj, t, w, b, tokens)?;
            }
            Ok::<(), String>(())
        };
        for (layer, map) in self.maps.iter().enumerate() {
            for proj in [Proj::AttnIn, Proj::AttnOut] {
                dense_call(&mut run, layer, proj)?;
            }
            let ids = routing.ids(layer, u, tokens, ne, nu, &mut self.rng);
            for &(proj, t) in &self.experts {
                let weights = &map[t.offset..t.offset + t.bytes()];
                let (b, b_rows) = if proj == Proj::Down {
                    (&self.b_down, nu)
                } else {
                    (&self.b_up, 1)
                };
                let descs = descs(t, weights, b, b_rows, &ids, &self.dst, tokens, nu, proj);
                let io = Inputs {
                    weights,
                    name: descs[0].name,
                    b,
                    ids: &ids,
                    dst: &self.dst[..t.n * nu * tokens],
                    pair: None,
                };
                run.call(layer, proj, &descs, io, false)?;
            }
            dense_call(&mut run, layer, Proj::Shared)?;
        }
        Ok((run.m, run.calls))
    }
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
        t: Tensor,
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

/// The four descriptors of one call (`b` has `b_rows` rows per token: 1, or n_used for down).
#[allow(clippy::too_many_arguments)]
fn descs<'a>(
    t: Tensor,
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
    t: Tensor,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_k_of_partial_blocks_takes_q5_0() {
        assert_eq!(type_for(GgmlType::Q4_K, 1408), GgmlType::Q5_0);
        assert_eq!(type_for(GgmlType::Q4_0, 1408), GgmlType::Q4_0);
    }
}
