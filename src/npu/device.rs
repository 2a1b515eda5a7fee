//! The device: one backend behind the submit primitives, its counters and its core mask.

use super::backend::{Backend, Job};
use super::buffer::Buffer;
use super::error::{Error, Result};
use super::exec;
use super::flags;
use super::kinds::{BackendKind, CoreMask, Primitive};
use super::stats::{Counters, Stats};
use super::storage::Elem;
use super::submit::{MatMul, Report, Submit};
use crate::layout::Tiles;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

static NEXT_DEVICE_ID: AtomicU64 = AtomicU64::new(1);

/// The device: one backend, its counters and its default core mask. Safe to share between threads.
pub struct Device {
    id: u64,
    backend: Box<dyn Backend>,
    counters: Counters,
    core_mask: AtomicU8,
}

impl Device {
    pub(super) fn with_backend(backend: Box<dyn Backend>) -> Device {
        Device {
            id: NEXT_DEVICE_ID.fetch_add(1, Ordering::Relaxed),
            backend,
            counters: Counters::default(),
            core_mask: AtomicU8::new(CoreMask::ALL.0),
        }
    }

    pub fn backend(&self) -> BackendKind {
        self.backend.kind()
    }

    /// The vendor runtime's version string (`rknn`; `None` elsewhere or where the library holds
    /// none).
    pub fn runtime_version(&self) -> Option<String> {
        self.backend.runtime_version()
    }

    /// Tile sizes of the native layouts the backend expects (from the runtime on `rknn`).
    pub fn tiles(&self) -> Tiles {
        self.backend.tiles()
    }

    /// The deepest (padded) K of one `run_i8` GEMM: deeper GEMMs are summed from depth segments
    /// by the caller (int32 partial sums add up exactly).
    pub fn max_k(&self) -> usize {
        self.backend.max_k()
    }

    /// Default core mask of `run_i8` (initially all cores).
    pub fn core_mask(&self) -> CoreMask {
        CoreMask(self.core_mask.load(Ordering::Relaxed))
    }

    pub fn set_core_mask(&self, mask: CoreMask) {
        self.core_mask.store(mask.0, Ordering::Relaxed);
    }

    /// A buffer of `len` elements with rknpu memory `flags` in IOMMU `domain` (0..8), zeroed.
    pub fn alloc<T: Elem>(&self, len: usize, flags: u32, domain: u32) -> Result<Buffer<T>> {
        if flags & !flags::ALL != 0 {
            return Err(Error::InvalidArgument(format!(
                "unknown memory flags {flags:#x}"
            )));
        }
        let storage = T::alloc(&*self.backend, len, flags, domain)?;
        self.counters.buffer_created();
        Ok(Buffer::new(self.id, flags, domain, len, storage))
    }

