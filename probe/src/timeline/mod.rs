//! The board timeline model: what one ubatch of a MoE prefill would take on an RK3588, from the
//! work the engine does, priced at board rates. Every figure it gives is *modelled*.
//!
//! - [`calls`]: what the engine did per call ([`CallWork`]), the model's input;
//! - [`engine`]: how an engine turns calls into tasks ([`EngineModel`]): the library's engine
//!   without and with its prefetch threads, submits blocking ggml's threads, pipelined variants;
//! - [`builder`]: the work graph of one ubatch ([`work`]: tasks with a resource, an amount of
//!   work, dependencies) from the calls under an engine model, the NPU runs of each expert from
//!   [`runs`], the contexts and buffers it holds from [`caches`];
//! - [`price`], [`sched`], [`simulate`]: each task's solo time, the serial time, the
//!   as-scheduled time of a list scheduler over the graph (DRAM shared among the running tasks)
//!   and the resource lower bound;
//! - [`params`], [`settings`], [`profile`], [`fit`]: the parameters with their sources, where each
//!   value came from, the board profile they are written to and read from, and the lines fitted to
//!   the profile's measurement arrays;
//! - [`shape`]: model shapes and the dense part (priced from a published CPU-only figure).
//!
//! The NPU runs are priced by the emulator's cost model ([`ork_moe::npu::emu::modelled_submit`]).
//! docs/BOARD-MODEL.md specifies the model and its parameters.

pub mod builder;
pub mod caches;
pub mod calls;
pub mod engine;
pub mod fit;
pub mod params;
pub mod price;
pub mod profile;
pub mod runs;
pub mod sched;
pub mod settings;
pub mod shape;
pub mod simulate;
pub mod work;

pub use builder::build;
pub use caches::ContextCache;
pub use calls::{CallWork, DenseWork, ExpertCall, Proj, UbatchWork};
pub use engine::{EngineModel, RingBound};
pub use params::{Params, SPECS};
pub use sched::{timeline, Bound, Timeline};
pub use settings::{Origin, ProfileInfo, Settings};
pub use shape::{CpuRates, ModelShape};
pub use work::{Graph, Stage, Unit, Work};

/// One ubatch under one engine model.
#[derive(Clone, Debug, PartialEq)]
pub struct UbatchModel {
    /// The expert part alone (the dense part's tasks take no time).
    pub experts: Timeline,
    /// The whole ubatch, the dense part on ggml's threads included.
    pub whole: Timeline,
}

impl UbatchModel {
    /// Prefill tokens per second of the whole ubatch, as scheduled.
    pub fn prefill_tokps(&self, tokens: usize) -> f64 {
        tokens as f64 * 1e6 / self.whole.scheduled_us
    }
}

/// Models `ub` under `engine`: the expert part alone and the whole ubatch. `contexts` carries
/// the backend's matmul contexts from one ubatch to the next (both graphs start from its state;
/// it ends as the whole ubatch leaves it).
pub fn model_ubatch(
    ub: &UbatchWork,
    engine: &EngineModel,
    params: &Params,
    cache_bytes: u64,
    contexts: &mut ContextCache,
) -> Result<UbatchModel, String> {
    let mut alone = contexts.clone();
    let at_dmc = params.at_dmc();
    let g = build(ub, engine, &at_dmc, cache_bytes, &mut alone, false);
    let experts = timeline(&g, &at_dmc)?;
    let whole = model_whole_ubatch(ub, engine, params, cache_bytes, contexts)?;
    Ok(UbatchModel { experts, whole })
}

/// The whole ubatch `ub` under `engine`, as [`model_ubatch`] models it.
pub fn model_whole_ubatch(
    ub: &UbatchWork,
    engine: &EngineModel,
    params: &Params,
    cache_bytes: u64,
    contexts: &mut ContextCache,
) -> Result<Timeline, String> {
    let params = &params.at_dmc();
    let g = build(ub, engine, params, cache_bytes, contexts, true);
    timeline(&g, params)
}

#[cfg(test)]
mod tests;
