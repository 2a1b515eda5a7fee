//! `ork-probe peak`: single-thread throughput of every int8 GEMM path at the A3B expert shapes
//! against that path's int8 peak (a benchmark: it prints numbers and asserts nothing about time).
//!
//! The peak is measured, not taken from a data sheet: a loop of independent chains of the path's
//! int8 multiply-accumulate instruction, long enough for the latency to be hidden. Both numbers
//! are best-of-several timings on one thread, and count 2 operations per multiply-accumulate.
//! Single-thread figures are timed in the thread's CPU time, so that on a shared machine the slices
//! other processes take are not counted; multi-thread times are wall time.

use super::options::Options;
use ork_moe::gemm::{gemm_isa, Shape};
use ork_moe::isa::Isa;
use ork_moe::layout::Tiles;
use ork_moe::moe::Config;
use ork_moe::testutil::Rng;
use std::process::ExitCode;

/// Rows per expert of the table.
const ROWS: [usize; 5] = [8, 16, 32, 64, 128];

/// Operands of one benchmark GEMM.
struct Operands {
    shape: Shape,
    a: Vec<i8>,
    b: Vec<i8>,
    c: Vec<i32>,
}

impl Operands {
    /// Native operands for `m` rows of depth `k` and `n` output channels (padded as needed).
    fn new(m: usize, k: usize, n: usize) -> Operands {
        let t = Tiles::RK3588;
        let mut rng = Rng::new(1);
        let mut random = |len| {
            let mut v = vec![0; len];
            rng.fill_i8(&mut v);
            v
        };
        let shape = Shape {
            m,
            kp: t.pad(k),
            np: t.pad(n),
        };
        Operands {
            shape,
            a: random(t.a_len(m, shape.kp)),
            b: random(t.b_len(shape.kp, shape.np)),
            c: vec![0; t.c_len(m, shape.np)],
        }
    }
}

fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_THREAD_CPUTIME_ID exists on every Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Best thread CPU time of `f` over `repeats` runs after one warm-up run, in seconds: on a shared
/// machine the slices other processes take are not counted.
fn best_of(repeats: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..repeats.max(1))
        .map(|_| {
            let start = thread_cpu_seconds();
            f();
            thread_cpu_seconds() - start
        })
        .fold(f64::INFINITY, f64::min)
}

/// Single-thread GOPS of the GEMM on `isa` for `m` × `k` × `n` (thread CPU time).
pub fn gemm_gops(isa: Isa, m: usize, k: usize, n: usize, repeats: usize) -> f64 {
    let Operands { shape, a, b, mut c } = Operands::new(m, k, n);
    let t = Tiles::RK3588;
    let secs = best_of(repeats, || gemm_isa(isa, &t, shape, &a, &b, &mut c));
    let macs = (shape.m * shape.kp * shape.np) as f64;
    2.0 * macs / secs / 1e9
}

/// The int8 instruction each path's peak is measured with.
pub fn peak_instruction(isa: Isa) -> Option<&'static str> {
    match isa {
        Isa::Avx512 => Some("vpdpbusd zmm"),
        Isa::Avx2 => Some("vpmaddubsw+vpmaddwd+vpaddd ymm"),
        Isa::NeonDot => Some("sdot v.4s"),
        Isa::Neon => Some("smull+smlal2+sadalp v.8h"),
        _ => None,
    }
}

/// Single-thread int8 peak of `isa` in GOPS (thread CPU time) (None for paths without an int8 multiply-add).
pub fn peak_gops(isa: Isa) -> Option<f64> {
    peak_instruction(isa)?;
    assert!(
        isa.is_available(),
        "kernel path {} is not available on this CPU",
        isa.name()
    );
    let iterations = 1 << 17;
    let mut macs = 0.0;
    let secs = best_of(30, || macs = peak_loop(isa, iterations));
    Some(2.0 * macs / secs / 1e9)
}

