//! `ork-probe inflate`: filled in by the inflate work.

use super::bench::Options;
use std::process::ExitCode;

pub fn run(_opts: &Options) -> Result<ExitCode, String> {
    Err("the inflate benchmark is not built yet".into())
}
