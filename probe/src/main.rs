//! ork-probe: measures the pieces of the MoE-on-NPU path on whatever backend is present.
//!
//! `ork-probe [SUBCOMMAND] [--json] [options]`; see `ork-probe --help`.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::missing_safety_doc)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod accuracy;
mod bench;
mod board;
mod columns;
mod decline;
mod gemm;
mod inflate;
mod model;
mod moe;
mod peak;
mod repacked;
mod research;
mod svg;
mod sweep;

use std::process::ExitCode;

const USAGE: &str = "\
usage: ork-probe [sweep|inflate|repacked|columns|gemm|peak|moe|accuracy|decline|model|board] [options]

subcommands:
  sweep     (default) the M0 viability sweep: per expert shape, weight type and rows per expert,
            inflate direct vs via f32, the GEMM on the NPU backend vs CPU int8 on 1 and all
            threads, primitive, bit-exact check; on the emulator also the modelled RK3588 time
  inflate   direct int4->int8 inflate vs the via-f32 path vs memcpy, per expert shape and type
  repacked  the inflate from each of ggml's repacked layouts vs from plain blocks, per shape
  columns   the outlier split's exact f32 weight columns of one expert, per type and layout, vs
            the reference one column at a time and the whole expert's inflate (default: K=768,
            N=2048, 55 columns)
  gemm      NPU backend GEMM vs CPU int8 (1 thread, all threads) at the A3B expert shapes
  peak      single-thread GOPS of every int8 GEMM path at the A3B shapes vs that path's peak
  moe       the whole MUL_MAT_ID call (qwen3-30b-a3b case), time split by stage, cold and warm cache
  accuracy  NMSE of ggml's Q4xQ8 path, the library and its accuracy levers against an f64
            reference, on issue 13's cases and real weights (--data), plus the levers' costs
  decline   what the ggml hook costs per declined decode call (check, pair check, supports_type)
            and per Qwen3-30B-A3B decode step
  model     whole forward passes' MUL_MAT_ID calls of a MoE model through the engine, and the
            modelled RK3588 timeline of the same work (its own options: ork-probe model --help)
  board     the board check (docs/BOARD.md section 5): runtime, driver, NPU cores, CPU clusters
            and memory; every primitive at the A3B shapes checked bit-exact and timed; the costs
            the board model prices (run floor, contexts, buffers, syncs, TOPS per core and on all,
            NPU DRAM, inflate per type and core type, memcpy, shared DRAM, the engine's CPU
            stages); writes the board profile JSON (--profile) that `model --profile` and
            ORK_EMU_PROFILE load

options (each subcommand uses those that apply to it):
  --json               one JSON array on stdout instead of the table
  --svg FILE           (sweep) draw time vs rows per expert into FILE
  --shapes KxN,...     expert shapes (default: 2048x768,768x2048,4096x1408,1408x4096)
  --m M,...            rows per expert (default: 8,16,32,64,128)
  --types T,...        weight types (sweep default: q4_0,q4_K)
  --threads N          threads of the CPU runs (default: ORK_THREADS, else all cores)
  --backend B          auto, emu, rknn or cpu (default: ORK_BACKEND, else auto)
  --paths P,...        (peak) kernel paths to measure (default: all with an int8 peak instruction)
  --rounds N           (peak) rounds; each number is the best round's (default 3)
  --quick              fewer rows per expert and repeats
  --calls N            (inflate) only run the direct inflate N times per shape and type, untimed:
                       a workload for instruction counters (callgrind, qemu) (board: seconds, for CI;
                       columns: the column decode N times per type and layout; repacked: the
                       inflate from each layout N times)
  --layouts L,...      (columns, repacked) plain and/or repacked layouts as RxC, e.g. plain,8x8 (default: all)
  --columns C          (columns) columns decoded per expert (default 55)
  --profile FILE       (board) where to write the profile (default board-profile.json)
  --data DIR           (accuracy) real-weights vectors (default: tests/data/accuracy/minilm)
  -h, --help

The library's ORK_* environment variables (README) configure everything else; ORK_LOG sets the
log level.

Exit status: 0, or 1 when a bit-exact check fails, 2 on bad usage or errors.
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        if args.first().is_some_and(|a| a == "model") {
            print!("{}", model::USAGE);
        } else {
            print!("{USAGE}");
        }
        return ExitCode::SUCCESS;
    }
    let (sub, rest) = match args.first().map(String::as_str) {
        Some(s) if !s.starts_with('-') => (s, &args[1..]),
        _ => ("sweep", &args[..]),
    };
    if sub == "model" {
        return finish(model::run(rest));
    }
    let opts = match bench::Options::parse(rest) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("ork-probe: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    // The library's configuration, parsed once; the options override it.
    let mut cfg = match ork_moe::config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ork-probe: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(t) = opts.threads {
        cfg.device.host.threads = ork_moe::config::threads(t);
    }
    if let Some(b) = opts.backend {
        cfg.device.backend = b;
    }
    ork_moe::ffi::log_install(cfg.log_level);
    let result = match sub {
        "sweep" => sweep::run(&opts, &cfg),
        "inflate" => inflate::run(&opts, &cfg),
        "repacked" => repacked::run(&opts, &cfg),
        "columns" => columns::run(&opts, &cfg),
        "gemm" => gemm::run(&opts, &cfg),
        "peak" => peak::run(&opts, &cfg),
        "moe" => moe::run(&opts, &cfg),
        "board" => board::run(&opts, &cfg),
        "accuracy" => accuracy::run(&opts),
        "decline" => decline::run(&opts),
        other => Err(format!("unknown subcommand {other:?}")),
    };
    finish(result)
}

fn finish(result: Result<ExitCode, String>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ork-probe: {e}");
            ExitCode::from(2)
        }
    }
}
