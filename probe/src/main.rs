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
mod coverage;
mod decline;
mod gemm;
mod inflate;
mod json;
mod model;
mod moe;
mod options;
mod peak;
mod repacked;
mod research;
mod svg;
mod sweep;

use clap::{Parser, Subcommand};
use options::Options;
use ork_moe::moe::Config;
use std::process::ExitCode;

/// ork-probe: measures the pieces of the MoE-on-NPU path on whatever backend is present; without
/// a subcommand, the sweep
#[derive(Parser)]
#[command(
    name = "ork-probe",
    args_conflicts_with_subcommands = true,
    args_override_self = true,
    disable_help_subcommand = true,
    max_term_width = 100,
    after_help = AFTER_HELP
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    options: Options,
}

/// Each subcommand but `model` and `coverage` takes every option of [`Options`] and uses those that apply to it.
#[derive(Subcommand)]
enum Command {
    /// (default) The M0 viability sweep: per expert shape, weight type and rows per expert,
    /// inflate direct vs via f32, the GEMM on the NPU backend vs CPU int8 on 1 and all threads,
    /// primitive, bit-exact check; on the emulator also the modelled RK3588 time
    Sweep(Options),
    /// Direct int4->int8 inflate vs the via-f32 path vs memcpy, per expert shape and type
    Inflate(Options),
    /// The inflate from each of ggml's repacked layouts vs from plain blocks, per shape
    Repacked(Options),
    /// The outlier split's exact f32 weight columns of one expert, per type and layout, vs the
    /// reference one column at a time and the whole expert's inflate (default: K=768, N=2048,
    /// 55 columns)
    Columns(Options),
    /// NPU backend GEMM vs CPU int8 (1 thread, all threads) at the A3B expert shapes
    Gemm(Options),
    /// Single-thread GOPS of every int8 GEMM path at the A3B shapes vs that path's peak
    Peak(Options),
    /// The whole MUL_MAT_ID call (qwen3-30b-a3b case), time split by stage, cold and warm cache
    Moe(Options),
    /// NMSE of ggml's Q4xQ8 path, the library and its accuracy levers against an f64 reference,
    /// on synthetic cases (uniform activations with outlier channels x10 and x50, Gaussian, tiny;
    /// K=2048 and K=768) and real weights (--data), plus the levers' costs
    Accuracy(Options),
    /// What the ggml hook costs per declined decode call (check, pair check, supports_type) and
    /// per Qwen3-30B-A3B decode step
    Decline(Options),
    /// Whole forward passes' MUL_MAT_ID calls of a MoE model through the engine, with the dense
    /// matmuls it takes (ORK_DENSE=0: none), and the modelled RK3588 timeline of the same work:
    /// the engine without and with its prefetch threads, and pipelined variants (its own options:
    /// ork-probe model --help)
    Model(Box<model::Options>),
    /// The board check (docs/BOARD.md section 5): runtime, driver, NPU cores, CPU clusters and
    /// memory; every primitive at the A3B shapes checked bit-exact and timed; the costs the board
    /// model prices (run floor, contexts, buffers, syncs, TOPS per core and on all, NPU DRAM,
    /// inflate per type and core type, memcpy, shared DRAM, the engine's CPU stages); writes the
    /// board profile JSON (--profile) that `model --profile` and ORK_EMU_PROFILE load
    Board(Options),
    /// Per GGUF model file, the share of its routed-expert and attention bytes whose weight type
    /// the library takes (ork_supports_type), from the headers (its own options: ork-probe
    /// coverage --help)
    Coverage(coverage::Options),
}

const AFTER_HELP: &str = "\
The library's ORK_* environment variables (README) configure everything else; ORK_LOG sets the
log level.

Exit status: 0, or 1 when a bit-exact check fails, 2 on bad usage or errors.";

/// A measuring subcommand: its options and the library's configuration with them applied.
type Run = fn(&Options, &Config) -> Result<ExitCode, String>;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (opts, run): (Options, Run) = match cli.command.unwrap_or(Command::Sweep(cli.options)) {
        Command::Model(o) => return finish(model::run(*o)),
        Command::Coverage(o) => return finish(coverage::run(o)),
        Command::Sweep(o) => (o, sweep::run),
        Command::Inflate(o) => (o, inflate::run),
        Command::Repacked(o) => (o, repacked::run),
        Command::Columns(o) => (o, columns::run),
        Command::Gemm(o) => (o, gemm::run),
        Command::Peak(o) => (o, peak::run),
        Command::Moe(o) => (o, moe::run),
        Command::Accuracy(o) => (o, |o, _| accuracy::run(o)),
        Command::Decline(o) => (o, |o, _| decline::run(o)),
        Command::Board(o) => (o, board::run),
    };
    finish(library_config(&opts).and_then(|cfg| run(&opts, &cfg)))
}

/// The library's configuration, parsed once; the options override it.
fn library_config(opts: &Options) -> Result<Config, String> {
    let mut cfg = options::library_config_from_env()?;
    if let Some(t) = opts.threads {
        cfg.device.host.threads = ork_moe::config::threads(t);
    }
    if let Some(b) = opts.backend {
        cfg.device.backend = b;
    }
    ork_moe::ffi::log_install(cfg.log_level);
    Ok(cfg)
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
