//! The engine behind one `ork_ctx`: its construction, the calls' entry points (single caller,
//! cooperative, leader) and the prefetch announcements. A call runs phase 1 (`super::phase1`)
//! and phase 2 (`super::phase2`, with `super::submit`'s threads on an offloaded device) on the
//! library's pool or on the caller's threads.

use super::call::{Call, CallKey, Joining};
use super::desc::TensorDesc;
use super::dispatch::{Choice, OpClass, Path, Verdict};
use super::phase1::phase1;
use super::phase2::phase2;
use super::plan::{Inputs, Plan};
use super::prefetch::{Placement, Prefetchers};
use super::resources::{device_tiles, Resources};
use super::staging::{Announced, HeldWeights, PrefetchStats};
use super::stats::{bump, load, ExpertRun, Stages, Stats};
use super::submit::with_submitters;
use super::{Config, Error, ErrorKind, MtMode};
use crate::npu::Device;
use crate::sync::lock;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;

/// The engine behind one `ork_ctx`. Safe to use from several threads at once.
pub struct Engine {
    /// Shared with the prefetch threads.
    res: Arc<Resources>,
    joining: Joining,
    prefetchers: Prefetchers,
}

impl Engine {
    pub fn new(config: Config) -> Result<Engine, Error> {
        let device = Device::open(&config.device)?;
        Engine::with_device(config, device)
    }

    /// An engine on a device the caller opened (`config.device` is then not used to open one),
    /// e.g. an emulator with injected faults.
    pub fn with_device(config: Config, device: Device) -> Result<Engine, Error> {
        let tiles = device_tiles(&device)?;
        let placement = Placement::of(&config, crate::cpus::idle_slow_cores, crate::cpus::online)?;
        // Without prefetch threads nothing is ever staged: a budget of 0 says so to the staging
        // area, which then skips its lock on every miss.
        let staged = if placement.threads > 0 {
            config.prefetch_bytes as usize
        } else {
            0
        };
        let res = Arc::new(Resources::new(config, device, tiles, staged));
        let prefetchers = Prefetchers::start(&res, &placement)?;
        Ok(Engine {
            res,
            joining: Joining::default(),
            prefetchers,
        })
    }

