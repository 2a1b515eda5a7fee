//! Pricing and scheduling a work graph: the serial time (every task alone, one after another),
//! the as-scheduled time (a list scheduler over the graph's dependencies and the board's cores,
//! DRAM shared among the running tasks) and the resource lower bound.
//!
//! DRAM is one budget (`shared_dram_gbps`, bytes read + written) shared by processor sharing:
//! each running task wants `bytes / solo time` and the budget is split max-min fairly, so a task
//! that gets less than it wants progresses proportionally slower. A task's solo time is its own
//! unit's: a CPU stage at its core's rate (never moving more than twice that core's memcpy per
//! second), an NPU run as the emulator's cost model prices it on one core.

use super::graph::{Graph, Stage, Unit, Work};
use super::params::Params;
use ork_moe::npu::emu::modelled_submit;
use ork_moe::quant::GgmlType;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// The kind of core a task runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Core {
    Big,
    Little,
    Npu,
    None,
}

/// A task's time alone on `core` (µs) and its DRAM bytes.
fn price(w: &Work, core: Core, p: &Params) -> (f64, u64) {
    let speed = if core == Core::Little {
        p.little_core_factor
    } else {
        1.0
    };
    let memcpy = if core == Core::Little {
        p.memcpy_gbps_little_core
    } else {
        p.memcpy_gbps_big_core
    };
    // Per byte on a big core at `gbps`, slower on a little one.
    let at = |bytes: u64, gbps: f64| bytes as f64 / (gbps * 1e3 * speed);
    let (us, bytes) = match *w {
        Work::Join => (0.0, 0),
        Work::Route { rows } => (rows as f64 / (p.route_mrows_big_core * speed), 0),
        Work::Quant { elems } => (
            elems as f64 / (p.quant_gelems_big_core * 1e3 * speed),
            5 * elems,
        ),
        Work::Gather { bytes } => (at(bytes, p.gather_gbps_big_core), 2 * bytes),
        Work::Concat { bytes } => (bytes as f64 / (memcpy * 1e3), 2 * bytes),
        Work::Lookup => (p.lookup_us / speed, 0),
        // The kernel zeroes the pages it hands out.
        Work::BufferCreate { bytes } => (p.buffer_create_us, bytes),
        Work::Inflate {
            ty,
            q_bytes,
            out_bytes,
        } => (at(out_bytes, inflate_gbps(ty, p)), q_bytes + out_bytes),
        // Maintenance of lines mostly written back already: CPU time, little DRAM traffic.
        Work::Sync { bytes } => (p.sync_us + at(bytes, p.sync_gbps), 0),
        Work::ContextCreate => (p.context_create_us, 0),
        Work::Run { primitive, m, k, n } => {
            let parts = modelled_submit(
                &p.npu_cost(),
                primitive,
                &[(m as usize, k as usize, n as usize)],
                &[0],
            );
            (parts.total_us(&p.npu_cost()), parts.bytes)
        }
        Work::Outliers {
            ty,
            weights,
            q_bytes,
        } => {
            let gweights = match ty {
                GgmlType::Q4_K | GgmlType::Q6_K => p.outlier_gweights_big_core_kquant,
                _ => p.outlier_gweights_big_core,
            };
            (weights as f64 / (gweights * 1e3 * speed), q_bytes)
        }
        Work::Scatter { c_bytes, dst_bytes } => {
            (at(dst_bytes, p.scatter_gbps_big_core), c_bytes + dst_bytes)
        }
        Work::Elementwise { elems } => (
            elems as f64 / (p.elementwise_gelems_big_core * 1e3 * speed),
            8 * elems,
        ),
        Work::Dense { us, bytes } => (us / speed, bytes),
    };
    let cap = match core {
        Core::Big | Core::Little => bytes as f64 / (2.0 * memcpy * 1e3),
        Core::Npu | Core::None => 0.0,
    };
    (us.max(cap), bytes)
}