/// Runs `iterations` of the path's instruction loop; returns the multiply-accumulates done.
fn peak_loop(isa: Isa, iterations: usize) -> f64 {
    // In every arm the path is available (checked by the caller), and the loops touch only the
    // registers they declare.
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx512 => unsafe { x86_peak::vnni(iterations) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Isa::Avx2 => unsafe { x86_peak::avx2(iterations) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: as above.
        Isa::NeonDot => unsafe { arm_peak::sdot(iterations) },
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => arm_peak::smull(iterations),
        _ => unreachable!("no int8 peak loop for {}", isa.name()),
    }
}

#[cfg(target_arch = "x86_64")]
mod x86_peak {
    use std::arch::asm;

    /// 16 independent `vpdpbusd` chains (latency 5 covered even at 2 per cycle), `iterations`
    /// (at least 1) rounds.
    ///
    /// # Safety
    /// The CPU has AVX-512 F and VNNI.
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub unsafe fn vnni(iterations: usize) -> f64 {
        // SAFETY: this function's features; only the declared registers are used, and the
        // inputs' values do not matter.
        unsafe {
            asm!(
                "2:",
                "vpdpbusd zmm0, zmm16, zmm17", "vpdpbusd zmm1, zmm16, zmm17",
                "vpdpbusd zmm2, zmm16, zmm17", "vpdpbusd zmm3, zmm16, zmm17",
                "vpdpbusd zmm4, zmm16, zmm17", "vpdpbusd zmm5, zmm16, zmm17",
                "vpdpbusd zmm6, zmm16, zmm17", "vpdpbusd zmm7, zmm16, zmm17",
                "vpdpbusd zmm8, zmm16, zmm17", "vpdpbusd zmm9, zmm16, zmm17",
                "vpdpbusd zmm10, zmm16, zmm17", "vpdpbusd zmm11, zmm16, zmm17",
                "vpdpbusd zmm12, zmm16, zmm17", "vpdpbusd zmm13, zmm16, zmm17",
                "vpdpbusd zmm14, zmm16, zmm17", "vpdpbusd zmm15, zmm16, zmm17",
                "dec {n}",
                "jnz 2b",
                n = inout(reg) iterations => _,
                out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
                out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _,
                out("zmm16") _, out("zmm17") _,
                options(nomem, nostack),
            );
        }
        (iterations * 16 * 64) as f64
    }

    /// 5 independent chains of the classic AVX2 int8 step: `vpmaddubsw` (32 products into 16
    /// int16 pair sums), `vpmaddwd` by ones (into 8 int32), `vpaddd` into the accumulator;
    /// `iterations` (at least 1) rounds.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub unsafe fn avx2(iterations: usize) -> f64 {
        // SAFETY: this function's features; only the declared registers are used, and the
        // inputs' values do not matter.
        unsafe {
            asm!(
                "2:",
                "vpmaddubsw ymm0, ymm13, ymm14", "vpmaddubsw ymm1, ymm13, ymm14",
                "vpmaddubsw ymm2, ymm13, ymm14", "vpmaddubsw ymm3, ymm13, ymm14",
                "vpmaddubsw ymm4, ymm13, ymm14",
                "vpmaddwd ymm0, ymm0, ymm15", "vpmaddwd ymm1, ymm1, ymm15",
                "vpmaddwd ymm2, ymm2, ymm15", "vpmaddwd ymm3, ymm3, ymm15",
                "vpmaddwd ymm4, ymm4, ymm15",
                "vpaddd ymm5, ymm5, ymm0", "vpaddd ymm6, ymm6, ymm1",
                "vpaddd ymm7, ymm7, ymm2", "vpaddd ymm8, ymm8, ymm3",
                "vpaddd ymm9, ymm9, ymm4",
                "dec {n}",
                "jnz 2b",
                n = inout(reg) iterations => _,
                out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _,
                out("ymm5") _, out("ymm6") _, out("ymm7") _, out("ymm8") _, out("ymm9") _,
                out("ymm13") _, out("ymm14") _, out("ymm15") _,
                options(nomem, nostack),
            );
        }
        (iterations * 5 * 32) as f64
    }
}

#[cfg(target_arch = "aarch64")]
mod arm_peak {
    use std::arch::asm;

    /// 16 independent `sdot` chains, `iterations` (at least 1) rounds.
    ///
    /// # Safety
    /// The CPU has the dot-product extension.
    #[target_feature(enable = "dotprod")]
    pub unsafe fn sdot(iterations: usize) -> f64 {
        // SAFETY: this function's features; only the declared registers are used, and the
        // inputs' values do not matter.
        unsafe {
            asm!(
                "2:",
                "sdot v0.4s, v16.16b, v17.16b", "sdot v1.4s, v16.16b, v17.16b",
                "sdot v2.4s, v16.16b, v17.16b", "sdot v3.4s, v16.16b, v17.16b",
                "sdot v4.4s, v16.16b, v17.16b", "sdot v5.4s, v16.16b, v17.16b",
                "sdot v6.4s, v16.16b, v17.16b", "sdot v7.4s, v16.16b, v17.16b",
                "sdot v8.4s, v16.16b, v17.16b", "sdot v9.4s, v16.16b, v17.16b",
                "sdot v10.4s, v16.16b, v17.16b", "sdot v11.4s, v16.16b, v17.16b",
                "sdot v12.4s, v16.16b, v17.16b", "sdot v13.4s, v16.16b, v17.16b",
                "sdot v14.4s, v16.16b, v17.16b", "sdot v15.4s, v16.16b, v17.16b",
                "subs {n}, {n}, #1",
                "b.ne 2b",
                n = inout(reg) iterations => _,
                out("v0") _, out("v1") _, out("v2") _, out("v3") _,
                out("v4") _, out("v5") _, out("v6") _, out("v7") _,
                out("v8") _, out("v9") _, out("v10") _, out("v11") _,
                out("v12") _, out("v13") _, out("v14") _, out("v15") _,
                out("v16") _, out("v17") _,
                options(nomem, nostack),
            );
        }
        (iterations * 16 * 16) as f64
    }

