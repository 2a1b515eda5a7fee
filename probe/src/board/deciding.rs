//! The quantities that decide the modelled prefill: the DRAM the CPUs and the NPU move when they
//! stream together, a run's time against M at the expert and projection shapes on one core and on
//! all of them, a sync's cost against its size from each core type, the memory controller's
//! governor and frequency, and, with `--sustained`, temperatures and throughput over five minutes.

use super::npu::{on_core, sync_time, us, Gemm};
use super::system::{pin, Cpus};
use super::{Effort, Findings};
use crate::gemm::Repeats;
use ork_moe::npu::{CoreMask, Device};
use ork_moe::pool::{allowed_cpus, pin_current_thread};
use serde_json::{json, Value};
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// (role, K, N): the routed experts' and Qwen3-30B-A3B's attention projections.
const RUN_SHAPES: [(&str, usize, usize); 5] = [
    ("gate/up", 2048, 768),
    ("down", 768, 2048),
    ("q", 2048, 4096),
    ("k/v", 2048, 512),
    ("o", 4096, 2048),
];

const RUN_ROWS: [usize; 8] = [16, 32, 64, 128, 256, 512, 1024, 2048];

/// B bytes a run against M cycles through: beyond every cache a run could find its B in (the
/// NPU cores' 384 KiB convolution buffers, the RK3588's 3 MiB CPU L3 the emulator's B passes
/// through on the board, most desktop L3s), so each run reads its B from DRAM, as a run of
/// another expert does.
const COLD_B_BYTES: usize = 32 << 20;

/// The rows of a quick check: far enough apart that the time's growth with M stands out of the
/// noise of a loaded machine, for the line `ork-probe model` fits to them.
const QUICK_RUN_ROWS: [usize; 2] = [16, 128];

const SYNC_BYTES: [usize; 5] = [4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20];

/// Each copying thread's buffer: beyond the CPU caches (an RK3588 has 3 MiB of L3).
const COPY_BYTES: usize = 32 << 20;

/// One run of `m × k × n` on `cores` NPU cores, median µs, its B cold: not the B of the run
/// before it.
pub struct RunRow {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub cores: usize,
    pub us: f64,
}

pub struct SyncRow {
    pub bytes: usize,
    pub core_type: &'static str,
    pub us: f64,
}

/// GB/s read + written: together (`cpu`, `npu`, their sum) and each alone.
#[derive(Default)]
pub struct Concurrent {
    pub cpu: f64,
    pub npu: f64,
    pub cpu_alone: f64,
    pub npu_alone: f64,
    pub copying_cpus: usize,
    /// Every streamed GEMM's last result equalled the reference.
    pub exact: bool,
}

/// One interval of the sustained run.
pub struct ThermalSample {
    pub t_s: f64,
    pub tops: f64,
    pub zones: Vec<(String, f64)>,
}

#[derive(Default)]
pub struct Deciding {
    pub runs: Vec<RunRow>,
    pub syncs: Vec<SyncRow>,
    pub concurrent: Concurrent,
    pub dmc_governor: String,
    pub thermal: Vec<ThermalSample>,
    /// The concurrent and the sustained runs' results equalled the reference (the runs against
    /// M are checks of their own).
    pub exact: bool,
}

impl Deciding {
    /// The profile's fields.
    pub fn fields(&self) -> Vec<(&'static str, Value)> {
        let c = &self.concurrent;
        let runs: Vec<Value> = self
            .runs
            .iter()
            .map(|r| {
                json!({"m": r.m as f64, "k": r.k as f64, "n": r.n as f64,
                       "cores": r.cores as f64, "us": r.us})
            })
            .collect();
        let syncs: Vec<Value> = self
            .syncs
            .iter()
            .map(|s| json!({"bytes": s.bytes as f64, "core_type": s.core_type, "us": s.us}))
            .collect();
        let thermal: Vec<Value> = self
            .thermal
            .iter()
            .map(|t| {
                let zones: serde_json::Map<String, Value> =
                    t.zones.iter().map(|(z, c)| (z.clone(), json!(c))).collect();
                json!({"t_s": t.t_s, "tops": t.tops, "celsius": zones})
            })
            .collect();
        vec![
            (
                "dram_gbps_cpu_npu_concurrent",
                json!({"total": c.cpu + c.npu, "cpu": c.cpu, "npu": c.npu,
                       "cpu_alone": c.cpu_alone, "npu_alone": c.npu_alone,
                       "copying_cpus": c.copying_cpus as f64}),
            ),
            ("run_us_vs_m", json!(runs)),
            ("sync_us_vs_bytes", json!(syncs)),
            ("dmc_governor", json!(self.dmc_governor)),
            ("thermal", json!(thermal)),
        ]
    }

