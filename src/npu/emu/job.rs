//! A prepared emulator submit: its execution on the CPU, an injected failure, and the dump of
//! its buffers.

use crate::npu::backend::Job;
use crate::npu::error::{Error, Result};
use crate::npu::exec::Execution;
use crate::npu::submit::Report;
use std::path::PathBuf;

/// What the device side of a failed run's output holds.
pub(super) const FAILED_RUN_GARBAGE: i32 = 0x5a5a_5a5a;

pub(super) struct EmuJob<'a> {
    pub(super) exec: Execution<'a>,
    /// An injected run failure: nothing is computed and finishing returns it.
    pub(super) failure: Option<String>,
    pub(super) report: Report,
    pub(super) dump: Option<Dump>,
    pub(super) gemms: usize,
    /// `Config::slow_us`.
    pub(super) slow_us: u32,
}

/// Where a submit's buffers go (`ORK_EMU_DUMP`): its folder, the submit's sequence number, and
/// each GEMM's A and B (device views) as the submit read them.
pub(super) struct Dump {
    pub(super) dir: PathBuf,
    pub(super) seq: u64,
    pub(super) inputs: Vec<(Vec<i8>, Vec<i8>)>,
}

impl Job for EmuJob<'_> {
    fn run_share(&self, _ith: usize, _nth: usize) {
        if self.failure.is_none() {
            self.exec.run();
        }
    }

    fn finish(self: Box<Self>) -> Result<Report> {
        if self.slow_us > 0 {
            std::thread::sleep(std::time::Duration::from_micros(self.slow_us.into()));
        }
        if let Some(msg) = self.failure {
            return Err(Error::Device(msg));
        }
        if let Some(d) = &self.dump {
            d.write((0..self.gemms).map(|g| self.exec.result(g)))
                .map_err(|e| Error::Device(format!("ORK_EMU_DUMP to {}: {e}", d.dir.display())))?;
        }
        Ok(self.report)
    }
}

impl Dump {
    /// Writes `submit-<seq>-g<i>-{a,b,c}.bin` (native layouts, little-endian) into the folder.
    fn write(&self, results: impl Iterator<Item = Vec<i32>>) -> std::io::Result<()> {
        let (dir, seq) = (&self.dir, self.seq);
        std::fs::create_dir_all(dir)?;
        for (g, ((a, b), c)) in self.inputs.iter().zip(results).enumerate() {
            let bytes = |v: &[i8]| v.iter().map(|&x| x as u8).collect::<Vec<u8>>();
            std::fs::write(dir.join(format!("submit-{seq}-g{g}-a.bin")), bytes(a))?;
            std::fs::write(dir.join(format!("submit-{seq}-g{g}-b.bin")), bytes(b))?;
            let c: Vec<u8> = c.iter().flat_map(|x| x.to_le_bytes()).collect();
            std::fs::write(dir.join(format!("submit-{seq}-g{g}-c.bin")), c)?;
        }
        Ok(())
    }
}
