//! The emulated RK3588 NPU: the default backend wherever no NPU answers.
//!
//! It refuses what the board refuses and shows what the board would show:
//! - native layouts only; K and N multiples of 32; `run_i8` up to K = 10240; chain and stream only
//!   inside `K % 512 == 0 && K <= 4096` ([`Error::Envelope`] otherwise);
//! - IOMMU: 8 domains of 32-bit IOVA, [`DOMAIN_BYTES`] usable each (sizes are accounted, memory is
//!   only touched when used); a full domain fails buffer creation, a submit mixing domains is
//!   rejected (the board faults and soft-resets the NPU);
//! - CACHEABLE buffers have a CPU view and a device view: a submit reads the device view, so CPU
//!   writes not synced to the device are read stale, and results stay invisible to the CPU until
//!   synced from the device. With `strict` (the default) a stale input is an error
//!   ([`Error::NotSynced`]), otherwise a warning and the stale bytes are read;
//! - 3 cores: the submit is planned first as data (tasks: N-tile range, row range, core; rows per
//!   task capped by the CBUF rule), then executed on the CPU int8 GEMM, exact int32;
//! - a cost model of the board ([`CostModel`]) gives each submit a *modelled* time.
//!
//! With [`Config::dump`] (`ORK_EMU_DUMP=dir`) it writes every submit's A, B and C (device views)
//! to files for diffing. [`Config::faults`] makes chosen allocations, submits or syncs fail
//! ([`FaultPlan`]); a [`Monitor`] reads the domain accounting and the operation counts, also after
//! the emulator is gone.

mod cost;
mod faults;
mod profile;

pub use cost::{CostModel, SubmitParts};
pub use faults::{Fault, FaultOp, FaultPlan, OpCounts};
pub use profile::ProfileFigures;

use super::exec::{self, Execution, GemmView, HostExec, Split, Task};
use super::{
    storage_as, storage_as_mut, Backend, BackendKind, Error, Job, Primitive, Report, Result,
    Storage, Submit,
};
use crate::layout::Tiles;
use crate::sync::lock;
use std::any::Any;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// IOMMU domains of the RK3588 NPU.
pub const DOMAINS: u32 = 8;
/// Usable bytes of one domain's 32-bit IOVA space (about 3.9 GiB: the runtime keeps the rest).
pub const DOMAIN_BYTES: u64 = (4 << 30) - (96 << 20);
/// IOVA pages: every buffer takes whole pages of its domain.
pub const PAGE: u64 = 4096;
/// Largest K of one `run_i8` (runtime 2.3.2).
pub const RUN_MAX_K: usize = 10240;
/// Chain and stream: the full-K reduction schedule is right only for K a multiple of this...
pub const STREAM_K_MULTIPLE: usize = 512;
/// ...and up to this K.
pub const STREAM_MAX_K: usize = 4096;
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
            faults: FaultPlan::default(),
        }
    }
}

/// Bytes in use per IOMMU domain, and the most ever in use.
struct Domains {
    used: Mutex<Usage>,
    capacity: u64,
}

#[derive(Default)]
struct Usage {
    now: [u64; DOMAINS as usize],
    peak: [u64; DOMAINS as usize],
}

/// What the emulator and its buffers share: the domain accounting and the fault counters.
struct Shared {
    domains: Domains,
    faults: faults::Faults,
}

/// A view of one emulator's accounting, valid after the emulator and its buffers are gone.
#[derive(Clone)]
pub struct Monitor(Arc<Shared>);

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
    fn reserve(&self, domain: u32, bytes: u64) -> Result<u64> {
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

    fn release(&self, domain: u32, pages: u64) {
        lock(&self.used).now[domain as usize] -= pages;
    }
}

