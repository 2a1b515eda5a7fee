//! What the emulator and its buffers share: the IOMMU domains' accounting and the fault counters,
//! and the [`Monitor`] that reads them.

use super::faults::{FaultPlan, Faults, OpCounts};
use super::{DOMAINS, PAGE};
use crate::npu::error::{Error, Result};
use crate::sync::lock;
use std::sync::{Arc, Mutex};

/// Bytes in use per IOMMU domain, and the most ever in use.
pub(super) struct Domains {
    used: Mutex<Usage>,
    capacity: u64,
}

#[derive(Default)]
struct Usage {
    now: [u64; DOMAINS as usize],
    peak: [u64; DOMAINS as usize],
}

/// What the emulator and its buffers share: the domain accounting and the fault counters.
pub(super) struct Shared {
    pub(super) domains: Domains,
    pub(super) faults: Faults,
}

impl Shared {
    /// Empty domains of `domain_bytes` each, and the faults of `plan` still to come.
    pub(super) fn new(domain_bytes: u64, plan: FaultPlan) -> Shared {
        Shared {
            domains: Domains {
                used: Mutex::new(Usage::default()),
                capacity: domain_bytes,
            },
            faults: Faults::new(plan),
        }
    }
}

/// A view of one emulator's accounting, valid after the emulator and its buffers are gone.
#[derive(Clone)]
pub struct Monitor(pub(super) Arc<Shared>);

impl Monitor {
    /// Bytes (whole pages) in use per IOMMU domain.
    pub fn domain_used(&self) -> [u64; DOMAINS as usize] {
        lock(&self.0.domains.used).now
    }

    /// The most bytes (whole pages) ever in use at once, per IOMMU domain.
    pub fn domain_peak(&self) -> [u64; DOMAINS as usize] {
        lock(&self.0.domains.used).peak
    }

    /// Allocations, submits and syncs so far, and how many were made to fail.
    pub fn ops(&self) -> OpCounts {
        self.0.faults.counts()
    }
}

impl Domains {
    /// Takes whole pages for `bytes` in `domain`; returns how many bytes they hold.
    pub(super) fn reserve(&self, domain: u32, bytes: u64) -> Result<u64> {
        if domain >= DOMAINS {
            return Err(Error::InvalidArgument(format!(
                "IOMMU domain {domain}: the NPU has {DOMAINS}"
            )));
        }
        let pages = bytes.div_ceil(PAGE).max(1) * PAGE;
        let mut used = lock(&self.used);
        let free = self.capacity - used.now[domain as usize];
        if pages > free {
            return Err(Error::OutOfMemory {
                domain,
                requested: pages,
                available: free,
            });
        }
        let d = domain as usize;
        used.now[d] += pages;
        used.peak[d] = used.peak[d].max(used.now[d]);
        Ok(pages)
    }

    pub(super) fn release(&self, domain: u32, pages: u64) {
        lock(&self.used).now[domain as usize] -= pages;
    }
}
