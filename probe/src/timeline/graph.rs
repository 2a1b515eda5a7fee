//! The work graph of one ubatch: tasks with a resource, an amount of work in the units the
//! parameters price, and dependencies; and the builder that makes it from what the engine did
//! per MUL_MAT_ID call (counts the engine or the probe supply).

use super::params::Params;
use super::shape::DenseWork;
use ork_moe::layout::Tiles;
use ork_moe::npu::rknn::CONTEXT_CACHE;
use ork_moe::npu::split_channels;
use ork_moe::npu::{expert_parts, submitter_ways};
use ork_moe::npu::{in_stream_envelope, Primitive};
use ork_moe::quant::GgmlType;
use std::collections::{HashSet, VecDeque};

/// What a task's time is reported under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    Route,
    Quant,
    Gather,
    Lookup,
    BufferCreate,
    Inflate,
    Sync,
    ContextCreate,
    Npu,
    Outliers,
    Scatter,
    Dense,
    Join,
}

impl Stage {
    /// Every stage but `Join` (which takes no time), in report order.
    pub const REPORTED: [Stage; 12] = [
        Stage::Route,
        Stage::Quant,
        Stage::Gather,
        Stage::Lookup,
        Stage::BufferCreate,
        Stage::Inflate,
        Stage::Sync,
        Stage::ContextCreate,
        Stage::Npu,
        Stage::Outliers,
        Stage::Scatter,
        Stage::Dense,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stage::Route => "route",
            Stage::Quant => "quant",
            Stage::Gather => "gather",
            Stage::Lookup => "lookup",
            Stage::BufferCreate => "buffer_create",
            Stage::Inflate => "inflate",
            Stage::Sync => "sync",
            Stage::ContextCreate => "context_create",
            Stage::Npu => "npu",
            Stage::Outliers => "outliers",
            Stage::Scatter => "scatter",
            Stage::Dense => "dense",
            Stage::Join => "join",
        }
    }
}

/// The resource a task needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Nothing: a join of its dependencies, done when they are.
    Free,
    /// A Cortex-A76.
    Big,
    /// A Cortex-A55.
    Little,
    /// Any CPU core.
    AnyCpu,
    /// NPU core `n`.
    Npu(u8),
    /// Any NPU core.
    AnyNpu,
}

/// A task's amount of work, in the units the parameters price.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Work {
    Join,
    /// Routing of `rows` (token, slot) pairs.
    Route {
        rows: u64,
    },
    /// Activation elements quantized (f32 read, int8 written).
    Quant {
        elems: u64,
    },
    /// Bytes of native A written from the quantized rows.
    Gather {
        bytes: u64,
    },
    /// Bytes of native A copied whole from phase 1's shares, written in A's order already (a
    /// dense call: `Call::quantized_native`).
    Concat {
        bytes: u64,
    },
    /// One expert-cache hit.
    Lookup,
    /// Creating a device buffer of `bytes`.
    BufferCreate {
        bytes: u64,
    },
    /// Inflating `q_bytes` of `ty` into `out_bytes` of native int8 B.
    Inflate {
        ty: GgmlType,
        q_bytes: u64,
        out_bytes: u64,
    },
    /// A cache sync (flush or invalidate) of `bytes`.
    Sync {
        bytes: u64,
    },
    /// Creating a matmul context.
    ContextCreate,
    /// One `rknn_matmul_run` of an `m × k × n` GEMM (padded k, n) on one core.
    Run {
        primitive: Primitive,
        m: u32,
        k: u32,
        n: u32,
    },
    /// The outlier split of one expert (`ORK_OUTLIERS`): `weights` f32 weight-column values
    /// decoded from `q_bytes` of `ty` (each row read once) and their products added.
    Outliers {
        ty: GgmlType,
        weights: u64,
        q_bytes: u64,
    },
    /// int32 C read, scaled f32 written to dst.
    Scatter {
        c_bytes: u64,
        dst_bytes: u64,
    },
    /// A ggml element-wise op (SiLU·mul, the expert combine) share.
    Elementwise {
        elems: u64,
    },
    /// A share of the dense part: wall time on one big core, and the DRAM bytes it reads.
    Dense {
        us: f64,
        bytes: u64,
    },
}