/// An emulated buffer: the CPU's view and, while a CACHEABLE buffer's two sides differ, the
/// device's own view.
///
/// The device view exists only while it differs from the CPU's: CPU writes to a synced buffer
/// first set the old contents aside as the device view, a sync to the device drops it, a submit
/// writing the buffer gets its own view, and a sync from the device makes that view the CPU's.
/// So a synced weight buffer costs its size once, and syncs move no bytes.
///
/// A strict buffer does not set the old contents aside when the CPU writes: a submit refuses
/// its unflushed input, so nothing reads them. A submit writing it, or a sync from the device,
/// before the CPU's writes are flushed takes the CPU's contents for the device memory's old ones
/// (the board would show those; only the bytes the submit did not write differ). Rewriting a
/// recycled weight buffer then costs no copy of its old weights.
///
/// A view that stops being needed is kept as the next split's vector, with a bound on where it
/// differs from the CPU's, so that a recycled output buffer costs neither fresh pages nor a copy
/// of what the submit overwrites: only the bytes that differ and that the submit leaves alone are
/// copied (at real scale the fresh pages and whole-buffer copies were a quarter of the host's
/// time per ubatch, docs/PERFORMANCE.md). A buffer whose views once parted (a submit wrote it,
/// or a lenient buffer's CPU rewrote it) so holds two vectors of its length from then on, as the
/// board holds its device memory besides the CPU's cached view.
pub struct EmuStorage<T> {
    cpu: Vec<T>,
    /// What the NPU sees when it differs from `cpu` (always None when non-cacheable).
    dev: Option<Vec<T>>,
    /// The last retired view (empty if none), reused by the next split.
    spare: Vec<T>,
    /// Elements outside this range are equal in `cpu` and in `dev` (or, without a device view,
    /// `spare`); None: no such bound is known.
    differs: Option<Range<usize>>,
    cacheable: bool,
    strict: bool,
    /// Neither side has written since allocation: both views are zero.
    fresh: bool,
    /// The CPU wrote since the last sync to the device.
    cpu_dirty: bool,
    /// The device wrote since the last sync from the device.
    dev_newer: bool,
    domain: u32,
    pages: u64,
    shared: Arc<Shared>,
}

impl<T: Copy + Default + Send + Sync + 'static> EmuStorage<T> {
    /// What the NPU reads.
    fn device_view(&self) -> &[T] {
        self.dev.as_deref().unwrap_or(&self.cpu)
    }

    /// Gives a cacheable buffer a device view of its own, holding what the device sees now except
    /// in `overwritten` (sorted, disjoint ranges the caller writes next, whose old contents are
    /// then left as they are), and widens `differs` by `overwritten`.
    fn split_views(&mut self, overwritten: &[Range<usize>]) {
        if !self.cacheable {
            return;
        }
        if self.dev.is_none() {
            let len = self.cpu.len();
            let dev = if self.fresh {
                // A fresh buffer is all zero: a zeroed vector costs no copy and no touched pages.
                self.differs = Some(0..0);
                vec![T::default(); len]
            } else {
                let mut dev = std::mem::take(&mut self.spare);
                let stale = match &self.differs {
                    Some(d) if dev.len() == len => d.clone(),
                    _ => {
                        dev.resize(len, T::default());
                        0..len
                    }
                };
                for r in outside(stale, overwritten) {
                    dev[r.clone()].copy_from_slice(&self.cpu[r]);
                }
                self.differs = Some(0..0);
                dev
            };
            self.dev = Some(dev);
        }
        self.fresh = false;
        if let (Some(d), Some(first), Some(last)) =
            (&mut self.differs, overwritten.first(), overwritten.last())
        {
            *d = if d.start == d.end {
                first.start..last.end
            } else {
                d.start.min(first.start)..d.end.max(last.end)
            };
        }
    }

    /// What a submit writes, all of it into `written` (sorted, disjoint ranges): the device view
    /// (made separate first for a cacheable buffer).
    fn device_view_mut(&mut self, written: &[Range<usize>]) -> &mut [T] {
        self.split_views(written);
        self.dev_newer = self.cacheable;
        match &mut self.dev {
            Some(d) => d,
            None => &mut self.cpu,
        }
    }
}

impl<T> Drop for EmuStorage<T> {
    fn drop(&mut self) {
        self.shared.domains.release(self.domain, self.pages);
    }
}

