//! `ork-probe inflate`: one expert's weight materialization, single thread, per A3B expert shape
//! and weight type: the direct inflate, the legacy via-f32 path, and memcpy of the same output
//! size as the ceiling. GB/s count output bytes (native B int8).

use super::bench::time;
use super::json::{self, fixed};
use super::options::Options;
use super::research::via_f32::inflate_expert_via_f32;
use ork_moe::inflate::{inflate_expert_with, ExpertWeights};
use ork_moe::isa::Isa;
use ork_moe::layout::Tiles;
use ork_moe::moe::Config;
use ork_moe::npu::Lines;
use ork_moe::quant::GgmlType;
use ork_moe::testutil::Rng;
use serde_json::json;
use std::hint::black_box;
use std::process::ExitCode;

/// The three measurements take turns, round after round, so that a busy machine (other
/// processes on the same cores) slows them alike; each reported figure is the median over the
/// rounds of that round's median.
const ROUNDS: usize = 15;
const WARMUP: usize = 2;
const REPEATS: usize = 5;
/// The via-f32 path is several times slower; fewer repeats keep the run short.
const REPEATS_VIA_F32: usize = 1;

struct Row {
    ty: GgmlType,
    k: usize,
    n: usize,
    direct_gbps: f64,
    via_f32_gbps: f64,
    memcpy_gbps: f64,
    /// The direct inflate's fastest and slowest repeat, in microseconds (how noisy the run was).
    direct_us_range: (f64, f64),
}

pub fn run(opts: &Options, cfg: &Config) -> Result<ExitCode, String> {
    let isa = cfg.device.host.isa;
    let tiles = Tiles::RK3588;
    if let Some(calls) = opts.calls {
        return calls_only(isa, &tiles, opts, calls);
    }
    let mut rows = Vec::new();
    for (k, n) in opts.shapes() {
        for ty in opts
            .types(&GgmlType::QUANTIZED)
            .into_iter()
            .filter(|t| k % t.block_elems() == 0)
        {
            rows.push(
                measure(isa, &tiles, ty, k, n)
                    .map_err(|e| format!("{} k={k} n={n}: {e}", ty.name()))?,
            );
        }
    }
    if opts.json {
        json::print_rows(
            rows.iter()
                .map(|r| {
                    json!({
                        "type": r.ty.name(),
                        "k": r.k,
                        "n": r.n,
                        "direct_gbps": fixed(r.direct_gbps),
                        "via_f32_gbps": fixed(r.via_f32_gbps),
                        "speedup": fixed(r.direct_gbps / r.via_f32_gbps),
                        "memcpy_gbps": fixed(r.memcpy_gbps),
                    })
                })
                .collect(),
        );
    } else {
        println!(
            "inflate, 1 thread, kernel path {}, GB/s of native int8 B written (median of {ROUNDS} \
             interleaved rounds)",
            isa.name()
        );
        println!(
            "{:<6} {:>5} {:>5} {:>11} {:>12} {:>8} {:>11} {:>14} {:>18}",
            "type",
            "k",
            "n",
            "direct_gbps",
            "via_f32_gbps",
            "speedup",
            "memcpy_gbps",
            "direct/memcpy",
            "direct_us min-max"
        );
        for r in &rows {
            println!(
                "{:<6} {:>5} {:>5} {:>11.2} {:>12.2} {:>7.1}x {:>11.2} {:>13.0}% {:>18}",
                r.ty.name(),
                r.k,
                r.n,
                r.direct_gbps,
                r.via_f32_gbps,
                r.direct_gbps / r.via_f32_gbps,
                r.memcpy_gbps,
                100.0 * r.direct_gbps / r.memcpy_gbps,
                format!("{:.0}-{:.0}", r.direct_us_range.0, r.direct_us_range.1)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The synthetic blocks of one `k` × `n` expert of `ty` the inflate measurements use (the same
/// bytes in every run).
pub fn expert_blocks(ty: GgmlType, k: usize, n: usize) -> Vec<u8> {
    Rng::new((k * 31 + n) as u64).blocks(ty, n * k / ty.block_elems(), 0.05)
}

/// `--calls`: the direct inflate `calls` times per shape and type, nothing else (the counts
/// of two runs with different `calls`, differenced, are those of the inflate alone).
fn calls_only(isa: Isa, tiles: &Tiles, opts: &Options, calls: usize) -> Result<ExitCode, String> {
    for (k, n) in opts.shapes() {
        for ty in opts
            .types(&GgmlType::QUANTIZED)
            .into_iter()
            .filter(|t| k % t.block_elems() == 0)
        {
            let data = expert_blocks(ty, k, n);
            let w = ExpertWeights::contiguous(ty, &data, k, n).map_err(|e| e.to_string())?;
            let mut b = Lines::<i8>::zeroed(tiles.b_len(tiles.pad(k), tiles.pad(n)));
            let mut scales = vec![0f32; tiles.pad(n)];
            for _ in 0..calls {
                inflate_expert_with(isa, black_box(&w), tiles, &mut b, &mut scales)
                    .map_err(|e| format!("{} k={k} n={n}: {e}", ty.name()))?;
                black_box(&b);
            }
            println!(
                "{} k={k} n={n}: {calls} calls, kernel path {}, {} runs of 32 weights each",
                ty.name(),
                isa.name(),
                tiles.pad(k) / 32 * tiles.pad(n)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn measure(isa: Isa, tiles: &Tiles, ty: GgmlType, k: usize, n: usize) -> Result<Row, String> {
    let data = expert_blocks(ty, k, n);
    let w = ExpertWeights::contiguous(ty, &data, k, n).map_err(|e| e.to_string())?;
    let out_len = tiles.b_len(tiles.pad(k), tiles.pad(n));
    let mut b = Lines::<i8>::zeroed(out_len);
    let mut scales = vec![0f32; tiles.pad(n)];
    let gbps = |seconds: f64| out_len as f64 / seconds / 1e9;

    inflate_expert_with(isa, &w, tiles, &mut b, &mut scales).map_err(|e| e.to_string())?;
    let src = vec![1i8; out_len];
    let (mut direct, mut via, mut copy) = (Vec::new(), Vec::new(), Vec::new());
    let mut direct_us_range = (f64::INFINITY, 0f64);
    for _ in 0..ROUNDS {
        let t = time(WARMUP, REPEATS, || {
            inflate_expert_with(isa, black_box(&w), tiles, &mut b, &mut scales)
                .expect("checked above");
            black_box(&b);
        });
        direct_us_range = (
            direct_us_range.0.min(t.min * 1e6),
            direct_us_range.1.max(t.max * 1e6),
        );
        direct.push(t.median);
        via.push(
            time(1, REPEATS_VIA_F32, || {
                inflate_expert_via_f32(black_box(&w), tiles, &mut b, &mut scales)
                    .expect("checked above");
                black_box(&b);
            })
            .median,
        );
        copy.push(
            time(WARMUP, REPEATS, || {
                b.copy_from_slice(black_box(&src));
                black_box(&b);
            })
            .median,
        );
    }
    Ok(Row {
        ty,
        k,
        n,
        direct_gbps: gbps(median(direct)),
        via_f32_gbps: gbps(median(via)),
        memcpy_gbps: gbps(median(copy)),
        direct_us_range,
    })
}

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
