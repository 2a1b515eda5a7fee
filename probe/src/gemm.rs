//! `ork-probe gemm`: the NPU backend (`ORK_BACKEND`) against the CPU int8 GEMM on one thread and
//! on all of them, at the A3B expert shapes, checked bit for bit against the reference.
//!
//! The NPU primitive is the one the engine would use: a stream (of this one GEMM) inside the
//! stream envelope (K % 512 == 0, K <= 4096), `run_i8` otherwise. Times are medians of wall
//! time per GEMM; on the emulator the table adds the cost model's RK3588 time, which is
//! modelled, not measured (the JSON carries measured fields only).

use super::bench::time;
use super::json::{self, fixed};
use super::options::Options;
use ork_moe::gemm::{self, Shape};
use ork_moe::isa::Isa;
use ork_moe::layout::Tiles;
use ork_moe::moe::Config;
use ork_moe::npu::{flags, Buffer, Device, MatMul, Primitive, Report};
use ork_moe::npu::{BackendChoice, DeviceConfig};
use ork_moe::testutil::Rng;
use serde_json::json;
use std::process::ExitCode;

const WARMUP: usize = 1;
const REPEATS: usize = 5;

/// One GEMM measured on the NPU backend and on the CPU (times in µs).
pub struct Row {
    pub k: usize,
    pub n: usize,
    pub m: usize,
    pub primitive: Primitive,
    pub npu_us: f64,
    /// Fastest and slowest NPU run.
    pub npu_spread_us: (f64, f64),
    /// The emulator's cost model of the RK3588 (never a measurement); `None` on other backends.
    pub modelled_us: Option<f64>,
    pub cpu1_us: f64,
    pub cpun_us: f64,
    /// NPU, CPU 1-thread and CPU all-threads results all equal the reference GEMM.
    pub bit_exact: bool,
}

/// Warm-up runs and timed repeats of each measurement.
#[derive(Clone, Copy)]
pub struct Repeats {
    pub warmup: usize,
    pub timed: usize,
}

/// A, B and C of one GEMM.
type Operands = (Buffer<i8>, Buffer<i8>, Buffer<i32>);

/// Buffers of one GEMM on `dev`, filled and synced.
pub fn upload(dev: &Device, a: &[i8], b: &[i8], c_len: usize) -> Result<Operands, String> {
    let e = |e: ork_moe::npu::Error| e.to_string();
    let mut ab = dev.alloc::<i8>(a.len(), flags::CPU_FILLED, 0).map_err(e)?;
    ab.write(0, a).map_err(e)?;
    ab.sync_to_device().map_err(e)?;
    let mut bb = dev.alloc::<i8>(b.len(), flags::CPU_FILLED, 0).map_err(e)?;
    bb.write(0, b).map_err(e)?;
    bb.sync_to_device().map_err(e)?;
    let cb = dev.alloc::<i32>(c_len, flags::CPU_FILLED, 0).map_err(e)?;
    Ok((ab, bb, cb))
}

/// One submit of `primitive` plus the sync that makes C visible to the CPU.
fn submit(
    dev: &Device,
    primitive: Primitive,
    mm: MatMul,
    c: &mut Buffer<i32>,
) -> Result<Report, String> {
    let report = match primitive {
        Primitive::StreamI8 => dev.run_stream_i8(vec![mm], c),
        _ => dev.run_i8(mm, c),
    }
    .map_err(|e| e.to_string())?;
    c.sync_from_device().map_err(|e| e.to_string())?;
    Ok(report)
}

/// [`measure_operands`] on random operands of a K × N GEMM with `m` rows.
pub fn measure(
    npu: &Device,
    cpu: &Device,
    isa: Isa,
    (k, n, m): (usize, usize, usize),
    reps: Repeats,
) -> Result<Row, String> {
    let t = npu.tiles();
    let mut rng = Rng::new((k * 131 + n * 7 + m) as u64);
    let mut a = vec![0i8; t.a_len(m, t.pad(k))];
    let mut b = vec![0i8; t.b_len(t.pad(k), t.pad(n))];
    rng.fill_i8(&mut a);
    rng.fill_i8(&mut b);
    measure_operands(npu, cpu, isa, (k, n, m), &a, &b, reps)
}