    /// The lines of the text report.
    pub fn print(&self) {
        let c = &self.concurrent;
        println!(
            "DRAM, CPUs ({} copying) and NPU together: {:.2} GB/s ({:.2} CPU + {:.2} NPU); alone \
             {:.2} CPU, {:.2} NPU; DMC governor {}",
            c.copying_cpus,
            c.cpu + c.npu,
            c.cpu,
            c.npu,
            c.cpu_alone,
            c.npu_alone,
            self.dmc_governor
        );
        println!("run time against M (µs, median; cores 1 and all):");
        for r in &self.runs {
            println!(
                "  M={:<5} K={:<5} N={:<5} cores {} {:>10.1}",
                r.m, r.k, r.n, r.cores, r.us
            );
        }
        let syncs: Vec<String> = self
            .syncs
            .iter()
            .map(|s| format!("{} B {} {:.1} µs", s.bytes, s.core_type, s.us))
            .collect();
        println!("sync against size: {}", syncs.join("; "));
        if !self.thermal.is_empty() {
            println!("sustained run (t s, TOPS, hottest zone °C):");
            for t in &self.thermal {
                let hot = t.zones.iter().map(|z| z.1).fold(f64::NAN, f64::max);
                println!("  {:>6.0} {:>8.3} {:>6.1}", t.t_s, t.tops, hot);
            }
        }
    }
}

/// Every deciding quantity; `memory` is the check's memory report (the DMC's files).
pub fn measure(
    dev: &Device,
    cores: &[usize],
    cpus: &Cpus,
    memory: &[(String, String)],
    effort: Effort,
    sustained: bool,
    f: &mut Findings,
) -> Result<Deciding, String> {
    let runs = runs_vs_m(dev, cores, effort, f)?;
    let syncs = syncs_vs_bytes(dev, cpus, effort)?;
    let concurrent = concurrent(dev, cpus, effort, f)?;
    let (thermal, sustained_exact) = if sustained {
        sustained_run(dev)?
    } else {
        (Vec::new(), true)
    };
    Ok(Deciding {
        runs,
        syncs,
        exact: concurrent.exact && sustained_exact,
        concurrent,
        dmc_governor: dmc(memory, f),
        thermal,
    })
}

fn runs_vs_m(
    dev: &Device,
    cores: &[usize],
    effort: Effort,
    f: &mut Findings,
) -> Result<Vec<RunRow>, String> {
    let rows: &[usize] = if effort.quick {
        &QUICK_RUN_ROWS
    } else {
        &RUN_ROWS
    };
    let shapes = &RUN_SHAPES[..effort.pick(2, RUN_SHAPES.len())];
    let mut masks: Vec<(usize, Option<CoreMask>)> = vec![(1, Some(on_core(cores[0])))];
    if cores.len() > 1 {
        masks.push((cores.len(), None));
    }
    let reps = Repeats {
        warmup: 1,
        timed: effort.pick(3, 5),
    };
    let mut out = Vec::new();
    for &(role, k, n) in shapes {
        for &m in rows {
            // At least two, so no run follows a run of its own B.
            let copies = COLD_B_BYTES.div_ceil(k * n).max(2);
            let mut g = Gemm::with_b_copies(dev, m, k, n, 40 + m as u64, copies)?;
            for &(count, mask) in &masks {
                let (t, _, exact) = g.timed(dev, mask, reps)?;
                let primitive = format!("run_i8 {count} core(s)");
                f.checks
                    .push(g.check(&format!("run vs M {role}"), primitive, &t, exact));
                out.push(RunRow {
                    m,
                    k,
                    n,
                    cores: count,
                    us: us(&t),
                });
            }
        }
    }
    Ok(out)
}

