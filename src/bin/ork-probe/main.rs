//! ork-probe: measures the pieces of the MoE-on-NPU path on whatever backend is present.
//!
//! `ork-probe [SUBCOMMAND] [--json] [options]`; see `ork-probe --help`.

mod bench;
mod gemm;
mod inflate;
mod moe;
mod svg;
mod sweep;

use std::process::ExitCode;

const USAGE: &str = "\
usage: ork-probe [sweep|inflate|gemm|moe] [options]

subcommands:
  sweep     (default) the M0 viability sweep: per expert shape, weight type and rows per expert,
            inflate direct vs via f32, the GEMM on the NPU backend vs CPU int8 on 1 and all
            threads, primitive, bit-exact check; on the emulator also the modelled RK3588 time
  inflate   direct int4->int8 inflate vs the via-f32 path vs memcpy, per expert shape and type
  gemm      NPU backend GEMM vs CPU int8 (1 thread, all threads) at the A3B expert shapes
  moe       the whole MUL_MAT_ID call (qwen3-30b-a3b case), time split by stage, cold and warm cache

options (each subcommand uses those that apply to it):
  --json               one JSON array on stdout instead of the table
  --svg FILE           (sweep) draw time vs rows per expert into FILE
  --shapes KxN,...     expert shapes (default: 2048x768,768x2048,4096x1408,1408x4096)
  --m M,...            rows per expert (default: 8,16,32,64,128)
  --types T,...        weight types (sweep default: q4_0,q4_K)
  --threads N          threads of the CPU runs (default: all cores; sets ORK_THREADS)
  --backend B          auto, emu, rknn or cpu (default: ORK_BACKEND, else auto; sets ORK_BACKEND)
  --quick              fewer rows per expert and repeats
  --calls N            (inflate) only run the direct inflate N times per shape and type, untimed:
                       a workload for instruction counters (callgrind, qemu)
  -h, --help

Exit status: 0, or 1 when a bit-exact check fails, 2 on bad usage or errors.
";

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let (sub, rest) = match args.first().map(String::as_str) {
        Some(s) if !s.starts_with('-') => (s, &args[1..]),
        _ => ("sweep", &args[..]),
    };
    let opts = match bench::Options::parse(rest) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("ork-probe: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    // Before anything reads them (the pool and the backend are created lazily).
    if let Some(t) = opts.threads {
        std::env::set_var("ORK_THREADS", t.to_string());
    }
    if let Some(b) = &opts.backend {
        std::env::set_var("ORK_BACKEND", b);
    }
    let result = match sub {
        "sweep" => sweep::run(&opts),
        "inflate" => inflate::run(&opts),
        "gemm" => gemm::run(&opts),
        "moe" => moe::run(&opts),
        other => Err(format!("unknown subcommand {other:?}")),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ork-probe: {e}");
            ExitCode::from(2)
        }
    }
}
