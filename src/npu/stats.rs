//! What a device counts: submits, tasks, bytes and MACs, modelled time, contexts and buffers.

use super::kinds::{CoreMask, Primitive};
use super::submit::Report;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters since the device opened.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Backend name: `emu`, `rknn` or `cpu`.
    pub backend: &'static str,
    /// Submits per primitive, indexed like [`Primitive::ALL`].
    pub submits: [u64; 3],
    pub tasks_per_core: [u64; CoreMask::CORES],
    pub bytes: u64,
    pub macs: u64,
    /// Sum of the modelled RK3588 submit times (emu only): modelled, never measured.
    pub modelled_us: f64,
    /// Runtime matmul contexts created by submits (rknn only).
    pub contexts_created: u64,
    /// Buffers created (on the board each is a driver allocation and an IOMMU mapping).
    pub buffers_created: u64,
}

/// The live counters behind [`Stats`], updated from any thread.
#[derive(Default)]
pub(super) struct Counters {
    submits: [AtomicU64; 3],
    tasks: [AtomicU64; CoreMask::CORES],
    bytes: AtomicU64,
    macs: AtomicU64,
    modelled_ns: AtomicU64,
    contexts_created: AtomicU64,
    buffers_created: AtomicU64,
}

impl Counters {
    /// Counts a finished submit of `p`.
    pub(super) fn record(&self, p: Primitive, r: &Report) {
        self.submits[p.index()].fetch_add(1, Ordering::Relaxed);
        for (t, n) in self.tasks.iter().zip(r.tasks_per_core) {
            t.fetch_add(n, Ordering::Relaxed);
        }
        self.bytes.fetch_add(r.bytes, Ordering::Relaxed);
        self.macs.fetch_add(r.macs, Ordering::Relaxed);
        self.modelled_ns.fetch_add(
            (r.modelled_us.unwrap_or(0.0) * 1e3) as u64,
            Ordering::Relaxed,
        );
        self.contexts_created
            .fetch_add(r.contexts_created, Ordering::Relaxed);
    }

    pub(super) fn buffer_created(&self) {
        self.buffers_created.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far, of a device on `backend`.
    pub(super) fn snapshot(&self, backend: &'static str) -> Stats {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            backend,
            submits: self.submits.each_ref().map(load),
            tasks_per_core: self.tasks.each_ref().map(load),
            bytes: load(&self.bytes),
            macs: load(&self.macs),
            modelled_us: load(&self.modelled_ns) as f64 / 1e3,
            contexts_created: load(&self.contexts_created),
            buffers_created: load(&self.buffers_created),
        }
    }
}
