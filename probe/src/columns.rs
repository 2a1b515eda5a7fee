//! `ork-probe columns`: the outlier split's exact f32 weight columns of one expert
//! (`dequantize_columns_in`), per weight type and layout, single thread, against the reference
//! (`ExpertWeights::dequantize_column` on the plain blocks, one column at a time) and, for scale,
//! the whole expert's inflate from the same layout. The three take turns round after round, so
//! the ratios hold on a busy machine. Default: the real-scale down projection (K=768, N=2048) and
//! 55 distinct columns spread at random over K, as the real-scale runs see (docs/PERFORMANCE.md).

use super::bench::time;
use super::inflate::median;
use super::json::{self, fixed};
use super::options::Options;
use ork_moe::inflate::{
    dequantize_columns_in, from_plain, inflate_expert_in_with, ExpertWeights, InflateError, Layout,
};
use ork_moe::isa::Isa;
use ork_moe::layout::Tiles;
use ork_moe::moe::Config;
use ork_moe::npu::Lines;
use ork_moe::quant::GgmlType;
use ork_moe::testutil::Rng;
use serde_json::json;
use std::hint::black_box;
use std::process::ExitCode;

const ROUNDS: usize = 9;
const WARMUP: usize = 1;
const REPEATS: usize = 5;
/// Columns per expert by default: the real-scale runs' ~55 distinct outlier channels per
/// down-projection expert.
const COLUMNS: usize = 55;
/// K × N by default: Qwen3-30B-A3B's down projection, the one with outlier columns.
const SHAPE: (usize, usize) = (768, 2048);

struct Row {
    ty: GgmlType,
    layout: Layout,
    k: usize,
    n: usize,
    columns: usize,
    /// One call of each, in microseconds.
    columns_us: f64,
    reference_us: f64,
    inflate_us: f64,
    /// The decode gave the reference's bits.
    identical: bool,
}

impl Row {
    fn weights(&self) -> f64 {
        (self.columns * self.n) as f64
    }
}