    /// Announces a call that will come (from the same metadata: `plan` is what [`Engine::plan`]
    /// or [`Engine::plan_pair`] gives for it) so that the prefetch threads inflate its experts
    /// ahead (`ORK_PREFETCH`; module `prefetch`). `weights` are its projections' `as` tensors,
    /// which the caller keeps valid until [`Engine::prefetch_fence`] returns. Returns how many
    /// experts it queued: none without prefetch threads, or for a small batch run on the CPU.
    pub fn prefetch(&self, plan: Plan, weights: Vec<HeldWeights>) -> Result<usize, Error> {
        if !self.prefetching() || plan.on_cpu {
            return Ok(0);
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
        let experts = plan.problem.n_expert;
        self.res
            .experts
            .staging()
            .announce(Announced { plan, weights });
        Ok(experts)
    }

    /// Whether the engine has prefetch threads ([`Engine::prefetch`] does something).
    pub fn prefetching(&self) -> bool {
        self.prefetchers.running()
    }

    /// After this returns no prefetch thread reads weights announced before it (a graph ended:
    /// its weights may be freed). Experts staged already stay for their calls.
    pub fn prefetch_fence(&self) {
        self.res.experts.staging().fence();
    }

    /// What the prefetch threads did.
    pub fn prefetch_stats(&self) -> PrefetchStats {
        self.res.experts.staging().stats()
    }

    pub fn device(&self) -> &Device {
        &self.res.device
    }

    /// Validates the descriptors and applies the small-batch policy, from metadata only.
    pub fn plan(
        &self,
        w: &TensorDesc,
        b: &TensorDesc,
        ids: &TensorDesc,
        dst: &TensorDesc,
    ) -> Result<Plan, Error> {
        Plan::single(&self.res.config, w, b, ids, dst)
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
        Plan::pair(&self.res.config, w0, w1, b, ids, dst0, dst1)
    }

    /// [`Engine::plan`] for a dense matmul `dst = w^T · b`
    /// ([`dense_as_mul_mat_id`](super::desc::dense_as_mul_mat_id): one expert every token routes
    /// to): the attention projections of a prefill, say. Its [`Inputs`] take `ids` =
    /// [`DENSE_IDS`](super::desc::DENSE_IDS). Declined when the configuration turns dense calls
    /// off.
    pub fn plan_dense(
        &self,
        w: &TensorDesc,
        b: &TensorDesc,
        dst: &TensorDesc,
    ) -> Result<Plan, Error> {
        Plan::dense(&self.res.config, w, b, dst)
    }

    /// Counts a declined call (the C boundary calls it once per call).
    pub fn note_declined(&self) {
        bump(&self.res.counters.calls, 1);
        bump(&self.res.counters.declined, 1);
    }

    /// Runs a planned call on the crate's pool.
    pub fn run(&self, plan: Plan, io: &Inputs) -> Result<Stages, Error> {
        self.run_traced(plan, io).map(|(stages, _)| stages)
    }

    /// [`Engine::run`], also returning the call's used experts in the order phase 2 took them
    /// (rows, cache hit or not): the board timeline model's input.
    pub fn run_traced(&self, plan: Plan, io: &Inputs) -> Result<(Stages, Vec<ExpertRun>), Error> {
        let choice = self.res.dispatch.choose(&plan);
        if choice.path == Path::Ggml {
            self.note_declined();
            return Err(declined(choice));
        }
        let call = self.start(plan, [0; 4], 1, self.res.threads(), io);
        self.run_on_pool(&call, io);
        let r = self.end(&call);
        let mut runs = std::mem::take(&mut *lock(&call.runs));
        runs.sort_by_key(|&(group, _)| group);
        self.res.recycle(call);
        r.map(|stages| (stages, runs.into_iter().map(|(_, run)| run).collect()))
    }

    /// Both phases of `call` on the crate's pool, `call.nth` threads.
    fn run_on_pool(&self, call: &Call, io: &Inputs) {
        let pool = crate::pool::global();
        pool.run(call.nth, |ith, _| phase1(&self.res, call, io, ith));
        if let Some(Ok(_)) = call.routing.get() {
            with_submitters(&self.res, call, || {
                pool.run(call.nth, |_, _| phase2(&self.res, call, io))
            });
        }
    }

    /// Runs a planned call cooperatively: every one of `nth` threads calls this with the same
    /// plan and tensors; `barrier` must be a full barrier across them. Every thread returns the
    /// same result. Threads that disagree on `nth` or `ith`, or a barrier that returns before
    /// all of them came, end the call with `InvalidArgument` before anything is written
    /// (`super::agreement`).
    pub fn run_mt(
        &self,
        plan: Plan,
        io: &Inputs,
        ith: usize,
        nth: usize,
        barrier: &mut dyn FnMut(),
    ) -> Result<Stages, Error> {
        let key = [
            io.weights.as_ptr() as usize,
            io.b.as_ptr() as usize,
            io.ids.as_ptr() as usize,
            io.dst.as_ptr() as usize,
        ];
        let leader = self.res.config.mt_mode == MtMode::Leader;
        let workers = if leader { self.res.threads() } else { nth };
        let call = self.joining.join(plan, key, (ith, nth), |plan| {
            let choice = self.res.dispatch.choose(&plan);
            if choice.path == Path::Library {
                return self.start(plan, key, nth, workers, io);
            }
            self.note_declined();
            let mut call = Call::new(plan, key, nth, 1);
            call.declined = Some(declined(choice));
            call
        });
        if let Some(e) = &call.declined {
            self.joining.leave_when_all_came(&call);
            return Err(e.clone());
        }
        // A panic must not skip a barrier: the other threads would wait forever.
        let guarded = |f: &dyn Fn()| {
            if let Err(p) = panic::catch_unwind(AssertUnwindSafe(f)) {
                call.fail(Error::from_panic(p));
            }
        };
        if !leader {
            guarded(&|| phase1(&self.res, &call, io, ith.min(call.nth - 1)));
            // Every thread sees the same routing result: an invalid id ends the call everywhere
            // before the barrier, with dst untouched.
            if let Some(Err(e)) = call.routing.get() {
                self.joining.leave(&call);
                return if ith == 0 {
                    self.end(&call)
                } else {
                    Err(e.clone())
                };
            }
        }
        call.agreement.ready();
        // In leader mode this barrier only lets every thread join before thread 0 writes.
        barrier();
        let r = match self.agreed(&call) {
            Err(e) => Err(e),
            Ok(()) => {
                if !leader {
                    // Thread 0 keeps the call's submitter threads, if any, while it works.
                    if ith == 0 {
                        guarded(&|| {
                            with_submitters(&self.res, &call, || phase2(&self.res, &call, io))
                        });
                    } else {
                        guarded(&|| phase2(&self.res, &call, io));
                    }
                } else if ith == 0 {
                    // Thread 0 runs the call on the crate's pool while the others wait in
                    // `barrier`.
                    guarded(&|| self.run_on_pool(&call, io));
                }
                barrier();
                if ith == 0 {
                    self.end(&call)
                } else {
                    call.result()
                }
            }
        };
        // The last thread out owns the call and returns its buffers.
        if let Some(call) = Arc::into_inner(call) {
            self.res.recycle(call);
        }
        r
    }

    /// Whether the threads of `call` agree (after its first barrier): if not, the call fails
    /// with the reason on every thread.
    fn agreed(&self, call: &Arc<Call>) -> Result<(), Error> {
        let (verdict, decided_here) = self.joining.verdict(call);
        let Err(e) = verdict else { return Ok(()) };
        if decided_here {
            call.fail(e.clone());
            let p = &call.plan.problem;
            log::debug!("failed {} K={} N={}: {e}", p.layout.name(p.wtype), p.k, p.n);
        }
        Err(e.clone())
    }

    fn start(
        &self,
        plan: Plan,
        key: CallKey,
        participants: usize,
        nth: usize,
        io: &Inputs,
    ) -> Call {
        bump(&self.res.counters.calls, 1);
        bump(&self.res.counters.rows, plan.problem.rows() as u64);
        let mut call = Call::new(plan, key, participants, nth);
        if self.prefetching() {
            let addr = io.weights.as_ptr() as usize;
            // A call of one expert (a dense matmul) is NPU work with little DRAM traffic of its
            // own: the prefetch threads keep inflating the next calls' experts meanwhile.
            let pause = !call.plan.problem.one_expert();
            call.prefetch_pause = self.res.experts.staging().call_starts(addr, pause);
            call.helps_prefetch = !pause;
        }
        call
    }

    fn end(&self, call: &Call) -> Result<Stages, Error> {
        let r = call.result();
        let p = &call.plan.problem;
        match &r {
            Ok(_) => {
                let seconds = call.started.elapsed().as_secs_f64();
                self.res
                    .dispatch
                    .observe(&call.plan, Path::Library, seconds);
                bump(&self.res.counters.handled, 1);
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
                    self.res.device.backend().name(),
                    self.res.experts.stats()
                );
            }
            Err(e) => log::debug!("failed {} K={} N={}: {e}", p.layout.name(p.wtype), p.k, p.n),
        }
        r
    }

