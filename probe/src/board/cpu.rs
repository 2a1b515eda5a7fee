//! The board check's CPU side, each figure on a thread pinned to one core of a type: the inflate
//! per weight type (checked bit for bit against the scalar reference), memcpy, the DRAM all cores
//! share, and the engine's own CPU stages (routing, quantization, gather, scatter).

use super::system::{on_cpu, pin, Cpus};
use super::{Effort, Findings};
use crate::bench::time;
use crate::moe::{self as probe_moe, Case};
use ork_moe::inflate::{
    from_plain, inflate_expert_in_with, inflate_expert_with, ExpertWeights, InflateError, Layout,
};
use ork_moe::isa::Isa;
use ork_moe::layout::Tiles;
use ork_moe::moe::outliers::split_row;
use ork_moe::moe::quantize::quantize_row_scaled;
use ork_moe::moe::{Config, Engine};
use ork_moe::quant::GgmlType;
use ork_moe::testutil::Rng;
use std::hint::black_box;
use std::sync::Barrier;
use std::time::Instant;

/// The expert shape the inflate is measured at (gate/up of Qwen3-30B-A3B).
const K: usize = 2048;
const N: usize = 768;

/// The board model's name of the inflate rate of `ty` on a big core.
fn inflate_param(ty: GgmlType) -> &'static str {
    match ty {
        GgmlType::Q4_K => "inflate_gbps_big_core_q4_k",
        GgmlType::Q5_0 => "inflate_gbps_big_core_q5_0",
        GgmlType::Q8_0 => "inflate_gbps_big_core_q8_0",
        GgmlType::Q6_K => "inflate_gbps_big_core_q6_k",
        GgmlType::Q4_1 => "inflate_gbps_big_core_q4_1",
        _ => "inflate_gbps_big_core",
    }
}

/// One weight type's inflate: bit-exact against the scalar path, and its rate per core type.
pub struct InflateRow {
    pub ty: GgmlType,
    pub bit_exact: bool,
    pub big_gbps: f64,
    pub little_gbps: Option<f64>,
}