impl<T: Copy + Default + Send + Sync + 'static> Storage<T> for EmuStorage<T> {
    fn cpu(&self) -> &[T] {
        if self.dev_newer {
            // Debug level: polling a buffer before syncing is legitimate, if pointless.
            log::debug!(
                "emu: CPU reads a cacheable buffer the NPU wrote, without sync_from_device"
            );
        }
        &self.cpu
    }

    fn cpu_mut(&mut self) -> &mut [T] {
        if self.strict {
            self.fresh = false;
        } else {
            self.split_views(&[]);
        }
        // The CPU may write anywhere.
        self.differs = None;
        self.cpu_dirty = self.cacheable;
        &mut self.cpu
    }

    fn sync_to_device(&mut self) -> Result<()> {
        if let Some(msg) = self.shared.faults.fails(FaultOp::SyncToDevice) {
            return Err(Error::Device(msg));
        }
        // A flush writes back what the CPU dirtied; untouched lines leave the device's as they are.
        if self.cpu_dirty {
            if let Some(dev) = self.dev.take() {
                self.spare = dev;
            }
            self.cpu_dirty = false;
            self.dev_newer = false;
        }
        Ok(())
    }

    fn sync_from_device(&mut self) -> Result<()> {
        if let Some(msg) = self.shared.faults.fails(FaultOp::SyncFromDevice) {
            return Err(Error::Device(msg));
        }
        // An invalidate makes the CPU see the device's memory, dropping unflushed CPU writes.
        if let Some(dev) = self.dev.take() {
            self.spare = std::mem::replace(&mut self.cpu, dev);
        }
        self.cpu_dirty = false;
        self.dev_newer = false;
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// The emulator backend.
pub struct Emu {
    config: Config,
    host: HostExec,
    shared: Arc<Shared>,
    submits: AtomicU64,
}

impl Emu {
    pub fn new(config: Config, host: HostExec) -> Emu {
        let shared = Arc::new(Shared {
            domains: Domains {
                used: Mutex::new(Usage::default()),
                capacity: config.domain_bytes,
            },
            faults: faults::Faults::new(config.faults.clone()),
        });
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

    fn alloc<T: Copy + Default + Send + Sync + 'static>(
        &self,
        len: usize,
        flags: u32,
        domain: u32,
    ) -> Result<EmuStorage<T>> {
        let bytes = (len as u64).saturating_mul(std::mem::size_of::<T>() as u64);
        self.shared.faults.alloc(domain, bytes)?;
        let pages = self.shared.domains.reserve(domain, bytes)?;
        // Zeroed vectors come from calloc/mmap: pages are only backed once touched, so a full
        // domain can be modelled without 4 GiB of RAM.
        let cacheable = flags & super::flags::CACHEABLE != 0;
        Ok(EmuStorage {
            cpu: vec![T::default(); len],
            dev: None,
            spare: Vec::new(),
            differs: None,
            cacheable,
            strict: self.config.strict,
            fresh: true,
            cpu_dirty: false,
            dev_newer: false,
            domain,
            pages,
            shared: Arc::clone(&self.shared),
        })
    }

    /// Rejects what the board cannot run.
    fn check_envelope(primitive: Primitive, k: usize) -> Result<()> {
        let reason = match primitive {
            Primitive::RunI8 if k > RUN_MAX_K => format!("K={k} > {RUN_MAX_K}"),
            Primitive::ChainI8 | Primitive::StreamI8 if !super::in_stream_envelope(k) => {
                format!("K={k} needs K % {STREAM_K_MULTIPLE} == 0 and K <= {STREAM_MAX_K}")
            }
            _ => return Ok(()),
        };
        Err(Error::Envelope { primitive, reason })
    }

    /// The tasks of a submit: `run_i8` over the core count the cost model likes best, stream
    /// with each GEMM over all enabled cores, chain on its one core.
    fn plan(
        cost: &CostModel,
        tiles: &Tiles,
        primitive: Primitive,
        shapes: &[(usize, usize, usize)],
        cores: &[usize],
    ) -> Vec<Task> {
        let plan_over = |cores: &[usize]| -> Vec<Task> {
            let mut tasks = Vec::new();
            for (g, &(m, k, n)) in shapes.iter().enumerate() {
                let m_max = (CBUF_ELEMS / k).max(1);
                for (core, n0, n1) in exec::split_channels(tiles, 0, n, cores) {
                    tasks.extend(exec::tasks_for(g, core, m, (n0, n1), TASK_MAX_N, m_max));
                }
            }
            tasks
        };
        match primitive {
            Primitive::ChainI8 => plan_over(&cores[..1]),
            Primitive::StreamI8 => plan_over(cores),
            // The auto-tuner: fewer cores save per-task costs on small GEMMs.
            Primitive::RunI8 => (1..=cores.len())
                .map(|c| plan_over(&cores[..c]))
                .min_by(|a, b| {
                    let t = |p: &Vec<Task>| cost.submit_us(&Emu::cost_input(shapes, p));
                    t(a).total_cmp(&t(b))
                })
                .unwrap_or_default(),
        }
    }

    /// What each task costs: its MACs, and the bytes it moves: its A rows and C block, plus the
    /// B slice for the first task of each N-range only (the weights of a slice are assumed to stay
    /// in the convolution buffer across its row tasks; re-reading them per row task would put
    /// large GEMMs far below the 0.4 TOPS seen in practice).
    fn cost_input(shapes: &[(usize, usize, usize)], tasks: &[Task]) -> Vec<cost::TaskCost> {
        let mut weights_loaded = std::collections::HashSet::new();
        tasks
            .iter()
            .map(|t| {
                let k = shapes[t.gemm].1 as u64;
                let (rows, ch) = (t.rows() as u64, t.channels() as u64);
                let b = if weights_loaded.insert((t.gemm, t.n0, t.n1)) {
                    ch * k
                } else {
                    0
                };
                cost::TaskCost {
                    core: t.core,
                    macs: rows * ch * k,
                    bytes: rows * k + b + rows * ch * 4,
                }
            })
            .collect()
    }
}

/// The parts of the modelled time of one submit of `primitive` over GEMMs of `shapes` (M, padded
/// K, padded N) on `cores`, planned exactly as the emulator plans the submit it executes. The
/// board timeline model prices NPU runs with it.
pub fn modelled_submit(
    cost: &CostModel,
    primitive: Primitive,
    shapes: &[(usize, usize, usize)],
    cores: &[usize],
) -> SubmitParts {
    let tasks = Emu::plan(cost, &Tiles::RK3588, primitive, shapes, cores);
    cost.parts(&Emu::cost_input(shapes, &tasks))
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

    fn alloc_i8(&self, len: usize, flags: u32, domain: u32) -> Result<Box<dyn Storage<i8>>> {
        Ok(Box::new(self.alloc::<i8>(len, flags, domain)?))
    }

    fn alloc_i32(&self, len: usize, flags: u32, domain: u32) -> Result<Box<dyn Storage<i32>>> {
        Ok(Box::new(self.alloc::<i32>(len, flags, domain)?))
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
        let domain = c.domain();
        for g in &gemms {
            Emu::check_envelope(primitive, g.k)?;
            for found in [g.a.domain(), g.b.domain()] {
                if found != domain {
                    return Err(Error::DomainMismatch {
                        expected: domain,
                        found,
                    });
                }
            }
        }
        let mut views = Vec::with_capacity(gemms.len());
        for g in &gemms {
            let a = storage_as::<EmuStorage<i8>, i8>(g.a.storage())?;
            let b = storage_as::<EmuStorage<i8>, i8>(g.b.storage())?;
            for (name, s) in [("A", a), ("B", b)] {
                if s.cpu_dirty {
                    if self.config.strict {
                        return Err(Error::NotSynced { operand: name });
                    }
                    log::warn!("emu: {name} was written by the CPU and not synced: the NPU reads stale data");
                }
            }
            views.push(GemmView {
                m: g.m,
                k: g.k,
                a: &a.device_view()[g.a_offset..g.a_offset + g.m * g.k],
                b: &b.device_view()[g.b_offset..g.b_offset + g.k * g.n],
            });
        }
        let shapes: Vec<_> = gemms.iter().map(|g| (g.m, g.k, g.n)).collect();
        let tasks = Emu::plan(
            &self.config.cost,
            &tiles,
            primitive,
            &shapes,
            &cores.cores(),
        );
        let costs = Emu::cost_input(&shapes, &tasks);
        let mut report = Report {
            modelled_us: Some(self.config.cost.submit_us(&costs)),
            ..Report::default()
        };
        for t in &costs {
            report.tasks_per_core[t.core] += 1;
            report.bytes += t.bytes;
            report.macs += t.macs;
        }
        let c_offsets: Vec<usize> = gemms.iter().map(|g| g.c_offset).collect();
        // A failing run leaves garbage where its results would be, so that a caller ignoring the
        // error would show it.
        let failure = self.shared.faults.fails(FaultOp::Run);
        let c_len = c.len();
        let written = match failure {
            Some(_) => std::iter::once(0..c_len).collect(),
            None => {
                // `exec::validate` (in `Device::prepare`) checked that they fit C and do not overlap.
                let mut r: Vec<_> = gemms
                    .iter()
                    .map(|g| g.c_offset..g.c_offset + g.m * g.n)
                    .collect();
                r.sort_by_key(|r| r.start);
                r
            }
        };
        let c_dev =
            storage_as_mut::<EmuStorage<i32>, i32>(c.storage_mut())?.device_view_mut(&written);
        if failure.is_some() {
            c_dev.fill(FAILED_RUN_GARBAGE);
        }
        let split = Split {
            threads: self.host.threads,
            per_task: self.config.per_task,
        };
        let dump = self
            .config
            .dump
            .clone()
            .map(|dir| (dir, self.submits.fetch_add(1, Ordering::Relaxed)));
        let dump_inputs: Vec<(Vec<i8>, Vec<i8>)> = match dump {
            Some(_) => views.iter().map(|v| (v.a.to_vec(), v.b.to_vec())).collect(),
            None => Vec::new(),
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
            dump_inputs,
            gemms: shapes.len(),
        }))
    }
}

