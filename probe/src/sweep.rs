//! `ork-probe` / `ork-probe sweep`: the M0 viability sweep. For each expert shape, weight type
//! and rows-per-expert M: one expert's weight materialization (direct inflate vs the via-f32
//! path), then its GEMM on the NPU backend against the CPU int8 GEMM on one thread and on all,
//! the primitive the engine would use, and a bit-exact check of the NPU result against the CPU
//! reference on the inflated weights. On the emulator each row also carries the cost model's
//! RK3588 time, which is modelled, never measured.

use super::bench::{role, time, Timing};
use super::gemm::{devices, measure_operands, Repeats, Row as GemmRow};
use super::json::{self, fixed};
use super::options::Options;
use super::research::via_f32::inflate_expert_via_f32;
use super::svg::lines::{self, Panel, Series};
use ork_moe::inflate::{inflate_expert_with, ExpertWeights};
use ork_moe::moe::Config;
use ork_moe::quant::GgmlType;
use ork_moe::testutil::Rng;
use serde_json::{json, Value};
use std::process::ExitCode;

const TYPES: [GgmlType; 2] = [GgmlType::Q4_0, GgmlType::Q4_K];

struct Row {
    role: &'static str,
    ty: GgmlType,
    direct: Timing,
    via_f32: Timing,
    gemm: GemmRow,
}

