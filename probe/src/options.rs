//! The options of the measuring subcommands (all but `model`): one set, of which each subcommand
//! uses those that apply to it, and the parsers of their values.

use super::bench::A3B_SHAPES;
use clap::Args;
use ork_moe::inflate::Layout;
use ork_moe::isa::Isa;
use ork_moe::moe::{Config, Dispatch};
use ork_moe::npu::BackendChoice;
use ork_moe::quant::GgmlType;
use std::path::PathBuf;

/// Rows per expert swept by default, and with `--quick`.
const ROWS: [usize; 5] = [8, 16, 32, 64, 128];
const QUICK_ROWS: [usize; 3] = [8, 32, 128];

// A list option is one value split at commas (`::std::vec::Vec` keeps clap from taking it as a
// repeated option); given twice, the last one counts, as every option.
#[derive(Args, Clone, Debug, Default)]
#[command(args_override_self = true)]
pub struct Options {
    /// One JSON array on stdout instead of the table
    #[arg(long)]
    pub json: bool,
    /// (sweep) Draw time vs rows per expert into FILE
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Expert shapes [default: 2048x768,768x2048,4096x1408,1408x4096]
    #[arg(long, value_name = "KxN,...", value_parser = shapes)]
    pub shapes: Option<::std::vec::Vec<(usize, usize)>>,
    /// Rows per expert [default: 8,16,32,64,128]
    #[arg(long, value_name = "M,...", value_parser = counts)]
    pub m: Option<::std::vec::Vec<usize>>,
    /// Weight types [sweep default: q4_0,q4_K]
    #[arg(long, value_name = "T,...", value_parser = types)]
    pub types: Option<::std::vec::Vec<GgmlType>>,
    /// Threads of the CPU runs [default: ORK_THREADS, else all cores]
    #[arg(long, value_name = "N", value_parser = count)]
    pub threads: Option<usize>,
    /// auto, emu, rknn or cpu [default: ORK_BACKEND, else auto]
    #[arg(long, value_name = "B", value_parser = backend)]
    pub backend: Option<BackendChoice>,
    /// (peak) Kernel paths to measure [default: all with an int8 peak instruction]
    #[arg(long, value_name = "P,...", value_parser = paths)]
    pub paths: Option<::std::vec::Vec<Isa>>,
    /// (peak) Rounds; each number is the best round's [default: 3]
    #[arg(long, value_name = "N", value_parser = count)]
    pub rounds: Option<usize>,
    /// Fewer rows per expert and repeats (board: seconds, for CI)
    #[arg(long)]
    pub quick: bool,
    /// (board) Also a five-minute run on the NPU's cores recording temperatures and throughput
    #[arg(long)]
    pub sustained: bool,
    /// (inflate) Only run the direct inflate N times per shape and type, untimed: a workload for
    /// instruction counters (callgrind, qemu) (columns: the column decode N times per type and
    /// layout; repacked: the inflate from each layout N times)
    #[arg(long, value_name = "N", value_parser = count)]
    pub calls: Option<usize>,
    /// (columns, repacked) Plain and/or repacked layouts as RxC, e.g. plain,8x8 [default: all]
    #[arg(long, value_name = "L,...", value_parser = layouts)]
    pub layouts: Option<::std::vec::Vec<Layout>>,
    /// (columns) Columns decoded per expert [default: 55]
    #[arg(long, value_name = "C", value_parser = count)]
    pub columns: Option<usize>,
    /// (board) Where to write the profile [default: board-profile.json]
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    /// (accuracy) Real-weights vectors [default: tests/data/accuracy/minilm]
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
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

/// The comma-separated items of `s` (empty ones skipped, each trimmed), each parsed.
/// The library's configuration from its environment variables, parsed once, for measuring the
/// library's own path: measured dispatch takes every call, since nothing here runs ggml's path
/// for it to compare with.
pub fn library_config_from_env() -> Result<Config, String> {
    let mut cfg = ork_moe::config::from_env()?;
    cfg.dispatch = Dispatch::Always;
    Ok(cfg)
}

pub fn list<T>(s: &str, parse: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| parse(p.trim()))
        .collect()
}

/// A whole number above zero.
pub fn count(s: &str) -> Result<usize, String> {
    s.parse::<usize>()
        .ok()
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("{s:?} is not a positive whole number"))
}

pub fn counts(s: &str) -> Result<Vec<usize>, String> {
    list(s, count)
}