    /// Prepares one GEMM over the cores of the device's core mask.
    pub fn prepare_i8<'a>(
        &'a self,
        mm: MatMul<'a>,
        c: &'a mut Buffer<i32>,
    ) -> Result<Submission<'a>> {
        self.prepare(Primitive::RunI8, vec![mm], c, self.core_mask())
    }

    /// Prepares one GEMM over the cores of `cores` (one, for a caller that keeps each core busy
    /// with its own GEMMs).
    pub fn prepare_i8_on<'a>(
        &'a self,
        mm: MatMul<'a>,
        c: &'a mut Buffer<i32>,
        cores: CoreMask,
    ) -> Result<Submission<'a>> {
        self.prepare(Primitive::RunI8, vec![mm], c, cores)
    }

    /// Whether a submit's runs wait for the NPU on the thread that runs them, without using its
    /// CPU (`rknn`), rather than computing on it (`emu`, `cpu`): callers then keep the NPU busy
    /// from threads of their own and their CPU threads free for the work around the GEMMs.
    pub fn offloads(&self) -> bool {
        self.backend.offloads()
    }

    /// Prepares several GEMMs as one submit on one core (the lowest of `core`).
    pub fn prepare_chain_i8<'a>(
        &'a self,
        gemms: Vec<MatMul<'a>>,
        c: &'a mut Buffer<i32>,
        core: CoreMask,
    ) -> Result<Submission<'a>> {
        let first = core.cores()[0];
        self.prepare(Primitive::ChainI8, gemms, c, CoreMask(1 << first))
    }

    /// Prepares GEMMs that share A (same buffer, offset, M and K) as one stream over the cores of
    /// the device's core mask.
    pub fn prepare_stream_i8<'a>(
        &'a self,
        gemms: Vec<MatMul<'a>>,
        c: &'a mut Buffer<i32>,
    ) -> Result<Submission<'a>> {
        if let Some(g0) = gemms.first() {
            let shares_a = |g: &MatMul| {
                std::ptr::eq(g.a, g0.a) && g.a_offset == g0.a_offset && g.m == g0.m && g.k == g0.k
            };
            if !gemms.iter().all(shares_a) {
                return Err(Error::InvalidArgument(
                    "stream GEMMs must share A (buffer, offset, M, K)".into(),
                ));
            }
        }
        self.prepare(Primitive::StreamI8, gemms, c, self.core_mask())
    }

    /// One GEMM on the crate's pool.
    pub fn run_i8(&self, mm: MatMul<'_>, c: &mut Buffer<i32>) -> Result<Report> {
        self.prepare_i8(mm, c)?.run()
    }

    /// Several GEMMs in one submit on one core, on the crate's pool.
    pub fn run_chain_i8(
        &self,
        gemms: Vec<MatMul<'_>>,
        c: &mut Buffer<i32>,
        core: CoreMask,
    ) -> Result<Report> {
        self.prepare_chain_i8(gemms, c, core)?.run()
    }

    /// GEMMs sharing A back to back, on the crate's pool.
    pub fn run_stream_i8(&self, gemms: Vec<MatMul<'_>>, c: &mut Buffer<i32>) -> Result<Report> {
        self.prepare_stream_i8(gemms, c)?.run()
    }

    pub fn stats(&self) -> Stats {
        self.counters.snapshot(self.backend().name())
    }

    /// Checks what every backend requires, then lets the backend plan the submit.
    fn prepare<'a>(
        &'a self,
        primitive: Primitive,
        gemms: Vec<MatMul<'a>>,
        c: &'a mut Buffer<i32>,
        cores: CoreMask,
    ) -> Result<Submission<'a>> {
        let tiles = self.tiles();
        exec::validate(self.id, &tiles, &gemms, c)?;
        let job = self.backend.prepare(Submit {
            primitive,
            gemms,
            c,
            cores,
            tiles,
        })?;
        Ok(Submission {
            device: self,
            primitive,
            job,
        })
    }
}

/// A prepared submit: run its shares on the caller's threads, then finish it.
pub struct Submission<'a> {
    device: &'a Device,
    primitive: Primitive,
    job: Box<dyn Job + 'a>,
}

impl<'a> Submission<'a> {
    pub fn primitive(&self) -> Primitive {
        self.primitive
    }

    /// Executes share `ith` of `nth`. Call it once for every `ith` in `0..nth`, from any threads,
    /// concurrently or not; `nth` must be the same in every call.
    pub fn run_share(&self, ith: usize, nth: usize) {
        self.job.run_share(ith, nth.max(1));
    }

    /// Ends the submit once all shares returned: the result is complete.
    pub fn finish(self) -> Result<Report> {
        let report = self.job.finish()?;
        self.device.counters.record(self.primitive, &report);
        Ok(report)
    }

    /// Runs every share on the crate's pool and finishes.
    pub fn run(self) -> Result<Report> {
        let nth = self.device.backend.threads().max(1);
        exec::run_parallel(nth, |ith, nth| self.run_share(ith, nth));
        self.finish()
    }
}