impl Work {
    pub fn stage(&self) -> Stage {
        match self {
            Work::Join => Stage::Join,
            Work::Route { .. } => Stage::Route,
            Work::Quant { .. } => Stage::Quant,
            Work::Gather { .. } | Work::Concat { .. } => Stage::Gather,
            Work::Lookup => Stage::Lookup,
            Work::BufferCreate { .. } => Stage::BufferCreate,
            Work::Inflate { .. } => Stage::Inflate,
            Work::Sync { .. } => Stage::Sync,
            Work::ContextCreate => Stage::ContextCreate,
            Work::Run { .. } => Stage::Npu,
            Work::Outliers { .. } => Stage::Outliers,
            Work::Scatter { .. } => Stage::Scatter,
            Work::Elementwise { .. } | Work::Dense { .. } => Stage::Dense,
        }
    }
}

/// One task of the graph.
#[derive(Clone, Debug, PartialEq)]
pub struct Task {
    pub work: Work,
    pub unit: Unit,
    /// Tasks that must finish first (all earlier in the graph).
    pub deps: Vec<u32>,
    /// Runs on, and until then keeps, the CPU thread of this dependency: a thread that works
    /// through one expert item (and blocks in the NPU run) in today's engine.
    pub thread_of: Option<u32>,
    pub layer: u32,
    /// Device bytes this task makes resident when it starts...
    pub alloc: u64,
    /// ...and releases when it ends (IOMMU domain occupancy).
    pub free: u64,
    /// A prefetched inflate its call withdraws: if it has not started when this task (the
    /// call's start) ends, ggml's threads (the big cores) run it, or, for an expert the call
    /// does not use, nobody does.
    pub withdrawn_by: Option<Withdraw>,
}

/// When, and how, a call takes over a prefetched inflate (`Task::withdrawn_by`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Withdraw {
    pub by: u32,
    /// The call does not use this expert: withdrawn, it is not inflated at all.
    pub unused: bool,
}

/// A work graph: tasks in a topological order (dependencies point backwards). The order is
/// also the scheduler's priority: earlier tasks first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Graph {
    pub tasks: Vec<Task>,
    /// Each call's first and last task, where the prefetcher pauses while a call runs
    /// (`EngineModel::pause`).
    pub calls: Vec<(u32, u32)>,
    /// The same for the calls whose waiting threads take prefetch inflates meanwhile
    /// (`EngineModel::help`).
    pub helping: Vec<(u32, u32)>,
}

impl Graph {
    /// Appends a task; `deps` must be earlier tasks.
    pub fn push(&mut self, work: Work, unit: Unit, deps: &[u32], layer: u32) -> u32 {
        let id = self.tasks.len() as u32;
        assert!(deps.iter().all(|&d| d < id), "dependencies point backwards");
        self.tasks.push(Task {
            work,
            unit,
            deps: deps.to_vec(),
            thread_of: None,
            layer,
            alloc: 0,
            free: 0,
            withdrawn_by: None,
        });
        id
    }

    /// Appends a task that continues on `thread`'s CPU thread (and depends on it).
    pub fn push_on(
        &mut self,
        work: Work,
        unit: Unit,
        thread: u32,
        deps: &[u32],
        layer: u32,
    ) -> u32 {
        let mut all = deps.to_vec();
        all.push(thread);
        let id = self.push(work, unit, &all, layer);
        self.tasks[id as usize].thread_of = Some(thread);
        id
    }

    /// A task that is done when all of `deps` are.
    pub fn join(&mut self, deps: &[u32], layer: u32) -> u32 {
        self.push(Work::Join, Unit::Free, deps, layer)
    }
}

/// The projection a call computes: a routed expert's (MUL_MAT_ID), or a dense weight matrix's
/// (MUL_MAT, one expert every token routes to: `ork_mul_mat_mt`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proj {
    Gate,
    Up,
    /// llama.cpp's fused `ffn_gate_up_exps`: one call, N = 2·n_ff.
    GateUp,
    Down,
    /// An attention projection before the attention core (q, k, v).
    AttnIn,
    /// The attention output projection (o), after the core.
    AttnOut,
    /// A shared expert's gate, up or down, after the routed experts.
    Shared,
}

