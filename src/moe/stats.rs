//! What the engine counts: per-call stage times and the context's counters.

use crate::npu::BackendKind;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Time spent per stage in one call, summed over the threads that worked on it (ns).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stages {
    pub route: u64,
    /// Activation quantization and the gather of each expert's rows into native A.
    pub quant: u64,
    /// Cache lookups and inflation.
    pub inflate: u64,
    /// Submits, their runs and the sync of C.
    pub gemm: u64,
    pub scatter: u64,
}

/// One stage of [`Stages`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stage {
    Route,
    Quant,
    Inflate,
    Gemm,
    Scatter,
}

/// The stage clocks of one call, shared by its threads.
#[derive(Default)]
pub(super) struct StageClock([AtomicU64; 5]);

impl StageClock {
    pub(super) fn add(&self, stage: Stage, since: Instant) {
        self.0[stage as usize].fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    pub(super) fn get(&self) -> Stages {
        let [route, quant, inflate, gemm, scatter] = self.0.each_ref().map(load);
        Stages {
            route,
            quant,
            inflate,
            gemm,
            scatter,
        }
    }
}

/// One used expert of a call, as phase 2 handled it: what a model of the call's schedule (the
/// board timeline model of `ork-probe model`) needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertRun {
    pub expert: usize,
    /// Rows routed to it.
    pub rows: usize,
    /// Found in the cache (not inflated by this call).
    pub hit: bool,
}

/// Counters since the engine was created (the C `ork_stats`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    pub calls: u64,
    pub handled: u64,
    pub declined: u64,
    pub rows: u64,
    pub experts_inflated: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub cache_evictions: u64,
    /// Inflated experts the cache did not keep (budget full of entries worth keeping).
    pub cache_bypassed: u64,
    pub bytes_inflated: u64,
    pub submits_run_i8: u64,
    pub submits_stream: u64,
    pub submits_chain: u64,
    pub cpu_gemms: u64,
    /// Matmul contexts the runtime created (rknn; 0 elsewhere).
    pub contexts_created: u64,
    /// Device buffers created (spares missed; the cache's own included). Not in `ork_stats`,
    /// whose layout ABI v1 fixes.
    pub buffers_created: u64,
    /// Modelled NPU time (emulator cost model), never a measurement.
    pub modelled_npu_us: f64,
    pub backend: Option<BackendKind>,
}

/// The engine's own counters (the cache and the device keep theirs).
#[derive(Default)]
pub(super) struct Counters {
    pub calls: AtomicU64,
    pub handled: AtomicU64,
    pub declined: AtomicU64,
    pub rows: AtomicU64,
    pub experts_inflated: AtomicU64,
    pub bytes_inflated: AtomicU64,
    pub cpu_gemms: AtomicU64,
}

pub(super) fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

pub(super) fn load(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}