    /// 4 independent chains of the classic NEON int8 step without dot product: `smull` and
    /// `smlal2` (16 products into 8 int16) then `sadalp` into int32; `iterations` (at least 1)
    /// rounds.
    pub fn smull(iterations: usize) -> f64 {
        // SAFETY: Advanced SIMD is part of every aarch64 CPU; only the declared registers are
        // used, and the inputs' values do not matter.
        unsafe {
            asm!(
                "2:",
                "smull v0.8h, v16.8b, v17.8b", "smull v1.8h, v16.8b, v17.8b",
                "smull v2.8h, v16.8b, v17.8b", "smull v3.8h, v16.8b, v17.8b",
                "smlal2 v0.8h, v16.16b, v17.16b", "smlal2 v1.8h, v16.16b, v17.16b",
                "smlal2 v2.8h, v16.16b, v17.16b", "smlal2 v3.8h, v16.16b, v17.16b",
                "sadalp v4.4s, v0.8h", "sadalp v5.4s, v1.8h",
                "sadalp v6.4s, v2.8h", "sadalp v7.4s, v3.8h",
                "subs {n}, {n}, #1",
                "b.ne 2b",
                n = inout(reg) iterations => _,
                out("v0") _, out("v1") _, out("v2") _, out("v3") _,
                out("v4") _, out("v5") _, out("v6") _, out("v7") _,
                out("v16") _, out("v17") _,
                options(nomem, nostack),
            );
        }
        (iterations * 4 * 16) as f64
    }
}

/// `ork-probe peak`: every path with an int8 peak instruction (or `--paths`), each number the best
/// of `--rounds` (default 3) measurements of the whole set: on a shared machine a neighbour's
/// burst can slow one round down for seconds.
pub fn run(opts: &Options, _cfg: &Config) -> Result<ExitCode, String> {
    let rounds = opts.rounds.unwrap_or(if opts.quick { 1 } else { 3 });
    let shapes = opts.shapes();
    let rows = opts.m.clone().unwrap_or_else(|| ROWS.to_vec());
    let paths = Isa::available()
        .into_iter()
        .filter(|isa| peak_instruction(*isa).is_some())
        .filter(|isa| opts.paths.as_ref().is_none_or(|w| w.contains(isa)));
    let cells: Vec<(usize, usize, usize)> = shapes
        .iter()
        .flat_map(|&(k, n)| rows.iter().map(move |&m| (k, n, m)))
        .collect();
    for isa in paths {
        let mut peak = 0f64;
        let mut gops = vec![0f64; cells.len()];
        for _ in 0..rounds.max(1) {
            peak = peak.max(peak_gops(isa).expect("paths with a peak instruction"));
            for (best, &(k, n, m)) in gops.iter_mut().zip(&cells) {
                *best = best.max(gemm_gops(isa, m, k, n, 40));
            }
        }
        let instruction = peak_instruction(isa).unwrap_or("");
        println!(
            "\n{}: peak {peak:.1} GOPS ({instruction}, 1 thread)",
            isa.name()
        );
        println!(
            "{:>5} {:>5} {:>4} {:>8} {:>7}",
            "K", "N", "M", "GOPS", "%peak"
        );
        for (g, (k, n, m)) in gops.iter().zip(&cells) {
            println!("{k:>5} {n:>5} {m:>4} {g:>8.1} {:>6.1}%", 100.0 * g / peak);
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measurements_run_on_every_path() {
        // The instruction loops must run (no SIGILL) wherever the path exists.
        for isa in Isa::available() {
            match peak_instruction(isa) {
                Some(_) => assert!(peak_gops(isa).is_some_and(|g| g.is_finite() && g > 0.0)),
                None => assert!(peak_gops(isa).is_none()),
            }
            let gops = gemm_gops(isa, 3, 64, 40, 1);
            assert!(gops.is_finite() && gops > 0.0, "{}", isa.name());
        }
    }
}
