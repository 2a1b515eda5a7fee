//! How an engine turns a ubatch's calls into tasks: the library's engine without and with its
//! prefetch threads, an engine whose submits block ggml's threads, and pipelined variants.

use super::params::Params;
use super::work::Unit;

/// How an engine turns the calls into tasks: the library's engine, or a variant of it.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineModel {
    pub name: &'static str,
    /// ggml runs one op at a time on all its threads: a call starts when the previous op ended,
    /// and within a call phase 1 (route, quantize) is a barrier before phase 2.
    pub ops_in_sequence: bool,
    /// Each expert item is one thread's chain (weights, gather, submit, scatter) and the
    /// thread blocks in `rknn_matmul_run`. Otherwise runs go to per-core submitter threads that
    /// cost no CPU and items' CPU stages are independent tasks.
    pub blocking_submits: bool,
    /// A cache miss allocates a fresh device buffer for B (the cache frees evicted experts);
    /// otherwise B comes from buffers allocated once and recycled.
    pub fresh_b_per_miss: bool,
    /// The rknn backend's placement: a one-GEMM stream runs on core 0, `run_i8` is split over
    /// the cores into runs issued one after another. Otherwise each expert is one run on any core.
    pub rknn_placement: bool,
    /// Gate and up as one call with N = 2·n_ff (one gather, one run per expert).
    pub fuse_gate_up: bool,
    /// Rows of a run rounded up to a multiple of this (1: exact M), so contexts are per bucket.
    pub m_bucket: u32,
    /// Row counts one matmul context covers (the runtime's dynamic shapes, `ORK_RKNN_DYNAMIC_M`;
    /// 1: a context per distinct M).
    pub context_rows: u32,
    /// Inflate every expert of a call ahead of its routing (at prefill sizes every expert is
    /// used) into a ring bounded by `ring`; otherwise an expert is inflated when its item runs.
    pub prefetch: bool,
    /// What bounds the prefetch ring's resident inflated experts.
    pub ring: RingBound,
    /// Where inflates run: ggml's threads (`Big`), any core, or the A55s only (leaving the A76s
    /// to the dense part and the items' CPU stages).
    pub inflate_on: Unit,
    /// A call withdraws its prefetched experts not started yet and inflates them itself, as the
    /// engine's prefetcher does (`Staging::withdraw`); otherwise it waits for the prefetch.
    pub withdraw: bool,
    /// The prefetch threads start no expert while a routed call runs, as the engine's (they
    /// leave the DRAM to the call's NPU runs); needs `withdraw`, or a call would wait for them
    /// forever.
    pub pause: bool,
    /// The outlier split runs (`ORK_OUTLIERS`, on by default): per expert, the f32 weight
    /// columns of its rows' outlier channels (`outlier_columns_*` parameters), on the CPU.
    pub outliers: bool,
    /// While a dense call's runs keep its threads waiting and more of its runs are queued, they
    /// inflate prefetch jobs, as the engine's do (`Staging::help_job`): the A76s' share of the
    /// prefetch. Once the submitters took the last runs, the threads are kept for the scatters.
    pub help: bool,
    /// A call whose activation rows are each read by one row of it (down) quantizes an expert's
    /// rows where it gathers them, not in phase 1 (`Call::quantized_at_gather`); a dense call's
    /// phase 1 writes native A's order, which its gather copies whole (`Call::quantized_native`).
    pub quant_at_gather: bool,
}

/// The bytes of inflated experts a prefetching engine keeps resident at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingBound {
    /// The whole IOMMU domain (`domain_mb`).
    Domain,
    /// The engine's staging budget (`prefetch_mb`, `ORK_PREFETCH_MB`).
    Staging,
}

impl RingBound {
    pub fn bytes(self, params: &Params) -> u64 {
        let mb = match self {
            RingBound::Domain => params.domain_mb,
            RingBound::Staging => params.prefetch_mb,
        };
        (mb * (1u64 << 20) as f64) as u64
    }
}

