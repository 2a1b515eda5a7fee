//! `ork-probe accuracy`: the error of each way to compute a MUL_MAT_ID, as NMSE against an f64
//! reference (f64 activations × ggml's dequantized weights in f64), per case:
//! - `ggml`: ggml's own arithmetic: activations quantized to Q8_0 / Q8_K, block-wise integer dot
//!   products (`quant::vec_dot`, ggml's reference quantizers and generic dot products, proved
//!   bit-exact against the pinned ggml by `tests/ggml_vec_dot.rs`);
//! - `library`: each row to int8 with one scale folded into one f32
//!   (`moe::quantize::quantize_row`), the expert inflated (`inflate::inflate_expert`), the CPU
//!   int8 GEMM (`gemm::gemm`, equal to the NPU bit for bit), `C · (row_scale · chan_scale)`;
//! - `library_tinyfix`: the same with the split row scale (`quantize_row_scaled`,
//!   `RowScale::output`), the engine's path with the outlier split off; identical to `library`
//!   except on tiny rows;
//! - `library_hadamard`: rows rotated (`research::rotated::quantize_row_rotated`), weights
//!   inflated rotated (`research::rotated::inflate_expert_rotated`);
//! - `library_seg256`, `library_seg512`: one activation scale per K segment, one int8 GEMM per
//!   segment, combined in f32 (`moe::segments`);
//! - `library_outliers`: the outlier split with the engine's default rule (`Config::default()`:
//!   channels above 6 RMS, at most 8 per row) taken out of the int8 row and added in f32
//!   against the dequantized weight columns (`moe::outliers`);
//! - `library_outliers_int8w`: the same with the correction's weights read from the inflated
//!   int8 expert (`outliers::native_column`), what the engine can do without dequantizing.
//!
//! The engine's default path (marked in the output) follows `Config::default().outliers`:
//! `library_outliers` with the split on, `library_tinyfix` with it off.
//!
//! Cases: synthetic ones (K=2048, N=64, 8 experts, 2 used per token, 32
//! tokens; uniform activations with outlier channels ×10 and ×50, Gaussian, tiny), the same at
//! the down-projection depth K=768, and the real ones in `--data` (all-MiniLM-L6-v2's FFN
//! weights and activations, `tools/make_accuracy_vectors.py`). The table also prints the levers'
//! costs: outlier channels split, segment GEMMs, and the rotated inflate's time against the
//! direct one (measured, 1 thread).

mod cases;

use super::bench::time;
use super::json::{self, fixed, sci};
use super::options::Options;
use super::research::hadamard::Rotation;
use super::research::rotated::{inflate_expert_rotated, quantize_row_rotated};
use cases::{real_cases, synthetic_cases, Case};
use ork_moe::gemm::Shape;
use ork_moe::inflate::{inflate_expert, ExpertWeights};
use ork_moe::layout::Tiles;
use ork_moe::moe::outliers::{self, Rule};
use ork_moe::moe::quantize::{quantize_row, quantize_row_scaled, RowScale};
use ork_moe::moe::segments::{self, Segmented};
use ork_moe::moe::Config;
use ork_moe::quant::vec_dot::{vec_dot, VecDotType};
use ork_moe::quant::{dequantize_row, GgmlType};
use ork_moe::testutil::Rng;
use serde_json::json;
use std::collections::HashMap;
use std::hint::black_box;
use std::path::PathBuf;
use std::process::ExitCode;

const PATHS: [&str; 8] = [
    "ggml",
    "library",
    "library_tinyfix",
    "library_hadamard",
    "library_seg256",
    "library_seg512",
    "library_outliers",
    "library_outliers_int8w",
];
/// The path the engine takes with its default configuration.
fn default_path() -> &'static str {
    match Config::default().outliers {
        Some(_) => "library_outliers",
        None => "library_tinyfix",
    }
}

/// The outlier lever's rule: the engine's default one (the library's own when the default is off).
fn outlier_rule() -> Rule {
    Config::default().outliers.unwrap_or(Rule::DEFAULT)
}

struct Measured {
    case: String,
    ty: GgmlType,
    k: usize,
    n: usize,
    rows: usize,
    nmse: Vec<f64>,
    /// Outlier lever: channels split per row (mean, max).
    outliers: (f64, usize),
    q4_own: Option<f64>,
}