/// The parts of `range` outside `holes` (sorted, disjoint).
fn outside(range: Range<usize>, holes: &[Range<usize>]) -> Vec<Range<usize>> {
    let mut parts = Vec::new();
    let mut at = range.start;
    for h in holes {
        if h.start > at {
            parts.push(at..h.start.min(range.end));
        }
        at = at.max(h.end);
        if at >= range.end {
            break;
        }
    }
    if at < range.end {
        parts.push(at..range.end);
    }
    parts.retain(|p| !p.is_empty());
    parts
}

/// What the device side of a failed run's output holds.
const FAILED_RUN_GARBAGE: i32 = 0x5a5a_5a5a;

struct EmuJob<'a> {
    exec: Execution<'a>,
    /// An injected run failure: nothing is computed and finishing returns it.
    failure: Option<String>,
    report: Report,
    dump: Option<(PathBuf, u64)>,
    dump_inputs: Vec<(Vec<i8>, Vec<i8>)>,
    gemms: usize,
}

impl Job for EmuJob<'_> {
    fn run_share(&self, _ith: usize, _nth: usize) {
        if self.failure.is_none() {
            self.exec.run();
        }
    }

    fn finish(self: Box<Self>) -> Result<Report> {
        if let Some(msg) = self.failure {
            return Err(Error::Device(msg));
        }
        if let Some((dir, seq)) = &self.dump {
            dump(
                dir,
                *seq,
                &self.dump_inputs,
                (0..self.gemms).map(|g| self.exec.result(g)),
            )
            .map_err(|e| Error::Device(format!("ORK_EMU_DUMP to {}: {e}", dir.display())))?;
        }
        Ok(self.report)
    }
}

