//! Pricing and scheduling a work graph: the serial time (every task alone, one after another),
//! the as-scheduled time (a list scheduler over the graph's dependencies and the board's cores,
//! DRAM shared among the running tasks) and the resource lower bound.
//!
//! DRAM is one budget (`shared_dram_gbps`, bytes read + written) shared by processor sharing:
//! each running task wants `bytes / solo time` and the budget is split max-min fairly, so a task
//! that gets less than it wants progresses proportionally slower.

use super::params::Params;
use super::price::{core_of, price};
use super::simulate::{simulate, Simulated};
use super::work::{Graph, Stage, Task, Unit, Work};

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
    let layers = g.tasks.iter().map(|t| t.layer + 1).max().unwrap_or(0) as usize;
    let mut tl = Timeline::empty(layers);
    let mut work = Resources::new(p);
    let mut path = vec![0.0f64; g.tasks.len()];
    for (i, t) in g.tasks.iter().enumerate() {
        let (us, bytes) = price(&t.work, core_of(t.unit), p);
        tl.count(t, us, bytes);
        work.add(t, us, p);
        let start = t.deps.iter().map(|&d| path[d as usize]).fold(0.0, f64::max);
        path[i] = start + us;
    }
    let critical_path_us = path.iter().copied().fold(0.0, f64::max);
    tl.bound = work.bound(tl.dram_bytes, critical_path_us, p);
    tl.schedule(g, &simulate(g, p)?, layers);
    Ok(tl)
}

impl Timeline {
    fn empty(layers: usize) -> Timeline {
        let n_stages = Stage::REPORTED.len();
        Timeline {
            stage_us: vec![0.0; n_stages],
            stage_bytes: vec![0; n_stages],
            layer_stage_us: vec![vec![0.0; n_stages]; layers],
            ..Timeline::default()
        }
    }

    /// Adds task `t`, `us` alone and moving `bytes`, to the serial figures and the counts.
    fn count(&mut self, t: &Task, us: f64, bytes: u64) {
        self.serial_us += us;
        self.dram_bytes += bytes;
        if let Some(s) = stage_index(t.work.stage()) {
            self.layer_stage_us[t.layer as usize][s] += us;
            self.stage_us[s] += us;
            self.stage_bytes[s] += bytes;
        }
        match t.work {
            Work::Run { .. } => self.runs += 1,
            Work::ContextCreate => self.contexts_created += 1,
            Work::BufferCreate { .. } => self.buffers_created += 1,
            _ => {}
        }
    }

    /// The schedule's figures: its end, each layer's end, the peak resident bytes.
    fn schedule(&mut self, g: &Graph, s: &Simulated, layers: usize) {
        self.scheduled_us = s.makespan;
        self.layer_end_us = vec![0.0; layers];
        for (t, end) in g.tasks.iter().zip(&s.end) {
            let l = &mut self.layer_end_us[t.layer as usize];
            *l = l.max(*end);
        }
        self.peak_resident_bytes = s.peak_resident;
    }
}

/// Solo time of a graph's tasks by the cores that may run them (µs at a big core's speed).
struct Resources {
    big_only: f64,
    little_only: f64,
    any_cpu: f64,
    npu_any: f64,
    npu_pinned: Vec<f64>,
}

impl Resources {
    fn new(p: &Params) -> Resources {
        Resources {
            big_only: 0.0,
            little_only: 0.0,
            any_cpu: 0.0,
            npu_any: 0.0,
            npu_pinned: vec![0.0; p.cores as usize],
        }
    }

    fn add(&mut self, t: &Task, us: f64, p: &Params) {
        let n_npu = self.npu_pinned.len();
        match t.unit {
            // A prefetch its call may take over: any core's, at an A76's speed.
            Unit::Little if t.withdrawn_by.is_some() => self.any_cpu += us * p.little_core_factor,
            Unit::Big => self.big_only += us,
            Unit::AnyCpu => self.any_cpu += us,
            // A task only an A55 may run: on the A55s alone, and in the total at an A76's speed.
            Unit::Little => {
                self.little_only += us;
                self.any_cpu += us * p.little_core_factor;
            }
            Unit::Npu(c) => self.npu_pinned[c as usize % n_npu] += us,
            Unit::AnyNpu => self.npu_any += us,
            Unit::Free => {}
        }
    }

    /// The bound of this work and `dram_bytes`, beside the longest dependency chain.
    fn bound(&self, dram_bytes: u64, critical_path_us: f64, p: &Params) -> Bound {
        let (big, little) = (p.big_cores, p.little_cores);
        let npu_total: f64 = self.npu_pinned.iter().sum::<f64>() + self.npu_any;
        Bound {
            dram_us: dram_bytes as f64 / (p.shared_dram_gbps * 1e3),
            cpu_us: (self.big_only / big)
                .max(self.little_only / little)
                .max((self.big_only + self.any_cpu) / (big + little * p.little_core_factor)),
            npu_us: (npu_total / p.cores).max(self.npu_pinned.iter().copied().fold(0.0, f64::max)),
            critical_path_us,
        }
    }
}

#[cfg(test)]
mod tests;
