//! `ork-probe moe`: filled in by the moe work.

use super::bench::Options;
use std::process::ExitCode;

pub fn run(_opts: &Options) -> Result<ExitCode, String> {
    Err("the moe benchmark is not built yet".into())
}
