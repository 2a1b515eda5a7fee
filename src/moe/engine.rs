//! The engine: the two phases of a call, on the library's pool or on the caller's threads.

use super::cache::Segment;
use super::call::{
    plan_items, try_vec, Call, CallKey, Corrections, Item, Joining, Prepared, PreparedSlot,
    Product, QuantShare,
};
use super::desc::{dense_as_mul_mat_id, validate, Problem, TensorDesc};
use super::expert::{Experts, Source, Weights};
use super::outliers::split_row;
use super::prefetch::{Announced, HeldWeights, Job, PrefetchStats};
use super::quantize::quantize_row_scaled;
use super::route::{Group, Routing, Row};
use super::scatter::{publish, scale_row, Row as ScatterRow, QUAD};
use super::spares::Spares;
use super::stats::{bump, load, Counters, ExpertRun, Stage, Stages, Stats};
use super::{Config, Error, ErrorKind, MtMode, SmallBatch};
use crate::inflate::{dequantize_columns_in, ExpertWeights};
use crate::isa::Isa;
use crate::layout::Tiles;
use crate::npu::{
    in_stream_envelope, submitter_ways, BackendKind, Buffer, CoreMask, Device, MatMul,
};
use crate::sync::lock;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

/// Views of one call's tensors, built by the caller from a [`Problem`]'s extents. `dst` is atomic
/// so that all threads of a cooperative call may hold it; every element is written by exactly one
/// thread (relaxed stores, plain stores on every target).
pub struct Inputs<'a> {
    /// The whole `as` tensor; its address is part of the cache key.
    pub weights: &'a [u8],
    pub name: Option<&'a str>,
    pub b: &'a [f32],
    pub ids: &'a [i32],
    pub dst: &'a [AtomicU32],
    /// The second projection of a pair ([`Engine::plan_pair`]).
    pub pair: Option<PairInputs<'a>>,
}

/// The second projection's own tensors in a pair call: its weights and its `dst`.
pub struct PairInputs<'a> {
    pub weights: &'a [u8],
    pub name: Option<&'a str>,
    pub dst: &'a [AtomicU32],
}

/// A call the engine takes: the validated problem and where its GEMMs run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub problem: Problem,
    /// A pair: the second projection, with the same activations, ids, weight type and shape as
    /// `problem` and its own weights and `dst`. Each expert's two projections are one GEMM.
    pub pair: Option<Problem>,
    /// Small batch under [`SmallBatch::Cpu`]: GEMMs on the CPU int8 kernels.
    pub on_cpu: bool,
}

impl Plan {
    /// The projections of the call: one, or both of a pair.
    pub fn problems(&self) -> impl Iterator<Item = &Problem> {
        std::iter::once(&self.problem).chain(&self.pair)
    }
}

/// The engine behind one `ork_ctx`. Safe to use from several threads at once.
pub struct Engine {
    config: Config,
    // Shared with the prefetch threads: the device, the experts (cache and staging) and B's spares.
    device: Arc<Device>,
    tiles: Tiles,
    /// Kernel path of the host-side kernels (inflate, scatter, the CPU GEMMs).
    isa: Isa,
    experts: Arc<Experts>,
    counters: Counters,
    joining: Joining,
    spare_a: Spares<i8>,
    spare_b: Arc<Spares<i8>>,
    spare_c: Spares<i32>,
    prefetchers: Vec<JoinHandle<()>>,
}

/// Items a caller thread prepares ahead of the scatters, per submitter thread: enough to keep a
/// core busy while the next ones are prepared, few enough that the streamed experts' B buffers
/// stay a small part of one IOMMU domain.
const AHEAD: usize = 3;

/// More prefetch threads than cores only contend; this bounds a mistyped setting.
const MAX_PREFETCH_THREADS: usize = 64;

/// The RK3588's A tile width, fixed so that row pieces are constant-sized (inlined copies);
/// [`Engine::new`] checks the device's, and its C quad against [`QUAD`].
const A_K: usize = 16;

impl Engine {
    pub fn new(config: Config) -> Result<Engine, Error> {
        let device = Device::open(&config.device)?;
        Engine::with_device(config, device)
    }