/// Inflate output GB/s of one big core for `ty`.
fn inflate_gbps(ty: GgmlType, p: &Params) -> f64 {
    match ty {
        GgmlType::Q4_K => p.inflate_gbps_big_core_q4_k,
        GgmlType::Q5_0 => p.inflate_gbps_big_core_q5_0,
        GgmlType::Q8_0 => p.inflate_gbps_big_core_q8_0,
        GgmlType::Q6_K => p.inflate_gbps_big_core_q6_k,
        GgmlType::Q4_1 => p.inflate_gbps_big_core_q4_1,
        _ => p.inflate_gbps_big_core,
    }
}

fn core_of(unit: Unit) -> Core {
    match unit {
        Unit::Free => Core::None,
        Unit::Big | Unit::AnyCpu => Core::Big,
        Unit::Little => Core::Little,
        Unit::Npu(_) | Unit::AnyNpu => Core::Npu,
    }
}

/// The resource lower bound of a graph's work, µs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Bound {
    /// Every byte at the full shared DRAM bandwidth.
    pub dram_us: f64,
    /// CPU work over the cores that may do it (little cores at their speed).
    pub cpu_us: f64,
    /// NPU work over the NPU cores (or the busiest core, for runs bound to one).
    pub npu_us: f64,
    /// The longest dependency chain, each task alone at full speed (not part of `us`).
    pub critical_path_us: f64,
}

impl Bound {
    /// `max(DRAM, CPU, NPU)`: what the resources allow, whatever the overlap.
    pub fn us(&self) -> f64 {
        self.dram_us.max(self.cpu_us).max(self.npu_us)
    }

    /// The resource that sets [`Bound::us`].
    pub fn limit(&self) -> &'static str {
        if self.dram_us >= self.cpu_us && self.dram_us >= self.npu_us {
            "dram"
        } else if self.npu_us >= self.cpu_us {
            "npu"
        } else {
            "cpu"
        }
    }
}

/// The modelled timeline of one graph.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timeline {
    /// Every task alone, one after another.
    pub serial_us: f64,
    /// As scheduled on the board's cores with shared DRAM.
    pub scheduled_us: f64,
    pub bound: Bound,
    /// Serial time per stage, indexed like [`Stage::REPORTED`].
    pub stage_us: Vec<f64>,
    /// DRAM bytes per stage, same index.
    pub stage_bytes: Vec<u64>,
    pub dram_bytes: u64,
    /// NPU runs (`rknn_matmul_run` calls).
    pub runs: u64,
    pub contexts_created: u64,
    pub buffers_created: u64,
    /// When each layer's last task ended in the schedule.
    pub layer_end_us: Vec<f64>,
    /// Serial time of each layer's tasks per stage (indexed like [`Stage::REPORTED`]).
    pub layer_stage_us: Vec<Vec<f64>>,
    /// Peak device bytes of inflated experts resident (as the graph allocates and frees them).
    pub peak_resident_bytes: u64,
}

fn stage_index(s: Stage) -> Option<usize> {
    Stage::REPORTED.iter().position(|&x| x == s)
}

