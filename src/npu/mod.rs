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
//! the board. Non-cacheable buffers need neither.
//!
//! # GEMMs
//! Every GEMM is `C[M,N] (int32) = A[M,K] · B[K,N]` (int8) in the native layouts of
//! [`crate::layout`], with K and N already padded to [`Tiles::align`]. Operands are given as a
//! buffer plus an element offset, so many experts can share one buffer. Three primitives:
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

pub mod cpu;
pub mod emu;
mod exec;
pub mod rknn;

pub use exec::{expert_parts, split_channels, submitter_ways, HostExec};

use crate::layout::Tiles;
use std::any::Any;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Once;

/// The rknpu kernel driver's memory flags (`rknpu_ioctl.h`), carried by every [`Buffer`].
pub mod flags {
    pub const NON_CONTIGUOUS: u32 = 1 << 0;
    /// CPU accesses go through the cache: CPU writes need a sync to the device, device writes a
    /// sync from the device.
    pub const CACHEABLE: u32 = 1 << 1;
    pub const WRITE_COMBINE: u32 = 1 << 2;
    pub const KERNEL_MAPPING: u32 = 1 << 3;
    pub const IOMMU: u32 = 1 << 4;
    pub const ZEROING: u32 = 1 << 5;
    pub const SECURE: u32 = 1 << 6;
    pub const DMA32: u32 = 1 << 7;
    pub const TRY_ALLOC_SRAM: u32 = 1 << 8;
    pub const TRY_ALLOC_NBUF: u32 = 1 << 9;
    pub const IOMMU_LIMIT_IOVA_ALIGNMENT: u32 = 1 << 10;
    /// Every flag the driver knows.
    pub const ALL: u32 = (1 << 11) - 1;
    /// Default for buffers the CPU fills (weights, activations): fast CPU writes, explicit syncs.
    pub const CPU_FILLED: u32 = NON_CONTIGUOUS | CACHEABLE | IOMMU_LIMIT_IOVA_ALIGNMENT;
    /// Non-cacheable (write-combined CPU mapping): no syncs, slow CPU fills (about 1 GB/s on the board).
    pub const UNCACHED: u32 = NON_CONTIGUOUS | IOMMU_LIMIT_IOVA_ALIGNMENT;
}

/// The three NPU cores, as a bit mask (`RKNN_NPU_CORE_0 = 1`, `_1 = 2`, `_2 = 4`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CoreMask(pub u8);

impl CoreMask {
    pub const CORE_0: CoreMask = CoreMask(1);
    pub const CORE_1: CoreMask = CoreMask(2);
    pub const CORE_2: CoreMask = CoreMask(4);
    pub const ALL: CoreMask = CoreMask(7);
    /// Number of cores the RK3588 has.
    pub const CORES: usize = 3;

    /// The enabled core indices, lowest first. An empty or out-of-range mask means all cores.
    pub fn cores(self) -> Vec<usize> {
        let m = if self.0 & 7 == 0 { 7 } else { self.0 & 7 };
        (0..Self::CORES).filter(|c| m & (1 << c) != 0).collect()
    }
}

/// The submit primitives, for errors and counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Primitive {
    RunI8,
    ChainI8,
    StreamI8,
}

impl Primitive {
    pub const ALL: [Primitive; 3] = [Primitive::RunI8, Primitive::ChainI8, Primitive::StreamI8];

    pub fn name(self) -> &'static str {
        match self {
            Primitive::RunI8 => "run_i8",
            Primitive::ChainI8 => "chain_i8",
            Primitive::StreamI8 => "stream_i8",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Which backend a [`Device`] runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    Emu,
    Rknn,
    Cpu,
}

impl BackendKind {
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Emu => "emu",
            BackendKind::Rknn => "rknn",
            BackendKind::Cpu => "cpu",
        }
    }
}

