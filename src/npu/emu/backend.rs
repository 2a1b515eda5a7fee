//! The emulator as a backend: its buffers, and each submit checked, planned and set up for
//! execution as the board would run it.

use super::faults::FaultOp;
use super::job::{Dump, EmuJob, FAILED_RUN_GARBAGE};
use super::shared::{Monitor, Shared};
use super::storage::EmuStorage;
use super::{plan, validate, Config, RUN_MAX_K};
use crate::layout::Tiles;
use crate::npu::backend::{Backend, Job};
use crate::npu::buffer::Buffer;
use crate::npu::error::Result;
use crate::npu::exec::{Execution, GemmView, HostExec, Split};
use crate::npu::flags;
use crate::npu::kinds::BackendKind;
use crate::npu::storage::{storage_as, storage_as_mut, Alloc, Storage};
use crate::npu::submit::{MatMul, Submit};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The emulator backend.
pub struct Emu {
    config: Config,
    host: HostExec,
    shared: Arc<Shared>,
    submits: AtomicU64,
}

impl Emu {
    pub fn new(config: Config, host: HostExec) -> Emu {
        let shared = Arc::new(Shared::new(config.domain_bytes, config.faults.clone()));
        Emu {
            config,
            host,
            shared,
            submits: AtomicU64::new(0),
        }
    }

    /// A view of this emulator's accounting that outlives it.
    pub fn monitor(&self) -> Monitor {
        Monitor(Arc::clone(&self.shared))
    }

    pub(super) fn alloc<T: Copy + Default + Send + Sync + 'static>(
        &self,
        len: usize,
        flags: u32,
        domain: u32,
    ) -> Result<EmuStorage<T>> {
        let bytes = (len as u64).saturating_mul(std::mem::size_of::<T>() as u64);
        self.shared.faults.alloc(domain, bytes)?;
        let pages = self.shared.domains.reserve(domain, bytes)?;
        let cacheable = flags & flags::CACHEABLE != 0;
        Ok(EmuStorage::new(
            len,
            cacheable,
            self.config.strict,
            domain,
            pages,
            Arc::clone(&self.shared),
        ))
    }

    /// What each GEMM's A and B read: their device views, refused (strict) or warned about when
    /// the CPU wrote them without a sync.
    fn input_views<'a>(&self, gemms: &[MatMul<'a>]) -> Result<Vec<GemmView<'a>>> {
        let strict = self.config.strict;
        gemms
            .iter()
            .map(|g| {
                let a = storage_as::<EmuStorage<i8>, i8>(g.a.storage())?;
                let b = storage_as::<EmuStorage<i8>, i8>(g.b.storage())?;
                let (a, b) = (a.input_view("A", strict)?, b.input_view("B", strict)?);
                Ok(GemmView {
                    m: g.m,
                    k: g.k,
                    a: &a[g.a_offset..g.a_offset + g.m * g.k],
                    b: &b[g.b_offset..g.b_offset + g.k * g.n],
                })
            })
            .collect()
    }

    /// The dump of a submit reading `views`, when dumps are on; numbers the submit.
    fn dump_of(&self, views: &[GemmView]) -> Option<Dump> {
        let dir = self.config.dump.clone()?;
        Some(Dump {
            dir,
            seq: self.submits.fetch_add(1, Ordering::Relaxed),
            inputs: views.iter().map(|v| (v.a.to_vec(), v.b.to_vec())).collect(),
        })
    }
}

/// The device view of C that a submit of `gemms` writes. A failing run leaves garbage where its
/// results would be, so that a caller ignoring the error would show it.
fn output_view<'a>(
    c: &'a mut Buffer<i32>,
    gemms: &[MatMul],
    failing: bool,
) -> Result<&'a mut [i32]> {
    let written: Vec<Range<usize>> = if failing {
        std::iter::once(0..c.len()).collect()
    } else {
        // `exec::validate` (in `Device::prepare`) checked that they fit C and do not overlap.
        let mut r: Vec<_> = gemms
            .iter()
            .map(|g| g.c_offset..g.c_offset + g.m * g.n)
            .collect();
        r.sort_by_key(|r| r.start);
        r
    };
    let c_dev = storage_as_mut::<EmuStorage<i32>, i32>(c.storage_mut())?.device_view_mut(&written);
    if failing {
        c_dev.fill(FAILED_RUN_GARBAGE);
    }
    Ok(c_dev)
}

impl Alloc for Emu {
    fn alloc_i8(&self, len: usize, flags: u32, domain: u32) -> Result<Box<dyn Storage<i8>>> {
        Ok(Box::new(self.alloc::<i8>(len, flags, domain)?))
    }

    fn alloc_i32(&self, len: usize, flags: u32, domain: u32) -> Result<Box<dyn Storage<i32>>> {
        Ok(Box::new(self.alloc::<i32>(len, flags, domain)?))
    }
}

impl Backend for Emu {
    fn kind(&self) -> BackendKind {
        BackendKind::Emu
    }

    fn tiles(&self) -> Tiles {
        Tiles::RK3588
    }

    fn max_k(&self) -> usize {
        RUN_MAX_K
    }

    fn threads(&self) -> usize {
        self.host.threads
    }

    fn prepare<'a>(&'a self, submit: Submit<'a>) -> Result<Box<dyn Job + 'a>> {
        let Submit {
            primitive,
            gemms,
            c,
            cores,
            tiles,
        } = submit;
        validate::check_submit(primitive, &gemms, c.domain())?;
        let views = self.input_views(&gemms)?;
        let shapes: Vec<_> = gemms.iter().map(|g| (g.m, g.k, g.n)).collect();
        let cost = &self.config.cost;
        let tasks = plan::tasks(cost, &tiles, primitive, &shapes, &cores.cores());
        let report = plan::report(cost, &shapes, &tasks);
        let c_offsets: Vec<usize> = gemms.iter().map(|g| g.c_offset).collect();
        let failure = self.shared.faults.fails(FaultOp::Run);
        let c_dev = output_view(c, &gemms, failure.is_some())?;
        let dump = self.dump_of(&views);
        let split = Split {
            threads: self.host.threads,
            per_task: self.config.per_task,
        };
        let exec = Execution::new(
            tiles,
            self.host.isa,
            views,
            &tasks,
            c_dev,
            &c_offsets,
            split,
        );
        Ok(Box::new(EmuJob {
            exec,
            failure,
            report,
            dump,
            gemms: shapes.len(),
            slow_us: self.config.slow_us,
        }))
    }
}