impl Proj {
    /// A routed projection: a MUL_MAT_ID, which the patch announces at graph begin for the
    /// prefetcher. Dense calls are not announced: their inflates run in the call.
    pub fn routed(self) -> bool {
        matches!(self, Proj::Gate | Proj::Up | Proj::GateUp | Proj::Down)
    }
}

/// One used expert of a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertCall {
    /// Rows routed to it.
    pub rows: u32,
    /// Found in the cache (no inflate).
    pub hit: bool,
}

/// One call as the engine ran it (a MUL_MAT_ID, or a dense matmul as one expert): what the
/// engine (or the probe, from the engine's statistics and the routing) can count.
#[derive(Clone, Debug, PartialEq)]
pub struct CallWork {
    pub layer: u32,
    pub proj: Proj,
    /// K and N of one expert (unpadded).
    pub k: usize,
    pub n: usize,
    pub ty: GgmlType,
    /// Distinct activation rows quantized (tokens, or tokens × n_used for down).
    pub act_rows: u64,
    pub n_expert: usize,
    /// The used experts, in the order the engine handles them.
    pub experts: Vec<ExpertCall>,
}

impl CallWork {
    /// Bytes of one expert's quantized weights.
    pub fn q_bytes(&self) -> u64 {
        (self.n * self.ty.row_bytes(self.k).expect("K is whole blocks")) as u64
    }

    /// Bytes of one expert's native int8 B.
    pub fn b_bytes(&self) -> u64 {
        let t = Tiles::RK3588;
        t.b_len(t.pad(self.k), t.pad(self.n)) as u64
    }

    /// (token, slot) rows of the call.
    pub fn rows(&self) -> u64 {
        self.experts.iter().map(|e| e.rows as u64).sum()
    }

    /// A dense call's: one expert (`Problem::one_expert`).
    pub fn one_expert(&self) -> bool {
        self.n_expert == 1
    }

    /// Each activation row read by one row of the call (`Problem::rows_read_once`).
    pub fn rows_read_once(&self) -> bool {
        self.act_rows == self.rows()
    }
}

/// One ubatch's expert work and dense part.
#[derive(Clone, Debug, PartialEq)]
pub struct UbatchWork {
    pub tokens: usize,
    /// The calls in the order ggml runs them: per layer the dense calls the library takes
    /// (q, k, v, o; none with `ORK_DENSE=0`), gate, up (or gate_up), down, a shared expert's.
    pub calls: Vec<CallWork>,
    /// The dense part, per layer (index = `CallWork::layer`).
    pub dense: Vec<DenseWork>,
}

/// How the engine turns the calls into tasks: today's engine, or a variant the lead may build.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineModel {
    pub name: &'static str,
    /// ggml runs one op at a time on all its threads: a call starts when the previous op ended,
    /// and within a call phase 1 (route, quantize) is a barrier before phase 2.
    pub ops_in_sequence: bool,
    /// Each expert item is one thread's chain (weights, gather, submit, scatter) and the
    /// thread blocks in `rknn_matmul_run`, as the engine does today. Otherwise runs go to
    /// per-core submitter threads that cost no CPU and items' CPU stages are independent tasks.
    pub blocking_submits: bool,
    /// A cache miss allocates a fresh device buffer for B (today's cache frees evicted
    /// experts); otherwise B comes from a ring of buffers allocated once.
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
    /// The outlier split runs (the default since issue 13): per expert, the f32 weight columns
    /// of its rows' outlier channels (`outlier_columns_*` parameters), on the CPU.
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
    fn bytes(self, params: &Params) -> u64 {
        let mb = match self {
            RingBound::Domain => params.domain_mb,
            RingBound::Staging => params.prefetch_mb,
        };
        (mb * (1u64 << 20) as f64) as u64
    }
}

