//! `ork-probe gemm`: filled in by the gemm work.

use super::bench::Options;
use std::process::ExitCode;

pub fn run(_opts: &Options) -> Result<ExitCode, String> {
    Err("the gemm benchmark is not built yet".into())
}
