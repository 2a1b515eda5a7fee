//! The work graph of one ubatch: tasks with a resource, an amount of work in the units the
//! parameters price, and dependencies. The builder makes it, the scheduler prices and
//! schedules it.

use ork_moe::npu::Primitive;
use ork_moe::quant::GgmlType;

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
    Submit,
    Dense,
    Join,
}

impl Stage {
    /// Every stage but `Join` (which takes no time), in report order.
    pub const REPORTED: [Stage; 13] = [
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
        Stage::Submit,
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
            Stage::Submit => "submit",
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
    /// The submitter threads' CPU time for `runs` of one call's `rknn_matmul_run`s.
    Submit {
        runs: u64,
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
            Work::Submit { .. } => Stage::Submit,
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
    /// through one expert item (and blocks in the NPU run) with blocking submits.
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
