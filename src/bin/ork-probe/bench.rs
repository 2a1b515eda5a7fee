//! Timing and output helpers shared by the probe's subcommands.

use std::time::Instant;

/// Options common to all subcommands.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Print one JSON array instead of a table.
    pub json: bool,
}

impl Options {
    pub fn parse(args: &[String]) -> Result<Options, String> {
        let mut o = Options::default();
        for a in args {
            match a.as_str() {
                "--json" => o.json = true,
                other => return Err(format!("unknown option {other:?}")),
            }
        }
        Ok(o)
    }
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
    let mut t: Vec<f64> = (0..repeats.max(1))
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    Timing {
        median: t[t.len() / 2],
        min: t[0],
        max: t[t.len() - 1],
    }
}

/// Formats one JSON value for the `--json` outputs (no external JSON crate needed for flat rows).
pub enum Json<'a> {
    Str(&'a str),
    Num(f64),
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
                Json::Num(_) => out.push_str("null"),
                Json::Int(x) => out.push_str(&x.to_string()),
                Json::Bool(b) => out.push_str(&b.to_string()),
            }
        }
        out.push('}');
    }
    out.push_str("\n]");
    println!("{out}");
}