impl EngineModel {
    /// The engine as it is: ggml's threads prepare experts (inflate, gather) and scatter while one
    /// submitter thread per NPU core runs each expert's GEMM on that core (`ORK_SUBMITTERS`); B
    /// buffers are recycled; gate and up are one pair call (the patch fuses them); contexts are
    /// the runtime's dynamic shapes, one per 64 row counts. Ops still run one after another and
    /// nothing is inflated before its call.
    pub fn engine() -> EngineModel {
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

    /// The engine of the M0 note's era (before submitter threads, recycled B buffers, pair calls,
    /// dynamic-shape contexts and the outlier split): what `Engine::run_mt` did with ggml's threads on the rknn
    /// backend.
    pub fn before() -> EngineModel {
        EngineModel {
            name: "before",
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

    /// Today's engine with its prefetcher: at graph begin llama.cpp names every MUL_MAT_ID node
    /// of the graph, and `ORK_PREFETCH` threads pinned to the A55s (`ORK_PREFETCH_CPUS=0-3`,
    /// ggml's `-t 4` on the A76s) inflate every expert of those calls, in graph order, into a
    /// staging area of `prefetch_mb` (`ORK_PREFETCH_MB`) inside one IOMMU domain; a call takes
    /// its experts from there and frees each slot when its runs are done. Everything else is
    /// `engine()`. When a call starts it withdraws its experts the prefetcher has not started:
    /// its own threads inflate the used ones, the unused ones are dropped; one the prefetcher
    /// is inflating it waits for; and until it ends the prefetcher starts no expert (a dense
    /// call, NPU work with little DRAM traffic, does not pause it). Assumes
    /// the prefetch threads start at graph begin (during layer 0's dense part).
    ///
    /// Against the engine: it frees a slot when the call takes the expert, not when its runs
    /// are done, which times the same, because nothing is started while the call runs. An
    /// expert staged but unused stays in the engine's staging area into the next graph (whose
    /// call may take it), where the model frees its slot at the routing; so where experts go
    /// unused (small ubatches) the engine has less staging room than modelled.
    pub fn prefetching() -> EngineModel {
        EngineModel {
            name: "engine+prefetch",
            prefetch: true,
            ring: RingBound::Staging,
            inflate_on: Unit::Little,
            withdraw: true,
            pause: true,
            help: true,
            ..EngineModel::engine()
        }
    }

    /// The same submits, pipelined: experts inflated ahead on all eight cores into a ring of
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

/// The rknn backend's matmul contexts: created on first use of a key, kept in a cache that
/// drops the unused ones when full (`src/npu/rknn`). Carried across ubatches.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContextCache {
    keys: HashSet<(u32, u32, u32, u8)>,
    /// Contexts created so far.
    pub created: u64,
}

impl ContextCache {
    /// Uses the context of `key` (M, K, N, core) from a cache of `capacity`; true when it had
    /// to be created.
    fn get(&mut self, key: (u32, u32, u32, u8), capacity: usize) -> bool {
        if self.keys.contains(&key) {
            return false;
        }
        if self.keys.len() >= capacity {
            // Between calls no context is in use: the backend's retain drops them all.
            self.keys.clear();
        }
        self.keys.insert(key);
        self.created += 1;
        true
    }
}

/// Device bytes held in first-in, first-out order: the expert cache under a streaming sweep (for
/// the occupancy count only), or the prefetch ring. Each entry remembers the task after which its bytes may be reused.
struct Fifo {
    capacity: u64,
    held: u64,
    entries: VecDeque<(u64, u32)>,
}

impl Fifo {
    fn new(capacity: u64) -> Fifo {
        Fifo {
            capacity,
            held: 0,
            entries: VecDeque::new(),
        }
    }

    /// Takes `bytes`, first letting the oldest entries go: returns (their bytes, their
    /// release tasks).
    fn take(&mut self, bytes: u64) -> (u64, Vec<u32>) {
        let (mut freed, mut releases) = (0, Vec::new());
        while self.held + bytes > self.capacity {
            let Some((b, release)) = self.entries.pop_front() else {
                break;
            };
            self.held -= b;
            freed += b;
            releases.push(release);
        }
        (freed, releases)
    }

    /// Holds `bytes` until `release` ended.
    fn hold(&mut self, bytes: u64, release: u32) {
        self.held += bytes;
        self.entries.push_back((bytes, release));
    }
}

/// Builds the work graph of one ubatch; `cache_bytes` is the engine's expert-cache budget,
/// `contexts` the backend's context cache carried over from earlier ubatches. `dense` false
/// leaves the dense part out (its tasks take no time): the expert part alone.
pub fn build(
    ub: &UbatchWork,
    engine: &EngineModel,
    params: &Params,
    cache_bytes: u64,
    contexts: &mut ContextCache,
    dense: bool,
) -> Graph {
    let mut b = Builder {
        g: Graph::default(),
        engine,
        params,
        contexts,
        cache: Fifo::new(cache_bytes),
        ring: Fifo::new(engine.ring.bytes(params)),
        ring_gate: None,
        dense,
    };
    let layers = ub.calls.iter().map(|c| c.layer).max().map_or(0, |l| l + 1);
    let mut last: Option<u32> = None;
    for layer in 0..layers {
        let calls: Vec<&CallWork> = ub.calls.iter().filter(|c| c.layer == layer).collect();
        let d = ub.dense.get(layer as usize).copied().unwrap_or(DenseWork {
            before_us: 0.0,
            act_elems: 0,
            combine_elems: 0,
            bytes: 0,
        });
        last = Some(b.layer(layer, &calls, &d, last));
    }
    b.g
}

struct Builder<'a> {
    g: Graph,
    engine: &'a EngineModel,
    params: &'a Params,
    contexts: &'a mut ContextCache,
    cache: Fifo,
    ring: Fifo,
    /// Ends when every ring slot given up so far is free.
    ring_gate: Option<u32>,
    dense: bool,
}

/// One run of an expert item.
struct RunPlan {
    primitive: Primitive,
    m: u32,
    n: u32,
    unit: Unit,
    /// Its context must be created first.
    new_context: bool,
}

impl Builder<'_> {
    /// A share on each big core, joined: the dense part and ggml's element-wise ops run on
    /// ggml's threads.
    fn on_big_cores(&mut self, work: Work, deps: &[u32], layer: u32) -> u32 {
        let n = self.params.big_cores as usize;
        let shares: Vec<u32> = (0..n)
            .map(|_| self.g.push(work, Unit::Big, deps, layer))
            .collect();
        self.g.join(&shares, layer)
    }

    fn elementwise(&mut self, elems: u64, deps: &[u32], layer: u32) -> u32 {
        let n = self.params.big_cores as u64;
        let elems = if self.dense { elems.div_ceil(n) } else { 0 };
        self.on_big_cores(Work::Elementwise { elems }, deps, layer)
    }

    fn layer(&mut self, layer: u32, calls: &[&CallWork], d: &DenseWork, prev: Option<u32>) -> u32 {
        let of = |proj: Proj| -> Vec<&CallWork> {
            calls.iter().copied().filter(|c| c.proj == proj).collect()
        };
        let mut before: Vec<u32> = prev.into_iter().collect();
        let attn_in = of(Proj::AttnIn);
        if !attn_in.is_empty() {
            // q, k and v read the layer's input; the attention core needs all three.
            let begin = self.g.join(&before, layer);
            let mut after = begin;
            let mut ends = Vec::new();
            for c in attn_in {
                after = self.call(c, begin, after);
                ends.push(after);
            }
            before = vec![self.g.join(&ends, layer)];
        }
        let (us, bytes) = if self.dense {
            (d.before_us, d.bytes / self.params.big_cores as u64)
        } else {
            (0.0, 0)
        };
        // The dense part's CPU work: with dense calls, the attention core and the router
        // (placed before o, which in ggml comes before the router: in sequence the sum is the same).
        let mut input = self.on_big_cores(Work::Dense { us, bytes }, &before, layer);
        for c in of(Proj::AttnOut) {
            input = self.call(c, input, input);
        }
        let gate_up: Vec<&CallWork> = calls
            .iter()
            .copied()
            .filter(|c| matches!(c.proj, Proj::Gate | Proj::Up | Proj::GateUp))
            .collect();
        let mut ends = Vec::new();
        if self.engine.fuse_gate_up && gate_up.len() == 2 {
            ends.push(self.call(&fuse(gate_up[0], gate_up[1]), input, input));
        } else {
            let mut after = input;
            for c in gate_up {
                // In sequence each op waits for the previous one; otherwise for its input only.
                after = self.call(c, input, after);
                ends.push(after);
            }
        }
        let act = self.elementwise(d.act_elems, &ends, layer);
        let mut end = act;
        for c in calls.iter().filter(|c| c.proj == Proj::Down) {
            end = self.call(c, act, end);
        }
        // A shared expert's projections, one after another (its SiLU·mul is in the dense time).
        for c in of(Proj::Shared) {
            end = self.call(c, end, end);
        }
        self.elementwise(d.combine_elems, &[end], layer)
    }

    /// The tasks of one call; `input` is where its activations come from, `previous` the op
    /// before it (which it waits for when ops run in sequence). Returns its end.
    fn call(&mut self, c: &CallWork, input: u32, previous: u32) -> u32 {
        let e = self.engine;
        let layer = c.layer;
        let seq = e.ops_in_sequence;
        // The engine's CPU stages run on ggml's threads, the big cores (the prefetch threads only
        // inflate); the pipelined variants spread them over any core.
        let cpu = if seq { Unit::Big } else { Unit::AnyCpu };
        let begin = if seq { previous } else { input };
        let route = self
            .g
            .push(Work::Route { rows: c.rows() }, Unit::Big, &[begin], layer);
        let big = self.params.big_cores as u64;
        // The engine's `Call::quantized_at_gather` and `Call::quantized_native`.
        let at_gather = e.quant_at_gather && c.rows_read_once() && !c.one_expert();
        let native = e.quant_at_gather && c.rows_read_once() && c.one_expert();
        let share = Work::Quant {
            elems: (c.act_rows * c.k as u64).div_ceil(big),
        };
        let mut phase1 = vec![route];
        for i in 0..if at_gather { 0 } else { big } {
            phase1.push(if seq && i == 0 {
                // The thread that routed quantizes its own share next.
                self.g.push_on(share, Unit::Big, route, &[], layer)
            } else if seq {
                self.g.push(share, Unit::Big, &[route], layer)
            } else {
                // Quantizing needs the activations, not the routing.
                self.g.push(share, cpu, &[input], layer)
            });
        }
        let phase1 = self.g.join(&phase1, layer);
        // Only the announced calls' experts are prefetched; a dense call inflates its own.
        let prefetched = e.prefetch && c.proj.routed();
        let t = Tiles::RK3588;
        let (kp, np) = (t.pad(c.k), t.pad(c.n));
        let mut scatters = Vec::new();
        let mut help_until = None;
        let columns = self.outlier_columns(c);
        for x in &c.experts {
            // Today an item's thread starts after phase 1 and keeps going through the item:
            // `chain` is its last task so far. The weights are ready at `weights`.
            let (chain, weights) = if x.hit {
                let w = self.g.push(
                    Work::Lookup,
                    cpu,
                    &[if seq { phase1 } else { route }],
                    layer,
                );
                (w, w)
            } else if prefetched {
                let w = self.weights(c, &[], e.inflate_on, true);
                self.withdraw(w, route, false);
                (phase1, w)
            } else {
                let w = self.weights(c, &[phase1], cpu, false);
                (w, w)
            };
            let m = x.rows as u64;
            let a_bytes = m * kp as u64;
            let gather = if native {
                Work::Concat { bytes: a_bytes }
            } else {
                Work::Gather { bytes: a_bytes }
            };
            let gather = if at_gather {
                let quant = Work::Quant {
                    elems: m * c.k as u64,
                };
                let quant = if e.blocking_submits {
                    self.g.push_on(quant, cpu, chain, &[phase1], layer)
                } else {
                    self.g.push(quant, cpu, &[phase1], layer)
                };
                self.g.push_on(gather, cpu, quant, &[], layer)
            } else if e.blocking_submits {
                self.g.push_on(gather, cpu, chain, &[phase1], layer)
            } else {
                self.g.push(gather, cpu, &[phase1], layer)
            };
            let sync_a = self
                .g
                .push_on(Work::Sync { bytes: a_bytes }, cpu, gather, &[], layer);
            let mut last = sync_a;
            let mut runs = Vec::new();
            for r in self.runs(c, x.rows, kp, np) {
                let mut deps = vec![sync_a, weights];
                if r.new_context {
                    let ctx = if e.blocking_submits {
                        self.g.push_on(Work::ContextCreate, cpu, last, &[], layer)
                    } else {
                        self.g.push(Work::ContextCreate, Unit::Big, &[route], layer)
                    };
                    deps.push(ctx);
                    last = ctx;
                }
                let work = Work::Run {
                    primitive: r.primitive,
                    m: r.m,
                    k: kp as u32,
                    n: r.n,
                };
                last = if e.blocking_submits {
                    // The calling thread issues the runs one after another and waits in each.
                    self.g.push_on(work, r.unit, last, &deps, layer)
                } else {
                    self.g.push(work, r.unit, &deps, layer)
                };
                runs.push((last, r.n));
            }
            // The last `cores` runs are the last ones the submitters take, when the others end:
            // from then on the call's threads are kept for its scatters (`help_until`).
            let cores = self.params.cores as usize;
            if runs.len() > cores {
                let first: Vec<u32> = runs[..runs.len() - cores].iter().map(|r| r.0).collect();
                help_until = Some(self.g.join(&first, layer));
            }
            let done = if runs.len() == 1 {
                runs[0].0
            } else {
                let ends: Vec<u32> = runs.iter().map(|&(run, _)| run).collect();
                self.g.join(&ends, layer)
            };
            if !x.hit {
                self.release(c.b_bytes(), done, prefetched);
            }
            // The columns need the rows' outlier channels (phase 1) and the quantized weights;
            // the correction is added where the rows are scattered.
            let mut scatter_deps = Vec::new();
            if columns > 0 {
                let work = Work::Outliers {
                    ty: c.ty,
                    weights: columns * c.n as u64,
                    q_bytes: c.q_bytes(),
                };
                scatter_deps.push(self.g.push(work, cpu, &[phase1], layer));
            }
            // The thread that issued the runs reads C back after the last of them; otherwise each
            // part is an item of its own, read back and scattered when its run ends.
            let parts = if e.blocking_submits {
                vec![(last, np as u32)]
            } else {
                runs
            };
            for (run, n) in parts {
                let c_bytes = m * n as u64 * 4;
                let sync_c = if e.blocking_submits {
                    self.g
                        .push_on(Work::Sync { bytes: c_bytes }, cpu, run, &[], layer)
                } else {
                    self.g
                        .push(Work::Sync { bytes: c_bytes }, cpu, &[run], layer)
                };
                let scatter = Work::Scatter {
                    c_bytes,
                    dst_bytes: m * 4 * (c.n as u64 * n as u64).div_ceil(np as u64),
                };
                scatters.push(self.g.push_on(scatter, cpu, sync_c, &scatter_deps, layer));
            }
        }
        if prefetched {
            // Prefetching inflates every expert of the call, the unused ones too; the call
            // learns which those are from its routing, and only then frees their slots.
            for _ in c.experts.len()..c.n_expert {
                let w = self.weights(c, &[], e.inflate_on, true);
                self.withdraw(w, route, true);
                let unused = self.g.join(&[w, route], layer);
                self.release(c.b_bytes(), unused, true);
            }
        }
        let end = self.g.join(&scatters, layer);
        // The engine's dense calls do not pause the prefetcher (`Engine::start`).
        if e.pause && c.proj.routed() {
            self.g.calls.push((route, end));
        } else if e.help && !c.proj.routed() {
            self.g.helping.push((route, help_until.unwrap_or(end)));
        }
        end
    }

    /// Outlier channels of one expert of call `c` (at most K), 0 when the engine does not split.
    fn outlier_columns(&self, c: &CallWork) -> u64 {
        if !self.engine.outliers {
            return 0;
        }
        let per_expert = match c.proj {
            Proj::Down => self.params.outlier_columns_down,
            // Dense calls: as gate/up, whose input is also a normed hidden state (assumption).
            _ => self.params.outlier_columns_gate_up,
        };
        (per_expert.max(0.0).round() as u64).min(c.k as u64)
    }

    /// The tasks that make one expert's B ready, the last of them returned: a fresh device
    /// buffer (or, `prefetched`, a ring slot, waiting for the runs of the expert that held it),
    /// the inflate, the flush. They run on one thread of `unit`, the first of them after `deps`.
    fn weights(&mut self, c: &CallWork, deps: &[u32], unit: Unit, prefetched: bool) -> u32 {
        let e = self.engine;
        let layer = c.layer;
        let bytes = c.b_bytes();
        let mut deps = deps.to_vec();
        let freed = if prefetched {
            // Inflates may run in any order: each waits for every slot given up so far, not
            // only its own, or the ring could overfill.
            let (_, mut releases) = self.ring.take(bytes);
            if !releases.is_empty() {
                releases.extend(self.ring_gate);
                self.ring_gate = Some(self.g.join(&releases, layer));
            }
            deps.extend(self.ring_gate);
            0
        } else {
            // Today's cache: under a streaming sweep the oldest entries leave (occupancy only).
            self.cache.take(bytes).0
        };
        let work = Work::Inflate {
            ty: c.ty,
            q_bytes: c.q_bytes(),
            out_bytes: bytes,
        };
        let inflate = if e.fresh_b_per_miss {
            let buffer = self
                .g
                .push(Work::BufferCreate { bytes }, unit, &deps, layer);
            self.g.push_on(work, unit, buffer, &[], layer)
        } else {
            self.g.push(work, unit, &deps, layer)
        };
        let t = &mut self.g.tasks[inflate as usize];
        t.alloc = bytes;
        t.free = freed;
        self.g
            .push_on(Work::Sync { bytes }, unit, inflate, &[], layer)
    }

    /// Marks the inflate behind `weights` (its flush) as withdrawn by the call's start `by`,
    /// where the engine does that.
    fn withdraw(&mut self, weights: u32, by: u32, unused: bool) {
        if self.engine.withdraw {
            let inflate = self.g.tasks[weights as usize]
                .thread_of
                .expect("a flush continues its inflate's thread");
            self.g.tasks[inflate as usize].withdrawn_by = Some(Withdraw { by, unused });
        }
    }

    /// The expert B just made ready may be reused (the ring, when `prefetched`) or evicted
    /// (cache) after `done`.
    fn release(&mut self, bytes: u64, done: u32, prefetched: bool) {
        if prefetched {
            self.ring.hold(bytes, done);
            self.g.tasks[done as usize].free += bytes;
        } else {
            self.cache.hold(bytes, done);
        }
    }

    /// The runs of one expert item of `rows` rows.
    fn runs(&mut self, c: &CallWork, rows: u32, kp: usize, np: usize) -> Vec<RunPlan> {
        let e = self.engine;
        let m = rows.div_ceil(e.m_bucket) * e.m_bucket;
        // Contexts are keyed by the range of row counts one of them covers.
        let ctx_m = m.div_ceil(e.context_rows.max(1));
        let stream = in_stream_envelope(c.k);
        let primitive = if stream {
            Primitive::StreamI8
        } else {
            Primitive::RunI8
        };
        let cores = self.params.cores as usize;
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
                    (Unit::Npu(core as u8), self.contexts.get(key, CONTEXT_CACHE))
                } else {
                    (
                        Unit::AnyNpu,
                        self.any_core_context(ctx_m, kp as u32, n, cores),
                    )
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
    fn any_core_context(&mut self, m: u32, k: u32, n: u32, cores: usize) -> bool {
        let mut new = false;
        for core in 0..cores {
            new |= self
                .contexts
                .get((m, k, n, core as u8), CONTEXT_CACHE * cores);
        }
        new
    }
}

/// Gate and up of one layer as llama.cpp's fused tensor: one call of N = 2·n_ff.
fn fuse(gate: &CallWork, up: &CallWork) -> CallWork {
    let experts = gate
        .experts
        .iter()
        .zip(&up.experts)
        .map(|(g, u)| ExpertCall {
            rows: g.rows,
            hit: g.hit && u.hit,
        })
        .collect();
    CallWork {
        proj: Proj::GateUp,
        n: gate.n + up.n,
        experts,
        ..gate.clone()
    }
}