/// The layout the pinned ggml-cpu stores `ty` in on this CPU (docs/REPACK.md), read from the
/// instruction sets the CPU has: ggml chooses by those it was compiled for, so this is the layout
/// of a native build (GGML_NATIVE, the default when llama.cpp is built on the board; SVE builds,
/// which no RK3588 runs, are not covered).
pub fn ggml_layout(ty: GgmlType) -> Layout {
    let repacked = |rows, chunk| Layout::Repacked { rows, chunk };
    #[cfg(target_arch = "aarch64")]
    {
        use std::arch::is_aarch64_feature_detected as has;
        let chunk = if has!("i8mm") {
            8
        } else if has!("dotprod") {
            4
        } else {
            return Layout::Plain;
        };
        match ty {
            GgmlType::Q4_0 | GgmlType::Q8_0 => repacked(4, chunk),
            GgmlType::Q4_K | GgmlType::Q6_K => repacked(8, chunk),
            _ => Layout::Plain,
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        // AVX2 repacks Q4_0 and Q4_K only; Q8_0 and Q6_K stay plain on x86.
        match ty {
            GgmlType::Q4_0 | GgmlType::Q4_K if std::arch::is_x86_feature_detected!("avx2") => {
                repacked(8, 8)
            }
            _ => Layout::Plain,
        }
    }
    #[cfg(not(any(target_arch = "aarch64", target_arch = "x86_64")))]
    {
        let _ = (ty, repacked);
        Layout::Plain
    }
}

/// One expert of `ty` in the layout ggml gives it here: the plain blocks and that layout's bytes.
fn expert_in_layout(ty: GgmlType) -> Result<(Layout, Vec<u8>, Vec<u8>), String> {
    let layout = ggml_layout(ty);
    let plain = crate::inflate::expert_blocks(ty, K, N);
    let w = ExpertWeights::contiguous(ty, &plain, K, N).map_err(|e| e.to_string())?;
    let mut stored = vec![0u8; plain.len()];
    from_plain(layout, &w, &mut stored).map_err(|e| e.to_string())?;
    Ok((layout, plain, stored))
}

/// Copies of one expert's bytes, together this large, so that each inflate reads its weights
/// from DRAM as at real scale (far beyond an RK3588's 3 MiB L3, and this x86's).
const WORKING_SET: usize = 96 << 20;

/// GB/s of native int8 B written by the inflate of each type from the layout ggml gives it here
/// ([`ggml_layout`]), on the calling thread: one output buffer (the engine's recycled one),
/// the weights of a different copy each time ([`WORKING_SET`]).
fn inflate_rates(isa: Isa, effort: Effort) -> Result<Vec<f64>, String> {
    let tiles = Tiles::RK3588;
    let out_len = tiles.b_len(tiles.pad(K), tiles.pad(N));
    let mut b = vec![0i8; out_len];
    let mut scales = vec![0f32; tiles.pad(N)];
    GgmlType::QUANTIZED
        .iter()
        .map(|&ty| {
            let (layout, _, stored) = expert_in_layout(ty)?;
            let copies = WORKING_SET.div_ceil(stored.len());
            let set: Vec<u8> = stored.repeat(copies);
            let mut next = 0;
            let t = time(effort.pick(1, 3), effort.pick(3, 15), || {
                let data = &set[next * stored.len()..(next + 1) * stored.len()];
                next = (next + 1) % copies;
                let w = ExpertWeights::contiguous(ty, black_box(data), K, N).expect("checked");
                inflate_expert_in_with(isa, layout, &w, &tiles, &mut b, &mut scales)
                    .expect("inflated once before");
                black_box(&b);
            });
            Ok(out_len as f64 / t.median / 1e9)
        })
        .collect()
}

/// Whether the kernel path `isa`, inflating every type from the layout ggml gives it here,
/// gives the scalar reference's bits from the plain blocks.
fn inflate_exact(isa: Isa) -> Result<Vec<bool>, String> {
    let tiles = Tiles::RK3588;
    let out_len = tiles.b_len(tiles.pad(K), tiles.pad(N));
    GgmlType::QUANTIZED
        .iter()
        .map(|&ty| {
            let (layout, plain, stored) = expert_in_layout(ty)?;
            let fail = |e: InflateError| format!("{} inflate: {e}", layout.name(ty));
            let mut out = [
                (vec![0i8; out_len], vec![0f32; tiles.pad(N)]),
                Default::default(),
            ];
            out[1] = out[0].clone();
            let w = ExpertWeights::contiguous(ty, &stored, K, N).map_err(fail)?;
            inflate_expert_in_with(isa, layout, &w, &tiles, &mut out[0].0, &mut out[0].1)
                .map_err(fail)?;
            let w = ExpertWeights::contiguous(ty, &plain, K, N).map_err(fail)?;
            inflate_expert_with(Isa::Scalar, &w, &tiles, &mut out[1].0, &mut out[1].1)
                .map_err(fail)?;
            let bits = |s: &[f32]| s.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            Ok(out[0].0 == out[1].0 && bits(&out[0].1) == bits(&out[1].1))
        })
        .collect()
}

/// The inflate of every type, checked, then timed on a big core and on a little one.
pub fn inflate(
    isa: Isa,
    cpus: &Cpus,
    effort: Effort,
    f: &mut Findings,
) -> Result<Vec<InflateRow>, String> {
    let exact = inflate_exact(isa)?;
    let big_cpu = cpus.big().cpus[0];
    let big = on_cpu(big_cpu, || inflate_rates(isa, effort))??;
    let little = match cpus.little() {
        Some(l) => Some(on_cpu(l.cpus[0], || inflate_rates(isa, effort))??),
        None => None,
    };
    let rows: Vec<InflateRow> = GgmlType::QUANTIZED
        .iter()
        .enumerate()
        .map(|(i, &ty)| InflateRow {
            ty,
            bit_exact: exact[i],
            big_gbps: big[i],
            little_gbps: little.as_ref().map(|l| l[i]),
        })
        .collect();
    for r in &rows {
        f.set(
            inflate_param(r.ty),
            r.big_gbps,
            format!(
                "{} inflate of a {K}x{N} expert from {} (ggml's layout here), weights out of cache, \
                 on cpu {big_cpu} ({}), int8 bytes written per second",
                r.ty.name(),
                ggml_layout(r.ty).name(r.ty),
                isa.name()
            ),
        );
    }
    match cpus.little() {
        Some(l) => {
            let q4 = &rows[0];
            let factor = q4.little_gbps.expect("measured") / q4.big_gbps;
            f.set(
                "little_core_factor",
                factor,
                format!("q4_0 inflate on cpu {} over cpu {big_cpu}", l.cpus[0]),
            );
        }
        None => f.keep(
            "little_core_factor",
            "one core type on this machine: no little core to compare",
        ),
    }
    eprintln!(
        "board: inflate q4_0 {:.2} GB/s on cpu {big_cpu}",
        rows[0].big_gbps
    );
    Ok(rows)
}

/// GB/s copied by one thread, `bytes` at a time.
fn copy_rate(bytes: usize, reps: usize) -> f64 {
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    let t = time(1, reps, || {
        dst.copy_from_slice(black_box(&src));
        black_box(&dst);
    });
    bytes as f64 / t.median / 1e9
}

/// memcpy on one core of each type, and the DRAM all the CPUs move at once.
pub fn memory(cpus: &Cpus, effort: Effort, f: &mut Findings) -> Result<(), String> {
    // Far beyond any CPU cache: the copies go to DRAM.
    let bytes = 64 << 20;
    let reps = effort.pick(3, 9);
    let big_cpu = cpus.big().cpus[0];
    let big = on_cpu(big_cpu, || copy_rate(bytes, reps))?;
    let how = |cpu: usize| {
        format!(
            "copy of {} MiB on cpu {cpu}, GB copied per second",
            bytes >> 20
        )
    };
    f.set("memcpy_gbps_big_core", big, how(big_cpu));
    match cpus.little() {
        Some(l) => {
            let little = on_cpu(l.cpus[0], || copy_rate(bytes, reps))?;
            f.set("memcpy_gbps_little_core", little, how(l.cpus[0]));
        }
        None => f.keep(
            "memcpy_gbps_little_core",
            "one core type on this machine: no little core",
        ),
    }
    let all = cpus.all();
    let shared = shared_dram(&all, effort)?;
    f.set(
        "shared_dram_gbps",
        shared,
        format!(
            "{} threads, one per CPU ({}), each copying its own {} MiB: bytes read + written per second",
            all.len(),
            all.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(","),
            SHARED_BYTES >> 20
        ),
    );
    eprintln!(
        "board: memcpy {big:.2} GB/s on cpu {big_cpu}; all CPUs {shared:.2} GB/s read+written"
    );
    Ok(())
}

/// What each thread of the shared-DRAM measurement copies: together far beyond the CPU caches.
const SHARED_BYTES: usize = 32 << 20;

/// Bytes read and written per second by one copying thread per CPU of `cpus`, all at once.
fn shared_dram(cpus: &[usize], effort: Effort) -> Result<f64, String> {
    let bytes = SHARED_BYTES;
    let reps = effort.pick(3, 5);
    let start = Barrier::new(cpus.len() + 1);
    let (t0, ends) = std::thread::scope(|s| {
        let threads: Vec<_> = cpus
            .iter()
            .map(|&cpu| {
                let start = &start;
                s.spawn(move || -> Result<Instant, String> {
                    let pinned = pin(cpu);
                    // Each thread's buffers are first touched on its own CPU.
                    let src = vec![1u8; bytes];
                    let mut dst = vec![0u8; bytes];
                    dst.copy_from_slice(&src);
                    // Even when pinning failed: every thread must reach the barrier.
                    start.wait();
                    for _ in 0..reps {
                        dst.copy_from_slice(black_box(&src));
                        black_box(&dst);
                    }
                    let end = Instant::now();
                    pinned.map(|()| end)
                })
            })
            .collect();
        start.wait();
        let t0 = Instant::now();
        let ends: Vec<Result<Instant, String>> = threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err("a copying thread panicked".into()))
            })
            .collect();
        (t0, ends)
    });
    let mut last = t0;
    for end in ends {
        last = last.max(end?);
    }
    let wall = last.duration_since(t0).as_secs_f64();
    Ok(2.0 * (bytes * reps * cpus.len()) as f64 / wall / 1e9)
}

