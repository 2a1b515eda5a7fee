//! The NPU device layer: what the MoE engine submits its GEMMs to.
//!
//! One [`Device`] fronts one backend ([`BackendKind`]):
//! - `emu` ([`emu`]): the emulated RK3588 NPU, the default wherever no NPU answers. It enforces
//!   what the board enforces (native layouts, envelopes, IOMMU domains, cache sync) and models
//!   the board's time; its math runs on the crate's CPU int8 GEMM.
//! - `rknn` ([`rknn`]): the vendor runtime `librknnrt.so`, opened with `dlopen`.
//! - `cpu` ([`cpu`]): the CPU int8 GEMM behind the same interface, no envelope emulation.
//!
//! [`DeviceConfig::backend`] (`ORK_BACKEND=auto|emu|rknn|cpu`) picks one ([`Device::open`]);
//! `auto` takes `rknn` when the runtime loads and answers, else `emu`. The choice is logged once
//! and reported by name in [`Stats`].
//!
//! # Buffers
//! [`Buffer`]s carry the rknpu driver's memory [`flags`] and an IOMMU domain. The CPU reaches a
//! buffer only through its CPU view ([`Buffer::as_slice`], [`Buffer::as_mut_slice`],
//! [`Buffer::write`]); a `CACHEABLE` buffer the CPU wrote must be flushed with
//! [`Buffer::sync_to_device`] before a submit reads it, and a `CACHEABLE` output must be
//! invalidated with [`Buffer::sync_from_device`] before the CPU reads the results, exactly as on
//! the board. Non-cacheable buffers need neither. The emulated and CPU backends' buffers start on
//! a 64-byte line, as the board's page-aligned ones do, so the CPU's wide stores behave alike.
//!
//! # GEMMs
//! Every GEMM is `C[M,N] (int32) = A[M,K] · B[K,N]` (int8) in the native layouts of
//! [`crate::layout`], with K and N already padded to
//! [`Tiles::align`](crate::layout::Tiles::align). Operands are given as a buffer plus an element
//! offset, so many experts can share one buffer. Three primitives:
//! - [`Device::run_i8`]: one GEMM, its N-tiles spread over the enabled cores;
//! - [`Device::run_chain_i8`]: several GEMMs in one submit on one core;
//! - [`Device::run_stream_i8`]: GEMMs sharing A (gate and up of one expert, or a run of experts)
//!   back to back; only inside `K % 512 == 0 && K <= 4096` on the NPU backends, otherwise
//!   [`Error::Envelope`], and the caller falls back to `run_i8`.
//!
//! # Threads
//! Each `run_*` has a `prepare_*` twin returning a [`Submission`]: every thread of a caller-owned
//! group calls [`Submission::run_share`]`(ith, nth)` (ggml drives ops from its own threads), then
//! one of them calls [`Submission::finish`]. The `run_*` forms do the same on the crate's pool.

mod backend;
mod buffer;
pub mod cpu;
mod device;
pub mod emu;
mod envelope;
mod error;
mod exec;
pub mod flags;
mod kinds;
mod open;
pub mod rknn;
mod stats;
mod storage;
mod submit;

pub use backend::{Backend, Job};
pub use buffer::Buffer;
pub use device::{Device, Submission};
pub use envelope::in_stream_envelope;
pub use error::{Error, Result};
pub use exec::{expert_parts, split_channels, submitter_ways, HostExec};
pub use kinds::{BackendKind, CoreMask, Primitive};
pub use open::{BackendChoice, DeviceConfig};
pub use stats::Stats;
pub use storage::{Alloc, Elem, Lines, Storage};
pub use submit::{MatMul, Report, Submit};
