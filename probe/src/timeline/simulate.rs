//! The list scheduler: whenever a core is free it takes the earliest ready task it may run (a
//! task continuing a thread's chain starts on that thread at once); time advances to the next
//! task end, the DRAM shares recomputed at every event.
//!
//! Two rules model the engine's prefetcher: a call withdraws its prefetched inflates that have
//! not started when it starts (ggml's threads, the big cores, run them; an expert the call does
//! not use is dropped), and while a call runs the little cores start no prefetch; meanwhile the
//! waiting threads of a dense call take prefetches on the big cores.

use super::params::Params;
use super::price::{price, Core};
use super::work::{Graph, Unit};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// What the schedule gives: its end, each task's end, and the peak of device bytes resident.
pub struct Simulated {
    pub makespan: f64,
    pub end: Vec<f64>,
    pub peak_resident: u64,
}

/// Schedules `g` on the cores of `p`.
pub fn simulate(g: &Graph, p: &Params) -> Result<Simulated, String> {
    let mut s = Scheduler::new(g, p)?;
    loop {
        s.settle();
        s.start_on_cpus();
        s.start_on_npus();
        if s.running.is_empty() {
            break;
        }
        s.advance();
    }
    let n = g.tasks.len();
    if s.done != n {
        return Err(format!(
            "the schedule stalled with {} of {n} tasks left (a chain holds every core)",
            n - s.done
        ));
    }
    Ok(Simulated {
        makespan: s.now,
        end: s.end,
        peak_resident: s.peak,
    })
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

type Queue = BinaryHeap<Reverse<u32>>;

/// Ready queues: per CPU kind, any CPU, per NPU core, any NPU; min task id first.
struct Ready {
    big: Queue,
    little: Queue,
    any_cpu: Queue,
    npu: Vec<Queue>,
    any_npu: Queue,
}

/// The earliest task of `q` not started yet (others are dropped: they started elsewhere).
fn pop_unstarted(q: &mut Queue, started: &[bool]) -> Option<u32> {
    while let Some(Reverse(i)) = q.pop() {
        if !started[i as usize] {
            return Some(i);
        }
    }
    None
}

/// The earlier of the first tasks of `a` and `b`, `a`'s on a tie.
fn pop_first(a: &mut Queue, b: &mut Queue) -> Option<u32> {
    match (a.peek(), b.peek()) {
        (Some(x), Some(y)) if x.0 <= y.0 => a.pop().map(|r| r.0),
        (Some(_), None) => a.pop().map(|r| r.0),
        (_, Some(_)) => b.pop().map(|r| r.0),
        (None, None) => None,
    }
}

/// Spans between pairs of tasks (a call's start and end): how many are open.
struct Spans {
    begins: Vec<bool>,
    ends: Vec<bool>,
    open: usize,
}

impl Spans {
    fn new(n: usize, pairs: &[(u32, u32)]) -> Spans {
        let (mut begins, mut ends) = (vec![false; n], vec![false; n]);
        for &(b, e) in pairs {
            begins[b as usize] = true;
            ends[e as usize] = true;
        }
        Spans {
            begins,
            ends,
            open: 0,
        }
    }

    /// Task `i` ended.
    fn pass(&mut self, i: usize) {
        self.open += self.begins[i] as usize;
        self.open -= self.ends[i] as usize;
    }
}

struct Scheduler<'a> {
    g: &'a Graph,
    p: &'a Params,
    /// CPU cores `0..n_big` are big, the rest little.
    n_big: usize,
    succ: Vec<Vec<u32>>,
    left_deps: Vec<usize>,
    /// The task continuing each task's CPU thread.
    chain_next: Vec<Option<u32>>,
    /// The prefetched inflates each task (a call's start) withdraws.
    withdraws: Vec<Vec<u32>>,
    /// Calls running now: the prefetcher pauses.
    calls: Spans,
    /// Dense calls whose threads help the prefetcher while they wait.
    helping: Spans,
    started: Vec<bool>,
    queued: Vec<bool>,
    /// Withdrawn by its call before it started: the big cores run it.
    taken_over: Vec<bool>,
    /// Withdrawn work nobody needs, done at no cost.
    dropped: Vec<bool>,
    /// The CPU core a task's chain holds for it.
    held: Vec<Option<usize>>,
    cpu_free: Vec<bool>,
    npu_free: Vec<bool>,
    ready: Ready,
    running: Vec<Running>,
    /// Ready now, to be queued or started.
    instant: Vec<u32>,
    /// Finished now (the CPU and NPU core each ran on), zero-time joins included.
    completed: Vec<(u32, Option<usize>, Option<usize>)>,
    end: Vec<f64>,
    now: f64,
    resident: u64,
    peak: u64,
    done: usize,
}

