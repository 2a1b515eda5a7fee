//! The board-model part: the calls of the layers run here stand for all of the model's layers,
//! in turn, and each ubatch of them is modelled on the RK3588 under each engine model
//! ([`ork_probe::timeline`]).

use super::Case;
use ork_moe::moe::cache::Policy;
use ork_moe::moe::Config;
use ork_probe::timeline::{
    self, CallWork, ContextCache, CpuRates, DenseWork, EngineModel, ModelShape, Params,
    UbatchModel, UbatchWork,
};

/// Bytes of one layer's dense matmuls inflated to int8.
fn dense_weight_bytes_per_layer(shape: &ModelShape) -> u64 {
    shape.dense_matmul_macs_per_token_layer() as u64
}

/// Bytes of all of `shape`'s experts inflated to int8, and with `dense` of its dense matmuls.
pub fn full_weight_bytes(shape: &ModelShape, dense: bool) -> u64 {
    let experts = (3 * shape.n_expert * shape.hidden * shape.expert_ff) as u64;
    let matmuls = if dense {
        dense_weight_bytes_per_layer(shape)
    } else {
        0
    };
    (experts + matmuls) * shape.layers as u64
}

pub const ENGINES: usize = 4;

/// Indexed as `UbatchResult::models`: the engine, pipelined, fused, the engine with its prefetch
/// threads.
pub fn engines() -> [EngineModel; ENGINES] {
    [
        EngineModel::without_prefetch(),
        EngineModel::pipelined(),
        EngineModel::pipelined_fused(),
        EngineModel::with_prefetch(),
    ]
}

/// One case on the board: the dense part of a layer, the CPU's rates, and each engine model's
/// contexts, which carry over from one ubatch to the next.
pub struct Board<'a> {
    shape: ModelShape,
    tokens: usize,
    params: &'a Params,
    cache_bytes: u64,
    policy: Policy,
    /// The library takes the dense matmuls (`ORK_DENSE`).
    dense_matmuls: bool,
    rates: CpuRates,
    dense: DenseWork,
    contexts: Vec<ContextCache>,
}

/// One ubatch as modelled.
pub struct Modelled {
    /// Indexed as [`engines`].
    pub models: Vec<UbatchModel>,
    /// Cache hits and lookups of the whole model's calls.
    pub hits: u64,
    pub lookups: u64,
}

impl<'a> Board<'a> {
    /// `shape` in ubatches of `tokens`, with the library configured by `cfg`.
    pub fn new(shape: ModelShape, tokens: usize, params: &'a Params, cfg: &Config) -> Board<'a> {
        let rates = CpuRates::from_reference(params);
        Board {
            shape,
            tokens,
            params,
            cache_bytes: cfg.cache_bytes,
            policy: cfg.cache_policy,
            dense_matmuls: cfg.dense,
            dense: rates.dense_layer(&shape, tokens, params, cfg.dense),
            rates,
            contexts: (0..ENGINES).map(|_| ContextCache::default()).collect(),
        }
    }

    /// One ubatch: `calls`, those of the first `run_layers` layers, repeated to the whole model
    /// and modelled under each engine model.
    pub fn ubatch(&mut self, calls: &[CallWork], run_layers: usize) -> Result<Modelled, String> {
        let calls = self.whole_model(calls, run_layers);
        let lookups = calls.iter().flat_map(|c| &c.experts);
        let hits = lookups.clone().filter(|x| x.hit).count() as u64;
        let lookups = lookups.count() as u64;
        let work = UbatchWork {
            tokens: self.tokens,
            calls,
            dense: vec![self.dense; self.shape.layers],
        };
        let models = engines()
            .iter()
            .zip(self.contexts.iter_mut())
            .map(|(e, ctx)| timeline::model_ubatch(&work, e, self.params, self.cache_bytes, ctx))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Modelled {
            models,
            hits,
            lookups,
        })
    }

    /// The calls of the layers run here, standing for all of the model's, in turn. Their hits
    /// repeat only if every layer's weights fit the cache; otherwise the layers run here already
    /// fill the budget (the setup warns otherwise), so whatever the policy keeps, the full model hits no
    /// more experts per ubatch than were hit here. Under `pin` the dense matrices are priority
    /// entries, which displace routed experts: those of the first layers that fit stay.
    fn whole_model(&self, calls: &[CallWork], run_layers: usize) -> Vec<CallWork> {
        let shape = &self.shape;
        let repeat_hits = full_weight_bytes(shape, self.dense_matmuls) <= self.cache_bytes;
        let dense_layers_held = match self.policy {
            Policy::Pin => (self.cache_bytes / dense_weight_bytes_per_layer(shape).max(1)) as usize,
            Policy::Lru if repeat_hits => shape.layers,
            Policy::Lru => 0,
        };
        let mut full = Vec::new();
        for l in 0..shape.layers {
            for c in calls.iter().filter(|c| c.layer as usize == l % run_layers) {
                let mut c = CallWork {
                    layer: l as u32,
                    ..c.clone()
                };
                let held = if c.proj.routed() {
                    repeat_hits
                } else {
                    l < dense_layers_held
                };
                if l >= run_layers && !held {
                    c.experts.iter_mut().for_each(|x| x.hit = false);
                }
                full.push(c);
            }
        }
        full
    }

    /// Modelled CPU-only prefill of the case.
    pub fn cpu_only_tokps(&self) -> f64 {
        self.rates.cpu_only_tokps(&self.shape, self.tokens)
    }

    /// The dense part of a ubatch, all layers.
    pub fn dense_us(&self) -> f64 {
        let d = &self.dense;
        (d.before_us
            + self
                .rates
                .elementwise_us(d.act_elems + d.combine_elems, self.params))
            * self.shape.layers as f64
    }
}

/// The published CPU-only figure this case compares against, and where it comes from.
pub fn reference(case: &Case, p: &Params) -> (f64, String) {
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