/// The engine's CPU stages on one big core: one gate-projection call, its cache warm, on one
/// thread that also submits its GEMMs (no submitter threads).
pub fn stages(cfg: &Config, cpus: &Cpus, effort: Effort, f: &mut Findings) -> Result<(), String> {
    let mut cfg = cfg.clone();
    cfg.min_rows = 0;
    cfg.device.host.threads = 1;
    cfg.submitters = Some(0);
    let (tokens, experts) = if effort.quick { (32, 32) } else { (512, 128) };
    let big_cpu = cpus.big().cpus[0];
    let (m, quant_us, used) = on_cpu(big_cpu, || -> Result<_, String> {
        let case = Case::with_experts(GgmlType::Q4_0, tokens, experts, &mut Rng::new(0xb0a4d));
        let engine = Engine::new(cfg.clone()).map_err(|e| e.to_string())?;
        // Cold: inflates every used expert into the cache; the timed calls hit it.
        case.call(&engine)?;
        let mut runs = (0..effort.pick(3, 5))
            .map(|_| case.call(&engine))
            .collect::<Result<Vec<_>, _>>()?;
        runs.sort_by(|a, b| a.total_us.total_cmp(&b.total_us));
        let m = runs[runs.len() / 2];
        // The quantization alone, as phase 1 does it, on the same rows.
        let kp = Tiles::RK3588.pad(probe_moe::K);
        let mut out = vec![0i8; kp];
        let (mut scratch, mut channels) = (vec![0f32; probe_moe::K], Vec::new());
        let t = time(1, effort.pick(3, 5), || {
            for x in case.b.chunks_exact(probe_moe::K) {
                black_box(match cfg.outliers {
                    Some(rule) => split_row(x, rule, &mut scratch, &mut channels, &mut out),
                    None => quantize_row_scaled(x, &mut out),
                });
            }
        });
        Ok((m, t.median * 1e6, case.used_experts()))
    })??;
    let stage_us = |ns: u64| ns as f64 / 1e3;
    let rows = (tokens * probe_moe::N_USED) as f64;
    let where_ = format!(
        "one gate call ({tokens} tokens, {experts} experts, {} used, warm cache) on cpu {big_cpu}, one thread",
        probe_moe::N_USED
    );
    f.num("stage_route_us", stage_us(m.stages.route));
    f.num("stage_quant_gather_us", stage_us(m.stages.quant));
    f.num("stage_scatter_us", stage_us(m.stages.scatter));
    f.num("quantize_rows_us", quant_us);
    f.set(
        "route_mrows_big_core",
        rows / stage_us(m.stages.route),
        format!("the engine's routing stage of {where_}"),
    );
    f.set(
        "quant_gelems_big_core",
        (tokens * probe_moe::K) as f64 / quant_us / 1e3,
        format!("the library's row quantization (phase 1, outlier split as configured) of the {tokens} rows of {where_}"),
    );
    f.set(
        "scatter_gbps_big_core",
        rows * (probe_moe::N * 4) as f64 / stage_us(m.stages.scatter) / 1e3,
        format!("the engine's scatter stage of {where_}, f32 dst bytes per second"),
    );
    // The engine times the gather with the quantization (one stage): what is left of that stage
    // after the quantization and the syncs of A, when that is clearly more than noise.
    let a_bytes = rows * Tiles::RK3588.pad(probe_moe::K) as f64;
    let p = f.params_so_far();
    let syncs_us = used as f64 * p.sync_us + a_bytes / (p.sync_gbps * 1e3);
    let stage = stage_us(m.stages.quant);
    let gather_us = stage - quant_us - syncs_us;
    if gather_us > 0.15 * stage {
        f.set(
            "gather_gbps_big_core",
            a_bytes / gather_us / 1e3,
            format!(
                "derived: the engine's quant+gather stage of {where_} ({stage:.0} us) less the quantization ({quant_us:.0} us) and {used} syncs of A ({syncs_us:.0} us)"
            ),
        );
    } else {
        f.keep(
            "gather_gbps_big_core",
            format!(
                "the engine times the gather with the quantization: its stage ({stage:.0} us) is the quantization ({quant_us:.0} us) and the syncs of A ({syncs_us:.0} us) within noise"
            ),
        );
    }
    eprintln!(
        "board: engine stages on cpu {big_cpu}: route {:.0} us, quant+gather {stage:.0} us, scatter {:.0} us",
        stage_us(m.stages.route),
        stage_us(m.stages.scatter)
    );
    Ok(())
}
