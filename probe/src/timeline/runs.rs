//! How one expert item's GEMM becomes NPU runs under an engine model: the placement (the rknn
//! backend's, or the submitters'), the split over the cores, M rounded to buckets, and the
//! matmul contexts a run needs created first.

use super::caches::ContextCache;
use super::calls::CallWork;
use super::engine::EngineModel;
use super::work::Unit;
use ork_moe::layout::Tiles;
use ork_moe::npu::rknn::CONTEXT_CACHE;
use ork_moe::npu::{expert_parts, in_stream_envelope, split_channels, submitter_ways, Primitive};

/// One run of an expert item.
pub struct RunPlan {
    pub primitive: Primitive,
    pub m: u32,
    pub n: u32,
    pub unit: Unit,
    /// Its context must be created first.
    pub new_context: bool,
}

/// The runs of one expert item of call `c` with `rows` rows, its K and N padded to `kp` and
/// `np`, on `cores` NPU cores; `contexts` notes the contexts they use.
pub fn plan(
    e: &EngineModel,
    cores: usize,
    contexts: &mut ContextCache,
    c: &CallWork,
    rows: u32,
    kp: usize,
    np: usize,
) -> Vec<RunPlan> {
    let m = rows.div_ceil(e.m_bucket) * e.m_bucket;
    // Contexts are keyed by the range of row counts one of them covers.
    let ctx_m = m.div_ceil(e.context_rows.max(1));
    let stream = in_stream_envelope(c.k);
    let primitive = if stream {
        Primitive::StreamI8
    } else {
        Primitive::RunI8
    };
    let t = Tiles::RK3588;
    let slices = if e.rknn_placement && !stream {
        let all: Vec<usize> = (0..cores).collect();
        split_channels(&t, 0, np, &all)
    } else if e.rknn_placement || e.blocking_submits {
        // A one-GEMM stream: one run, on core 0 in the rknn backend.
        vec![(0, 0, np)]
    } else {
        // The engine's submitters: an expert with a large share of the call's rows is split
        // over the cores as the engine's work items are; each part one run on any core.
        let ways = submitter_ways(cores, c.one_expert());
        let parts = expert_parts(rows as usize, c.rows() as usize, ways, np / t.b_n);
        let ways: Vec<usize> = (0..parts).map(|_| 0).collect();
        split_channels(&t, 0, np, &ways)
    };
    slices
        .into_iter()
        .map(|(core, n0, n1)| {
            let n = (n1 - n0) as u32;
            let (unit, new_context) = if e.rknn_placement && e.blocking_submits {
                let key = (ctx_m, kp as u32, n, core as u8);
                (Unit::Npu(core as u8), contexts.get(key, CONTEXT_CACHE))
            } else {
                let new = any_core_context(contexts, (ctx_m, kp as u32, n), cores);
                (Unit::AnyNpu, new)
            };
            RunPlan {
                primitive,
                m,
                n,
                unit,
                new_context,
            }
        })
        .collect()
}

/// A run that may land on any core needs its shape's context on every core; each core's
/// submitter keeps a cache of its own.
fn any_core_context(contexts: &mut ContextCache, (m, k, n): (u32, u32, u32), cores: usize) -> bool {
    let mut new = false;
    for core in 0..cores {
        new |= contexts.get((m, k, n, core as u8), CONTEXT_CACHE * cores);
    }
    new
}
