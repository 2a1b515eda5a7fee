//! A prepared rknn submit: its runtime matmuls in the units a share claims, the staging buffers
//! it holds, and the copy of staged output slices into C when it finishes.

use super::ctx::MatmulCtx;
use super::mem::{Mem, Spares};
use super::sys::{self, TensorMem};
use crate::npu::backend::Job;
use crate::npu::buffer::Buffer;
use crate::npu::error::{Error, Result};
use crate::npu::submit::Report;
use crate::sync::lock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// One runtime matmul: its context (one core), its rows and its three operands (tensor_mem, bytes).
pub(super) struct RunTask {
    pub(super) ctx: Arc<Mutex<MatmulCtx>>,
    pub(super) m: usize,
    pub(super) operands: [(*mut TensorMem, usize); 3],
}

/// Staging buffers a submit holds; back to the spares when it ends, however it ends.
pub(super) struct Staged<'a> {
    spares: &'a Spares,
    pub(super) inputs: Vec<Mem>,
    /// Output slices: the buffer the runtime writes and where its `len` elements go in C.
    pub(super) outputs: Vec<(Mem, usize, usize)>,
}

impl<'a> Staged<'a> {
    /// Nothing staged yet; what will be goes back to `spares`.
    pub(super) fn new(spares: &'a Spares) -> Staged<'a> {
        Staged {
            spares,
            inputs: Vec::new(),
            outputs: Vec::new(),
        }
    }
}

impl Drop for Staged<'_> {
    fn drop(&mut self) {
        for m in self.inputs.drain(..) {
            self.spares.give(m);
        }
        for (m, _, _) in self.outputs.drain(..) {
            self.spares.give(m);
        }
    }
}

pub(super) struct RknnJob<'a> {
    bind: &'a Mutex<()>,
    /// Runs per share unit: a unit's runs go one after another on one core.
    units: Vec<Vec<RunTask>>,
    next: AtomicUsize,
    failure: Mutex<Option<Error>>,
    /// The submit's output, borrowed exclusively while the runs write it.
    c: &'a mut Buffer<i32>,
    staged: Staged<'a>,
    report: Report,
}

impl<'a> RknnJob<'a> {
    /// The job running `units` into `c` under the process's binding lock `bind`, holding `staged`.
    pub(super) fn new(
        bind: &'a Mutex<()>,
        units: Vec<Vec<RunTask>>,
        c: &'a mut Buffer<i32>,
        staged: Staged<'a>,
        report: Report,
    ) -> RknnJob<'a> {
        RknnJob {
            bind,
            units,
            next: AtomicUsize::new(0),
            failure: Mutex::new(None),
            c,
            staged,
            report,
        }
    }
}

// SAFETY: the raw tensor_mem pointers refer to buffers borrowed for 'a (A and B shared, C
// exclusively through `c`), their views (which live as long as those buffers) or the staging
// buffers the job owns; the runtime only reads A/B and writes disjoint C regions, each context is
// used under its Mutex.
unsafe impl Send for RknnJob<'_> {}
// SAFETY: as above.
unsafe impl Sync for RknnJob<'_> {}

impl Job for RknnJob<'_> {
    fn run_share(&self, _ith: usize, _nth: usize) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(unit) = self.units.get(i) else {
                return;
            };
            for t in unit {
                if let Err(e) = lock(&t.ctx).run(self.bind, t.m, t.operands) {
                    lock(&self.failure).get_or_insert(e);
                    return;
                }
            }
        }
    }

    fn finish(self: Box<Self>) -> Result<Report> {
        let RknnJob {
            failure,
            c,
            staged,
            report,
            ..
        } = *self;
        if let Some(e) = failure.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(e);
        }
        if !staged.outputs.is_empty() {
            // The CPU must see the device's writes to C before it adds the staged slices.
            c.sync_from_device()?;
            for (mem, at, len) in &staged.outputs {
                mem.sync(sys::SYNC_FROM_DEVICE)?;
                let dst = &mut c.as_mut_slice()[*at..at + len];
                for (d, s) in dst.iter_mut().zip(mem.cpu_bytes().chunks_exact(4)) {
                    *d = i32::from_ne_bytes(s.try_into().expect("4 bytes"));
                }
            }
            // Clean what the CPU wrote, so that the caller's sync from the device keeps it.
            c.sync_to_device()?;
        }
        Ok(report)
    }
}