/// Syncs of buffers the CPU just wrote, from a thread on a big core and on a little one.
fn syncs_vs_bytes(dev: &Device, cpus: &Cpus, effort: Effort) -> Result<Vec<SyncRow>, String> {
    let sizes: Vec<usize> = if effort.quick {
        vec![SYNC_BYTES[0], SYNC_BYTES[2]]
    } else {
        SYNC_BYTES.to_vec()
    };
    let mut on = vec![("big", cpus.big().cpus[0])];
    if let Some(l) = cpus.little() {
        on.push(("little", l.cpus[0]));
    }
    let mut out = Vec::new();
    let measured = (|| {
        for (core_type, cpu) in on {
            pin(cpu)?;
            for &bytes in &sizes {
                let us = sync_time(dev, bytes, effort.pick(3, 9))?;
                out.push(SyncRow {
                    bytes,
                    core_type,
                    us,
                });
            }
        }
        Ok::<(), String>(())
    })();
    pin_current_thread(&allowed_cpus())?;
    measured.map(|()| out)
}

/// Copying threads on `cpus` until `stop`, each adding the bytes it read and wrote to `moved`.
fn copy_until<'scope>(
    cpus: &[usize],
    stop: &'scope AtomicBool,
    moved: &'scope AtomicU64,
    s: &'scope std::thread::Scope<'scope, '_>,
) {
    for &cpu in cpus {
        s.spawn(move || {
            // A thread that cannot pin still copies: the figure is then less sharp, not wrong.
            let _ = pin(cpu);
            let src = vec![1u8; COPY_BYTES];
            let mut dst = vec![0u8; COPY_BYTES];
            while !stop.load(Ordering::Relaxed) {
                dst.copy_from_slice(black_box(&src));
                black_box(&dst);
                moved.fetch_add(2 * COPY_BYTES as u64, Ordering::Relaxed);
            }
        });
    }
}

/// Runs of M=32 at the expert shape, B resident, on the device's cores for `window`: GB/s.
fn npu_stream(dev: &Device, gemms: &mut [Gemm], window: Duration) -> Result<f64, String> {
    let start = Instant::now();
    let mut bytes = 0u64;
    let mut i = 0;
    while start.elapsed() < window {
        bytes += gemms[i % gemms.len()].submit(dev, None)?.bytes;
        i += 1;
    }
    Ok(bytes as f64 / start.elapsed().as_secs_f64() / 1e9)
}

/// CPU GB/s of `cpus` copying during `during`.
fn cpu_stream<R>(cpus: &[usize], during: impl FnOnce() -> R) -> (f64, R) {
    let stop = AtomicBool::new(false);
    let moved = AtomicU64::new(0);
    std::thread::scope(|s| {
        copy_until(cpus, &stop, &moved, s);
        // Every thread has its buffers before the counting starts.
        std::thread::sleep(Duration::from_millis(50));
        let (m0, t0) = (moved.load(Ordering::Relaxed), Instant::now());
        let r = during();
        let (m1, t1) = (moved.load(Ordering::Relaxed), Instant::now());
        stop.store(true, Ordering::Relaxed);
        let gbps = (m1 - m0) as f64 / (t1 - t0).as_secs_f64() / 1e9;
        (gbps, r)
    })
}