/// Measures `C = A·B` for native `a` (`m` rows) and native `b` (padded `k` × `n`) on the NPU
/// backend (the primitive the engine would pick), on one CPU thread and on all of them.
pub fn measure_operands(
    npu: &Device,
    cpu: &Device,
    isa: Isa,
    (k, n, m): (usize, usize, usize),
    a: &[i8],
    b: &[i8],
    reps: Repeats,
) -> Result<Row, String> {
    let t = npu.tiles();
    let shape = Shape {
        m,
        kp: t.pad(k),
        np: t.pad(n),
    };
    let mut expected = vec![0i32; t.c_len(m, shape.np)];
    gemm::reference(&t, shape, a, b, &mut expected);

    let in_stream = ork_moe::npu::in_stream_envelope(t.pad(k));
    let primitive = if in_stream {
        Primitive::StreamI8
    } else {
        Primitive::RunI8
    };
    let matmul = |a, b| MatMul {
        m,
        k: shape.kp,
        n: shape.np,
        a,
        a_offset: 0,
        b,
        b_offset: 0,
        c_offset: 0,
    };

    let (na, nb, mut nc) = upload(npu, a, b, expected.len())?;
    let report = submit(npu, primitive, matmul(&na, &nb), &mut nc)?;
    let bit_exact = nc.as_slice() == &expected[..];
    let mut failure = None;
    let npu_t = time(reps.warmup, reps.timed, || {
        if let Err(e) = submit(npu, primitive, matmul(&na, &nb), &mut nc) {
            failure.get_or_insert(e);
        }
    });
    if let Some(e) = failure {
        return Err(e);
    }
    // The last timed run's result too: a backend that goes wrong after its first runs is caught.
    nc.sync_from_device().map_err(|e| e.to_string())?;
    let bit_exact = bit_exact && nc.as_slice() == &expected[..];

    let mut c1 = vec![0i32; expected.len()];
    let cpu1_t = time(reps.warmup, reps.timed, || {
        gemm::gemm_isa(isa, &Tiles::RK3588, shape, a, b, &mut c1)
    });

    let (ca, cb, mut cc) = upload(cpu, a, b, expected.len())?;
    let cpun_t = time(reps.warmup, reps.timed, || {
        if let Err(e) = cpu.run_i8(matmul(&ca, &cb), &mut cc) {
            failure.get_or_insert(e.to_string());
        }
    });
    if let Some(e) = failure {
        return Err(e);
    }
    let cpu_exact = c1 == expected && cc.as_slice() == &expected[..];
    Ok(Row {
        k,
        n,
        m,
        primitive,
        npu_us: npu_t.median * 1e6,
        npu_spread_us: (npu_t.min * 1e6, npu_t.max * 1e6),
        modelled_us: report.modelled_us,
        cpu1_us: cpu1_t.median * 1e6,
        cpun_us: cpun_t.median * 1e6,
        bit_exact: bit_exact && cpu_exact,
    })
}

pub fn run(opts: &Options, cfg: &Config) -> Result<ExitCode, String> {
    let (npu, cpu) = devices(cfg)?;
    let isa = cfg.device.host.isa;
    let backend = npu.backend().name();
    let mut rows = Vec::new();
    for (k, n) in opts.shapes() {
        for m in opts.rows() {
            let reps = Repeats {
                warmup: WARMUP,
                timed: REPEATS,
            };
            rows.push(measure(&npu, &cpu, isa, (k, n, m), reps)?);
        }
    }
    if opts.json {
        json::print_rows(
            rows.iter()
                .map(|r| {
                    json!({
                        "backend": backend,
                        "k": r.k,
                        "n": r.n,
                        "m": r.m,
                        "primitive": r.primitive.name(),
                        "npu_us": fixed(r.npu_us),
                        "cpu1_us": fixed(r.cpu1_us),
                        "cpun_us": fixed(r.cpun_us),
                        "bit_exact": r.bit_exact,
                    })
                })
                .collect(),
        );
    } else {
        println!(
            "backend {backend}; CPU kernel threads: 1 and {}; times are medians of {REPEATS} runs (µs)",
            cfg.device.host.threads
        );
        println!(
            "{:>5} {:>5} {:>4}  {:<9} {:>10} {:>19} {:>16} {:>10} {:>10}  bit_exact",
            "k",
            "n",
            "m",
            "primitive",
            "npu_us",
            "npu_min-max",
            "rk3588_modelled",
            "cpu1_us",
            "cpun_us"
        );
        for r in &rows {
            let modelled = r
                .modelled_us
                .map_or("-".to_string(), |u| format!("{u:.1} (model)"));
            println!(
                "{:>5} {:>5} {:>4}  {:<9} {:>10.1} {:>19} {:>16} {:>10.1} {:>10.1}  {}",
                r.k,
                r.n,
                r.m,
                r.primitive.name(),
                r.npu_us,
                format!("{:.1}-{:.1}", r.npu_spread_us.0, r.npu_spread_us.1),
                modelled,
                r.cpu1_us,
                r.cpun_us,
                r.bit_exact
            );
        }
    }
    let all_exact = rows.iter().all(|r| r.bit_exact);
    Ok(if all_exact {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The configured NPU backend, and the `cpu` backend with the same kernel path and threads.
pub fn devices(cfg: &Config) -> Result<(Device, Device), String> {
    let npu = Device::open(&cfg.device).map_err(|e| e.to_string())?;
    let cpu_cfg = DeviceConfig {
        backend: BackendChoice::Cpu,
        ..cfg.device.clone()
    };
    let cpu = Device::open(&cpu_cfg).map_err(|e| e.to_string())?;
    Ok((npu, cpu))
}
