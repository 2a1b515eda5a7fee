//! What a backend implements: storage for buffers, and the plan and execution of a submit.

use super::error::Result;
use super::kinds::BackendKind;
use super::storage::Alloc;
use super::submit::{Report, Submit};
use crate::layout::Tiles;

/// Backend side of a prepared submit.
#[doc(hidden)]
pub trait Job: Send + Sync {
    /// Executes this thread's share; every `ith` in `0..nth` must be called exactly once.
    fn run_share(&self, ith: usize, nth: usize);
    /// Called once after all shares returned.
    fn finish(self: Box<Self>) -> Result<Report>;
}

/// A backend. Implemented by [`emu`](super::emu), [`rknn`](super::rknn) and [`cpu`](super::cpu).
#[doc(hidden)]
pub trait Backend: Alloc + Send + Sync {
    fn kind(&self) -> BackendKind;
    /// Tile sizes of the native layouts this backend expects.
    fn tiles(&self) -> Tiles;
    /// The deepest (padded) K one `run_i8` GEMM takes; deeper ones are split by the caller.
    fn max_k(&self) -> usize;
    /// See [`Device::offloads`](super::Device::offloads).
    fn offloads(&self) -> bool {
        false
    }
    /// Checks the backend's own rules (envelopes, domains, syncs) and plans the submit.
    fn prepare<'a>(&'a self, submit: Submit<'a>) -> Result<Box<dyn Job + 'a>>;
    /// Pool threads a submit should use (never more than it has independent work units for).
    fn threads(&self) -> usize;
    /// The vendor runtime's version string, where there is one.
    fn runtime_version(&self) -> Option<String> {
        None
    }
}