impl<'a> Scheduler<'a> {
    fn new(g: &'a Graph, p: &'a Params) -> Result<Scheduler<'a>, String> {
        let n = g.tasks.len();
        let n_big = p.big_cores as usize;
        let n_npu = p.cores as usize;
        let mut succ: Vec<Vec<u32>> = vec![Vec::new(); n];
        let mut left_deps: Vec<usize> = vec![0; n];
        let mut chain_next: Vec<Option<u32>> = vec![None; n];
        let mut withdraws: Vec<Vec<u32>> = vec![Vec::new(); n];
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
            if let Some(w) = t.withdrawn_by {
                withdraws[w.by as usize].push(i as u32);
            }
        }
        let instant = (0..n as u32)
            .filter(|&i| left_deps[i as usize] == 0)
            .collect();
        Ok(Scheduler {
            g,
            p,
            n_big,
            succ,
            left_deps,
            chain_next,
            withdraws,
            calls: Spans::new(n, &g.calls),
            helping: Spans::new(n, &g.helping),
            started: vec![false; n],
            queued: vec![false; n],
            taken_over: vec![false; n],
            dropped: vec![false; n],
            held: vec![None; n],
            cpu_free: vec![true; n_big + p.little_cores as usize],
            npu_free: vec![true; n_npu],
            ready: Ready {
                big: Queue::new(),
                little: Queue::new(),
                any_cpu: Queue::new(),
                npu: (0..n_npu).map(|_| Queue::new()).collect(),
                any_npu: Queue::new(),
            },
            running: Vec::new(),
            instant,
            completed: Vec::new(),
            end: vec![0.0; n],
            now: 0.0,
            resident: 0,
            peak: 0,
            done: 0,
        })
    }

    /// Completes what finished and queues (or starts) what became ready, until nothing more
    /// changes at this time.
    fn settle(&mut self) {
        loop {
            for (i, cpu, npu) in std::mem::take(&mut self.completed) {
                self.complete(i, cpu, npu);
            }
            if self.instant.is_empty() {
                break;
            }
            while let Some(i) = self.instant.pop() {
                self.enqueue(i);
            }
        }
    }

    /// Task `i` ended now on `cpu` and `npu`.
    fn complete(&mut self, i: u32, cpu: Option<usize>, npu: Option<usize>) {
        let k = i as usize;
        self.end[k] = self.now;
        self.done += 1;
        self.resident = self.resident.saturating_sub(self.g.tasks[k].free);
        if let Some(c) = npu {
            self.npu_free[c] = true;
        }
        self.release_chain(i, cpu);
        self.take_over(i);
        self.calls.pass(k);
        self.helping.pass(k);
        for &s in &self.succ[k] {
            self.left_deps[s as usize] -= 1;
            if self.left_deps[s as usize] == 0 {
                self.instant.push(s);
            }
        }
    }

    /// A finished task's CPU thread goes on to the task continuing its chain, or is free again.
    fn release_chain(&mut self, i: u32, cpu: Option<usize>) {
        let Some(c) = cpu.or(self.held[i as usize]) else {
            return;
        };
        match self.chain_next[i as usize] {
            Some(next) => self.held[next as usize] = Some(c),
            None => self.cpu_free[c] = true,
        }
    }

    /// Calls whose start is `i` take over their prefetched inflates not started yet: ggml's
    /// threads (the big cores) run them from now on.
    fn take_over(&mut self, i: u32) {
        for &w in &self.withdraws[i as usize] {
            let k = w as usize;
            if !self.started[k] {
                self.taken_over[k] = true;
                if self.queued[k] {
                    self.ready.big.push(Reverse(w));
                }
            }
        }
    }

    /// A task whose dependencies are done: a join completes, a task continuing its chain starts
    /// on that thread, any other waits in the queue of the cores that may run it.
    fn enqueue(&mut self, i: u32) {
        let k = i as usize;
        let g = self.g;
        let t = &g.tasks[k];
        if t.unit == Unit::Free {
            self.completed.push((i, None, None));
            return;
        }
        let n_npu = self.npu_free.len();
        let q = match (t.unit, self.held[k]) {
            (Unit::Npu(c), _) => &mut self.ready.npu[c as usize % n_npu],
            (Unit::AnyNpu, _) => &mut self.ready.any_npu,
            (_, Some(c)) => {
                self.started[k] = true;
                // The flush of a dropped inflate is dropped with it.
                let with_it = t.thread_of.is_some_and(|th| self.dropped[th as usize]);
                self.dropped[k] = with_it;
                self.start(i, Some(c), None, with_it);
                return;
            }
            (Unit::Big, None) => &mut self.ready.big,
            (Unit::Little, None) if self.taken_over[k] => &mut self.ready.big,
            (Unit::Little, None) => &mut self.ready.little,
            _ => &mut self.ready.any_cpu,
        };
        q.push(Reverse(i));
        self.queued[k] = true;
    }

    /// Each free CPU core takes the earliest ready task it may run.
    fn start_on_cpus(&mut self) {
        let mut deferred = Vec::new();
        for c in 0..self.cpu_free.len() {
            if !self.cpu_free[c] {
                continue;
            }
            if let Some(i) = self.next_for_cpu(c, &mut deferred) {
                let k = i as usize;
                self.started[k] = true;
                self.cpu_free[c] = false;
                let withdrawn = self.g.tasks[k].withdrawn_by;
                self.dropped[k] = self.taken_over[k] && withdrawn.is_some_and(|w| w.unused);
                self.start(i, Some(c), None, self.dropped[k]);
            }
        }
        for i in deferred {
            self.ready.little.push(Reverse(i));
        }
    }

    /// The task CPU core `c` starts next, if any: its own kind's or any core's, earliest first; on
    /// an idle big core of a dense call that helps, a prefetch. A withdrawn prefetch sits in two
    /// queues until one of them starts it, and only a big core may then; a little core meeting a
    /// prefetch while a call runs puts it in `deferred`, back in its queue for later.
    fn next_for_cpu(&mut self, c: usize, deferred: &mut Vec<u32>) -> Option<u32> {
        let big = c < self.n_big;
        let mut helps = big && self.helping.open > 0;
        loop {
            let own = if big {
                &mut self.ready.big
            } else {
                &mut self.ready.little
            };
            let i = match pop_first(own, &mut self.ready.any_cpu) {
                Some(i) => i,
                None if helps => {
                    helps = false;
                    pop_unstarted(&mut self.ready.little, &self.started)?
                }
                None => return None,
            };
            let k = i as usize;
            if self.started[k] || (!big && self.taken_over[k]) {
                continue;
            }
            if self.calls.open > 0 && !big && self.g.tasks[k].withdrawn_by.is_some() {
                deferred.push(i);
                continue;
            }
            return Some(i);
        }
    }

    /// Each free NPU core takes the earliest ready run for it or for any core.
    fn start_on_npus(&mut self) {
        for c in 0..self.npu_free.len() {
            if !self.npu_free[c] {
                continue;
            }
            if let Some(i) = pop_first(&mut self.ready.npu[c], &mut self.ready.any_npu) {
                self.started[i as usize] = true;
                self.npu_free[c] = false;
                let blocked = self.held[i as usize];
                self.start(i, blocked, Some(c), false);
            }
        }
    }

    /// Starts task `i` now on `cpu` (where it runs, or the thread it blocks) and `npu`.
    fn start(&mut self, i: u32, cpu: Option<usize>, npu: Option<usize>, dropped: bool) {
        let g = self.g;
        let t = &g.tasks[i as usize];
        let core = match (npu, cpu) {
            (Some(_), _) => Core::Npu,
            (None, Some(c)) if c >= self.n_big => Core::Little,
            _ => Core::Big,
        };
        let (solo, bytes) = if dropped {
            (0.0, 0)
        } else {
            price(&t.work, core, self.p)
        };
        self.resident += t.alloc;
        self.peak = self.peak.max(self.resident);
        // A zero-time task still passes through an event, at no time.
        let solo = solo.max(1e-9);
        self.running.push(Running {
            task: i,
            left: 1.0,
            solo,
            demand: bytes as f64 / solo,
            rate: 1.0 / solo,
            cpu,
            npu,
        });
    }

    /// Advances time to the next task end at the current DRAM shares.
    fn advance(&mut self) {
        share_dram(&mut self.running, self.p.shared_dram_gbps * 1e3);
        let (k, dt) = self
            .running
            .iter()
            .enumerate()
            .map(|(k, r)| (k, r.left / r.rate))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .expect("running is not empty");
        self.now += dt;
        for r in self.running.iter_mut() {
            r.left -= r.rate * dt;
        }
        self.running[k].left = 0.0;
        let completed = &mut self.completed;
        self.running.retain(|r| {
            if r.left <= 1e-12 {
                completed.push((r.task, r.cpu, r.npu));
                false
            } else {
                true
            }
        });
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
