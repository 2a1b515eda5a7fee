//! The builder of one ubatch's work graph from the calls the engine made, under an engine model.

use super::caches::{ContextCache, Fifo};
use super::calls::{CallWork, DenseWork, ExpertCall, Proj, UbatchWork};
use super::engine::EngineModel;
use super::params::Params;
use super::runs;
use super::work::{Graph, Unit, Withdraw, Work};
use ork_moe::layout::Tiles;

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

/// What the tasks of one call's expert items share.
struct CallPlan<'c> {
    c: &'c CallWork,
    /// Where its CPU stages run.
    cpu: Unit,
    route: u32,
    /// The end of phase 1.
    phase1: u32,
    /// Its experts come from the prefetcher.
    prefetched: bool,
    /// Each expert's rows are quantized where it gathers them (`Call::quantized_at_gather`).
    at_gather: bool,
    /// Phase 1 writes native A's order, which the gather copies whole (`Call::quantized_native`).
    native: bool,
    /// K and N padded to whole tiles.
    kp: usize,
    np: usize,
    /// Outlier columns per expert.
    columns: u64,
}

/// The tasks of one expert item a call waits for.
struct Item {
    scatters: Vec<u32>,
    /// Once this ends, the submitters have taken the item's last runs.
    help_until: Option<u32>,
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
        let plan = self.phase1(c, input, previous);
        let first_task = self.g.tasks.len();
        let mut scatters = Vec::new();
        let mut help_until = None;
        for x in &c.experts {
            let item = self.item(&plan, x);
            scatters.extend(item.scatters);
            help_until = item.help_until.or(help_until);
        }
        let runs = self.g.tasks[first_task..]
            .iter()
            .filter(|t| matches!(t.work, Work::Run { .. }))
            .count() as u64;
        // The submitter threads' CPU time, beside the runs they submit.
        let submit = Work::Submit { runs };
        scatters.push(self.g.push(submit, Unit::AnyCpu, &[plan.route], c.layer));
        if plan.prefetched {
            self.unused_prefetches(&plan);
        }
        let end = self.g.join(&scatters, c.layer);
        let e = self.engine;
        // The engine's dense calls do not pause the prefetcher (`Engine::start`).
        if e.pause && c.proj.routed() {
            self.g.calls.push((plan.route, end));
        } else if e.help && !c.proj.routed() {
            self.g.helping.push((plan.route, help_until.unwrap_or(end)));
        }
        end
    }

    /// A call's phase 1: the routing, and the activations quantized in a share per big core
    /// (none where each expert quantizes its rows as it gathers them).
    fn phase1<'c>(&mut self, c: &'c CallWork, input: u32, previous: u32) -> CallPlan<'c> {
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
        let t = Tiles::RK3588;
        CallPlan {
            c,
            cpu,
            route,
            phase1,
            // Only the announced calls' experts are prefetched; a dense call inflates its own.
            prefetched: e.prefetch && c.proj.routed(),
            at_gather,
            native,
            kp: t.pad(c.k),
            np: t.pad(c.n),
            columns: self.outlier_columns(c),
        }
    }

    /// The tasks of one used expert: its weights, its rows gathered into native A, its runs, the
    /// outlier split's columns and the scatter of its results.
    fn item(&mut self, plan: &CallPlan, x: &ExpertCall) -> Item {
        let (chain, weights) = self.item_weights(plan, x);
        let sync_a = self.gather(plan, x, chain);
        let runs = self.item_runs(plan, x, sync_a, weights);
        let layer = plan.c.layer;
        // The last `cores` runs are the last ones the submitters take, when the others end:
        // from then on the call's threads are kept for its scatters (`help_until`).
        let cores = self.params.cores as usize;
        let help_until = (runs.len() > cores).then(|| {
            let first: Vec<u32> = runs[..runs.len() - cores].iter().map(|r| r.0).collect();
            self.g.join(&first, layer)
        });
        let done = if runs.len() == 1 {
            runs[0].0
        } else {
            let ends: Vec<u32> = runs.iter().map(|&(run, _)| run).collect();
            self.g.join(&ends, layer)
        };
        if !x.hit {
            self.release(plan.c.b_bytes(), done, plan.prefetched);
        }
        let scatters = self.scatter(plan, x, runs);
        Item {
            scatters,
            help_until,
        }
    }

    /// Where an item's weights come from: (the last task of the item's thread so far, the task
    /// after which its B is ready). With blocking submits an item's thread starts after phase 1
    /// and keeps going through the item.
    fn item_weights(&mut self, plan: &CallPlan, x: &ExpertCall) -> (u32, u32) {
        let c = plan.c;
        if x.hit {
            let after = if self.engine.ops_in_sequence {
                plan.phase1
            } else {
                plan.route
            };
            let w = self.g.push(Work::Lookup, plan.cpu, &[after], c.layer);
            (w, w)
        } else if plan.prefetched {
            let w = self.weights(c, &[], self.engine.inflate_on, true);
            self.withdraw(w, plan.route, false);
            (plan.phase1, w)
        } else {
            let w = self.weights(c, &[plan.phase1], plan.cpu, false);
            (w, w)
        }
    }

    /// An item's rows gathered into native A (quantized there, or copied whole from phase 1's
    /// native order) and flushed; returns the flush.
    fn gather(&mut self, plan: &CallPlan, x: &ExpertCall, chain: u32) -> u32 {
        let (c, cpu, phase1) = (plan.c, plan.cpu, plan.phase1);
        let layer = c.layer;
        let blocking = self.engine.blocking_submits;
        let m = x.rows as u64;
        let a_bytes = m * plan.kp as u64;
        let gather = if plan.native {
            Work::Concat { bytes: a_bytes }
        } else {
            Work::Gather { bytes: a_bytes }
        };
        let gather = if plan.at_gather {
            let quant = Work::Quant {
                elems: m * c.k as u64,
            };
            let quant = if blocking {
                self.g.push_on(quant, cpu, chain, &[phase1], layer)
            } else {
                self.g.push(quant, cpu, &[phase1], layer)
            };
            self.g.push_on(gather, cpu, quant, &[], layer)
        } else if blocking {
            self.g.push_on(gather, cpu, chain, &[phase1], layer)
        } else {
            self.g.push(gather, cpu, &[phase1], layer)
        };
        self.g
            .push_on(Work::Sync { bytes: a_bytes }, cpu, gather, &[], layer)
    }

    /// An item's NPU runs after A (`sync_a`) and B (`weights`) are ready, each with the context
    /// it must create first, if any: (the run, its N), in the order they are issued.
    fn item_runs(
        &mut self,
        plan: &CallPlan,
        x: &ExpertCall,
        sync_a: u32,
        weights: u32,
    ) -> Vec<(u32, u32)> {
        let layer = plan.c.layer;
        let blocking = self.engine.blocking_submits;
        let mut last = sync_a;
        let mut runs = Vec::new();
        let cores = self.params.cores as usize;
        let c = plan.c;
        for r in runs::plan(
            self.engine,
            cores,
            self.contexts,
            c,
            x.rows,
            plan.kp,
            plan.np,
        ) {
            let mut deps = vec![sync_a, weights];
            if r.new_context {
                let ctx = if blocking {
                    self.g
                        .push_on(Work::ContextCreate, plan.cpu, last, &[], layer)
                } else {
                    self.g
                        .push(Work::ContextCreate, Unit::Big, &[plan.route], layer)
                };
                deps.push(ctx);
                last = ctx;
            }
            let work = Work::Run {
                primitive: r.primitive,
                m: r.m,
                k: plan.kp as u32,
                n: r.n,
            };
            last = if blocking {
                // The calling thread issues the runs one after another and waits in each.
                self.g.push_on(work, r.unit, last, &deps, layer)
            } else {
                self.g.push(work, r.unit, &deps, layer)
            };
            runs.push((last, r.n));
        }
        runs
    }

    /// An item's results read back and scattered, with the outlier split's correction; returns
    /// the scatters.
    fn scatter(&mut self, plan: &CallPlan, x: &ExpertCall, runs: Vec<(u32, u32)>) -> Vec<u32> {
        let (c, cpu) = (plan.c, plan.cpu);
        let layer = c.layer;
        let blocking = self.engine.blocking_submits;
        // The columns need the rows' outlier channels (phase 1) and the quantized weights;
        // the correction is added where the rows are scattered.
        let mut scatter_deps = Vec::new();
        if plan.columns > 0 {
            let work = Work::Outliers {
                ty: c.ty,
                weights: plan.columns * c.n as u64,
                q_bytes: c.q_bytes(),
            };
            scatter_deps.push(self.g.push(work, cpu, &[plan.phase1], layer));
        }
        // The thread that issued the runs reads C back after the last of them; otherwise each
        // part is an item of its own, read back and scattered when its run ends.
        let parts = match runs.last() {
            Some(&(last, _)) if blocking => vec![(last, plan.np as u32)],
            _ => runs,
        };
        let m = x.rows as u64;
        let np = plan.np as u64;
        let mut scatters = Vec::new();
        for (run, n) in parts {
            let c_bytes = m * n as u64 * 4;
            let sync = Work::Sync { bytes: c_bytes };
            let sync_c = if blocking {
                self.g.push_on(sync, cpu, run, &[], layer)
            } else {
                self.g.push(sync, cpu, &[run], layer)
            };
            let scatter = Work::Scatter {
                c_bytes,
                dst_bytes: m * 4 * (c.n as u64 * n as u64).div_ceil(np),
            };
            scatters.push(self.g.push_on(scatter, cpu, sync_c, &scatter_deps, layer));
        }
        scatters
    }

    /// A prefetching engine inflates every expert of the call, the unused ones too; the call
    /// learns which those are from its routing, and only then frees their slots.
    fn unused_prefetches(&mut self, plan: &CallPlan) {
        let c = plan.c;
        for _ in c.experts.len()..c.n_expert {
            let w = self.weights(c, &[], self.engine.inflate_on, true);
            self.withdraw(w, plan.route, true);
            let unused = self.g.join(&[w, plan.route], c.layer);
            self.release(c.b_bytes(), unused, true);
        }
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
            // The engine's cache: under a streaming sweep the oldest entries leave (occupancy
            // only).
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
