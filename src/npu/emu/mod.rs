//! The emulated RK3588 NPU: the default backend wherever no NPU answers.
//!
//! It refuses what the board refuses and shows what the board would show:
//! - native layouts only; K and N multiples of 32; `run_i8` up to K = 10240; chain and stream only
//!   inside `K % 512 == 0 && K <= 4096` ([`Error::Envelope`](crate::npu::Error::Envelope)
//!   otherwise);
//! - IOMMU: 8 domains of 32-bit IOVA, [`DOMAIN_BYTES`] usable each (sizes are accounted, memory is
//!   only touched when used); a full domain fails buffer creation, a submit mixing domains is
//!   rejected (the board faults and soft-resets the NPU);
//! - CACHEABLE buffers have a CPU view and a device view: a submit reads the device view, so CPU
//!   writes not synced to the device are read stale, and results stay invisible to the CPU until
//!   synced from the device. With `strict` (the default) a stale input is an error
//!   ([`Error::NotSynced`](crate::npu::Error::NotSynced)), otherwise a warning and the stale
//!   bytes are read;
//! - 3 cores: the submit is planned first as data (tasks: N-tile range, row range, core; rows per
//!   task capped by the CBUF rule), then executed on the CPU int8 GEMM, exact int32;
//! - a cost model of the board ([`CostModel`]) gives each submit a *modelled* time.
//!
//! With [`Config::dump`] (`ORK_EMU_DUMP=dir`) it writes every submit's A, B and C (device views)
//! to files for diffing. [`Config::faults`] makes chosen allocations, submits or syncs fail
//! ([`FaultPlan`]); a [`Monitor`] reads the domain accounting and the operation counts, also after
//! the emulator is gone.

mod backend;
mod cost;
mod faults;
mod job;
mod plan;
mod profile;
mod shared;
mod storage;
mod validate;

pub use crate::npu::envelope::{STREAM_K_MULTIPLE, STREAM_MAX_K};
pub use backend::Emu;
pub use cost::{CostModel, SubmitParts};
pub use faults::{Fault, FaultOp, FaultPlan, OpCounts};
pub use plan::modelled_submit;
pub use profile::ProfileFigures;
pub use shared::Monitor;
pub use storage::EmuStorage;

use std::path::PathBuf;

/// IOMMU domains of the RK3588 NPU.
pub const DOMAINS: u32 = 8;
/// Usable bytes of one domain's 32-bit IOVA space (about 3.9 GiB: the runtime keeps the rest).
pub const DOMAIN_BYTES: u64 = (4 << 30) - (96 << 20);
/// IOVA pages: every buffer takes whole pages of its domain.
pub const PAGE: u64 = 4096;
/// Largest K of one `run_i8` (runtime 2.3.2).
pub const RUN_MAX_K: usize = 10240;
/// Elements of A one task may hold in the convolution buffer: caps the rows per task at
/// `CBUF_ELEMS / K` (at least one).
pub const CBUF_ELEMS: usize = 32768;
/// Widest N slice of one task.
pub const TASK_MAX_N: usize = 8192;

/// Emulator settings (`ORK_EMU_*`, see `crate::config`).
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub cost: CostModel,
    /// The board profile `cost` was read from (`ORK_EMU_PROFILE`), if any.
    pub profile: Option<PathBuf>,
    /// Stale (CPU-written, unsynced) input is an error rather than a warning. Strict buffers keep
    /// no copy of what the CPU overwrites, since no submit may read it (see [`EmuStorage`]).
    pub strict: bool,
    /// Folder to dump each submit's buffers into.
    pub dump: Option<PathBuf>,
    /// Usable bytes per IOMMU domain.
    pub domain_bytes: u64,
    /// Execute each planned task's rows separately: slower, same bits; exercises the strided row
    /// gather and scatter of the hardware tasks.
    pub per_task: bool,
    /// Real wall time added to every submit, µs: makes the library's path slower for real, for
    /// tests and benchmarks of measured dispatch (`ORK_EMU_SLOW_US`).
    pub slow_us: u32,
    /// Operations to fail on purpose (none by default).
    pub faults: FaultPlan,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            cost: CostModel::default(),
            profile: None,
            strict: true,
            dump: None,
            domain_bytes: DOMAIN_BYTES,
            per_task: false,
            slow_us: 0,
            faults: FaultPlan::default(),
        }
    }
}