/// Writes `submit-<seq>-g<i>-{a,b,c}.bin` (native layouts, little-endian) into `dir`.
fn dump(
    dir: &std::path::Path,
    seq: u64,
    inputs: &[(Vec<i8>, Vec<i8>)],
    results: impl Iterator<Item = Vec<i32>>,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (g, ((a, b), c)) in inputs.iter().zip(results).enumerate() {
        let bytes = |v: &[i8]| v.iter().map(|&x| x as u8).collect::<Vec<u8>>();
        std::fs::write(dir.join(format!("submit-{seq}-g{g}-a.bin")), bytes(a))?;
        std::fs::write(dir.join(format!("submit-{seq}-g{g}-b.bin")), bytes(b))?;
        let c: Vec<u8> = c.iter().flat_map(|x| x.to_le_bytes()).collect();
        std::fs::write(dir.join(format!("submit-{seq}-g{g}-c.bin")), c)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written_and_rewritten(strict: bool) -> EmuStorage<i8> {
        let emu = Emu::new(
            Config {
                strict,
                ..Config::default()
            },
            HostExec::default(),
        );
        let mut s = emu
            .alloc::<i8>(4096, super::super::flags::CPU_FILLED, 0)
            .unwrap();
        s.cpu_mut().fill(1);
        s.sync_to_device().unwrap();
        s.cpu_mut().fill(2);
        s
    }

    #[test]
    fn only_a_lenient_buffer_keeps_what_the_cpu_overwrote() {
        let lenient = written_and_rewritten(false);
        assert!(
            lenient.device_view().iter().all(|&x| x == 1),
            "stale view kept"
        );
        let mut strict = written_and_rewritten(true);
        assert!(strict.dev.is_none(), "no copy of the old contents");
        assert!(
            strict.cpu_dirty,
            "a submit still refuses the unflushed input"
        );
        strict.sync_to_device().unwrap();
        assert!(strict.device_view().iter().all(|&x| x == 2));
    }

    /// The two views as the emulator defines them, keeping a whole copy whenever they part.
    struct Views {
        cpu: Vec<i32>,
        dev: Option<Vec<i32>>,
        dirty: bool,
    }

    #[test]
    fn reused_views_show_what_whole_copies_show() {
        const LEN: usize = 64;
        let mut rng = crate::testutil::Rng::new(7);
        for strict in [true, false] {
            let emu = Emu::new(
                Config {
                    strict,
                    ..Config::default()
                },
                HostExec::default(),
            );
            let flags = super::super::flags::CPU_FILLED;
            let mut s = emu.alloc::<i32>(LEN, flags, 0).unwrap();
            let mut v = Views {
                cpu: vec![0; LEN],
                dev: None,
                dirty: false,
            };
            let mut value = 0;
            for step in 0..20_000 {
                value += 1;
                match rng.below(4) {
                    0 => {
                        let (a, b) = (rng.below(LEN), rng.below(LEN + 1));
                        let r = a.min(b)..a.max(b);
                        s.cpu_mut()[r.clone()].fill(value);
                        if !strict && v.dev.is_none() {
                            v.dev = Some(v.cpu.clone());
                        }
                        v.cpu[r].fill(value);
                        v.dirty = true;
                    }
                    1 => {
                        // Up to three disjoint regions, as a submit of several GEMMs writes.
                        let mut cuts: Vec<usize> = (0..6).map(|_| rng.below(LEN + 1)).collect();
                        cuts.sort();
                        let written: Vec<_> = cuts
                            .chunks(2)
                            .map(|c| c[0]..c[1])
                            .filter(|r| !r.is_empty() && rng.below(3) > 0)
                            .collect();
                        let dev = s.device_view_mut(&written);
                        let model = v.dev.get_or_insert_with(|| v.cpu.clone());
                        for r in &written {
                            dev[r.clone()].fill(value);
                            model[r.clone()].fill(value);
                        }
                    }
                    2 => {
                        s.sync_to_device().unwrap();
                        if v.dirty {
                            v.dev = None;
                            v.dirty = false;
                        }
                    }
                    _ => {
                        s.sync_from_device().unwrap();
                        if let Some(d) = v.dev.take() {
                            v.cpu = d;
                        }
                        v.dirty = false;
                    }
                }
                assert_eq!(s.cpu, v.cpu, "CPU view, step {step}, strict {strict}");
                let model_dev = v.dev.as_ref().unwrap_or(&v.cpu);
                assert_eq!(s.device_view(), &model_dev[..], "device view, step {step}");
            }
        }
    }

    #[test]
    fn a_recycled_output_buffer_reuses_its_two_vectors() {
        let emu = Emu::new(Config::default(), HostExec::default());
        let mut s = emu
            .alloc::<i32>(1 << 16, super::super::flags::CPU_FILLED, 0)
            .unwrap();
        let mut seen = std::collections::HashSet::new();
        for round in 0..8 {
            let n = 1000 + round * 3000;
            s.device_view_mut(std::slice::from_ref(&(0..n)))
                .fill(round as i32);
            s.sync_from_device().unwrap();
            assert!(s.cpu[..n].iter().all(|&x| x == round as i32));
            seen.insert(s.cpu.as_ptr());
        }
        assert!(seen.len() <= 2, "{} vectors for one buffer", seen.len());
    }
}