    /// An engine on a device the caller opened (`config.device` is then not used to open one),
    /// e.g. an emulator with injected faults.
    pub fn with_device(config: Config, device: Device) -> Result<Engine, Error> {
        let tiles = device.tiles();
        if tiles.a_k != A_K
            || tiles.c_n != QUAD
            || !tiles.b_n.is_multiple_of(QUAD)
            || tiles.b_k != 32
        {
            return Err(Error::new(
                ErrorKind::DeviceError,
                format!("unsupported tile sizes {tiles:?}"),
            ));
        }
        let placement = PrefetchPlacement::of(&config);
        if placement.threads > MAX_PREFETCH_THREADS {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "{} prefetch threads: at most {MAX_PREFETCH_THREADS}",
                    placement.threads
                ),
            ));
        }
        // Without prefetch threads nothing is ever staged: a budget of 0 says so to the staging
        // area, which then skips its lock on every miss.
        let staged = if placement.threads > 0 {
            config.prefetch_bytes as usize
        } else {
            0
        };
        let experts = Arc::new(Experts::new(
            config.cache_bytes,
            config.cache_policy,
            config.cache_verify,
            staged as u64,
        ));
        // Enough for the streamed experts of a few calls (a 2048x768 expert is 1.5 MiB), and
        // with prefetch for the staged ones too, which would otherwise be created again every
        // graph (milliseconds each on the board).
        let spare_b = Arc::new(Spares::new(256 + (staged >> 20), (256 << 20) + staged));
        let device = Arc::new(device);
        let mut prefetchers = Vec::with_capacity(placement.threads);
        for i in 0..placement.threads {
            let worker = Prefetcher {
                device: Arc::clone(&device),
                experts: Arc::clone(&experts),
                spares: Arc::clone(&spare_b),
                tiles,
                isa: config.device.host.isa,
                cpus: placement.cpus.clone(),
                pinned_or_none: placement.picked,
            };
            let spawned = std::thread::Builder::new()
                .name(format!("ork-prefetch-{i}"))
                .spawn(move || worker.run());
            match spawned {
                Ok(t) => prefetchers.push(t),
                Err(e) => {
                    experts.staging().shut_down();
                    for t in prefetchers {
                        let _ = t.join();
                    }
                    return Err(Error::new(
                        ErrorKind::OutOfMemory,
                        format!("starting prefetch thread {i}: {e}"),
                    ));
                }
            }
        }
        Ok(Engine {
            experts,
            isa: config.device.host.isa,
            config,
            device,
            tiles,
            counters: Counters::default(),
            joining: Joining::default(),
            spare_a: Spares::new(256, 128 << 20),
            spare_b,
            spare_c: Spares::new(256, 128 << 20),
            prefetchers,
        })
    }

    /// Announces a call that will come (from the same metadata: `plan` is what [`Engine::plan`]
    /// or [`Engine::plan_pair`] gives for it) so that the prefetch threads inflate its experts
    /// ahead (`ORK_PREFETCH`; module `prefetch`). `weights` are its projections' `as` tensors,
    /// which the caller keeps valid until [`Engine::prefetch_fence`] returns. Without prefetch
    /// threads, or for a small batch, it does nothing.
    pub fn prefetch(&self, plan: Plan, weights: Vec<HeldWeights>) -> Result<(), Error> {
        if !self.prefetching() || plan.on_cpu {
            return Ok(());
        }
        let projections = plan.problems().count();
        if weights.len() != projections {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "prefetch: {} weight tensors for a call of {projections} projection(s)",
                    weights.len()
                ),
            ));
        }
        for (p, w) in plan.problems().zip(&weights) {
            if w.data.bytes().len() < p.w_extent {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "prefetch: weights of {} bytes, the tensor spans {}",
                        w.data.bytes().len(),
                        p.w_extent
                    ),
                ));
            }
        }
        self.experts.staging().announce(Announced { plan, weights });
        Ok(())
    }

    /// Whether the engine has prefetch threads ([`Engine::prefetch`] does something).
    pub fn prefetching(&self) -> bool {
        !self.prefetchers.is_empty()
    }

    /// After this returns no prefetch thread reads weights announced before it (a graph ended:
    /// its weights may be freed). Experts staged already stay for their calls.
    pub fn prefetch_fence(&self) {
        self.experts.staging().fence();
    }

    /// What the prefetch threads did.
    pub fn prefetch_stats(&self) -> PrefetchStats {
        self.experts.staging().stats()
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Validates the descriptors and applies the small-batch policy, from metadata only.
    pub fn plan(
        &self,
        w: &TensorDesc,
        b: &TensorDesc,
        ids: &TensorDesc,
        dst: &TensorDesc,
    ) -> Result<Plan, Error> {
        self.policy(validate(w, b, ids, dst)?, None)
    }

    /// [`Engine::plan`] for two projections of one input (gate and up of a MoE FFN): `w0`/`dst0`
    /// and `w1`/`dst1` share `b` and `ids`, and the weights share type and shape. Each expert's
    /// two weight matrices are inflated into one native B, so one GEMM per expert computes both.
    #[allow(clippy::too_many_arguments)]
    pub fn plan_pair(
        &self,
        w0: &TensorDesc,
        w1: &TensorDesc,
        b: &TensorDesc,
        ids: &TensorDesc,
        dst0: &TensorDesc,
        dst1: &TensorDesc,
    ) -> Result<Plan, Error> {
        let (p0, p1) = (validate(w0, b, ids, dst0)?, validate(w1, b, ids, dst1)?);
        let format = |p: &Problem| (p.wtype, p.layout, p.k, p.n, p.n_expert);
        if format(&p0) != format(&p1) {
            return Err(Error::new(
                ErrorKind::NotHandled,
                format!(
                    "a pair needs weights of one type, layout and shape: {} {}x{}x{} and {} \
                     {}x{}x{}",
                    p0.layout.name(p0.wtype),
                    p0.k,
                    p0.n,
                    p0.n_expert,
                    p1.layout.name(p1.wtype),
                    p1.k,
                    p1.n,
                    p1.n_expert
                ),
            ));
        }
        // Each dst against the other dst and the other projection's weights (validate checked
        // it against its own inputs).
        let range = |d: &TensorDesc, len: usize| (d.addr, d.addr.saturating_add(len));
        let (d0, d1) = (range(dst0, p0.dst_extent), range(dst1, p1.dst_extent));
        let (a0, a1) = (range(w0, p0.w_extent), range(w1, p1.w_extent));
        let meet = |x: (usize, usize), y: (usize, usize)| x.0 < y.1 && y.0 < x.1;
        if meet(d0, d1) || meet(d0, a1) || meet(d1, a0) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "pair: a dst overlaps the other dst or the other projection's weights",
            ));
        }
        self.policy(p0, Some(p1))
    }

    /// [`Engine::plan`] for a dense matmul `dst = w^T · b` ([`dense_as_mul_mat_id`]: one expert
    /// every token routes to): the attention projections of a prefill, say. Its [`Inputs`] take
    /// `ids` = [`DENSE_IDS`](super::desc::DENSE_IDS). Declined when the configuration turns
    /// dense calls off.
    pub fn plan_dense(
        &self,
        w: &TensorDesc,
        b: &TensorDesc,
        dst: &TensorDesc,
    ) -> Result<Plan, Error> {
        if !self.config.dense {
            return Err(Error::not_handled(
                "dense matmuls are turned off (ORK_DENSE=0)",
            ));
        }
        let [w, b, ids, dst] = dense_as_mul_mat_id(w, b, dst)?;
        self.plan(&w, &b, &ids, &dst)
    }

    /// The small-batch policy for a validated call.
    fn policy(&self, problem: Problem, pair: Option<Problem>) -> Result<Plan, Error> {
        let small = problem.rows_per_expert() < self.config.min_rows as usize;
        if small && self.config.small_batch == SmallBatch::Decline {
            return Err(Error::below_min_rows(
                problem.rows_per_expert(),
                self.config.min_rows,
            ));
        }
        Ok(Plan {
            problem,
            pair,
            on_cpu: small,
        })
    }

    /// Counts a declined call (the C boundary calls it once per call).
    pub fn note_declined(&self) {
        bump(&self.counters.calls, 1);
        bump(&self.counters.declined, 1);
    }

    /// Threads of the single-caller entry point: the pool's, capped by the configuration.
    fn threads(&self) -> usize {
        self.config
            .device
            .host
            .threads
            .clamp(1, crate::pool::global().threads())
    }

    /// Runs a planned call on the crate's pool.
    pub fn run(&self, plan: Plan, io: &Inputs) -> Result<Stages, Error> {
        self.run_traced(plan, io).map(|(stages, _)| stages)
    }

    /// [`Engine::run`], also returning the call's used experts in the order phase 2 took them
    /// (rows, cache hit or not): the board timeline model's input.
    pub fn run_traced(&self, plan: Plan, io: &Inputs) -> Result<(Stages, Vec<ExpertRun>), Error> {
        let call = self.start(plan, ([0; 4], 1), 1, self.threads(), io);
        self.run_on_pool(&call, io);
        let r = self.end(&call);
        let mut runs = std::mem::take(&mut *lock(&call.runs));
        runs.sort_by_key(|&(group, _)| group);
        self.recycle(call);
        r.map(|stages| (stages, runs.into_iter().map(|(_, run)| run).collect()))
    }

    /// Both phases of `call` on the crate's pool, `call.nth` threads.
    fn run_on_pool(&self, call: &Call, io: &Inputs) {
        let pool = crate::pool::global();
        pool.run(call.nth, |ith, _| self.phase1(call, io, ith));
        if let Some(Ok(_)) = call.routing.get() {
            self.with_submitters(call, || pool.run(call.nth, |_, _| self.phase2(call, io)));
        }
    }

    /// The NPU cores submitter threads run on (one thread each; empty: the caller's threads run
    /// the GEMMs themselves). `Config::submitters`, by default one per enabled core when the
    /// device offloads its runs (the threads wait for the NPU without using a core), else none.
    fn submitter_cores(&self) -> Vec<CoreMask> {
        let cores = self.device.core_mask().cores();
        let n = match self.config.submitters {
            Some(n) => n,
            None if self.device.offloads() => cores.len(),
            None => 0,
        };
        (0..n)
            .map(|i| CoreMask(1 << cores[i % cores.len()]))
            .collect()
    }

    /// Runs `phase2` (the caller's threads' share of phase 2) with this call's submitter threads
    /// alive, if it has any: they start once the work items exist and end with the call's GEMMs.
    fn with_submitters<R>(&self, call: &Call, phase2: impl FnOnce() -> R) -> R {
        let cores = self.submitter_cores();
        if cores.is_empty() || call.failed.load(Ordering::Relaxed) {
            return phase2();
        }
        self.items(call);
        std::thread::scope(|scope| {
            for core in cores {
                scope.spawn(move || {
                    // A panic must end the call, not leave the other threads waiting for items.
                    let r = panic::catch_unwind(AssertUnwindSafe(|| self.submitter(call, core)));
                    if let Err(p) = r {
                        call.fail(Error::from_panic(p));
                    }
                });
            }
            phase2()
        })
    }

    /// Runs a planned call cooperatively: every one of `nth` threads calls this with the same
    /// plan and tensors; `barrier` must be a full barrier across them. Every thread returns the
    /// same result.
    pub fn run_mt(
        &self,
        plan: Plan,
        io: &Inputs,
        ith: usize,
        nth: usize,
        barrier: &mut dyn FnMut(),
    ) -> Result<Stages, Error> {
        let key = (
            [
                io.weights.as_ptr() as usize,
                io.b.as_ptr() as usize,
                io.ids.as_ptr() as usize,
                io.dst.as_ptr() as usize,
            ],
            nth,
        );
        let leader = self.config.mt_mode == MtMode::Leader;
        let workers = if leader { self.threads() } else { nth };
        let call = self
            .joining
            .join(plan, key, |plan| self.start(plan, key, nth, workers, io));
        // A panic must not skip a barrier: the other threads would wait forever.
        let guarded = |f: &dyn Fn()| {
            if let Err(p) = panic::catch_unwind(AssertUnwindSafe(f)) {
                call.fail(Error::from_panic(p));
            }
        };
        if leader {
            // Thread 0 runs the call on the crate's pool while the others wait in `barrier`.
            if ith == 0 {
                guarded(&|| self.run_on_pool(&call, io));
            }
        } else {
            let ith = ith.min(call.nth - 1);
            guarded(&|| self.phase1(&call, io, ith));
            // Every thread sees the same routing result: an invalid id ends the call everywhere
            // before the barrier, with dst untouched.
            if let Some(Err(e)) = call.routing.get() {
                return Err(e.clone());
            }
            barrier();
            // Thread 0 keeps the call's submitter threads, if any, while it works.
            if ith == 0 {
                guarded(&|| self.with_submitters(&call, || self.phase2(&call, io)));
            } else {
                guarded(&|| self.phase2(&call, io));
            }
        }
        barrier();
        let r = if ith == 0 {
            self.end(&call)
        } else {
            call.result()
        };
        // The last thread out owns the call and returns its buffers.
        if let Some(call) = Arc::into_inner(call) {
            self.recycle(call);
        }
        r
    }

    fn start(
        &self,
        plan: Plan,
        key: CallKey,
        participants: usize,
        nth: usize,
        io: &Inputs,
    ) -> Call {
        bump(&self.counters.calls, 1);
        bump(&self.counters.rows, plan.problem.rows() as u64);
        let mut call = Call::new(plan, key, participants, nth);
        if self.prefetching() {
            let addr = io.weights.as_ptr() as usize;
            // A call of one expert (a dense matmul) is NPU work with little DRAM traffic of its
            // own: the prefetch threads keep inflating the next calls' experts meanwhile.
            let pause = !call.plan.problem.one_expert();
            call.prefetch_pause = self.experts.staging().call_starts(addr, pause);
            call.helps_prefetch = !pause;
        }
        call
    }

    fn end(&self, call: &Call) -> Result<Stages, Error> {
        let r = call.result();
        let p = &call.plan.problem;
        match &r {
            Ok(_) => {
                bump(&self.counters.handled, 1);
                let prefetch = if self.prefetching() && log::log_enabled!(log::Level::Debug) {
                    format!("; {}", self.prefetch_stats())
                } else {
                    String::new()
                };
                log::debug!(
                    "handled {} K={} N={}: {} tokens x {} slots of {} experts on {}; {}{prefetch}",
                    p.layout.name(p.wtype),
                    p.k,
                    p.n,
                    p.n_tokens,
                    p.n_used,
                    p.n_expert,
                    self.device.backend().name(),
                    self.experts.stats()
                );
            }
            Err(e) => log::debug!("failed {} K={} N={}: {e}", p.layout.name(p.wtype), p.k, p.n),
        }
        r
    }

    /// Returns what a finished call still holds to the spares.
    fn recycle(&self, call: Call) {
        for p in call.into_prepared() {
            self.recycle_prepared(p);
        }
    }

    /// Returns a prepared expert's A buffer to the spares, and its B buffer if nothing holds it
    /// any more (not kept by the cache, or evicted since).
    fn recycle_prepared(&self, p: Prepared) {
        self.spare_a.give(p.a);
        if let Ok(expert) = Arc::try_unwrap(p.expert) {
            self.spare_b.give(expert.b);
        }
    }

    /// `item` is scattered: after its group's last item, the group's buffers go back to the
    /// spares.
    fn scattered(&self, call: &Call, item: &Item) {
        if let Some(p) = self.items(call).1[item.group].scattered() {
            self.recycle_prepared(p);
        }
    }

    /// Phase 1, share `ith`: routing (computed once, by whichever thread comes first) and the
    /// quantization of this share's activation rows.
    fn phase1(&self, call: &Call, io: &Inputs, ith: usize) {
        let p = &call.plan.problem;
        let routed = call.routing.get_or_init(|| {
            let t = Instant::now();
            let r = panic::catch_unwind(AssertUnwindSafe(|| Routing::new(p, io.ids)))
                .unwrap_or_else(|e| Err(Error::from_panic(e)));
            call.clock.add(Stage::Route, t);
            r
        });
        if routed.is_err() {
            return;
        }
        if call.quantized_at_gather() {
            return;
        }
        let t = Instant::now();
        let first = (ith * call.chunk).min(p.act_rows());
        let last = ((ith + 1) * call.chunk).min(p.act_rows());
        match self.quantize_rows(p, io, first, first..last, call.quantized_native()) {
            Ok(s) => {
                // Set once per share index; a second set cannot happen (one thread per ith).
                let _ = call.quant[ith].set(s);
            }
            Err(e) => call.fail(e),
        }
        call.clock.add(Stage::Quant, t);
    }

    /// The activation rows `rows` quantized (with the outlier split if configured), as a share
    /// whose first row has index `first`: row after row, or with `native` in native A's order
    /// (`[K/16][rows][16]`).
    fn quantize_rows(
        &self,
        p: &Problem,
        io: &Inputs,
        first: usize,
        rows: impl ExactSizeIterator<Item = usize>,
        native: bool,
    ) -> Result<QuantShare, Error> {
        let kp = self.tiles.pad(p.k);
        let n = rows.len();
        let mut q = try_vec(n * kp, 0i8, "quantized activations")?;
        let mut share = QuantShare {
            first,
            q: Vec::new(),
            scales: Vec::with_capacity(n),
            outliers: Vec::new(),
            ends: Vec::with_capacity(n),
        };
        let (mut scratch, mut channels) = (Vec::new(), Vec::new());
        let mut native_row = if native { vec![0i8; kp] } else { Vec::new() };
        for (i, r) in rows.enumerate() {
            let out = if native {
                &mut native_row[..]
            } else {
                &mut q[i * kp..(i + 1) * kp]
            };
            let off = p.b_offset(r);
            let x = &io.b[off..off + p.k];
            let scale = match self.config.outliers {
                Some(rule) => {
                    scratch.resize(p.k, 0.0);
                    let scale = split_row(x, rule, &mut scratch, &mut channels, out);
                    share.outliers.extend(channels.iter().map(|&c| c as u32));
                    scale
                }
                None => quantize_row_scaled(x, out),
            };
            share.scales.push(scale);
            share.ends.push(share.outliers.len() as u32);
            if native {
                for (kb, piece) in native_row.chunks_exact(A_K).enumerate() {
                    let at = (kb * n + i) * A_K;
                    q[at..at + A_K].copy_from_slice(piece);
                }
            }
        }
        share.q = q;
        Ok(share)
    }

    /// The call's phase-2 work items and the slots of its prepared experts (made once).
    fn items<'c>(&self, call: &'c Call) -> &'c (Vec<Item>, Vec<PreparedSlot>) {
        call.items.get_or_init(|| {
            let routing = call.routing();
            // A pair's GEMM covers both projections' padded channels.
            let np = self.tiles.pad(call.plan.problem.n) * call.plan.problems().count();
            // The real NPU takes one submit per expert: one is split only over the submitters'
            // cores, when it has a large share of the rows (a dense call's one expert, which
            // would otherwise keep one core busy and the others idle: in two parts per core,
            // `submitter_ways`); where the GEMM runs on the CPU, over the caller's threads.
            let split = if self.device.backend() == BackendKind::Rknn {
                submitter_ways(
                    self.submitter_cores().len().max(1),
                    call.plan.problem.one_expert(),
                )
            } else {
                call.nth
            };
            let items = plan_items(&routing.groups, np, self.tiles.b_n, split);
            let mut per_group = vec![0; routing.groups.len()];
            for item in &items {
                per_group[item.group] += 1;
            }
            let slots = per_group.into_iter().map(PreparedSlot::new).collect();
            (items, slots)
        })
    }

    /// The prepared expert of `item`, made now by this thread if no other did. Drop it before
    /// the item counts as scattered.
    fn prepared(&self, call: &Call, io: &Inputs, item: &Item) -> Result<Arc<Prepared>, Error> {
        let (_, prepared) = self.items(call);
        let group = &call.routing().groups[item.group];
        prepared[item.group].get_or_make(|| self.prepare_group(call, io, group))
    }

    /// Phase 2 on one of the caller's threads: take items until none is left, and with submitter
    /// threads, scatter their products until every item is done.
    fn phase2(&self, call: &Call, io: &Inputs) {
        if call.failed.load(Ordering::Relaxed) {
            return;
        }
        if !self.submitter_cores().is_empty() {
            return self.phase2_piped(call, io);
        }
        let (items, _) = self.items(call);
        while !call.failed.load(Ordering::Relaxed) {
            let i = call.next.fetch_add(1, Ordering::Relaxed);
            let Some(item) = items.get(i) else { break };
            let done = self.prepared(call, io, item).and_then(|prep| {
                let product = self.product(call, &prep, item, None)?;
                self.scatter_item(call, io, &prep, item, product)
            });
            match done {
                Ok(()) => self.scattered(call, item),
                Err(e) => call.fail(e),
            }
        }
    }

    /// Phase 2 with submitter threads, on a caller thread: prepares items (weights, gathered A)
    /// for the submitters, at most [`AHEAD`] per submitter beyond those already scattered, and
    /// scatters the products they hand back, until every item is scattered or the call failed.
    fn phase2_piped(&self, call: &Call, io: &Inputs) {
        let (items, _) = self.items(call);
        let ahead = AHEAD * self.submitter_cores().len();
        let pipe = &call.pipe;
        loop {
            // Under the lock: scatter a product if one is done, else prepare the next item if the
            // lookahead allows, else wait for a change.
            let mut st = lock(&pipe.state);
            let next = loop {
                if call.failed.load(Ordering::Relaxed) || st.scattered == items.len() {
                    return;
                }
                if let Some(done) = st.done.pop_front() {
                    break Next::Scatter(done);
                }
                let more = call.next.load(Ordering::Relaxed) < items.len();
                if more && st.queued - st.scattered < ahead {
                    break Next::Prepare;
                }
                // Nothing to do but wait for the runs: inflate an expert of a later call, while
                // some runs are still queued (once the submitters took the last ones, the threads
                // stay free for the scatters that end the call).
                if call.helps_prefetch && st.submitted < items.len() {
                    if let Some(job) = self.experts.staging().help_job() {
                        break Next::Help(job);
                    }
                }
                st = pipe.moved.wait(st).unwrap_or_else(|e| e.into_inner());
            };
            drop(st);
            match next {
                Next::Help(job) => {
                    // This call's threads' time, so this call's stage, although another call's
                    // expert.
                    let t = Instant::now();
                    inflate_job(
                        job,
                        &self.device,
                        &self.experts,
                        &self.spare_b,
                        &self.tiles,
                        self.isa,
                    );
                    call.clock.add(Stage::Inflate, t);
                }
                Next::Scatter((i, product)) => {
                    let item = &items[i];
                    let done = self
                        .prepared(call, io, item)
                        .and_then(|prep| self.scatter_item(call, io, &prep, item, product));
                    match done {
                        Ok(()) => self.scattered(call, item),
                        Err(e) => call.fail(e),
                    }
                    lock(&pipe.state).scattered += 1;
                    pipe.moved.notify_all();
                }
                Next::Prepare => {
                    let i = call.next.fetch_add(1, Ordering::Relaxed);
                    let Some(item) = items.get(i) else { continue };
                    if let Err(e) = self.prepared(call, io, item) {
                        call.fail(e);
                        continue;
                    }
                    let mut st = lock(&pipe.state);
                    st.ready.push_back(i);
                    st.queued += 1;
                    drop(st);
                    pipe.moved.notify_all();
                }
            }
        }
    }

    /// A submitter thread: runs the GEMMs of the items the caller's threads prepared, on `core`,
    /// until every item is submitted or the call failed.
    fn submitter(&self, call: &Call, core: CoreMask) {
        let (items, prepared) = self.items(call);
        let pipe = &call.pipe;
        loop {
            let mut st = lock(&pipe.state);
            let i = loop {
                if call.failed.load(Ordering::Relaxed) || st.submitted == items.len() {
                    return;
                }
                if let Some(i) = st.ready.pop_front() {
                    st.submitted += 1;
                    break i;
                }
                st = pipe.moved.wait(st).unwrap_or_else(|e| e.into_inner());
            };
            drop(st);
            let item = &items[i];
            // The expert's `Arc` is dropped before the product is handed on.
            let product = prepared[item.group]
                .get()
                .and_then(|prep| self.product(call, &prep, item, Some(core)));
            match product {
                Ok(product) => {
                    lock(&pipe.state).done.push_back((i, product));
                    pipe.moved.notify_all();
                }
                Err(e) => call.fail(e),
            }
        }
    }

    /// The expert's weights (cached or inflated now) and its rows gathered into native A.
    fn prepare_group(&self, call: &Call, io: &Inputs, g: &Group) -> Result<Prepared, Error> {
        let p = &call.plan.problem;
        let t = Instant::now();
        let mut weights = vec![Weights {
            problem: p,
            data: io.weights,
            name: io.name,
        }];
        if let (Some(problem), Some(second)) = (&call.plan.pair, &io.pair) {
            weights.push(Weights {
                problem,
                data: second.weights,
                name: second.name,
            });
        }
        let (expert, source) = self.experts.get(
            &self.device,
            &self.spare_b,
            &self.tiles,
            self.isa,
            &weights,
            g.expert,
        )?;
        if let Source::Inflated(bytes) | Source::Prefetched(bytes) = source {
            bump(&self.counters.experts_inflated, 1);
            bump(&self.counters.bytes_inflated, bytes);
        }
        let group = call
            .routing()
            .groups
            .iter()
            .position(|x| x.expert == g.expert);
        lock(&call.runs).push((
            group.unwrap_or(usize::MAX),
            ExpertRun {
                expert: g.expert,
                rows: g.len,
                hit: matches!(source, Source::Cache),
            },
        ));
        call.clock.add(Stage::Inflate, t);
        let t = Instant::now();
        let kp = self.tiles.pad(p.k);
        let rows = call.routing().rows_of(g);
        let m = rows.len();
        let mut a = self.spare_a.take(&self.device, m * kp)?;
        let mut row_scales = Vec::with_capacity(m);
        let mut src = Vec::with_capacity(m);
        let mut outliers = Vec::with_capacity(m);
        let own;
        if call.quantized_native() {
            // The one group is every activation row in order (`rows_read_once`).
            let in_order = rows
                .iter()
                .enumerate()
                .all(|(i, row)| p.act_row(row.token as usize, row.slot as usize) == i);
            if m != p.act_rows() || !in_order {
                return Err(Error::new(
                    ErrorKind::Internal,
                    "a one-expert call's rows are not its activation rows in order",
                ));
            }
            let a = a.as_mut_slice();
            for cell in &call.quant {
                let share = cell.get().expect("phase 1 quantized every share");
                let n = share.scales.len();
                if n == 0 {
                    continue;
                }
                for (kb, block) in share.q.chunks_exact(n * A_K).enumerate() {
                    let at = (kb * m + share.first) * A_K;
                    a[at..at + n * A_K].copy_from_slice(block);
                }
                row_scales.extend_from_slice(&share.scales);
                outliers.extend((share.first..share.first + n).map(|r| (r, share.outliers_of(r))));
            }
        } else if call.quantized_at_gather() {
            let act_rows = rows
                .iter()
                .map(|row| p.act_row(row.token as usize, row.slot as usize));
            own = self.quantize_rows(p, io, 0, act_rows.clone(), false)?;
            for (i, r) in act_rows.enumerate() {
                src.push(&own.q[i * kp..(i + 1) * kp]);
                row_scales.push(own.scales[i]);
                outliers.push((r, own.outliers_of(i)));
            }
        } else {
            for row in rows {
                let r = p.act_row(row.token as usize, row.slot as usize);
                let share = call.quant[r / call.chunk]
                    .get()
                    .expect("phase 1 quantized every share");
                src.push(&share.q[(r - share.first) * kp..(r - share.first + 1) * kp]);
                row_scales.push(share.scales[r - share.first]);
                outliers.push((r, share.outliers_of(r)));
            }
        }
        let outliers = self.corrections(call, io, g.expert, &outliers)?;
        // Native A is [K/16][M][16]: filled in that order, the writes are one sequential stream
        // and each row is read 16 bytes at a time (m rows of 16-byte pieces stay in cache).
        if !src.is_empty() {
            let blocks = a.as_mut_slice()[..m * kp].chunks_exact_mut(m * A_K);
            for (kb, block) in blocks.enumerate() {
                let k0 = kb * A_K;
                for (piece, row) in block.chunks_exact_mut(A_K).zip(&src) {
                    piece.copy_from_slice(&row[k0..k0 + A_K]);
                }
            }
        }
        a.sync_to_device()?;
        call.clock.add(Stage::Quant, t);
        Ok(Prepared {
            expert,
            a,
            row_scales,
            outliers,
        })
    }

    /// The outlier correction of expert `e`'s rows (`(activation row, its outlier channels)`):
    /// the dequantized weight columns of their channels, from the GGML blocks in the call's
    /// layout (the same values as ggml's own dequantization), for every projection of the call.
    fn corrections(
        &self,
        call: &Call,
        io: &Inputs,
        e: usize,
        rows: &[(usize, &[u32])],
    ) -> Result<Option<Corrections>, Error> {
        let mut channels: Vec<u32> = rows.iter().flat_map(|(_, c)| c.iter().copied()).collect();
        if channels.is_empty() {
            return Ok(None);
        }
        channels.sort_unstable();
        channels.dedup();
        let p = &call.plan.problem;
        let weights = std::iter::once(io.weights).chain(io.pair.as_ref().map(|x| x.weights));
        let projections: Vec<_> = call.plan.problems().zip(weights).collect();
        let mut columns = try_vec(
            projections.len() * channels.len() * p.n,
            0f32,
            "outlier columns",
        )?;
        let wanted: Vec<usize> = channels.iter().map(|&c| c as usize).collect();
        let per_projection = columns.chunks_exact_mut(channels.len() * p.n);
        for ((q, data), out) in projections.into_iter().zip(per_projection) {
            let (off, len) = q.expert_bytes(e);
            let w = ExpertWeights {
                ty: q.wtype,
                data: &data[off..off + len],
                row_stride: q.w_nb1,
                n: q.n,
                k: q.k,
            };
            dequantize_columns_in(self.isa, q.layout, &w, &wanted, out).map_err(|err| {
                Error::new(ErrorKind::Internal, format!("outlier columns: {err}"))
            })?;
        }
        let (mut terms, mut ends) = (Vec::new(), Vec::with_capacity(rows.len()));
        for &(r, chans) in rows {
            let off = p.b_offset(r);
            for &c in chans {
                let i = channels.binary_search(&c).expect("collected above");
                terms.push((i as u32, io.b[off + c as usize]));
            }
            ends.push(terms.len() as u32);
        }
        Ok(Some(Corrections {
            columns,
            channels: channels.len(),
            n: p.n,
            terms,
            ends,
        }))
    }

    /// The int32 product of `item` (its group's rows × padded channels `n0..n1`): on the device
    /// (on `core`, or over the device's core mask), or on the CPU kernels for a small batch.
    fn product(
        &self,
        call: &Call,
        prep: &Prepared,
        item: &Item,
        core: Option<CoreMask>,
    ) -> Result<Product, Error> {
        let t = Instant::now();
        let (n0, n1) = (item.n0, item.n1);
        let m = call.routing().groups[item.group].len;
        let nc = n1 - n0;
        let segments = &prep.expert.segments;
        // The int32 product of one depth segment, into `c` (native C, m × nc).
        let product = |seg: &Segment, c: &mut Buffer<i32>| -> Result<(), Error> {
            let ks = seg.k1 - seg.k0;
            let (a_offset, b_offset) = (seg.k0 * m, seg.b_offset + self.tiles.b_len(ks, n0));
            if call.plan.on_cpu {
                let shape = crate::gemm::Shape { m, kp: ks, np: nc };
                let a = &prep.a.as_slice()[a_offset..a_offset + self.tiles.a_len(m, ks)];
                let b = &prep.expert.b.as_slice()[b_offset..b_offset + self.tiles.b_len(ks, nc)];
                crate::gemm::gemm_isa(self.isa, &self.tiles, shape, a, b, c.as_mut_slice());
                bump(&self.counters.cpu_gemms, 1);
                return Ok(());
            }
            let mm = MatMul {
                m,
                k: ks,
                n: nc,
                a: &prep.a,
                a_offset,
                b: &prep.expert.b,
                b_offset,
                c_offset: 0,
            };
            // The stream envelope holds for the padded K too: 512 is a multiple of the padding.
            let sub = match core {
                Some(core) => self.device.prepare_i8_on(mm, c, core)?,
                None if in_stream_envelope(ks) => self.device.prepare_stream_i8(vec![mm], c)?,
                None => self.device.prepare_i8(mm, c)?,
            };
            sub.run_share(0, 1);
            sub.finish()?;
            Ok(c.sync_from_device()?)
        };
        let mut c = self.spare_c.take(&self.device, self.tiles.c_len(m, nc))?;
        product(&segments[0], &mut c)?;
        // Deeper than one device GEMM: the segments' int32 products add up to the full one
        // exactly (|sum| <= K·127·127 < 2^31 for the K validation admits).
        let mut sum: Option<Vec<i32>> = None;
        for seg in &segments[1..] {
            let acc = match &mut sum {
                Some(acc) => acc,
                None => sum.insert(c.as_slice()[..self.tiles.c_len(m, nc)].to_vec()),
            };
            product(seg, &mut c)?;
            for (a, &x) in acc.iter_mut().zip(c.as_slice()) {
                *a += x;
            }
        }
        call.clock.add(Stage::Gemm, t);
        Ok(Product { c, sum })
    }

    /// Scatters the f32 results of `item`'s `product` to the call's dst(s).
    fn scatter_item(
        &self,
        call: &Call,
        io: &Inputs,
        prep: &Prepared,
        item: &Item,
        product: Product,
    ) -> Result<(), Error> {
        let t = Instant::now();
        let p = &call.plan.problem;
        let rows = call.routing().rows_of(&call.routing().groups[item.group]);
        let (n0, n1, m) = (item.n0, item.n1, rows.len());
        let c_int = product.ints(self.tiles.c_len(m, n1 - n0));
        // Channel block j·np.. of a pair's product is projection j's.
        let np = self.tiles.pad(p.n);
        let dsts = std::iter::once(io.dst).chain(io.pair.as_ref().map(|x| x.dst));
        for (j, (p, dst)) in call.plan.problems().zip(dsts).enumerate() {
            let (lo, hi) = (n0.max(j * np), n1.min((j + 1) * np));
            if lo < hi {
                let c_part = &c_int[(lo - n0) * m..(hi - n0) * m];
                let chan = &prep.expert.chan[lo..hi];
                let part = (j, lo - j * np, hi - j * np);
                self.scatter(p, rows, prep, part, chan, c_part, dst);
            }
        }
        self.spare_c.give(product.c);
        call.clock.add(Stage::Scatter, t);
        Ok(())
    }

    /// `dst[n, slot, token] = C[m][n] · (row_scale[m] · chan[n])` (with a tiny row's power of two
    /// and the row's outlier correction, [`ScatterRow`]) for the padded channels `n0..n1` of
    /// projection `proj` (`p`), from their native C block `c` and channel scales `chan`
    /// ([`scale_row`] per row).
    ///
    /// Native C is [N/4][M][4]: the 4 rows of a block hold one 64-byte run per tile, so a block's
    /// tiles (one line each) are read from memory once, for its first row, and from L1 for the
    /// other three, while every `dst` row is written front to back.
    #[allow(clippy::too_many_arguments)]
    fn scatter(
        &self,
        p: &Problem,
        rows: &[Row],
        prep: &Prepared,
        (proj, n0, n1): (usize, usize, usize),
        chan: &[f32],
        c: &[i32],
        dst: &[AtomicU32],
    ) {
        if n0 >= p.n {
            return; // padding channels only
        }
        let m = rows.len();
        let width = n1.min(p.n) - n0;
        let (chan, _) = chan.as_chunks::<QUAD>();
        let (c, _) = c.as_chunks::<QUAD>();
        let mut add = vec![0f32; if prep.outliers.is_some() { width } else { 0 }];
        for (mi, row) in rows.iter().enumerate() {
            let base = p.dst_offset(row.token as usize, row.slot as usize) + n0;
            let out = &dst[base..base + width];
            let scale = prep.row_scales[mi];
            let corrected = prep
                .outliers
                .as_ref()
                .is_some_and(|o| o.row(mi, proj, n0, &mut add));
            let finish = ScatterRow {
                scale: scale.scale,
                post: scale.post(),
                add: corrected.then_some(&add[..]),
            };
            scale_row(self.isa, c, mi, m, finish, chan, out);
        }
        publish(self.isa);
    }

    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        let cache = self.experts.stats();
        let dev = self.device.stats();
        Stats {
            calls: load(&c.calls),
            handled: load(&c.handled),
            declined: load(&c.declined),
            rows: load(&c.rows),
            experts_inflated: load(&c.experts_inflated),
            cache_hits: cache.hits,
            cache_misses: cache.misses,
            cache_evictions: cache.evictions,
            cache_bypassed: cache.bypassed,
            bytes_inflated: load(&c.bytes_inflated),
            submits_run_i8: dev.submits[0],
            submits_chain: dev.submits[1],
            submits_stream: dev.submits[2],
            cpu_gemms: load(&c.cpu_gemms),
            contexts_created: dev.contexts_created,
            buffers_created: dev.buffers_created,
            modelled_npu_us: dev.modelled_us,
            backend: Some(self.device.backend()),
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let staging = self.experts.staging();
        staging.fence();
        staging.shut_down();
        for t in self.prefetchers.drain(..) {
            // A prefetch thread catches its jobs' panics; a failed join has nothing left to undo.
            let _ = t.join();
        }
    }
}

