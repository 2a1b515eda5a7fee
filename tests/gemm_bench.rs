//! Benchmark, not a test (ignored; prints numbers, asserts nothing about time):
//!
//!     cargo test --release --test gemm_bench -- --ignored --nocapture
//!
//! Single-thread GOPS of every int8 GEMM path at the A3B expert shapes against that path's
//! instruction peak. `ORK_BENCH_PATHS=avx512,avx2` limits the paths. The whole set is measured
//! `ORK_BENCH_ROUNDS` times (default 3) and each number is the best round's: on a shared machine a
//! neighbour's burst can slow one round down for seconds.

use ork_moe::gemm::bench::{gemm_gops, peak_gops, peak_instruction, A3B_SHAPES};
use ork_moe::isa::Isa;

const ROWS: [usize; 5] = [8, 16, 32, 64, 128];

#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn bench_gemm_single_thread_vs_int8_peak() {
    let wanted: Option<Vec<Isa>> = std::env::var("ORK_BENCH_PATHS")
        .ok()
        .map(|v| v.split(',').filter_map(Isa::from_name).collect());
    let rounds: usize = std::env::var("ORK_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let paths = Isa::available()
        .into_iter()
        .filter(|isa| peak_instruction(*isa).is_some())
        .filter(|isa| wanted.as_ref().is_none_or(|w| w.contains(isa)));
    for isa in paths {
        let mut peak = 0f64;
        let mut gops = vec![0f64; A3B_SHAPES.len() * ROWS.len()];
        for _ in 0..rounds.max(1) {
            peak = peak.max(peak_gops(isa).expect("paths with a peak instruction"));
            let cells = A3B_SHAPES.iter().flat_map(|&kn| ROWS.map(|m| (kn, m)));
            for (best, ((k, n), m)) in gops.iter_mut().zip(cells) {
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
        let cells = A3B_SHAPES.iter().flat_map(|&kn| ROWS.map(|m| (kn, m)));
        for (g, ((k, n), m)) in gops.iter().zip(cells) {
            println!("{k:>5} {n:>5} {m:>4} {g:>8.1} {:>6.1}%", 100.0 * g / peak);
        }
    }
}
