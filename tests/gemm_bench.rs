//! Benchmark, not a test (ignored; prints numbers, asserts nothing about time):
//!
//!     cargo test --release --test gemm_bench -- --ignored --nocapture
//!
//! Single-thread GOPS of every int8 GEMM path at the A3B expert shapes against that path's
//! instruction peak; `ORK_BENCH_PATHS=avx512,avx2` limits the paths.

use ork_moe::gemm::bench::{gemm_gops, peak_gops, peak_instruction, A3B_SHAPES};
use ork_moe::isa::Isa;

#[test]
#[ignore = "benchmark: run with --ignored --nocapture"]
fn bench_gemm_single_thread_vs_int8_peak() {
    let wanted: Option<Vec<Isa>> = std::env::var("ORK_BENCH_PATHS")
        .ok()
        .map(|v| v.split(',').filter_map(Isa::from_name).collect());
    let paths = Isa::available()
        .into_iter()
        .filter(|isa| peak_instruction(*isa).is_some())
        .filter(|isa| wanted.as_ref().is_none_or(|w| w.contains(isa)));
    for isa in paths {
        let peak = peak_gops(isa).expect("paths with a peak instruction");
        println!(
            "\n{}: peak {peak:.1} GOPS ({}, 1 thread)",
            isa.name(),
            peak_instruction(isa).unwrap_or("")
        );
        println!(
            "{:>5} {:>5} {:>4} {:>8} {:>7}",
            "K", "N", "M", "GOPS", "%peak"
        );
        for (k, n) in A3B_SHAPES {
            for m in [8, 16, 32, 64, 128] {
                let gops = gemm_gops(isa, m, k, n, 40);
                println!(
                    "{k:>5} {n:>5} {m:>4} {gops:>8.1} {:>6.1}%",
                    100.0 * gops / peak
                );
            }
        }
    }
}
