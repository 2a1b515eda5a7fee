//! The classes calls are grouped in: calls whose times per row compare.

use crate::moe::desc::weight_code;
use crate::moe::Plan;
use std::fmt;

/// What kind of call a class holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Routed,
    Pair,
    Dense,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Routed, Kind::Pair, Kind::Dense];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Routed => "routed",
            Kind::Pair => "pair",
            Kind::Dense => "dense",
        }
    }
}

/// Calls whose times per row compare: one kind, weight type and layout, shape, and rows per
/// expert within a factor of two.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
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
            "{} type {} K={} N={} rows/expert {}..{}",
            self.kind.name(),
            self.weight,
            self.k,
            self.n,
            self.rows_bucket,
            2 * self.rows_bucket - 1
        )
    }
}