/// What a submit can fail with. Every variant is something the caller can act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// The shape is outside what this primitive does correctly on the NPU: use another primitive
    /// (`run_i8` for chain/stream) or the CPU.
    Envelope {
        primitive: Primitive,
        reason: String,
    },
    /// Inconsistent arguments: unpadded dims, an operand past the end of its buffer, overlapping
    /// outputs, a buffer of another device, bad flags...
    InvalidArgument(String),
    /// The IOMMU domain has no room for the buffer.
    OutOfMemory {
        domain: u32,
        requested: u64,
        available: u64,
    },
    /// A submit's buffers are not all in one IOMMU domain (on the board: fault, NPU soft reset).
    DomainMismatch { expected: u32, found: u32 },
    /// A cacheable input was written by the CPU and not synced to the device (strict emulation).
    NotSynced { operand: &'static str },
    /// The backend itself failed (runtime missing, runtime error code...).
    Device(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Envelope { primitive, reason } => {
                write!(f, "{} outside its envelope: {reason}", primitive.name())
            }
            Error::InvalidArgument(s) => write!(f, "invalid argument: {s}"),
            Error::OutOfMemory {
                domain,
                requested,
                available,
            } => {
                write!(f, "out of memory in IOMMU domain {domain}: {requested} bytes requested, {available} free")
            }
            Error::DomainMismatch { expected, found } => {
                write!(
                    f,
                    "buffers of one submit in different IOMMU domains ({expected} and {found})"
                )
            }
            Error::NotSynced { operand } => write!(
                f,
                "{operand} written by the CPU and not synced to the device"
            ),
            Error::Device(s) => write!(f, "device error: {s}"),
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// Element types a [`Buffer`] can hold: int8 (A, B) and int32 (C).
pub trait Elem: Copy + Default + Send + Sync + fmt::Debug + 'static + sealed::Sealed {
    #[doc(hidden)]
    fn alloc(
        dev: &dyn Backend,
        len: usize,
        flags: u32,
        domain: u32,
    ) -> Result<Box<dyn Storage<Self>>>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for i8 {}
    impl Sealed for i32 {}
}

impl Elem for i8 {
    fn alloc(
        dev: &dyn Backend,
        len: usize,
        flags: u32,
        domain: u32,
    ) -> Result<Box<dyn Storage<i8>>> {
        dev.alloc_i8(len, flags, domain)
    }
}

impl Elem for i32 {
    fn alloc(
        dev: &dyn Backend,
        len: usize,
        flags: u32,
        domain: u32,
    ) -> Result<Box<dyn Storage<i32>>> {
        dev.alloc_i32(len, flags, domain)
    }
}

/// Backend side of a buffer: a CPU view and whatever the device reads.
#[doc(hidden)]
pub trait Storage<T>: Send + Sync {
    fn cpu(&self) -> &[T];
    /// The CPU view for writing; the storage notes that the CPU made it dirty.
    fn cpu_mut(&mut self) -> &mut [T];
    fn sync_to_device(&mut self) -> Result<()>;
    fn sync_from_device(&mut self) -> Result<()>;
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

fn foreign_buffer() -> Error {
    Error::InvalidArgument("buffer of another backend".into())
}

/// A backend's own storage type `S` behind a buffer's storage.
fn storage_as<S: 'static, T>(s: &dyn Storage<T>) -> Result<&S> {
    s.as_any().downcast_ref().ok_or_else(foreign_buffer)
}

fn storage_as_mut<S: 'static, T>(s: &mut dyn Storage<T>) -> Result<&mut S> {
    s.as_any_mut().downcast_mut().ok_or_else(foreign_buffer)
}

/// A device buffer of `len` elements of `T` in one IOMMU domain.
pub struct Buffer<T: Elem> {
    device: u64,
    flags: u32,
    domain: u32,
    len: usize,
    storage: Box<dyn Storage<T>>,
}

impl<T: Elem> Buffer<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn flags(&self) -> u32 {
        self.flags
    }

    pub fn domain(&self) -> u32 {
        self.domain
    }

    pub fn is_cacheable(&self) -> bool {
        self.flags & flags::CACHEABLE != 0
    }

    /// The CPU view. For a cacheable output, call [`Buffer::sync_from_device`] after the submit
    /// first, or this shows what the CPU cache held before it.
    pub fn as_slice(&self) -> &[T] {
        self.storage.cpu()
    }

    /// The CPU view for writing. For a cacheable buffer, call [`Buffer::sync_to_device`] before
    /// a submit reads it.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        self.storage.cpu_mut()
    }

    /// Copies `data` into the CPU view at element `offset`.
    pub fn write(&mut self, offset: usize, data: &[T]) -> Result<()> {
        let end = offset
            .checked_add(data.len())
            .filter(|&e| e <= self.len)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "write of {} at {offset} past {}",
                    data.len(),
                    self.len
                ))
            })?;
        self.storage.cpu_mut()[offset..end].copy_from_slice(data);
        Ok(())
    }

    /// Makes the CPU's writes visible to the device (cache flush). A no-op for non-cacheable buffers.
    pub fn sync_to_device(&mut self) -> Result<()> {
        self.storage.sync_to_device()
    }

    /// Makes the device's writes visible to the CPU (cache invalidate). A no-op for non-cacheable
    /// buffers.
    pub fn sync_from_device(&mut self) -> Result<()> {
        self.storage.sync_from_device()
    }

    pub(crate) fn storage(&self) -> &dyn Storage<T> {
        &*self.storage
    }

    pub(crate) fn storage_mut(&mut self) -> &mut dyn Storage<T> {
        &mut *self.storage
    }
}

