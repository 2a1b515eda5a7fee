//! An engine's classes of calls and their verdicts under `ORK_DISPATCH`, shared by its threads.

use super::{Choice, Class, Params, Path, Verdict};
use crate::moe::desc::weight_code;
use crate::moe::{Dispatch, Plan};
use crate::sync::lock;
use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

/// What kind of call a class holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Routed,
    Pair,
    Dense,
}

/// Calls whose times per row compare: one kind, weight type and layout, shape, and rows per
/// expert within a factor of two.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OpClass {
    pub kind: Kind,
    /// The weights' `ork_tensor.type` (type and layout).
    pub weight: i32,
    pub k: usize,
    pub n: usize,
    /// Rows per used expert, rounded down to a power of two.
    pub rows_bucket: usize,
}

impl OpClass {
    pub fn of(plan: &Plan) -> OpClass {
        let p = &plan.problem;
        let kind = match (&plan.pair, p.one_expert()) {
            (Some(_), _) => Kind::Pair,
            (None, true) => Kind::Dense,
            (None, false) => Kind::Routed,
        };
        let per_expert = p.rows_per_expert().max(1);
        OpClass {
            kind,
            weight: weight_code(p.wtype, p.layout),
            k: p.k,
            n: p.n,
            rows_bucket: 1 << per_expert.ilog2(),
        }
    }
}

impl fmt::Display for OpClass {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "{:?} type {} K={} N={} rows/expert {}..{}",
            self.kind,
            self.weight,
            self.k,
            self.n,
            self.rows_bucket,
            2 * self.rows_bucket - 1
        )
    }
}

/// The verdicts of one engine.
pub struct Table {
    mode: Dispatch,
    params: Params,
    classes: Mutex<HashMap<OpClass, Class>>,
}

impl Table {
    pub fn new(mode: Dispatch) -> Table {
        Table {
            mode,
            params: Params::DEFAULT,
            classes: Mutex::new(HashMap::new()),
        }
    }

    /// The path of the next call of `plan`.
    pub fn choose(&self, plan: &Plan) -> Choice {
        let path = match self.mode {
            Dispatch::Always => Path::Library,
            Dispatch::Never => Path::Ggml,
            Dispatch::Auto => {
                let class = OpClass::of(plan);
                let rows = plan.problem.rows();
                return lock(&self.classes)
                    .entry(class)
                    .or_default()
                    .choose(&self.params, rows);
            }
        };
        Choice {
            path,
            explore: false,
        }
    }

    /// A call of `plan` ran on `path` in `seconds` (under `auto` only; ignored otherwise).
    pub fn observe(&self, plan: &Plan, path: Path, seconds: f64) {
        if self.mode != Dispatch::Auto {
            return;
        }
        let class = OpClass::of(plan);
        let mut classes = lock(&self.classes);
        let c = classes.entry(class).or_default();
        let before = c.verdict();
        c.observe(&self.params, path, plan.problem.rows(), seconds);
        let after = c.verdict();
        if after.decided && (after.path != before.path || !before.decided) {
            log::info!("dispatch: {class}: {}", describe(&after));
        }
    }
}

/// A verdict with both times, µs per row.
fn describe(v: &Verdict) -> String {
    let us = |t: Option<f64>| t.map_or("-".to_owned(), |t| format!("{:.3}", t * 1e6));
    format!(
        "{} (library {} µs/row, ggml {} µs/row{})",
        v.path.name(),
        us(v.library),
        us(v.ggml),
        if v.decided { "" } else { ", undecided" }
    )
}
