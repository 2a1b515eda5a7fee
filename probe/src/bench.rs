//! Timing and output helpers shared by the probe's subcommands.

use ork_moe::inflate::Layout;
use ork_moe::isa::Isa;
use ork_moe::npu::BackendChoice;
use ork_moe::quant::GgmlType;
use std::path::PathBuf;
use std::time::Instant;

/// (K, N, role) of the Qwen3 A3B expert GEMMs: gate/up and down of two model sizes.
pub const A3B_SHAPES: [(usize, usize, &str); 4] = [
    (2048, 768, "gate/up"),
    (768, 2048, "down"),
    (4096, 1408, "gate/up (wide)"),
    (1408, 4096, "down (wide)"),
];
/// Rows per expert swept by default, and with `--quick`.
const ROWS: [usize; 5] = [8, 16, 32, 64, 128];
const QUICK_ROWS: [usize; 3] = [8, 32, 128];

/// Options common to all subcommands; each uses those that apply to it.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Print one JSON array instead of a table.
    pub json: bool,
    /// Also draw the results into this SVG file.
    pub svg: Option<PathBuf>,
    /// Expert GEMM shapes as (K, N).
    pub shapes: Option<Vec<(usize, usize)>>,
    /// Rows per expert.
    pub m: Option<Vec<usize>>,
    pub types: Option<Vec<GgmlType>>,
    /// Threads of the CPU runs (overrides `ORK_THREADS`).
    pub threads: Option<usize>,
    /// Backend (overrides `ORK_BACKEND`).
    pub backend: Option<BackendChoice>,
    /// Kernel paths to measure (`peak`).
    pub paths: Option<Vec<Isa>>,
    /// Measurement rounds (`peak`).
    pub rounds: Option<usize>,
    /// Fewer sizes and repeats.
    pub quick: bool,
    /// (accuracy) folder of real-weights vectors.
    pub data: Option<PathBuf>,
    /// (board) the profile JSON to write.
    pub profile: Option<PathBuf>,
    /// `inflate`: only call the direct inflate this many times per shape and type, untimed (a
    /// workload for instruction counters: callgrind, qemu).
    pub calls: Option<usize>,
    /// (columns) weight layouts to measure.
    pub layouts: Option<Vec<Layout>>,
    /// (columns) weight columns decoded per expert.
    pub columns: Option<usize>,
}

impl Options {
    pub fn parse(args: &[String]) -> Result<Options, String> {
        let mut o = Options::default();
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) => (f, Some(v.to_string())),
                None => (arg.as_str(), None),
            };
            let mut value = || {
                inline
                    .clone()
                    .or_else(|| it.next().cloned())
                    .ok_or_else(|| format!("{flag} needs a value"))
            };
            match flag {
                "--json" => o.json = true,
                "--quick" => o.quick = true,
                "--svg" => o.svg = Some(PathBuf::from(value()?)),
                "--data" => o.data = Some(PathBuf::from(value()?)),
                "--profile" => o.profile = Some(PathBuf::from(value()?)),
                "--shapes" => o.shapes = Some(list(&value()?, parse_shape)?),
                "--m" => o.m = Some(list(&value()?, parse_count)?),
                "--types" => {
                    o.types = Some(list(&value()?, |t| {
                        GgmlType::from_name(t)
                            .filter(|t| GgmlType::QUANTIZED.contains(t))
                            .ok_or_else(|| format!("unknown weight type {t:?}"))
                    })?)
                }
                "--threads" => o.threads = Some(parse_count(&value()?)?),
                "--calls" => o.calls = Some(parse_count(&value()?)?),
                "--backend" => {
                    let v = value()?;
                    o.backend = Some(BackendChoice::parse(&v).ok_or_else(|| {
                        format!("--backend {v:?}: expected auto, emu, rknn or cpu")
                    })?);
                }
                "--paths" => {
                    o.paths = Some(list(&value()?, |p| {
                        Isa::from_name(p).ok_or_else(|| format!("unknown kernel path {p:?}"))
                    })?)
                }
                "--rounds" => o.rounds = Some(parse_count(&value()?)?),
                "--layouts" => o.layouts = Some(list(&value()?, parse_layout)?),
                "--columns" => o.columns = Some(parse_count(&value()?)?),
                other => return Err(format!("unknown option {other:?}")),
            }
        }
        Ok(o)
    }
}

impl Options {
    /// `--shapes`, else the A3B shapes.
    pub fn shapes(&self) -> Vec<(usize, usize)> {
        self.shapes
            .clone()
            .unwrap_or_else(|| A3B_SHAPES.iter().map(|s| (s.0, s.1)).collect())
    }

    /// `--m`, else [`ROWS`] (fewer with `--quick`).
    pub fn rows(&self) -> Vec<usize> {
        self.m.clone().unwrap_or_else(|| {
            if self.quick {
                QUICK_ROWS.to_vec()
            } else {
                ROWS.to_vec()
            }
        })
    }

    /// `--types`, else `default`.
    pub fn types(&self, default: &[GgmlType]) -> Vec<GgmlType> {
        self.types.clone().unwrap_or_else(|| default.to_vec())
    }
}

/// The role of an A3B shape ("gate/up", "down", ...), or "custom".
pub fn role(k: usize, n: usize) -> &'static str {
    A3B_SHAPES
        .iter()
        .find(|s| (s.0, s.1) == (k, n))
        .map_or("custom", |s| s.2)
}

fn list<T>(s: &str, parse: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| parse(p.trim()))
        .collect()
}

fn parse_count(s: &str) -> Result<usize, String> {
    s.parse::<usize>()
        .ok()
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("{s:?} is not a positive whole number"))
}

/// `KxN`, e.g. `2048x768`.
fn parse_shape(s: &str) -> Result<(usize, usize), String> {
    let (k, n) = s
        .split_once(['x', 'X'])
        .ok_or_else(|| format!("shape {s:?} is not KxN"))?;
    Ok((parse_count(k)?, parse_count(n)?))
}

/// `plain`, or a repacked layout as `RxC` (rows per group × chunk bytes, e.g. `8x8`).
fn parse_layout(s: &str) -> Result<Layout, String> {
    if s.eq_ignore_ascii_case("plain") {
        return Ok(Layout::Plain);
    }
    let (rows, chunk) = parse_shape(s).map_err(|_| format!("layout {s:?} is not plain or RxC"))?;
    Ok(Layout::Repacked { rows, chunk })
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