/// A quantized weight type by its ggml name.
pub fn weight_type(s: &str) -> Result<GgmlType, String> {
    GgmlType::from_name(s)
        .filter(|t| GgmlType::QUANTIZED.contains(t))
        .ok_or_else(|| format!("unknown weight type {s:?}"))
}

pub fn types(s: &str) -> Result<Vec<GgmlType>, String> {
    list(s, weight_type)
}

pub fn backend(s: &str) -> Result<BackendChoice, String> {
    BackendChoice::parse(s).ok_or_else(|| format!("{s:?}: expected auto, emu, rknn or cpu"))
}

/// `KxN`, e.g. `2048x768`.
fn shape(s: &str) -> Result<(usize, usize), String> {
    let (k, n) = s
        .split_once(['x', 'X'])
        .ok_or_else(|| format!("shape {s:?} is not KxN"))?;
    Ok((count(k)?, count(n)?))
}

fn shapes(s: &str) -> Result<Vec<(usize, usize)>, String> {
    list(s, shape)
}

fn paths(s: &str) -> Result<Vec<Isa>, String> {
    list(s, |p| {
        Isa::from_name(p).ok_or_else(|| format!("unknown kernel path {p:?}"))
    })
}

/// `plain`, or a repacked layout as `RxC` (rows per group × chunk bytes, e.g. `8x8`).
fn layout(s: &str) -> Result<Layout, String> {
    if s.eq_ignore_ascii_case("plain") {
        return Ok(Layout::Plain);
    }
    let (rows, chunk) = shape(s).map_err(|_| format!("layout {s:?} is not plain or RxC"))?;
    Ok(Layout::Repacked { rows, chunk })
}

fn layouts(s: &str) -> Result<Vec<Layout>, String> {
    list(s, layout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Probe {
        #[command(flatten)]
        options: Options,
    }

    fn parse(args: &str) -> Result<Options, clap::Error> {
        let argv = std::iter::once("ork-probe").chain(args.split_whitespace());
        Probe::try_parse_from(argv).map(|p| p.options)
    }

    #[test]
    fn values_parse_into_lists_and_counts() {
        let o = parse(
            "--json --quick --shapes 2048x768,768X64, --m=8,32 --types q4_0,q4_K --threads 3 \
             --backend emu --paths scalar --rounds 2 --calls 4 --layouts plain,8x4 --columns 7 \
             --svg a.svg --profile p.json --data d",
        )
        .unwrap();
        assert!(o.json && o.quick);
        assert_eq!(o.shapes(), vec![(2048, 768), (768, 64)]);
        assert_eq!(o.rows(), vec![8, 32]);
        assert_eq!(o.types(&[]), vec![GgmlType::Q4_0, GgmlType::Q4_K]);
        assert_eq!(
            (o.threads, o.rounds, o.calls, o.columns),
            (Some(3), Some(2), Some(4), Some(7))
        );
        assert_eq!(o.backend, Some(BackendChoice::Emu));
        assert_eq!(o.paths, Some(vec![Isa::Scalar]));
        assert_eq!(
            o.layouts,
            Some(vec![Layout::Plain, Layout::Repacked { rows: 8, chunk: 4 }])
        );
        assert_eq!(
            (o.svg, o.profile, o.data),
            (
                Some("a.svg".into()),
                Some("p.json".into()),
                Some("d".into())
            )
        );
    }

    #[test]
    fn defaults_and_the_last_of_a_repeated_option() {
        let o = parse("").unwrap();
        assert_eq!(o.shapes().len(), A3B_SHAPES.len());
        assert_eq!(o.rows(), ROWS);
        assert_eq!(o.types(&[GgmlType::Q8_0]), vec![GgmlType::Q8_0]);
        assert_eq!(parse("--quick").unwrap().rows(), QUICK_ROWS);
        assert_eq!(parse("--m 8 --m 16").unwrap().rows(), vec![16]);
        assert!(parse("--json --json").unwrap().json);
    }

    #[test]
    fn bad_values_are_usage_errors() {
        for bad in [
            "--m 0",
            "--m 8,x",
            "--shapes 2048",
            "--shapes 0x8",
            "--types f32",
            "--types q9",
            "--threads",
            "--backend gpu",
            "--paths nope",
            "--layouts 8",
            "--frobnicate",
            "sweep",
        ] {
            let e = parse(bad).err().unwrap_or_else(|| panic!("{bad} parsed"));
            assert_eq!(e.exit_code(), 2, "{bad}");
        }
    }
}