/// Prices, bounds and schedules `g`.
pub fn timeline(g: &Graph, p: &Params) -> Result<Timeline, String> {
    let n_stages = Stage::REPORTED.len();
    let layers = g.tasks.iter().map(|t| t.layer + 1).max().unwrap_or(0) as usize;
    let mut tl = Timeline {
        stage_us: vec![0.0; n_stages],
        stage_bytes: vec![0; n_stages],
        layer_stage_us: vec![vec![0.0; n_stages]; layers],
        ..Timeline::default()
    };
    let (big, little) = (p.big_cores, p.little_cores);
    let (mut big_only, mut little_only, mut any_cpu, mut npu_any) = (0.0, 0.0, 0.0, 0.0);
    let n_npu = p.cores as usize;
    let mut npu_pinned = vec![0.0; n_npu];
    let mut path = vec![0.0f64; g.tasks.len()];
    for (i, t) in g.tasks.iter().enumerate() {
        let (us, bytes) = price(&t.work, core_of(t.unit), p);
        tl.serial_us += us;
        tl.dram_bytes += bytes;
        if let Some(s) = stage_index(t.work.stage()) {
            tl.layer_stage_us[t.layer as usize][s] += us;
            tl.stage_us[s] += us;
            tl.stage_bytes[s] += bytes;
        }
        match t.unit {
            // A prefetch its call may take over: any core's, at an A76's speed.
            Unit::Little if t.withdrawn_by.is_some() => any_cpu += us * p.little_core_factor,
            Unit::Big => big_only += us,
            Unit::AnyCpu => any_cpu += us,
            // A task only an A55 may run: on the A55s alone, and in the total at an A76's speed.
            Unit::Little => {
                little_only += us;
                any_cpu += us * p.little_core_factor;
            }
            Unit::Npu(c) => npu_pinned[c as usize % n_npu] += us,
            Unit::AnyNpu => npu_any += us,
            Unit::Free => {}
        }
        match t.work {
            Work::Run { .. } => tl.runs += 1,
            Work::ContextCreate => tl.contexts_created += 1,
            Work::BufferCreate { .. } => tl.buffers_created += 1,
            _ => {}
        }
        let start = t.deps.iter().map(|&d| path[d as usize]).fold(0.0, f64::max);
        path[i] = start + us;
    }
    let npu_total: f64 = npu_pinned.iter().sum::<f64>() + npu_any;
    tl.bound = Bound {
        dram_us: tl.dram_bytes as f64 / (p.shared_dram_gbps * 1e3),
        cpu_us: (big_only / big)
            .max(little_only / little)
            .max((big_only + any_cpu) / (big + little * p.little_core_factor)),
        npu_us: (npu_total / p.cores).max(npu_pinned.iter().copied().fold(0.0, f64::max)),
        critical_path_us: path.iter().copied().fold(0.0, f64::max),
    };
    let s = simulate(g, p)?;
    tl.scheduled_us = s.makespan;
    tl.layer_end_us = vec![0.0; layers];
    for (t, end) in g.tasks.iter().zip(&s.end) {
        let l = &mut tl.layer_end_us[t.layer as usize];
        *l = l.max(*end);
    }
    tl.peak_resident_bytes = s.peak_resident;
    Ok(tl)
}

struct Simulated {
    makespan: f64,
    end: Vec<f64>,
    peak_resident: u64,
}

/// A running task.
struct Running {
    task: u32,
    /// Fraction of the work left.
    left: f64,
    solo: f64,
    /// Bytes per µs it wants at solo speed.
    demand: f64,
    /// Fraction of its work done per µs at the current share of DRAM.
    rate: f64,
    /// The CPU core it runs on or blocks.
    cpu: Option<usize>,
    npu: Option<usize>,
}

/// Ready queues: per CPU kind, any CPU, per NPU core, any NPU; min task id first.
struct Ready {
    big: BinaryHeap<Reverse<u32>>,
    little: BinaryHeap<Reverse<u32>>,
    any_cpu: BinaryHeap<Reverse<u32>>,
    npu: Vec<BinaryHeap<Reverse<u32>>>,
    any_npu: BinaryHeap<Reverse<u32>>,
}

/// The earliest task of `q` not started yet (others are dropped: they started elsewhere).
fn pop_unstarted(q: &mut BinaryHeap<Reverse<u32>>, started: &[bool]) -> Option<u32> {
    while let Some(Reverse(i)) = q.pop() {
        if !started[i as usize] {
            return Some(i);
        }
    }
    None
}

fn pop_first(a: &mut BinaryHeap<Reverse<u32>>, b: &mut BinaryHeap<Reverse<u32>>) -> Option<u32> {
    match (a.peek(), b.peek()) {
        (Some(x), Some(y)) if x.0 <= y.0 => a.pop().map(|r| r.0),
        (Some(_), None) => a.pop().map(|r| r.0),
        (_, Some(_)) => b.pop().map(|r| r.0),
        (None, None) => None,
    }
}