pub fn run(opts: &Options, cfg: &Config) -> Result<ExitCode, String> {
    let isa = cfg.device.host.isa;
    let cases = cases(opts);
    if let Some(calls) = opts.calls {
        return calls_only(isa, opts, &cases, calls);
    }
    let mut rows = Vec::new();
    for &(ty, layout, k, n) in &cases {
        rows.push(measure(
            isa,
            ty,
            layout,
            k,
            n,
            opts.columns.unwrap_or(COLUMNS),
        )?);
    }
    let names: Vec<String> = rows.iter().map(|r| r.layout.name(r.ty)).collect();
    if opts.json {
        json::print_rows(
            rows.iter()
                .zip(&names)
                .map(|(r, name)| {
                    json!({
                        "type": r.ty.name(),
                        "layout": name,
                        "k": r.k,
                        "n": r.n,
                        "columns": r.columns,
                        "columns_us": fixed(r.columns_us),
                        "columns_ns_per_weight": fixed(r.columns_us * 1e3 / r.weights()),
                        "reference_us": fixed(r.reference_us),
                        "reference_ns_per_weight": fixed(r.reference_us * 1e3 / r.weights()),
                        "inflate_us": fixed(r.inflate_us),
                        "identical": r.identical,
                    })
                })
                .collect(),
        );
    } else {
        print_table(isa, &rows, &names);
    }
    Ok(if rows.iter().all(|r| r.identical) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Every (type, layout, K, N) asked for: `--types` (default all), `--layouts` (default plain
/// and every repacked one of the type), `--shapes` (default [`SHAPE`]), where the type's blocks
/// divide K and the layout's row groups divide N.
fn cases(opts: &Options) -> Vec<(GgmlType, Layout, usize, usize)> {
    let shapes = opts.shapes.clone().unwrap_or(vec![SHAPE]);
    let mut cases = Vec::new();
    for (k, n) in shapes {
        for ty in opts.types(&GgmlType::QUANTIZED) {
            let layouts = std::iter::once(Layout::Plain).chain(
                Layout::REPACKED
                    .iter()
                    .filter(|(t, _)| *t == ty)
                    .map(|&(_, l)| l),
            );
            for layout in layouts {
                let wanted = opts.layouts.as_ref().is_none_or(|l| l.contains(&layout));
                if wanted && k % ty.block_elems() == 0 && n % layout.rows() == 0 {
                    cases.push((ty, layout, k, n));
                }
            }
        }
    }
    cases
}

/// `count` distinct input channels of `0..k`, at random, in order (at most `k`).
fn spread_columns(k: usize, count: usize) -> Vec<usize> {
    let mut rng = Rng::new(55);
    let mut chosen = vec![false; k];
    let mut left = count.min(k);
    while left > 0 {
        let c = rng.below(k);
        if !chosen[c] {
            chosen[c] = true;
            left -= 1;
        }
    }
    (0..k).filter(|&c| chosen[c]).collect()
}

/// One expert of synthetic blocks in plain blocks and in `layout`.
struct Expert {
    plain: Vec<u8>,
    stored: Vec<u8>,
}

impl Expert {
    fn new(ty: GgmlType, layout: Layout, k: usize, n: usize) -> Result<Expert, InflateError> {
        let plain = crate::inflate::expert_blocks(ty, k, n);
        let mut stored = plain.clone();
        from_plain(
            layout,
            &ExpertWeights::contiguous(ty, &plain, k, n)?,
            &mut stored,
        )?;
        Ok(Expert { plain, stored })
    }
}

fn measure(
    isa: Isa,
    ty: GgmlType,
    layout: Layout,
    k: usize,
    n: usize,
    count: usize,
) -> Result<Row, String> {
    let fail = |e: InflateError| format!("{} k={k} n={n}: {e}", layout.name(ty));
    let expert = Expert::new(ty, layout, k, n).map_err(fail)?;
    let plain = ExpertWeights::contiguous(ty, &expert.plain, k, n).map_err(fail)?;
    let stored = ExpertWeights {
        data: &expert.stored,
        ..plain
    };
    let columns = spread_columns(k, count);
    let (mut got, mut want) = (vec![0f32; columns.len() * n], vec![0f32; columns.len() * n]);
    let reference = |want: &mut [f32]| {
        for (&c, col) in columns.iter().zip(want.chunks_exact_mut(n)) {
            plain
                .dequantize_column(c, col)
                .expect("a column of the expert");
        }
    };
    reference(&mut want);
    dequantize_columns_in(isa, layout, &stored, &columns, &mut got).map_err(fail)?;
    let identical = got
        .iter()
        .zip(&want)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    let tiles = Tiles::RK3588;
    let mut b = Lines::<i8>::zeroed(tiles.b_len(tiles.pad(k), tiles.pad(n)));
    let mut scales = vec![0f32; tiles.pad(n)];
    let (mut cols, mut refs, mut infl) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        cols.push(
            time(WARMUP, REPEATS, || {
                dequantize_columns_in(isa, layout, black_box(&stored), &columns, &mut got)
                    .expect("checked above");
                black_box(&got);
            })
            .median,
        );
        refs.push(
            time(WARMUP, REPEATS, || {
                reference(black_box(&mut want));
                black_box(&want);
            })
            .median,
        );
        infl.push(
            time(WARMUP, REPEATS, || {
                inflate_expert_in_with(
                    isa,
                    layout,
                    black_box(&stored),
                    &tiles,
                    &mut b,
                    &mut scales,
                )
                .expect("the same weights");
                black_box(&b);
            })
            .median,
        );
    }
    Ok(Row {
        ty,
        layout,
        k,
        n,
        columns: columns.len(),
        columns_us: median(cols) * 1e6,
        reference_us: median(refs) * 1e6,
        inflate_us: median(infl) * 1e6,
        identical,
    })
}

fn print_table(isa: Isa, rows: &[Row], names: &[String]) {
    println!(
        "outlier weight columns (dequantize_columns_in) vs the reference (dequantize_column per \
         column, plain blocks) and the whole expert's inflate, 1 thread, kernel path {} (medians \
         of {ROUNDS} interleaved rounds)",
        isa.name()
    );
    println!(
        "{:<10} {:>5} {:>5} {:>4} {:>10} {:>9} {:>12} {:>11} {:>10} {:>15} {:>9}",
        "layout",
        "k",
        "n",
        "cols",
        "ns/weight",
        "cols_us",
        "ref_ns/wt",
        "ref/cols",
        "infl_us",
        "cols/inflate",
        "identical"
    );
    for (r, name) in rows.iter().zip(names) {
        println!(
            "{:<10} {:>5} {:>5} {:>4} {:>10.3} {:>9.1} {:>12.3} {:>10.2}x {:>10.1} {:>15.3} {:>9}",
            name,
            r.k,
            r.n,
            r.columns,
            r.columns_us * 1e3 / r.weights(),
            r.columns_us,
            r.reference_us * 1e3 / r.weights(),
            r.reference_us / r.columns_us,
            r.inflate_us,
            r.columns_us / r.inflate_us,
            if r.identical { "yes" } else { "NO" }
        );
    }
}

/// `--calls`: the column decode `calls` times per case, nothing else, untimed (the instruction
/// counts of two runs with different `calls`, differenced, are those of the decode alone).
fn calls_only(
    isa: Isa,
    opts: &Options,
    cases: &[(GgmlType, Layout, usize, usize)],
    calls: usize,
) -> Result<ExitCode, String> {
    for &(ty, layout, k, n) in cases {
        let fail = |e: InflateError| format!("{} k={k} n={n}: {e}", layout.name(ty));
        let expert = Expert::new(ty, layout, k, n).map_err(fail)?;
        let stored = ExpertWeights::contiguous(ty, &expert.stored, k, n).map_err(fail)?;
        let columns = spread_columns(k, opts.columns.unwrap_or(COLUMNS));
        let mut out = vec![0f32; columns.len() * n];
        for _ in 0..calls {
            dequantize_columns_in(isa, layout, black_box(&stored), &columns, &mut out)
                .map_err(fail)?;
            black_box(&out);
        }
        println!(
            "{} k={k} n={n}: {calls} calls of {} columns, kernel path {}, {} weights per call",
            layout.name(ty),
            columns.len(),
            isa.name(),
            columns.len() * n
        );
    }
    Ok(ExitCode::SUCCESS)
}