    /// ggml's own path ran a call of `plan` (one the engine declined, or would have) in
    /// `seconds`: a sample for `ORK_DISPATCH=auto`.
    pub fn observe(&self, plan: &Plan, seconds: f64) {
        self.res.dispatch.observe(plan, Path::Ggml, seconds);
    }

    /// The engine's configuration.
    pub fn config(&self) -> &Config {
        &self.res.config
    }

    /// Every class of call's verdict under `ORK_DISPATCH=auto`.
    pub fn dispatch_verdicts(&self) -> Vec<(OpClass, Verdict)> {
        self.res.dispatch.verdicts()
    }

    /// Saves the verdicts that changed after the cache file was last written.
    pub fn save_dispatch(&self) {
        self.res.dispatch.save_changes();
    }

    pub fn stats(&self) -> Stats {
        let c = &self.res.counters;
        let cache = self.res.experts.stats();
        let dev = self.res.device.stats();
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
            backend: Some(self.res.device.backend()),
        }
    }
}

/// The error of a call `ORK_DISPATCH` leaves to the caller's own path.
fn declined(choice: Choice) -> Error {
    Error::not_handled(if choice.explore {
        "declined to measure the caller's own path (ORK_DISPATCH=auto)"
    } else {
        "declined by ORK_DISPATCH (`never`, or under `auto` measured slower than the caller's own path for calls of this class)"
    })
}