pub fn run(opts: &Options, cfg: &Config) -> Result<ExitCode, String> {
    let (npu, cpu) = devices(cfg)?;
    let isa = cfg.device.host.isa;
    let tiles = npu.tiles();
    let (shapes, ms, types) = (opts.shapes(), opts.rows(), opts.types(&TYPES));
    let reps = if opts.quick {
        Repeats {
            warmup: 1,
            timed: 3,
        }
    } else {
        Repeats {
            warmup: 2,
            timed: 7,
        }
    };
    let jobs: Vec<(usize, usize, GgmlType)> = shapes
        .iter()
        .flat_map(|&(k, n)| types.iter().map(move |&ty| (k, n, ty)))
        .filter(|&(k, _, ty)| k % ty.block_elems() == 0)
        .collect();
    let total = jobs.len() * ms.len();
    let mut rows = Vec::with_capacity(total);
    for (k, n, ty) in jobs {
        let data = crate::inflate::expert_blocks(ty, k, n);
        let w = ExpertWeights::contiguous(ty, &data, k, n).map_err(|e| e.to_string())?;
        let mut b = vec![0i8; tiles.b_len(tiles.pad(k), tiles.pad(n))];
        let mut scales = vec![0f32; tiles.pad(n)];
        let fail = |e: ork_moe::inflate::InflateError| format!("{} {k}x{n}: {e}", ty.name());
        inflate_expert_via_f32(&w, &tiles, &mut b, &mut scales).map_err(fail)?;
        let via_f32 = time(1, reps.timed, || {
            inflate_expert_via_f32(&w, &tiles, &mut b, &mut scales).expect("inflated above");
        });
        inflate_expert_with(isa, &w, &tiles, &mut b, &mut scales).map_err(fail)?;
        let direct = time(reps.warmup, reps.timed, || {
            inflate_expert_with(isa, &w, &tiles, &mut b, &mut scales).expect("inflated above");
        });
        for &m in &ms {
            eprintln!(
                "[{}/{total}] {} {k}x{n} {} M={m}",
                rows.len() + 1,
                role(k, n),
                ty.name()
            );
            let mut a = vec![0i8; tiles.a_len(m, tiles.pad(k))];
            Rng::new((m * 7919 + k) as u64).fill_i8(&mut a);
            let gemm = measure_operands(&npu, &cpu, isa, (k, n, m), &a, &b, reps)?;
            rows.push(Row {
                role: role(k, n),
                ty,
                direct,
                via_f32,
                gemm,
            });
        }
    }

    let backend = npu.backend().name();
    let threads = cfg.device.host.threads;
    if opts.json {
        json::print_rows(json_rows(&rows, backend, threads));
    } else {
        print_table(&rows, backend, threads, reps);
    }
    if let Some(path) = &opts.svg {
        let title = format!(
            "ork-probe: one expert's GEMM time vs rows per expert — backend {backend}, {} ({threads} threads)",
            machine_name()
        );
        std::fs::write(
            path,
            lines::render(&title, "rows per expert (M)", "µs", &panels(&rows), 4),
        )
        .map_err(|e| format!("{}: {e}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    let failed = rows.iter().filter(|r| !r.gemm.bit_exact).count();
    if failed > 0 {
        eprintln!("ork-probe: {failed} rows are not bit-exact against the CPU int8 reference");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

fn json_rows(rows: &[Row], backend: &str, threads: usize) -> Vec<Value> {
    rows.iter()
        .map(|r| {
            let g = &r.gemm;
            json!({
                "backend": backend,
                "shape": r.role,
                "k": g.k,
                "n": g.n,
                "type": r.ty.name(),
                "m": g.m,
                "primitive": g.primitive.name(),
                "inflate_direct_us": fixed(r.direct.median * 1e6),
                "inflate_via_f32_us": fixed(r.via_f32.median * 1e6),
                "inflate_speedup": fixed(r.via_f32.median / r.direct.median),
                "npu_us": fixed(g.npu_us),
                "npu_min_us": fixed(g.npu_spread_us.0),
                "npu_max_us": fixed(g.npu_spread_us.1),
                "modelled_rk3588_us": g.modelled_us.map(fixed),
                "cpu1_us": fixed(g.cpu1_us),
                "cpun_us": fixed(g.cpun_us),
                "cpu_threads": threads,
                "speedup_vs_cpu1": fixed(g.cpu1_us / g.npu_us),
                "speedup_vs_cpun": fixed(g.cpun_us / g.npu_us),
                "bit_exact": g.bit_exact,
            })
        })
        .collect()
}

fn print_table(rows: &[Row], backend: &str, threads: usize, reps: Repeats) {
    println!(
        "ork-probe sweep: backend {backend}, {}; medians of {} runs after {} warm-up (µs); \
         npu spread = fastest-slowest run",
        machine_name(),
        reps.timed,
        reps.warmup
    );
    if rows.iter().any(|r| r.gemm.modelled_us.is_some()) {
        println!(
            "the emulator's wall time is its CPU work; 'rk3588*' is the cost model's board time (modelled, not measured)"
        );
    }
    println!(
        "{:<15} {:>5} {:>5} {:<5} {:>4} {:>9} {:>9} {:>6}  {:<9} {:>9} {:>15} {:>9} {:>9} {:>9} {:>7} {:>7}  exact",
        "shape", "k", "n", "type", "m", "infl_us", "viaf32_us", "infl×", "primitive", "npu_us",
        "npu_spread", "rk3588*", "cpu1_us", format!("cpu{threads}_us"), "×cpu1", format!("×cpu{threads}")
    );
    for r in rows {
        let g = &r.gemm;
        println!(
            "{:<15} {:>5} {:>5} {:<5} {:>4} {:>9.1} {:>9.1} {:>5.1}×  {:<9} {:>9.1} {:>15} {:>9} {:>9.1} {:>9.1} {:>6.2}× {:>6.2}×  {}",
            r.role,
            g.k,
            g.n,
            r.ty.name(),
            g.m,
            r.direct.median * 1e6,
            r.via_f32.median * 1e6,
            r.via_f32.median / r.direct.median,
            g.primitive.name(),
            g.npu_us,
            format!("{:.0}-{:.0}", g.npu_spread_us.0, g.npu_spread_us.1),
            g.modelled_us.map_or("-".into(), |u| format!("{u:.1}")),
            g.cpu1_us,
            g.cpun_us,
            g.cpu1_us / g.npu_us,
            g.cpun_us / g.npu_us,
            if g.bit_exact { "✓" } else { "✗" }
        );
    }
}

/// One panel per (shape, type): GEMM time against M for each path, and the inflate times.
fn panels(rows: &[Row]) -> Vec<Panel> {
    let mut panels: Vec<Panel> = Vec::new();
    let mut keys: Vec<(usize, usize, GgmlType)> = Vec::new();
    for r in rows {
        let key = (r.gemm.k, r.gemm.n, r.ty);
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    for (k, n, ty) in keys {
        let these: Vec<&Row> = rows
            .iter()
            .filter(|r| (r.gemm.k, r.gemm.n, r.ty) == (k, n, ty))
            .collect();
        let line = |name: &str, dashed: bool, y: &dyn Fn(&Row) -> Option<f64>| Series {
            name: name.to_string(),
            points: these
                .iter()
                .filter_map(|r| y(r).map(|v| (r.gemm.m as f64, v)))
                .collect(),
            dashed,
        };
        let mut series = vec![
            line("npu backend", false, &|r| Some(r.gemm.npu_us)),
            line("cpu int8, 1 thread", false, &|r| Some(r.gemm.cpu1_us)),
            line("cpu int8, all threads", false, &|r| Some(r.gemm.cpun_us)),
            line("inflate direct", false, &|r| Some(r.direct.median * 1e6)),
            line("inflate via f32", false, &|r| Some(r.via_f32.median * 1e6)),
        ];
        if these.iter().any(|r| r.gemm.modelled_us.is_some()) {
            series.push(line("rk3588 (modelled)", true, &|r| r.gemm.modelled_us));
        }
        panels.push(Panel {
            title: format!("{} {k}×{n} {}", role(k, n), ty.name()),
            series,
        });
    }
    panels
}

/// The CPU model name (Linux), else the architecture.
fn machine_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name") || l.starts_with("Model"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}