/// How many prefetch threads run and where ([`Config::prefetch_threads`]).
struct PrefetchPlacement {
    threads: usize,
    cpus: Vec<usize>,
    /// The library picked the CPUs (idle slow cores): a thread that cannot run there does not
    /// run at all, where it would take a core from the host's threads.
    picked: bool,
}

impl PrefetchPlacement {
    fn of(config: &Config) -> PrefetchPlacement {
        let given = |threads| PrefetchPlacement {
            threads,
            cpus: config.prefetch_cpus.clone(),
            picked: false,
        };
        match config.prefetch_threads {
            Some(n) => given(n),
            None if !config.prefetch_cpus.is_empty() => given(config.prefetch_cpus.len()),
            None => match crate::cpus::idle_slow_cores() {
                Ok(cpus) => {
                    log::info!(
                        "prefetch: {} threads on the idle slow cores, cpu {} (ORK_PREFETCH=0: none)",
                        cpus.len(),
                        crate::cpus::list(&cpus)
                    );
                    PrefetchPlacement {
                        threads: cpus.len().min(MAX_PREFETCH_THREADS),
                        cpus,
                        picked: true,
                    }
                }
                Err(why) => {
                    log::debug!("prefetch: no threads by default: {why}");
                    given(0)
                }
            },
        }
    }
}

