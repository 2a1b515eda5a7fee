//! The A3B expert shapes, and the timing and output helpers the measuring subcommands share.

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

/// Formats one JSON value for the `--json` outputs (no external JSON crate needed for flat rows).
pub enum Json<'a> {
    Str(&'a str),
    Num(f64),
    /// A number printed in scientific notation (small errors).
    Sci(f64),
    Int(i64),
    Bool(bool),
}

/// Prints `rows` (each a list of `(field, value)`) as one JSON array of objects.
pub fn print_json(rows: &[Vec<(&str, Json)>]) {
    let mut out = String::from("[");
    for (i, row) in rows.iter().enumerate() {
        out.push_str(if i == 0 { "\n  {" } else { ",\n  {" });
        for (j, (k, v)) in row.iter().enumerate() {
            if j > 0 {
                out.push_str(", ");
            }
            out.push_str(&format!("\"{k}\": "));
            match v {
                Json::Str(s) => out.push_str(&format!("{s:?}")),
                Json::Num(x) if x.is_finite() => out.push_str(&format!("{x:.4}")),
                Json::Sci(x) if x.is_finite() => out.push_str(&format!("{x:.4e}")),
                Json::Num(_) | Json::Sci(_) => out.push_str("null"),
                Json::Int(x) => out.push_str(&x.to_string()),
                Json::Bool(b) => out.push_str(&b.to_string()),
            }
        }
        out.push('}');
    }
    out.push_str("\n]");
    println!("{out}");
}