/// The list scheduler: whenever a core is free it takes the earliest ready task it may run;
/// time advances to the next task end, DRAM shares recomputed at every event.
fn simulate(g: &Graph, p: &Params) -> Result<Simulated, String> {
    let n = g.tasks.len();
    let n_big = p.big_cores as usize;
    let n_cpu = n_big + p.little_cores as usize;
    let n_npu = p.cores as usize;
    let mut succ: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut left_deps: Vec<usize> = vec![0; n];
    let mut chain_next: Vec<Option<u32>> = vec![None; n];
    for (i, t) in g.tasks.iter().enumerate() {
        left_deps[i] = t.deps.len();
        for &d in &t.deps {
            succ[d as usize].push(i as u32);
        }
        if let Some(th) = t.thread_of {
            if chain_next[th as usize].replace(i as u32).is_some() {
                return Err(format!("task {th} continues on two threads"));
            }
        }
    }
    // Prefetched inflates each call's start withdraws, and which were taken over.
    let mut withdraws: Vec<Vec<u32>> = vec![Vec::new(); n];
    for (i, t) in g.tasks.iter().enumerate() {
        if let Some(w) = t.withdrawn_by {
            withdraws[w.by as usize].push(i as u32);
        }
    }
    let mut started = vec![false; n];
    let mut queued = vec![false; n];
    let mut taken_over = vec![false; n];
    let mut dropped = vec![false; n];
    // Calls running now, and the tasks that begin and end one.
    let mut active = 0usize;
    let (mut begins, mut ends) = (vec![false; n], vec![false; n]);
    for &(b, e) in &g.calls {
        begins[b as usize] = true;
        ends[e as usize] = true;
    }
    // Dense calls whose threads help the prefetcher while they wait.
    let mut helping = 0usize;
    let (mut help_begins, mut help_ends) = (vec![false; n], vec![false; n]);
    for &(b, e) in &g.helping {
        help_begins[b as usize] = true;
        help_ends[e as usize] = true;
    }
    let mut held: Vec<Option<usize>> = vec![None; n];
    let mut cpu_free = vec![true; n_cpu];
    let mut npu_free = vec![true; n_npu];
    let mut ready = Ready {
        big: BinaryHeap::new(),
        little: BinaryHeap::new(),
        any_cpu: BinaryHeap::new(),
        npu: (0..n_npu).map(|_| BinaryHeap::new()).collect(),
        any_npu: BinaryHeap::new(),
    };
    let mut end = vec![0.0; n];
    let mut running: Vec<Running> = Vec::new();
    let mut now = 0.0f64;
    let (mut resident, mut peak) = (0u64, 0u64);
    let mut done = 0usize;
    let mut instant: Vec<u32> = (0..n as u32)
        .filter(|&i| left_deps[i as usize] == 0)
        .collect();
    let cap = p.shared_dram_gbps * 1e3;

    // Tasks finished now (the CPU and NPU core each ran on), zero-time joins included.
    let mut completed: Vec<(u32, Option<usize>, Option<usize>)> = Vec::new();
    loop {
        // Make ready tasks ready and complete what finished, until nothing more changes now.
        loop {
            for (i, cpu, npu) in completed.drain(..) {
                end[i as usize] = now;
                done += 1;
                resident = resident.saturating_sub(g.tasks[i as usize].free);
                if let Some(c) = npu {
                    npu_free[c] = true;
                }
                release_chain(i, cpu, &chain_next, &mut held, &mut cpu_free);
                take_over(
                    i,
                    &withdraws,
                    &started,
                    &queued,
                    &mut taken_over,
                    &mut ready,
                );
                active += begins[i as usize] as usize;
                active -= ends[i as usize] as usize;
                helping += help_begins[i as usize] as usize;
                helping -= help_ends[i as usize] as usize;
                for &s in &succ[i as usize] {
                    left_deps[s as usize] -= 1;
                    if left_deps[s as usize] == 0 {
                        instant.push(s);
                    }
                }
            }
            if instant.is_empty() {
                break;
            }
            while let Some(i) = instant.pop() {
                let t = &g.tasks[i as usize];
                if t.unit == Unit::Free {
                    completed.push((i, None, None));
                    continue;
                }
                let q = match (t.unit, held[i as usize]) {
                    (Unit::Npu(c), _) => &mut ready.npu[c as usize % n_npu],
                    (Unit::AnyNpu, _) => &mut ready.any_npu,
                    // A task continuing on its chain's thread starts there at once.
                    (_, Some(c)) => {
                        started[i as usize] = true;
                        // The flush of a dropped inflate is dropped with it.
                        let with_it = t.thread_of.is_some_and(|th| dropped[th as usize]);
                        dropped[i as usize] = with_it;
                        running.push(start(g, i, Some(c), None, n_big, p, &mut resident, with_it));
                        peak = peak.max(resident);
                        continue;
                    }
                    (Unit::Big, None) => &mut ready.big,
                    (Unit::Little, None) if taken_over[i as usize] => &mut ready.big,
                    (Unit::Little, None) => &mut ready.little,
                    _ => &mut ready.any_cpu,
                };
                q.push(Reverse(i));
                queued[i as usize] = true;
            }
        }
        // Free cores take the earliest ready task they may run (a withdrawn prefetch sits in
        // two queues until one of them starts it; only a big core may).
        let mut deferred = Vec::new();
        for (c, free) in cpu_free.iter_mut().enumerate().filter(|(_, f)| **f) {
            let mut helps = c < n_big && helping > 0;
            loop {
                let own = if c < n_big {
                    &mut ready.big
                } else {
                    &mut ready.little
                };
                let i = match pop_first(own, &mut ready.any_cpu) {
                    Some(i) => i,
                    // Nothing of its own: a waiting thread of a dense call takes a prefetch.
                    None if helps => {
                        helps = false;
                        match pop_unstarted(&mut ready.little, &started) {
                            Some(i) => i,
                            None => break,
                        }
                    }
                    None => break,
                };
                let k = i as usize;
                if started[k] || (c >= n_big && taken_over[k]) {
                    continue;
                }
                if active > 0 && c >= n_big && g.tasks[k].withdrawn_by.is_some() {
                    // The prefetcher pauses while a call runs: back in its queue for later.
                    deferred.push(i);
                    continue;
                }
                started[k] = true;
                *free = false;
                dropped[k] = taken_over[k] && g.tasks[k].withdrawn_by.is_some_and(|w| w.unused);
                running.push(start(
                    g,
                    i,
                    Some(c),
                    None,
                    n_big,
                    p,
                    &mut resident,
                    dropped[k],
                ));
                peak = peak.max(resident);
                break;
            }
        }
        for i in deferred {
            ready.little.push(Reverse(i));
        }
        for (c, free) in npu_free.iter_mut().enumerate().filter(|(_, f)| **f) {
            if let Some(i) = pop_first(&mut ready.npu[c], &mut ready.any_npu) {
                started[i as usize] = true;
                *free = false;
                let blocked = held[i as usize];
                running.push(start(
                    g,
                    i,
                    blocked,
                    Some(c),
                    n_big,
                    p,
                    &mut resident,
                    false,
                ));
                peak = peak.max(resident);
            }
        }
        if running.is_empty() {
            break;
        }
        share_dram(&mut running, cap);
        let (k, dt) = running
            .iter()
            .enumerate()
            .map(|(k, r)| (k, r.left / r.rate))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .expect("running is not empty");
        now += dt;
        for r in running.iter_mut() {
            r.left -= r.rate * dt;
        }
        running[k].left = 0.0;
        running.retain(|r| {
            if r.left <= 1e-12 {
                completed.push((r.task, r.cpu, r.npu));
                false
            } else {
                true
            }
        });
    }
    if done != n {
        return Err(format!(
            "the schedule stalled with {} of {n} tasks left (a chain holds every core)",
            n - done
        ));
    }
    Ok(Simulated {
        makespan: now,
        end,
        peak_resident: peak,
    })
}