impl<T: Elem> fmt::Debug for Buffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("len", &self.len)
            .field("flags", &format_args!("{:#x}", self.flags))
            .field("domain", &self.domain)
            .finish()
    }
}

/// One GEMM of a submit. `k` and `n` are padded; offsets are in elements of each buffer.
/// The int32 result goes to the submit's C buffer at `c_offset` (`m·n` elements).
pub struct MatMul<'a> {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub a: &'a Buffer<i8>,
    pub a_offset: usize,
    pub b: &'a Buffer<i8>,
    pub b_offset: usize,
    pub c_offset: usize,
}

impl MatMul<'_> {
    /// Multiply-accumulates of this GEMM.
    pub fn macs(&self) -> u64 {
        (self.m * self.k * self.n) as u64
    }
}

/// A validated submit, as the backends receive it.
#[doc(hidden)]
pub struct Submit<'a> {
    pub primitive: Primitive,
    pub gemms: Vec<MatMul<'a>>,
    pub c: &'a mut Buffer<i32>,
    pub cores: CoreMask,
    pub tiles: Tiles,
}

/// What one finished submit did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    /// Hardware tasks per core.
    pub tasks_per_core: [u64; CoreMask::CORES],
    /// Bytes the device read and wrote (A, B, C).
    pub bytes: u64,
    pub macs: u64,
    /// Modelled RK3588 time of the submit in µs (emu only; never a measurement).
    pub modelled_us: Option<f64>,
    /// Runtime matmul contexts the submit had to create (rknn only: each is costly on the board).
    pub contexts_created: u64,
}

/// Backend side of a prepared submit.
#[doc(hidden)]
pub trait Job: Send + Sync {
    /// Executes this thread's share; every `ith` in `0..nth` must be called exactly once.
    fn run_share(&self, ith: usize, nth: usize);
    /// Called once after all shares returned.
    fn finish(self: Box<Self>) -> Result<Report>;
}

/// A backend. Implemented by [`emu`], [`rknn`] and [`cpu`].
#[doc(hidden)]
pub trait Backend: Send + Sync {
    fn kind(&self) -> BackendKind;
    /// Tile sizes of the native layouts this backend expects.
    fn tiles(&self) -> Tiles;
    /// The deepest (padded) K one `run_i8` GEMM takes; deeper ones are split by the caller.
    fn max_k(&self) -> usize;
    /// See [`Device::offloads`].
    fn offloads(&self) -> bool {
        false
    }
    fn alloc_i8(&self, len: usize, flags: u32, domain: u32) -> Result<Box<dyn Storage<i8>>>;
    fn alloc_i32(&self, len: usize, flags: u32, domain: u32) -> Result<Box<dyn Storage<i32>>>;
    /// Checks the backend's own rules (envelopes, domains, syncs) and plans the submit.
    fn prepare<'a>(&'a self, submit: Submit<'a>) -> Result<Box<dyn Job + 'a>>;
    /// Pool threads a submit should use (never more than it has independent work units for).
    fn threads(&self) -> usize;
    /// The vendor runtime's version string, where there is one.
    fn runtime_version(&self) -> Option<String> {
        None
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

#[derive(Default)]
struct Counters {
    submits: [AtomicU64; 3],
    tasks: [AtomicU64; CoreMask::CORES],
    bytes: AtomicU64,
    macs: AtomicU64,
    modelled_ns: AtomicU64,
    contexts_created: AtomicU64,
    buffers_created: AtomicU64,
}

impl Counters {
    fn record(&self, p: Primitive, r: &Report) {
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
}

/// Whether a GEMM of depth `k` (padded) may go to `run_chain_i8` / `run_stream_i8` on the NPU
/// backends: `K % 512 == 0 && K <= 4096`, outside which the hardware's full-K reduction schedule is
/// wrong. Outside it, use `run_i8`.
pub fn in_stream_envelope(k: usize) -> bool {
    k.is_multiple_of(emu::STREAM_K_MULTIPLE) && k <= emu::STREAM_MAX_K
}

/// Backend selection, as in `ORK_BACKEND`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// `rknn` when the runtime loads and answers, else `emu`.
    Auto,
    Emu,
    Rknn,
    Cpu,
}

impl BackendChoice {
    pub fn parse(s: &str) -> Option<BackendChoice> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Some(BackendChoice::Auto),
            "emu" => Some(BackendChoice::Emu),
            "rknn" => Some(BackendChoice::Rknn),
            "cpu" => Some(BackendChoice::Cpu),
            _ => None,
        }
    }
}

