//! A submit planned as data, as the board's driver plans it: the hardware tasks (N-tile range,
//! row range, core), what each costs, and the modelled time and counts of the whole.

use super::cost::{CostModel, SubmitParts, TaskCost};
use super::{CBUF_ELEMS, TASK_MAX_N};
use crate::layout::Tiles;
use crate::npu::exec::{split_channels, tasks_for, Task};
use crate::npu::kinds::Primitive;
use crate::npu::submit::Report;
use std::collections::HashSet;

/// The tasks of a submit: `run_i8` over the core count the cost model likes best, stream
/// with each GEMM over all enabled cores, chain on its one core.
pub(super) fn tasks(
    cost: &CostModel,
    tiles: &Tiles,
    primitive: Primitive,
    shapes: &[(usize, usize, usize)],
    cores: &[usize],
) -> Vec<Task> {
    let plan_over = |cores: &[usize]| -> Vec<Task> {
        let mut tasks = Vec::new();
        for (g, &(m, k, n)) in shapes.iter().enumerate() {
            let m_max = (CBUF_ELEMS / k).max(1);
            for (core, n0, n1) in split_channels(tiles, 0, n, cores) {
                tasks.extend(tasks_for(g, core, m, (n0, n1), TASK_MAX_N, m_max));
            }
        }
        tasks
    };
    match primitive {
        Primitive::ChainI8 => plan_over(&cores[..1]),
        Primitive::StreamI8 => plan_over(cores),
        // The auto-tuner: fewer cores save per-task costs on small GEMMs.
        Primitive::RunI8 => (1..=cores.len())
            .map(|c| plan_over(&cores[..c]))
            .min_by(|a, b| {
                let t = |p: &Vec<Task>| cost.submit_us(&cost_input(shapes, p));
                t(a).total_cmp(&t(b))
            })
            .unwrap_or_default(),
    }
}

/// What each task costs: its MACs, and the bytes it moves: its A rows and C block, plus the
/// B slice for the first task of each N-range only (the weights of a slice are assumed to stay
/// in the convolution buffer across its row tasks; re-reading them per row task would put
/// large GEMMs far below the 0.4 TOPS seen in practice).
fn cost_input(shapes: &[(usize, usize, usize)], tasks: &[Task]) -> Vec<TaskCost> {
    let mut weights_loaded = HashSet::new();
    tasks
        .iter()
        .map(|t| {
            let k = shapes[t.gemm].1 as u64;
            let (rows, ch) = (t.rows() as u64, t.channels() as u64);
            let b = if weights_loaded.insert((t.gemm, t.n0, t.n1)) {
                ch * k
            } else {
                0
            };
            TaskCost {
                core: t.core,
                macs: rows * ch * k,
                bytes: rows * k + b + rows * ch * 4,
            }
        })
        .collect()
}

/// The report of a submit of `tasks` over GEMMs of `shapes`: tasks per core, bytes, MACs and the
/// modelled time.
pub(super) fn report(cost: &CostModel, shapes: &[(usize, usize, usize)], tasks: &[Task]) -> Report {
    let costs = cost_input(shapes, tasks);
    let mut report = Report {
        modelled_us: Some(cost.submit_us(&costs)),
        ..Report::default()
    };
    for t in &costs {
        report.tasks_per_core[t.core] += 1;
        report.bytes += t.bytes;
        report.macs += t.macs;
    }
    report
}

/// The parts of the modelled time of one submit of `primitive` over GEMMs of `shapes` (M, padded
/// K, padded N) on `cores`, planned exactly as the emulator plans the submit it executes. The
/// board timeline model prices NPU runs with it.
pub fn modelled_submit(
    cost: &CostModel,
    primitive: Primitive,
    shapes: &[(usize, usize, usize)],
    cores: &[usize],
) -> SubmitParts {
    let tasks = tasks(cost, &Tiles::RK3588, primitive, shapes, cores);
    cost.parts(&cost_input(shapes, &tasks))
}