/// A finished task's CPU thread goes on to the task continuing its chain, or is free again.
fn release_chain(
    i: u32,
    cpu: Option<usize>,
    chain_next: &[Option<u32>],
    held: &mut [Option<usize>],
    cpu_free: &mut [bool],
) {
    let Some(c) = cpu.or(held[i as usize]) else {
        return;
    };
    match chain_next[i as usize] {
        Some(next) => held[next as usize] = Some(c),
        None => cpu_free[c] = true,
    }
}

/// Calls whose start is `i` take over their prefetched inflates not started yet: ggml's threads
/// (the big cores) run them from now on.
fn take_over(
    i: u32,
    withdraws: &[Vec<u32>],
    started: &[bool],
    queued: &[bool],
    taken_over: &mut [bool],
    ready: &mut Ready,
) {
    for &w in &withdraws[i as usize] {
        let k = w as usize;
        if !started[k] {
            taken_over[k] = true;
            if queued[k] {
                ready.big.push(Reverse(w));
            }
        }
    }
}

/// A task starting now; `dropped`: withdrawn work nobody needs, done at no cost.
#[allow(clippy::too_many_arguments)]
fn start(
    g: &Graph,
    i: u32,
    cpu: Option<usize>,
    npu: Option<usize>,
    n_big: usize,
    p: &Params,
    resident: &mut u64,
    dropped: bool,
) -> Running {
    let t = &g.tasks[i as usize];
    let core = match (npu, cpu) {
        (Some(_), _) => Core::Npu,
        (None, Some(c)) if c >= n_big => Core::Little,
        _ => Core::Big,
    };
    let (solo, bytes) = if dropped {
        (0.0, 0)
    } else {
        price(&t.work, core, p)
    };
    *resident += t.alloc;
    // A zero-time task still passes through an event, at no time.
    let solo = solo.max(1e-9);
    Running {
        task: i,
        left: 1.0,
        solo,
        demand: bytes as f64 / solo,
        rate: 1.0 / solo,
        cpu,
        npu,
    }
}

