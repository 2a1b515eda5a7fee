//! ork-probe: measures the pieces of the MoE-on-NPU path on whatever backend is present.
//!
//! `ork-probe [SUBCOMMAND] [--json] [options]`; see `ork-probe --help`.

mod bench;
mod gemm;
mod inflate;
mod moe;

use std::process::ExitCode;

const USAGE: &str = "\
usage: ork-probe [inflate|gemm|moe] [--json]

subcommands:
  inflate   direct int4->int8 inflate vs the via-f32 path vs memcpy, per expert shape and type
            (the default for now)
  gemm      NPU backend GEMM vs CPU int8 (1 thread, all threads) at the A3B expert shapes
  moe       the whole MUL_MAT_ID call (qwen3-30b-a3b case), time split by stage, cold and warm cache

options:
  --json    one JSON array on stdout instead of the table
  -h, --help
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
        _ => ("inflate", &args[..]),
    };
    let opts = match bench::Options::parse(rest) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("ork-probe: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = match sub {
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