/// What [`Device::open`] opens: the backend and its settings (`crate::config` fills it).
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceConfig {
    pub backend: BackendChoice,
    /// The vendor runtime's settings (`ORK_RKNN_LIB`, `ORK_RKNN_DYNAMIC_M`).
    pub rknn: rknn::Config,
    /// Cores of `run_i8` and `run_stream_i8`.
    pub core_mask: CoreMask,
    /// Kernel path and pool threads of the CPU-executed backends (emu, cpu).
    pub host: HostExec,
    pub emu: emu::Config,
}

impl Default for DeviceConfig {
    fn default() -> DeviceConfig {
        DeviceConfig {
            backend: BackendChoice::Auto,
            rknn: rknn::Config::default(),
            core_mask: CoreMask::ALL,
            host: HostExec::default(),
            emu: emu::Config::default(),
        }
    }
}

static NEXT_DEVICE_ID: AtomicU64 = AtomicU64::new(1);
static LOG_CHOICE: Once = Once::new();

/// The device: one backend, its counters and its default core mask. Safe to share between threads.
pub struct Device {
    id: u64,
    backend: Box<dyn Backend>,
    counters: Counters,
    core_mask: AtomicU8,
}

impl Device {
    fn with_backend(backend: Box<dyn Backend>) -> Device {
        Device {
            id: NEXT_DEVICE_ID.fetch_add(1, Ordering::Relaxed),
            backend,
            counters: Counters::default(),
            core_mask: AtomicU8::new(CoreMask::ALL.0),
        }
    }

    /// The emulated RK3588 NPU with `config`, on the best kernel path and every core.
    pub fn emu(config: emu::Config) -> Device {
        Device::emu_monitored(config).0
    }

    /// [`Device::emu`], with a view of the emulator's domain accounting and operation counts
    /// that stays valid after the device is dropped (leak and fault-injection checks).
    pub fn emu_monitored(config: emu::Config) -> (Device, emu::Monitor) {
        let emu = emu::Emu::new(config, HostExec::default());
        let monitor = emu.monitor();
        (Device::with_backend(Box::new(emu)), monitor)
    }

    /// The CPU int8 GEMM behind the device interface, on the best kernel path and every core.
    pub fn cpu() -> Device {
        Device::with_backend(Box::new(cpu::Cpu::new(HostExec::default())))
    }

    /// The vendor runtime, from `path` or the default library names.
    pub fn rknn(path: Option<&str>) -> Result<Device> {
        rknn::open(path).map(Device::with_backend)
    }

    /// The vendor runtime with explicit settings.
    pub fn rknn_with(config: &rknn::Config) -> Result<Device> {
        rknn::open_with(config).map(Device::with_backend)
    }

    /// Opens the backend `cfg` names; `Auto` tries `rknn` and falls back to `emu`. The device's
    /// core mask starts as `cfg.core_mask`.
    pub fn open(cfg: &DeviceConfig) -> Result<Device> {
        let emu = || emu::Emu::new(cfg.emu.clone(), cfg.host);
        let backend: Box<dyn Backend> = match cfg.backend {
            BackendChoice::Emu => Box::new(emu()),
            BackendChoice::Cpu => Box::new(cpu::Cpu::new(cfg.host)),
            BackendChoice::Rknn => rknn::open_with(&cfg.rknn)?,
            BackendChoice::Auto => rknn::open_with(&cfg.rknn).unwrap_or_else(|e| {
                log::debug!("rknn backend unavailable ({e}); using the emulator");
                Box::new(emu())
            }),
        };
        let dev = Device::with_backend(backend);
        dev.set_core_mask(cfg.core_mask);
        LOG_CHOICE.call_once(|| {
            let profile = match (&cfg.emu.profile, dev.backend()) {
                (Some(p), BackendKind::Emu) => {
                    format!("; cost model from board profile {}", p.display())
                }
                _ => String::new(),
            };
            log::info!(
                "NPU backend: {} (ORK_BACKEND={:?}){profile}",
                dev.backend().name(),
                cfg.backend
            )
        });
        Ok(dev)
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
        self.counters
            .buffers_created
            .fetch_add(1, Ordering::Relaxed);
        Ok(Buffer {
            device: self.id,
            flags,
            domain,
            len,
            storage,
        })
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
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            backend: self.backend().name(),
            submits: c.submits.each_ref().map(load),
            tasks_per_core: c.tasks.each_ref().map(load),
            bytes: load(&c.bytes),
            macs: load(&c.macs),
            modelled_us: load(&c.modelled_ns) as f64 / 1e3,
            contexts_created: load(&c.contexts_created),
            buffers_created: load(&c.buffers_created),
        }
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