pub fn run(opts: &Options) -> Result<ExitCode, String> {
    let types = opts.types(&[GgmlType::Q4_0, GgmlType::Q4_K]);
    let mut cases = synthetic_cases(&types);
    let data = opts.data.clone().unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/accuracy/minilm")
    });
    cases.extend(real_cases(&data, &types)?);
    let mut results = Vec::new();
    for case in &cases {
        eprintln!(
            "accuracy: {} {} ({} rows)",
            case.name,
            case.ty.name(),
            case.rows.len()
        );
        results.push(measure(case)?);
    }
    if opts.json {
        let mut rows = Vec::new();
        for r in &results {
            for (path, nmse) in PATHS.iter().zip(&r.nmse) {
                rows.push(json!({
                    "case": r.case,
                    "k": r.k,
                    "n": r.n,
                    "type": r.ty.name(),
                    "path": path,
                    "nmse": sci(*nmse),
                    "vs_ggml": fixed(nmse / r.nmse[0]),
                    "default": *path == default_path(),
                    "rows": r.rows,
                    "q4_own_nmse": r.q4_own.map(sci),
                    "of_q4_own": fixed(r.q4_own.map_or(f64::NAN, |q| nmse / q)),
                }));
            }
        }
        json::print_rows(rows);
        return Ok(ExitCode::SUCCESS);
    }
    println!("NMSE against the f64 reference (dequantized weights × f32 activations); in brackets: × ggml's");
    print!("{:<16} {:<5} {:>5} {:>5}", "case", "type", "k", "n");
    for p in PATHS {
        print!(" {:>20}", p.strip_prefix("library_").unwrap_or(p));
    }
    println!(" {:>9}", "outl/row");
    for r in &results {
        print!("{:<16} {:<5} {:>5} {:>5}", r.case, r.ty.name(), r.k, r.n);
        for (i, v) in r.nmse.iter().enumerate() {
            if i == 0 {
                print!(" {:>20}", format!("{v:.2e}"));
            } else {
                print!(" {:>20}", format!("{v:.2e} ({:.2})", v / r.nmse[0]));
            }
        }
        println!(" {:>9}", format!("{:.1}/{}", r.outliers.0, r.outliers.1));
    }
    println!(
        "(default: {}; outl/row: channels the outlier lever splits per row, mean/max)",
        default_path()
    );
    println!("\nreal weights: error added to Q4's own (NMSE of the path / NMSE of Q4 against the f32 weights)");
    print!("{:<16} {:<5} {:>9}", "case", "type", "q4_own");
    for p in PATHS {
        print!(" {:>9}", p.strip_prefix("library_").unwrap_or(p));
    }
    println!();
    for r in results.iter().filter(|r| r.q4_own.is_some()) {
        let q = r.q4_own.expect("filtered");
        print!("{:<16} {:<5} {:>9.2e}", r.case, r.ty.name(), q);
        for v in &r.nmse {
            print!(" {:>8.1}%", 100.0 * v / q);
        }
        println!();
    }
    costs();
    Ok(ExitCode::SUCCESS)
}

/// The lever a library path applies.
#[derive(Clone, Copy, PartialEq)]
enum Lever {
    /// One int8 scale per row, folded into one f32.
    Folded,
    TinyFix,
    Hadamard,
    Segments(usize),
    Outliers,
    /// The same, the correction's weights from the inflated int8 expert.
    OutliersInt8W,
}

fn measure(case: &Case) -> Result<Measured, String> {
    let (k, n) = (case.k, case.n);
    // The reference and ggml, row by row.
    let mut wf: Vec<Vec<f32>> = Vec::new();
    let rb = case.ty.row_bytes(k).expect("whole blocks");
    for ex in &case.experts {
        let mut f = vec![0f32; n * k];
        for (r, out) in f.chunks_exact_mut(k).enumerate() {
            dequantize_row(case.ty, &ex[r * rb..(r + 1) * rb], out).map_err(|e| e.to_string())?;
        }
        wf.push(f);
    }
    let reference: Vec<f64> = case
        .rows
        .iter()
        .flat_map(|(ex, x)| {
            let w = &wf[*ex];
            (0..n).map(move |j| {
                w[j * k..(j + 1) * k]
                    .iter()
                    .zip(x)
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum::<f64>()
            })
        })
        .collect();
    let at = VecDotType::for_weights(case.ty).ok_or("no vec-dot type")?;
    let mut ggml = Vec::with_capacity(reference.len());
    for (ex, x) in &case.rows {
        let act = at.quantize_row(x).map_err(|e| e.to_string())?;
        for j in 0..n {
            ggml.push(
                vec_dot(case.ty, k, &case.experts[*ex][j * rb..(j + 1) * rb], &act)
                    .map_err(|e| e.to_string())? as f64,
            );
        }
    }
    let mut nmse = vec![nmse_of(&ggml, &reference)];
    let mut outlier_stats = (0.0, 0);
    for lever in [
        Lever::Folded,
        Lever::TinyFix,
        Lever::Hadamard,
        Lever::Segments(256),
        Lever::Segments(512),
        Lever::Outliers,
        Lever::OutliersInt8W,
    ] {
        let (y, stats) = library(case, lever)?;
        if lever == Lever::Outliers {
            outlier_stats = stats;
        }
        nmse.push(nmse_of(&y, &reference));
    }
    Ok(Measured {
        case: case.name.clone(),
        ty: case.ty,
        k,
        n,
        rows: case.rows.len(),
        nmse,
        outliers: outlier_stats,
        q4_own: case.q4_own,
    })
}

