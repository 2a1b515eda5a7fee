//! The range `ork-probe model` gives instead of a point: the prefill of the engine with its
//! prefetch threads (the library as deployed with `taskset -c 4-7`) under a low, a mid and a high
//! parameter set, and the mid case's sensitivity to each parameter taken alone. A parameter a
//! board profile measured or the command line set keeps its value in all three sets.

use super::modelled::Board;
use ork_probe::timeline::params::index;
use ork_probe::timeline::{CallWork, Origin, Params, Settings};

/// A parameter the range varies: its low (pessimistic), mid and high (optimistic) values.
pub struct Varied {
    pub name: &'static str,
    pub values: [f64; 3],
}

/// The parameter sets: shared DRAM from the RK1's 16 GB/s under concurrent load to STREAM copy's
/// 22–24; NPU throughput from below the fixed-cost-bound 0.4 to the 0.55–0.66 TOPS measured at
/// M=128; the A55 from in-order narrow NEON (0.25) to its memcpy ratio (0.4); the run floor from
/// ork-driver's 100 µs to the 30–37 µs of a bare `rknn_matmul_run`; the CPU leftover ±50 %.
pub const VARIED: [Varied; 5] = [
    Varied {
        name: "shared_dram_gbps",
        values: [16.0, 20.0, 24.0],
    },
    Varied {
        name: "core_tops",
        values: [0.33, 0.45, 0.65],
    },
    Varied {
        name: "little_core_factor",
        values: [0.25, 0.3, 0.4],
    },
    Varied {
        name: "run_us_floor",
        values: [100.0, 50.0, 30.0],
    },
    Varied {
        name: "leftover_cpu_factor",
        values: [1.5, 1.0, 0.67],
    },
];

pub const LOW: usize = 0;
pub const MID: usize = 1;
pub const HIGH: usize = 2;

/// The mid case with one parameter at another value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sensitivity {
    pub parameter: &'static str,
    pub value: f64,
    pub tokps: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Range {
    /// Prefill tok/s at the low, mid and high sets.
    pub tokps: [f64; 3],
    pub sensitivity: Vec<Sensitivity>,
}

impl Range {
    /// The parameter whose low value costs the mid case the most: what bounds the low end.
    pub fn bounded_by(&self) -> Option<&'static str> {
        VARIED
            .iter()
            .filter_map(|v| {
                let low = self
                    .sensitivity
                    .iter()
                    .find(|s| s.parameter == v.name && s.value == v.values[LOW])?;
                Some((v.name, self.tokps[MID] - low.tokps))
            })
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(name, _)| name)
    }
}

/// Whether the range varies `name`: not where a profile measured it or the command line set it.
pub fn varies(settings: &Settings, name: &str) -> bool {
    let i = index(name).expect("a parameter");
    matches!(
        settings.origins[i],
        Origin::Default | Origin::ProfileKept(_)
    )
}

/// The parameters of set `at` ([`LOW`], [`MID`], [`HIGH`]).
pub fn params_at(settings: &Settings, at: usize) -> Params {
    let mut p = settings.params.clone();
    for v in VARIED.iter().filter(|v| varies(settings, v.name)) {
        p.set(v.name, v.values[at]).expect("a usable value");
    }
    p
}