/// One prefetch thread: takes announced experts and inflates them into the staging area.
struct Prefetcher {
    device: Arc<Device>,
    experts: Arc<Experts>,
    spares: Arc<Spares<i8>>,
    tiles: Tiles,
    isa: Isa,
    cpus: Vec<usize>,
    /// [`PrefetchPlacement::picked`].
    pinned_or_none: bool,
}

impl Prefetcher {
    fn run(self) {
        if !self.cpus.is_empty() {
            if let Err(e) = crate::pool::pin_current_thread(&self.cpus) {
                if self.pinned_or_none {
                    // Announced experts it would have taken are inflated by their calls.
                    log::warn!("prefetch thread does not run: {e}");
                    return;
                }
                log::warn!("prefetch thread stays unpinned: {e}");
            }
        }
        while let Some(job) = self.experts.staging().next_job() {
            inflate_job(
                job,
                &self.device,
                &self.experts,
                &self.spares,
                &self.tiles,
                self.isa,
            );
        }
    }
}

/// Inflates the expert of an announced call into the staging area: a prefetch thread's job, or
/// one a waiting call's thread took ([`Staging::help_job`]). Errors and panics stay here: the
/// call inflates the expert itself and reports what goes wrong then.
fn inflate_job(
    job: Job,
    device: &Device,
    experts: &Experts,
    spares: &Spares<i8>,
    tiles: &Tiles,
    isa: Isa,
) {
    let done = panic::catch_unwind(AssertUnwindSafe(|| {
        let call = &job.call;
        let weights: Vec<Weights> = call
            .plan
            .problems()
            .zip(&call.weights)
            .map(|(problem, w)| Weights {
                problem,
                data: w.data.bytes(),
                name: w.name.as_deref(),
            })
            .collect();
        experts.prefetch(device, spares, tiles, isa, &weights, job.expert)
    }));
    match done {
        Ok(Ok(())) => {}
        Ok(Err(e)) => log::debug!("prefetch of expert {}: {e}", job.expert),
        Err(p) => log::warn!(
            "prefetch of expert {}: {}",
            job.expert,
            Error::from_panic(p)
        ),
    }
    // The job holds the host's weights: gone before the fence can count it finished.
    drop(job);
    experts.staging().finish();
}

/// What a caller thread of a piped phase 2 does next.
enum Next {
    Scatter((usize, Product)),
    Prepare,
    Help(Job),
}
