//! The configuration of one context (the C `ork_config`): typed, with defaults, and no knowledge
//! of where the values came from (`crate::config` reads the environment).

use super::cache::{Policy, Verify};
use super::outliers::Rule;
use crate::npu::DeviceConfig;
use std::path::PathBuf;

/// Under [`Dispatch::Auto`], the fewest rows per expert (at most `min_rows`) of a call that is
/// measured rather than declined from its metadata. Below it, and below `min_rows` tokens, a call
/// is decode-sized: one token or a few parallel ones, whose ops are so short that entering the
/// measured call (the threads meet to decide) costs more than measuring could ever win back;
/// above it the threshold is the measurement's, class by class.
pub const MEASURED_ROWS_PER_EXPERT: u32 = 2;

/// What happens to calls below `min_rows` rows per expert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmallBatch {
    /// `NotHandled`: the caller's own path runs them.
    Decline,
    /// Taken, but the GEMMs run on the CPU int8 kernels instead of the device.
    Cpu,
}

/// How [`super::Engine::run_mt`] uses the caller's threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MtMode {
    /// Every caller thread takes a share of the work (phase 1 split, phase 2 work items).
    Coop,
    /// Caller thread 0 runs the call on the crate's pool; the others wait in the caller's barrier.
    /// Kept to measure against `Coop` where the caller's idle threads spin.
    Leader,
}

/// A context's configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The device and how its CPU-executed backends run (kernel path, threads).
    pub device: DeviceConfig,
    /// Expert cache budget in bytes.
    pub cache_bytes: u64,
    pub cache_policy: Policy,
    pub cache_verify: Verify,
    /// Calls whose average rows per used expert (`Problem::rows_per_expert`) are below this go
    /// to `small_batch`. Under [`Dispatch::Auto`] with [`SmallBatch::Decline`] it counts tokens
    /// instead: a call of fewer tokens, or of fewer than [`MEASURED_ROWS_PER_EXPERT`] rows per
    /// expert, is declined from its metadata; every other call is measured.
    pub min_rows: u32,
    pub small_batch: SmallBatch,
    pub mt_mode: MtMode,
    /// Submitter threads, one per NPU core (round robin over the enabled cores), that keep the
    /// NPU busy while the caller's threads prepare experts and scatter results; `None`: one per
    /// enabled core when the device offloads its runs (rknn), none otherwise (the caller's
    /// threads run the GEMMs themselves, as on the emulator, whose GEMMs are CPU work).
    pub submitters: Option<usize>,
    /// The outlier split of activation rows (docs/ACCURACY.md); `None`: one int8 scale per row.
    pub outliers: Option<Rule>,
    /// Most verbose library log level (process-wide: the last context created sets it).
    pub log_level: log::LevelFilter,
    /// Threads that inflate the experts of announced calls ahead (`Engine::prefetch`); 0: none;
    /// `None`: one per CPU of `prefetch_cpus`, else one per idle core of the slowest type
    /// ([`crate::cpus::idle_slow_cores`]), else none.
    pub prefetch_threads: Option<usize>,
    /// CPUs those threads run on (empty: as `None` above picks them, else wherever the process
    /// may run). On the RK3588 the A55s, while ggml's threads keep the A76s for the work between
    /// the calls.
    pub prefetch_cpus: Vec<usize>,
    /// Inflated experts the prefetch threads may hold ahead of their calls, in bytes.
    pub prefetch_bytes: u64,
    /// Whether dense matmuls ([`super::Engine::plan_dense`]) are taken; false declines them all.
    pub dense: bool,
    /// Which calls are taken: all that can be, none, or those measured faster here.
    pub dispatch: Dispatch,
    /// Where `auto`'s verdicts are remembered between runs; `None`: not remembered.
    pub dispatch_cache: Option<PathBuf>,
    /// Whether a context prints its dispatch verdicts when the process exits (`ORK_MOE_STATS`).
    pub print_verdicts: bool,
}

/// Which calls the engine takes (`ORK_DISPATCH`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dispatch {
    /// Every call it can.
    Always,
    /// None: the caller's own path runs them all.
    Never,
    /// Per class of call, the path measured faster ([`super::dispatch`]).
    Auto,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            device: DeviceConfig::default(),
            cache_bytes: 1 << 30,
            cache_policy: Policy::Pin,
            cache_verify: Verify::Sampled,
            min_rows: 8,
            small_batch: SmallBatch::Decline,
            mt_mode: MtMode::Coop,
            submitters: None,
            outliers: Some(Rule::DEFAULT),
            log_level: log::LevelFilter::Warn,
            prefetch_threads: None,
            prefetch_cpus: Vec::new(),
            prefetch_bytes: 1 << 30,
            dense: true,
            dispatch: Dispatch::Auto,
            dispatch_cache: None,
            print_verdicts: false,
        }
    }
}
