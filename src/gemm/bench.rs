//! Throughput of the int8 GEMM against the machine's int8 peak, for the probe and the ignored
//! benchmark test.
//!
//! The peak is measured, not taken from a data sheet: a loop of independent chains of the path's
//! int8 multiply-accumulate instruction, long enough for the latency to be hidden. Both numbers
//! are best-of-several timings on one thread, and count 2 operations per multiply-accumulate.
//! Single-thread figures are timed in the thread's CPU time, so that on a shared machine the slices
//! other processes take are not counted; multi-thread times are wall time.

use super::{gemm_isa, gemm_parallel, Shape};
use crate::isa::Isa;
use crate::layout::Tiles;
use crate::pool::Pool;
use crate::testutil::Rng;
use std::time::Instant;

/// The Qwen3-30B-A3B expert matmuls as (K, N): gate/up 2048→768, down 768→2048, and the same for a
/// wider model (4096→1408, 1408→4096).
pub const A3B_SHAPES: [(usize, usize); 4] = [(2048, 768), (768, 2048), (4096, 1408), (1408, 4096)];

/// Which clock a timing reads.
#[derive(Clone, Copy)]
enum Clock {
    Wall,
    /// CPU time of the calling thread.
    Thread,
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

/// Best time of `f` on `clock` over `repeats` runs after one warm-up run, in seconds.
fn best_of(clock: Clock, repeats: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..repeats.max(1))
        .map(|_| match clock {
            Clock::Wall => {
                let start = Instant::now();
                f();
                start.elapsed().as_secs_f64()
            }
            Clock::Thread => {
                let start = thread_cpu_seconds();
                f();
                thread_cpu_seconds() - start
            }
        })
        .fold(f64::INFINITY, f64::min)
}

/// Operands of one benchmark GEMM, made once and reused across timings.
pub struct Operands {
    pub shape: Shape,
    pub a: Vec<i8>,
    pub b: Vec<i8>,
    pub c: Vec<i32>,
}

impl Operands {
    /// Native operands for `m` rows of depth `k` and `n` output channels (padded as needed).
    pub fn new(m: usize, k: usize, n: usize) -> Operands {
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

    /// Multiply-accumulates of one GEMM.
    pub fn macs(&self) -> f64 {
        (self.shape.m * self.shape.kp * self.shape.np) as f64
    }

    /// Best wall time of one GEMM on `isa`, on the calling thread (`pool` None) or split over
    /// `pool`, in seconds.
    pub fn time(&mut self, isa: Isa, pool: Option<&Pool>, repeats: usize) -> f64 {
        let clock = Clock::Wall;
        let t = Tiles::RK3588;
        let Operands { shape, a, b, c } = self;
        match pool {
            None => best_of(clock, repeats, || gemm_isa(isa, &t, *shape, a, b, c)),
            Some(p) => best_of(clock, repeats, || {
                gemm_parallel(p, isa, &t, *shape, a, b, c)
            }),
        }
    }
}

/// Single-thread GOPS of the GEMM on `isa` for `m` × `k` × `n` (thread CPU time).
pub fn gemm_gops(isa: Isa, m: usize, k: usize, n: usize, repeats: usize) -> f64 {
    let mut ops = Operands::new(m, k, n);
    let t = Tiles::RK3588;
    let Operands { shape, a, b, c } = &mut ops;
    let secs = best_of(Clock::Thread, repeats, || {
        gemm_isa(isa, &t, *shape, a, b, c)
    });
    2.0 * ops.macs() / secs / 1e9
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
    let secs = best_of(Clock::Thread, 30, || macs = peak_loop(isa, iterations));
    Some(2.0 * macs / secs / 1e9)
}

/// Runs `iterations` of the path's instruction loop; returns the multiply-accumulates done.
fn peak_loop(isa: Isa, iterations: usize) -> f64 {
    match isa {
        // SAFETY (all arms): the path is available (checked by the caller), and the loops touch
        // only the registers they declare.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86_peak::vnni(iterations) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86_peak::avx2(iterations) },
        #[cfg(target_arch = "aarch64")]
        Isa::NeonDot => unsafe { arm_peak::sdot(iterations) },
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => unsafe { arm_peak::smull(iterations) },
        _ => unreachable!("no int8 peak loop for {}", isa.name()),
    }
}

#[cfg(target_arch = "x86_64")]
mod x86_peak {
    use std::arch::asm;

    /// 16 independent `vpdpbusd` chains (latency 5 covered even at 2 per cycle).
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub unsafe fn vnni(iterations: usize) -> f64 {
        // SAFETY: only the declared registers are used; the inputs' values do not matter.
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
        (iterations * 16 * 64) as f64
    }

    /// 5 independent chains of the classic AVX2 int8 step: `vpmaddubsw` (32 products into 16
    /// int16 pair sums), `vpmaddwd` by ones (into 8 int32), `vpaddd` into the accumulator.
    #[target_feature(enable = "avx2")]
    pub unsafe fn avx2(iterations: usize) -> f64 {
        // SAFETY: only the declared registers are used; the inputs' values do not matter.
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
        (iterations * 5 * 32) as f64
    }
}

#[cfg(target_arch = "aarch64")]
mod arm_peak {
    use std::arch::asm;

    /// 16 independent `sdot` chains.
    #[target_feature(enable = "dotprod")]
    pub unsafe fn sdot(iterations: usize) -> f64 {
        // SAFETY: only the declared registers are used; the inputs' values do not matter.
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
        (iterations * 16 * 16) as f64
    }

    /// 4 independent chains of the classic NEON int8 step without dot product: `smull` and
    /// `smlal2` (16 products into 8 int16) then `sadalp` into int32.
    pub unsafe fn smull(iterations: usize) -> f64 {
        // SAFETY: only the declared registers are used; the inputs' values do not matter.
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
        (iterations * 4 * 16) as f64
    }
}