/// Max-min fair shares of `cap` bytes/µs: no task gets more than it wants, none less than an
/// equal share of what the smaller ones leave.
fn share_dram(running: &mut [Running], cap: f64) {
    let mut order: Vec<usize> = (0..running.len()).collect();
    order.sort_by(|&a, &b| running[a].demand.total_cmp(&running[b].demand));
    let mut left = cap;
    let mut wanting = order.iter().filter(|&&k| running[k].demand > 0.0).count();
    for k in order {
        let r = &mut running[k];
        if r.demand <= 0.0 {
            r.rate = 1.0 / r.solo;
            continue;
        }
        let got = r.demand.min(left / wanting as f64);
        left -= got;
        wanting -= 1;
        r.rate = got / r.demand / r.solo;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::graph::{Graph, Unit, Withdraw, Work};

    fn params() -> Params {
        Params {
            big_cores: 2.0,
            little_cores: 0.0,
            shared_dram_gbps: 10.0,
            memcpy_gbps_big_core: 1e6,
            ..Params::default()
        }
    }

    fn dense(g: &mut Graph, us: f64, bytes: u64, deps: &[u32]) -> u32 {
        g.push(Work::Dense { us, bytes }, Unit::Big, deps, 0)
    }

    #[test]
    fn independent_tasks_share_the_cores() {
        let p = params();
        let mut g = Graph::default();
        for _ in 0..4 {
            dense(&mut g, 100.0, 0, &[]);
        }
        let t = timeline(&g, &p).unwrap();
        assert!((t.serial_us - 400.0).abs() < 1e-6);
        assert!((t.scheduled_us - 200.0).abs() < 1e-6);
        assert!((t.bound.cpu_us - 200.0).abs() < 1e-6);
    }

    #[test]
    fn work_only_the_little_cores_may_do_is_bounded_by_them() {
        // Two A76s idle, two A55s at half speed with 4 x 100 µs (A76 time) of their own work:
        // 400 µs on the A55s, not the 133 µs of all four cores together.
        let p = Params {
            little_cores: 2.0,
            little_core_factor: 0.5,
            memcpy_gbps_little_core: 1e6,
            ..params()
        };
        let mut g = Graph::default();
        for _ in 0..4 {
            g.push(
                Work::Dense {
                    us: 100.0,
                    bytes: 0,
                },
                Unit::Little,
                &[],
                0,
            );
        }
        let t = timeline(&g, &p).unwrap();
        assert!((t.scheduled_us - 400.0).abs() < 1e-6, "{}", t.scheduled_us);
        assert!((t.bound.cpu_us - 400.0).abs() < 1e-6, "{}", t.bound.cpu_us);
    }

    #[test]
    fn a_call_takes_over_its_prefetch_and_pauses_the_others() {
        // 2 A76s, 2 A55s at half speed. A call starts (`begin`, 10 µs) and runs 500 µs; each
        // prefetch waits for some 150 µs of A55 work (300 µs there) first.
        let p = Params {
            little_cores: 2.0,
            little_core_factor: 0.5,
            memcpy_gbps_little_core: 1e6,
            ..params()
        };
        let little = |g: &mut Graph, us: f64, deps: &[u32]| {
            g.push(Work::Dense { us, bytes: 0 }, Unit::Little, deps, 0)
        };
        let case = |unused: bool| {
            let mut g = Graph::default();
            let begin = dense(&mut g, 10.0, 0, &[]);
            let body = dense(&mut g, 500.0, 0, &[begin]);
            let end = g.join(&[body], 0);
            let later = dense(&mut g, 1.0, 0, &[end]);
            let (x, y) = (little(&mut g, 150.0, &[]), little(&mut g, 150.0, &[]));
            // Its own call's: not started when the call starts, so the A76s take it (or drop it).
            let own = little(&mut g, 100.0, &[x]);
            g.tasks[own as usize].withdrawn_by = Some(Withdraw { by: begin, unused });
            // A later call's: ready during this call, it waits for the call's end.
            let next = little(&mut g, 100.0, &[y]);
            g.tasks[next as usize].withdrawn_by = Some(Withdraw {
                by: later,
                unused: false,
            });
            g.calls.push((begin, end));
            let s = simulate(&g, &p).unwrap();
            (s.end[own as usize], s.end[next as usize])
        };
        let (own, next) = case(false);
        assert!(
            (own - 400.0).abs() < 1e-6,
            "taken over: 300 + 100 on an A76, not {own}"
        );
        assert!(
            (next - 710.0).abs() < 1e-6,
            "paused until 510, then 200 on an A55, not {next}"
        );
        let (own, _) = case(true);
        assert!(
            (own - 300.0).abs() < 1e-6,
            "an unused expert withdrawn costs nothing: {own}"
        );
    }

    #[test]
    fn a_waiting_dense_call_takes_a_prefetch_on_an_idle_big_core() {
        // 2 A76s, 2 A55s at half speed. A dense call starts (`begin`, 10 µs) and keeps one A76
        // for 500 µs; three prefetches of 150 µs of A76 work (300 µs on an A55) are queued.
        let p = Params {
            little_cores: 2.0,
            little_core_factor: 0.5,
            memcpy_gbps_little_core: 1e6,
            ..params()
        };
        let case = |helps: bool| {
            let mut g = Graph::default();
            let begin = dense(&mut g, 10.0, 0, &[]);
            let body = dense(&mut g, 500.0, 0, &[begin]);
            let end = g.join(&[body], 0);
            let work = Work::Dense {
                us: 150.0,
                bytes: 0,
            };
            let prefetches: Vec<u32> = (0..3).map(|_| g.push(work, Unit::Little, &[], 0)).collect();
            if helps {
                g.helping.push((begin, end));
            }
            let s = simulate(&g, &p).unwrap();
            s.end[prefetches[2] as usize]
        };
        let third = case(true);
        assert!(
            (third - 160.0).abs() < 1e-6,
            "on the idle A76 from 10 µs: {third}"
        );
        let third = case(false);
        assert!(
            (third - 600.0).abs() < 1e-6,
            "after the first two on an A55: {third}"
        );
    }

    #[test]
    fn dependencies_serialize() {
        let p = params();
        let mut g = Graph::default();
        let a = dense(&mut g, 100.0, 0, &[]);
        let b = dense(&mut g, 50.0, 0, &[a]);
        dense(&mut g, 25.0, 0, &[b]);
        let t = timeline(&g, &p).unwrap();
        assert!((t.scheduled_us - 175.0).abs() < 1e-6);
        assert!((t.bound.critical_path_us - 175.0).abs() < 1e-6);
        assert!((t.bound.cpu_us - 87.5).abs() < 1e-6);
    }

    #[test]
    fn dram_is_shared_among_running_tasks() {
        // Two tasks each wanting 10 GB/s for 100 µs on a 10 GB/s budget: both take 200 µs.
        let p = params();
        let mut g = Graph::default();
        dense(&mut g, 100.0, 1_000_000, &[]);
        dense(&mut g, 100.0, 1_000_000, &[]);
        let t = timeline(&g, &p).unwrap();
        assert!((t.scheduled_us - 200.0).abs() < 1e-6, "{}", t.scheduled_us);
        assert!((t.bound.dram_us - 200.0).abs() < 1e-6);
        // A light task keeps its own speed next to a heavy one: max-min fairness.
        let mut g = Graph::default();
        dense(&mut g, 100.0, 200_000, &[]);
        dense(&mut g, 100.0, 2_000_000, &[]);
        let t = timeline(&g, &p).unwrap();
        // Light: 2 GB/s, granted; heavy gets 8 of its 20 GB/s until the light ends at 100 µs,
        // then 10: 0.4 of its work done at 100 µs, the rest (1.2 MB) at 10 GB/s, 120 µs.
        assert!((t.scheduled_us - 220.0).abs() < 1e-6, "{}", t.scheduled_us);
    }

    #[test]
    fn a_chain_keeps_its_thread_through_a_blocking_run() {
        // Two cores; chain A: cpu 100 -> npu run (blocks the thread) -> cpu 100. A second
        // independent CPU task of 300 µs. While A blocks, only one core is left for it.
        let p = params();
        let mut g = Graph::default();
        let a0 = dense(&mut g, 100.0, 0, &[]);
        let run = Work::Run {
            primitive: ork_moe::npu::Primitive::RunI8,
            m: 32,
            k: 2048,
            n: 768,
        };
        let r = g.push_on(run, Unit::Npu(0), a0, &[], 0);
        g.push_on(
            Work::Dense {
                us: 100.0,
                bytes: 0,
            },
            Unit::Big,
            r,
            &[],
            0,
        );
        let other = dense(&mut g, 300.0, 0, &[]);
        let (run_us, _) = price(&run, Core::Npu, &p);
        let t = timeline(&g, &p).unwrap();
        assert!(t.scheduled_us >= 200.0 + run_us - 1e-6);
        // The other task ran alone on the second core from 0 to 300 µs.
        let s = simulate(&g, &p).unwrap();
        assert!((s.end[other as usize] - 300.0).abs() < 1e-6);
        assert_eq!(t.runs, 1);
    }

    #[test]
    fn little_cores_are_slower_and_take_any_cpu_work() {
        let p = Params {
            big_cores: 1.0,
            little_cores: 1.0,
            little_core_factor: 0.5,
            ..params()
        };
        let mut g = Graph::default();
        g.push(Work::Lookup, Unit::AnyCpu, &[], 0);
        g.push(Work::Lookup, Unit::AnyCpu, &[], 0);
        let t = timeline(&g, &p).unwrap();
        // One lookup on the A76 (4 µs), one on the A55 (8 µs).
        assert!((t.scheduled_us - 2.0 * p.lookup_us).abs() < 1e-6);
    }
}
