//! `ork-probe repacked`: one expert inflated from each of ggml's repacked layouts against the same
//! weights in plain blocks, single thread, per A3B expert shape and type; the two take turns
//! round after round, so the ratio holds on a busy machine. Also times the untangling alone
//! (`to_plain_with` of the whole expert).

use super::bench::time;
use super::inflate::median;
use super::json::{self, fixed};
use super::options::Options;
use ork_moe::inflate::{
    from_plain, inflate_expert_in_with, inflate_expert_with, to_plain_with, ExpertWeights,
    InflateError, Layout,
};
use ork_moe::isa::Isa;
use ork_moe::layout::Tiles;
use ork_moe::moe::Config;
use ork_moe::npu::Lines;
use ork_moe::quant::GgmlType;
use serde_json::json;
use std::hint::black_box;
use std::process::ExitCode;

const ROUNDS: usize = 15;
const WARMUP: usize = 2;
const REPEATS: usize = 5;

struct Row {
    ty: GgmlType,
    layout: Layout,
    k: usize,
    n: usize,
    plain_us: f64,
    repacked_us: f64,
    to_plain_us: f64,
    /// The two inflates gave the same native B and channel scales.
    identical: bool,
}

pub fn run(opts: &Options, cfg: &Config) -> Result<ExitCode, String> {
    let isa = cfg.device.host.isa;
    let tiles = Tiles::RK3588;
    let types = opts.types(&[
        GgmlType::Q4_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ]);
    if let Some(calls) = opts.calls {
        return calls_only(isa, &tiles, &types, calls, opts);
    }
    let mut rows = Vec::new();
    for (k, n) in opts.shapes() {
        for (ty, layout) in Layout::REPACKED {
            if wanted(opts, &types, ty, layout)
                && k % ty.block_elems() == 0
                && n % layout.rows() == 0
            {
                rows.push(measure(isa, &tiles, ty, layout, k, n)?);
            }
        }
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
                        "plain_us": fixed(r.plain_us),
                        "repacked_us": fixed(r.repacked_us),
                        "to_plain_us": fixed(r.to_plain_us),
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

/// Whether `--types` and `--layouts` (default: all) select `layout` of `ty`.
fn wanted(opts: &Options, types: &[GgmlType], ty: GgmlType, layout: Layout) -> bool {
    types.contains(&ty) && opts.layouts.as_ref().is_none_or(|l| l.contains(&layout))
}

/// `--calls`: the inflate from each layout `calls` times per shape, nothing else (the counts of
/// two runs with different `calls`, differenced, are those of the inflate alone; instruction
/// counts under qemu, docs/BOARD-MODEL.md).
fn calls_only(
    isa: Isa,
    tiles: &Tiles,
    types: &[GgmlType],
    calls: usize,
    opts: &Options,
) -> Result<ExitCode, String> {
    for (k, n) in opts.shapes() {
        for (ty, layout) in Layout::REPACKED {
            if !wanted(opts, types, ty, layout)
                || k % ty.block_elems() != 0
                || n % layout.rows() != 0
            {
                continue;
            }
            let fail = |e: InflateError| format!("{} k={k} n={n}: {e}", layout.name(ty));
            let plain = crate::inflate::expert_blocks(ty, k, n);
            let w = ExpertWeights::contiguous(ty, &plain, k, n).map_err(fail)?;
            let mut packed = vec![0u8; plain.len()];
            from_plain(layout, &w, &mut packed).map_err(fail)?;
            let wp = ExpertWeights { data: &packed, ..w };
            let mut b = Lines::<i8>::zeroed(tiles.b_len(tiles.pad(k), tiles.pad(n)));
            let mut scales = vec![0f32; tiles.pad(n)];
            for _ in 0..calls {
                inflate_expert_in_with(isa, layout, black_box(&wp), tiles, &mut b, &mut scales)
                    .map_err(fail)?;
                black_box(&b);
            }
            println!(
                "{} k={k} n={n}: {calls} calls, kernel path {}, {} runs of 32 weights each",
                layout.name(ty),
                isa.name(),
                tiles.pad(k) / 32 * tiles.pad(n)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_table(isa: Isa, rows: &[Row], names: &[String]) {
    println!(
        "inflate from ggml's repacked layouts vs plain blocks, 1 thread, kernel path {} \
         (medians of {ROUNDS} interleaved rounds)",
        isa.name()
    );
    println!(
        "{:<10} {:>5} {:>5} {:>9} {:>12} {:>16} {:>12} {:>10}",
        "layout", "k", "n", "plain_us", "repacked_us", "repacked/plain", "to_plain_us", "identical"
    );
    for (r, name) in rows.iter().zip(names) {
        println!(
            "{:<10} {:>5} {:>5} {:>9.1} {:>12.1} {:>16.3} {:>12.1} {:>10}",
            name,
            r.k,
            r.n,
            r.plain_us,
            r.repacked_us,
            r.repacked_us / r.plain_us,
            r.to_plain_us,
            if r.identical { "yes" } else { "NO" }
        );
    }
}

fn measure(
    isa: Isa,
    tiles: &Tiles,
    ty: GgmlType,
    layout: Layout,
    k: usize,
    n: usize,
) -> Result<Row, String> {
    let fail = |e: ork_moe::inflate::InflateError| format!("{} k={k} n={n}: {e}", layout.name(ty));
    let plain = crate::inflate::expert_blocks(ty, k, n);
    let w = ExpertWeights::contiguous(ty, &plain, k, n).map_err(fail)?;
    let mut packed = vec![0u8; plain.len()];
    from_plain(layout, &w, &mut packed).map_err(fail)?;
    let wp = ExpertWeights { data: &packed, ..w };
    let out_len = tiles.b_len(tiles.pad(k), tiles.pad(n));
    let (mut b, mut scales) = (Lines::<i8>::zeroed(out_len), vec![0f32; tiles.pad(n)]);
    let (mut b2, mut scales2) = (Lines::<i8>::zeroed(out_len), scales.clone());
    inflate_expert_with(isa, &w, tiles, &mut b, &mut scales).map_err(fail)?;
    inflate_expert_in_with(isa, layout, &wp, tiles, &mut b2, &mut scales2).map_err(fail)?;
    let identical = *b == *b2 && scales == scales2;
    let mut back = vec![0u8; plain.len()];
    let (mut p, mut q, mut u) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        p.push(
            time(WARMUP, REPEATS, || {
                inflate_expert_with(isa, black_box(&w), tiles, &mut b, &mut scales)
                    .expect("checked");
                black_box(&b);
            })
            .median,
        );
        q.push(
            time(WARMUP, REPEATS, || {
                inflate_expert_in_with(isa, layout, black_box(&wp), tiles, &mut b, &mut scales)
                    .expect("checked");
                black_box(&b);
            })
            .median,
        );
        u.push(
            time(WARMUP, REPEATS, || {
                to_plain_with(isa, layout, black_box(&wp), &mut back).expect("checked");
                black_box(&back);
            })
            .median,
        );
    }
    Ok(Row {
        ty,
        layout,
        k,
        n,
        plain_us: median(p) * 1e6,
        repacked_us: median(q) * 1e6,
        to_plain_us: median(u) * 1e6,
        identical,
    })
}