fn nmse_of(y: &[f64], reference: &[f64]) -> f64 {
    let err: f64 = y
        .iter()
        .zip(reference)
        .map(|(a, b)| (a - b) * (a - b))
        .sum();
    err / reference.iter().map(|b| b * b).sum::<f64>()
}

/// The library's outputs (in `case.rows` order, `n` per row) with `lever`, and for the outlier
/// lever the channels split per row (mean, max).
fn library(case: &Case, lever: Lever) -> Result<(Vec<f64>, (f64, usize)), String> {
    let e = |e: ork_moe::inflate::InflateError| e.to_string();
    let tiles = Tiles::RK3588;
    let (k, n) = (case.k, case.n);
    let (kp, np) = (tiles.pad(k), tiles.pad(n));
    let rot = Rotation::new(k);
    let rule = outlier_rule();
    let mut y = vec![0f64; case.rows.len() * n];
    let (mut split_total, mut split_max) = (0usize, 0usize);
    for ex in 0..case.experts.len() {
        let members: Vec<usize> = (0..case.rows.len())
            .filter(|&r| case.rows[r].0 == ex)
            .collect();
        if members.is_empty() {
            continue;
        }
        let m = members.len();
        let w = case.weights(ex);
        let mut b = vec![0i8; tiles.b_len(kp, np)];
        let mut chan = vec![0f32; np];
        match lever {
            Lever::Hadamard => inflate_expert_rotated(&w, &rot, &tiles, &mut b, &mut chan)
                .map_err(|e| e.to_string())?,
            _ => inflate_expert(&w, &tiles, &mut b, &mut chan).map_err(e)?,
        }
        // Row-major int8 rows, then native A.
        let mut a = vec![0i8; m * kp];
        let mut scales: Vec<Vec<RowScale>> = Vec::with_capacity(m);
        let mut split: Vec<Vec<usize>> = vec![Vec::new(); m];
        let mut scratch = vec![0f32; k];
        for (i, &r) in members.iter().enumerate() {
            let x = &case.rows[r].1;
            let q = &mut a[i * kp..(i + 1) * kp];
            scales.push(match lever {
                Lever::Folded => vec![RowScale {
                    scale: quantize_row(x, q),
                    exp2: 0,
                }],
                Lever::TinyFix => vec![quantize_row_scaled(x, q)],
                Lever::Hadamard => vec![quantize_row_rotated(&rot, x, &mut scratch, q)],
                Lever::Segments(seg) => {
                    let mut s = Vec::new();
                    segments::quantize_row_segments(x, seg, q, &mut s);
                    s
                }
                Lever::Outliers | Lever::OutliersInt8W => {
                    vec![outliers::split_row(x, rule, &mut scratch, &mut split[i], q)]
                }
            });
            split_total += split[i].len();
            split_max = split_max.max(split[i].len());
        }
        let mut an = vec![0i8; tiles.a_len(m, kp)];
        tiles.pack_a(&a, m, kp, &mut an);
        let shape = Shape { m, kp, np };
        let seg = match lever {
            Lever::Segments(s) => s,
            _ => kp,
        };
        let mut c = vec![0i32; kp.div_ceil(seg) * tiles.c_len(m, np)];
        segments::gemm_segments(&tiles, shape, seg, &an, &b, &mut c);
        let mut columns: HashMap<usize, Vec<f32>> = HashMap::new();
        for ch in split.iter().flatten() {
            if !columns.contains_key(ch) {
                let mut col = vec![0f32; n];
                if lever == Lever::OutliersInt8W {
                    outliers::native_column(&tiles, kp, &b, &chan, *ch, &mut col);
                } else {
                    w.dequantize_column(*ch, &mut col).map_err(e)?;
                }
                columns.insert(*ch, col);
            }
        }
        let result = Segmented {
            tiles: &tiles,
            m,
            np,
            c: &c,
        };
        for (i, &r) in members.iter().enumerate() {
            for j in 0..n {
                let v = if lever == Lever::Folded {
                    // The scatter's expression, with the folded scale.
                    c[tiles.c_index(m, i, j)] as f32 * (scales[i][0].scale * chan[j])
                } else {
                    result.output(&scales[i], i, j, chan[j])
                };
                let corr = outliers::correction(&case.rows[r].1, &split[i], j, |ch| &columns[&ch]);
                y[r * n + j] = (v + corr) as f64;
            }
        }
    }
    Ok((y, (split_total as f64 / case.rows.len() as f64, split_max)))
}

