//! The A3B expert shapes, and the timing the measuring subcommands share.

use std::time::Instant;

/// (K, N, role) of the Qwen3 A3B expert GEMMs: gate/up and down of two model sizes.
pub const A3B_SHAPES: [(usize, usize, &str); 4] = [
    (2048, 768, "gate/up"),
    (768, 2048, "down"),
    (4096, 1408, "gate/up (wide)"),
    (1408, 4096, "down (wide)"),
];

/// The role of an A3B shape ("gate/up", "down", ...), or "custom".
pub fn role(k: usize, n: usize) -> &'static str {
    A3B_SHAPES
        .iter()
        .find(|s| (s.0, s.1) == (k, n))
        .map_or("custom", |s| s.2)
}

/// Median and spread of repeated timings, in seconds.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

/// Runs `f` `warmup` times untimed, then `repeats` times timed; returns the median and spread.
pub fn time<F: FnMut()>(warmup: usize, repeats: usize, mut f: F) -> Timing {
    for _ in 0..warmup {
        f();
    }
    let t: Vec<f64> = (0..repeats.max(1))
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .collect();
    Timing::of(t)
}

impl Timing {
    /// Median and spread of `seconds` (at least one).
    pub fn of(mut seconds: Vec<f64>) -> Timing {
        seconds.sort_by(f64::total_cmp);
        Timing {
            median: seconds[seconds.len() / 2],
            min: seconds[0],
            max: seconds[seconds.len() - 1],
        }
    }
}