/// The range of one ubatch of `calls` (the first `run_layers` layers) of `board`'s case.
pub fn model(
    board: &Board,
    calls: &[CallWork],
    run_layers: usize,
    settings: &Settings,
) -> Result<Range, String> {
    let at = |p: &Params| board.prefill_tokps_under(calls, run_layers, p);
    let mut tokps = [0.0; 3];
    for (set, t) in tokps.iter_mut().enumerate() {
        *t = at(&params_at(settings, set))?;
    }
    let mid = params_at(settings, MID);
    let mut sensitivity = Vec::new();
    for v in VARIED.iter().filter(|v| varies(settings, v.name)) {
        for value in [v.values[LOW], v.values[HIGH]] {
            let mut p = mid.clone();
            p.set(v.name, value).expect("a usable value");
            sensitivity.push(Sensitivity {
                parameter: v.name,
                value,
                tokps: at(&p)?,
            });
        }
    }
    Ok(Range { tokps, sensitivity })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ork_moe::moe::Config;
    use ork_moe::quant::GgmlType;
    use ork_probe::timeline::{ExpertCall, ModelShape, Proj};

    /// Two layers of Qwen3-30B-A3B at 512 tokens, every expert used by 32 rows and missed, and
    /// the dense matmuls as one-expert calls.
    fn calls(shape: &ModelShape, tokens: usize) -> Vec<CallWork> {
        let mut calls = Vec::new();
        for layer in 0..2 {
            let call = |proj, k, n, act_rows: usize, experts: Vec<ExpertCall>| CallWork {
                layer,
                proj,
                k,
                n,
                ty: GgmlType::Q4_0,
                act_rows: act_rows as u64,
                n_expert: experts.len().max(shape.n_expert),
                experts,
            };
            for (proj, k, n) in shape.dense_matmuls() {
                let one = vec![ExpertCall {
                    rows: tokens as u32,
                    hit: false,
                }];
                calls.push(call(proj, k, n, tokens, one));
            }
            let rows = (tokens * shape.n_used / shape.n_expert) as u32;
            let experts = vec![ExpertCall { rows, hit: false }; shape.n_expert];
            let (h, f) = (shape.hidden, shape.expert_ff);
            calls.push(call(Proj::GateUp, h, 2 * f, tokens, experts.clone()));
            calls.push(call(Proj::Down, f, h, tokens * shape.n_used, experts));
        }
        calls
    }

    fn range_of(settings: &Settings) -> Range {
        let shape = ModelShape::QWEN3_30B_A3B;
        let cfg = Config::default();
        let board = Board::new(shape, 512, &settings.params, &cfg);
        model(&board, &calls(&shape, 512), 2, settings).unwrap()
    }

    #[test]
    fn the_range_is_ordered_and_each_parameter_moves_it_its_way() {
        let settings = Settings::default();
        let r = range_of(&settings);
        let [low, mid, high] = r.tokps;
        assert!(low < mid && mid < high, "{:?}", r.tokps);
        assert_eq!(r.sensitivity.len(), 2 * VARIED.len());
        for v in &VARIED {
            let at = |value: f64| {
                let s = r
                    .sensitivity
                    .iter()
                    .find(|s| s.parameter == v.name && s.value == value);
                s.expect("both ends").tokps
            };
            let (down, up) = (at(v.values[LOW]), at(v.values[HIGH]));
            // The pessimistic value never helps, the optimistic one never hurts.
            assert!(down <= mid * (1.0 + 1e-9), "{}: {down} vs {mid}", v.name);
            assert!(up >= mid * (1.0 - 1e-9), "{}: {up} vs {mid}", v.name);
            assert!(up > down, "{}: {down} .. {up}", v.name);
        }
        assert!(r.bounded_by().is_some());
    }

    #[test]
    fn a_parameter_set_on_the_command_line_is_not_varied() {
        let mut settings = Settings::default();
        settings.apply_override("shared_dram_gbps=18").unwrap();
        assert!(!varies(&settings, "shared_dram_gbps") && varies(&settings, "core_tops"));
        let fitted = Origin::ProfileFit {
            path: "b.json".into(),
            how: "a line".into(),
        };
        let mut measured = settings.clone();
        measured.origins[index("core_tops").unwrap()] = fitted;
        assert!(!varies(&measured, "core_tops"));
        for at in [LOW, MID, HIGH] {
            let p = params_at(&settings, at);
            assert_eq!(p.shared_dram_gbps, 18.0);
            assert_eq!(p.core_tops, VARIED[1].values[at]);
        }
    }
}