/// The CPUs (all but the submitter's) and the NPU streaming alone and together.
fn concurrent(
    dev: &Device,
    cpus: &Cpus,
    effort: Effort,
    f: &mut Findings,
) -> Result<Concurrent, String> {
    let submitter = cpus.big().cpus[0];
    let copiers: Vec<usize> = cpus.all().into_iter().filter(|&c| c != submitter).collect();
    let mut gemms = (0..effort.pick(2, 8))
        .map(|i| Gemm::new(dev, 32, 2048, 768, 60 + i as u64))
        .collect::<Result<Vec<_>, _>>()?;
    let window = Duration::from_millis(effort.pick(200, 3000) as u64);
    pin(submitter)?;
    let measured = (|| {
        let npu_alone = npu_stream(dev, &mut gemms, window)?;
        let (cpu_alone, ()) = cpu_stream(&copiers, || std::thread::sleep(window));
        let (cpu, npu) = cpu_stream(&copiers, || npu_stream(dev, &mut gemms, window));
        Ok::<_, String>(Concurrent {
            cpu,
            npu: npu?,
            cpu_alone,
            npu_alone,
            copying_cpus: copiers.len(),
            exact: true,
        })
    })();
    pin_current_thread(&allowed_cpus())?;
    let mut c = measured?;
    for g in &mut gemms {
        c.exact &= g.exact()?;
    }
    if !copiers.is_empty() {
        f.set(
            "shared_dram_gbps",
            c.cpu + c.npu,
            format!(
                "M=32 K=2048 N=768 runs on the NPU's cores, B resident, while {} CPUs copy {} MiB \
                 each: CPU and NPU bytes read + written per second together",
                copiers.len(),
                COPY_BYTES >> 20
            ),
        );
    }
    eprintln!(
        "board: DRAM together {:.2} GB/s ({:.2} CPU + {:.2} NPU)",
        c.cpu + c.npu,
        c.cpu,
        c.npu
    );
    Ok(c)
}

/// The DMC governor, and its frequency as `dmc_mhz`.
fn dmc(memory: &[(String, String)], f: &mut Findings) -> String {
    let get = |k: &str| memory.iter().find(|(key, _)| key == k).map(|(_, v)| v);
    let hz = get("dmc_cur_freq").and_then(|v| v.parse::<f64>().ok());
    match hz {
        Some(hz) => f.set(
            "dmc_mhz",
            hz / 1e6,
            "cur_freq of the DMC devfreq device while the check ran",
        ),
        None => f.keep(
            "dmc_mhz",
            "no readable DMC devfreq cur_freq on this machine (memory clock not exposed)",
        ),
    }
    get("dmc_governor")
        .cloned()
        .unwrap_or_else(|| get("dmc").cloned().unwrap_or_else(|| "unknown".to_string()))
}

/// The thermal zones' temperatures (°C), by zone type.
fn thermal_zones() -> Vec<(String, f64)> {
    let mut out = Vec::new();
    let zones = std::fs::read_dir("/sys/class/thermal")
        .into_iter()
        .flatten();
    for z in zones.flatten() {
        let path = z.path();
        let read = |f: &str| std::fs::read_to_string(path.join(f)).ok();
        if let (Some(name), Some(milli)) = (read("type"), read("temp")) {
            if let Ok(m) = milli.trim().parse::<f64>() {
                out.push((name.trim().to_string(), m / 1e3));
            }
        }
    }
    out
}

/// Five minutes of M=128 gate/up runs on the device's cores, sampled every ten seconds; and
/// whether the last result was exact.
fn sustained_run(dev: &Device) -> Result<(Vec<ThermalSample>, bool), String> {
    let (total, every) = (Duration::from_secs(300), Duration::from_secs(10));
    let mut g = Gemm::new(dev, 128, 2048, 768, 80)?;
    let start = Instant::now();
    let mut out = Vec::new();
    while start.elapsed() < total {
        let t0 = Instant::now();
        let mut runs = 0u64;
        while t0.elapsed() < every {
            g.submit(dev, None)?;
            runs += 1;
        }
        let tops = 2.0 * g.macs() * runs as f64 / t0.elapsed().as_secs_f64() / 1e12;
        out.push(ThermalSample {
            t_s: start.elapsed().as_secs_f64(),
            tops,
            zones: thermal_zones(),
        });
        eprintln!(
            "board: sustained {:.0} s: {tops:.3} TOPS",
            start.elapsed().as_secs_f64()
        );
    }
    Ok((out, g.exact()?))
}