/// What the levers cost: the rotated inflate against the direct one (1 thread, median of
/// interleaved rounds), the activation rotation per row against plain quantization, and the
/// segment GEMMs per expert on the NPU.
fn costs() {
    let tiles = Tiles::RK3588;
    println!("\nlever costs, 1 thread (measured; interleaved rounds, medians):");
    println!(
        "{:<6} {:>5} {:>5} {:>12} {:>13} {:>7} {:>12} {:>14} {:>16}",
        "type",
        "k",
        "n",
        "inflate_us",
        "rotated_us",
        "ratio",
        "quant_row_us",
        "rot+quant_us",
        "seg512_gemms"
    );
    for (k, n) in [
        (2048usize, 768usize),
        (768, 2048),
        (4096, 1408),
        (1408, 4096),
    ] {
        for ty in [GgmlType::Q4_0, GgmlType::Q4_K] {
            if !k.is_multiple_of(ty.block_elems()) {
                continue;
            }
            let data = Rng::new(k as u64).blocks(ty, n * k / ty.block_elems(), 0.05);
            let w = ExpertWeights {
                ty,
                data: &data,
                row_stride: ty.row_bytes(k).expect("blocks"),
                n,
                k,
            };
            let rot = Rotation::new(k);
            let mut b = vec![0i8; tiles.b_len(tiles.pad(k), tiles.pad(n))];
            let mut s = vec![0f32; tiles.pad(n)];
            let x: Vec<f32> = {
                let mut r = Rng::new(1);
                (0..k).map(|_| r.normal()).collect()
            };
            let (mut q, mut scratch) = (vec![0i8; k], vec![0f32; k]);
            let (mut direct, mut rotated, mut plain, mut rotq) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for _ in 0..5 {
                direct.push(
                    time(1, 3, || {
                        inflate_expert(black_box(&w), &tiles, &mut b, &mut s).expect("valid")
                    })
                    .median,
                );
                rotated.push(
                    time(0, 1, || {
                        inflate_expert_rotated(black_box(&w), &rot, &tiles, &mut b, &mut s)
                            .expect("valid")
                    })
                    .median,
                );
                plain.push(
                    time(10, 200, || {
                        black_box(quantize_row(black_box(&x), &mut q));
                    })
                    .median,
                );
                rotq.push(
                    time(10, 200, || {
                        black_box(quantize_row_rotated(
                            &rot,
                            black_box(&x),
                            &mut scratch,
                            &mut q,
                        ));
                    })
                    .median,
                );
            }
            let med = |mut v: Vec<f64>| {
                v.sort_by(f64::total_cmp);
                v[v.len() / 2] * 1e6
            };
            let (d, r) = (med(direct), med(rotated));
            println!(
                "{:<6} {:>5} {:>5} {:>12.0} {:>13.0} {:>6.1}x {:>12.2} {:>14.2} {:>16}",
                ty.name(),
                k,
                n,
                d,
                r,
                r / d,
                med(plain),
                med(rotq),
                segments::cost(1, k, n, 512).gemms
            );
        }
    }
    println!(
        "(rotation: {} for K=2048, {} for K=768, {} for K=1408)",
        Rotation::new(2048).construction(),
        Rotation::new(768).construction(),
        Rotation::new(1408).construction()
    );
}