impl EngineModel {
    /// The library's engine with its defaults, no prefetch threads (`ORK_PREFETCH=0`, or
    /// llama.cpp on every core): ggml's threads prepare experts (inflate, gather) and scatter
    /// while one submitter thread per NPU core runs each expert's GEMM on that core
    /// (`ORK_SUBMITTERS`); B buffers are recycled; gate and up are one pair call (the patch fuses
    /// them); contexts are the runtime's dynamic shapes, one per 64 row counts. Ops run one
    /// after another and nothing is inflated before its call.
    pub fn without_prefetch() -> EngineModel {
        EngineModel {
            name: "engine",
            ops_in_sequence: true,
            blocking_submits: false,
            fresh_b_per_miss: false,
            rknn_placement: false,
            fuse_gate_up: true,
            m_bucket: 1,
            context_rows: 64,
            prefetch: false,
            ring: RingBound::Domain,
            inflate_on: Unit::Big,
            withdraw: false,
            pause: false,
            outliers: true,
            help: false,
            quant_at_gather: true,
        }
    }

    /// The engine without submitter threads, recycled B buffers, pair calls, dynamic-shape
    /// contexts or the outlier split: ggml's threads submit each expert's runs on the rknn
    /// backend and block in them, and every cache miss creates a device buffer. The reference the
    /// other variants' gains are measured against.
    pub fn blocking() -> EngineModel {
        EngineModel {
            name: "blocking",
            ops_in_sequence: true,
            blocking_submits: true,
            fresh_b_per_miss: true,
            rknn_placement: true,
            fuse_gate_up: false,
            m_bucket: 1,
            context_rows: 1,
            prefetch: false,
            ring: RingBound::Domain,
            inflate_on: Unit::Big,
            withdraw: false,
            pause: false,
            outliers: false,
            help: false,
            quant_at_gather: false,
        }
    }

    /// The library's engine with its prefetch threads: at graph begin llama.cpp names every
    /// MUL_MAT_ID node of the graph, and `ORK_PREFETCH` threads pinned to the A55s
    /// (`ORK_PREFETCH_CPUS=0-3`, ggml's `-t 4` on the A76s) inflate every expert of those calls,
    /// in graph order, into a staging area of `prefetch_mb` (`ORK_PREFETCH_MB`) inside one IOMMU
    /// domain; a call takes its experts from there and frees each slot when its runs are done.
    /// Everything else is `without_prefetch()`. When a call starts it withdraws its experts the
    /// prefetcher has not started: its own threads inflate the used ones, the unused ones are
    /// dropped; one the prefetcher is inflating it waits for; and until it ends the prefetcher
    /// starts no expert (a dense call, NPU work with little DRAM traffic, does not pause it).
    /// Assumes the prefetch threads start at graph begin (during layer 0's dense part).
    ///
    /// Against the engine: it frees a slot when the call takes the expert, not when its runs
    /// are done, which times the same, because nothing is started while the call runs. An
    /// expert staged but unused stays in the engine's staging area into the next graph (whose
    /// call may take it), where the model frees its slot at the routing; so where experts go
    /// unused (small ubatches) the engine has less staging room than modelled.
    pub fn with_prefetch() -> EngineModel {
        EngineModel {
            name: "engine+prefetch",
            prefetch: true,
            ring: RingBound::Staging,
            inflate_on: Unit::Little,
            withdraw: true,
            pause: true,
            help: true,
            ..EngineModel::without_prefetch()
        }
    }

    /// The blocking engine's runs, pipelined: experts inflated ahead on all eight cores into a ring of
    /// buffers inside one IOMMU domain while the NPU runs the current ones, runs issued by
    /// per-core submitter threads, calls overlapping wherever the data allows.
    pub fn pipelined() -> EngineModel {
        EngineModel {
            name: "pipelined",
            ops_in_sequence: false,
            blocking_submits: false,
            fresh_b_per_miss: false,
            rknn_placement: true,
            fuse_gate_up: false,
            m_bucket: 1,
            context_rows: 1,
            prefetch: true,
            ring: RingBound::Domain,
            inflate_on: Unit::AnyCpu,
            withdraw: false,
            pause: false,
            outliers: true,
            help: false,
            quant_at_gather: true,
        }
    }

    /// Pipelined with fewer submits: gate and up fused, one run per expert and projection on any
    /// core, M rounded up to multiples of 16 (the rows of one hardware task at K = 2048), so
    /// contexts are created once per bucket.
    pub fn pipelined_fused() -> EngineModel {
        EngineModel {
            name: "pipelined+fused",
            rknn_placement: false,
            fuse_gate_up: true,
            m_bucket: 16,
            ..EngineModel::pipelined()
        }
    }
}
