//! The real backend: the vendor runtime `librknnrt.so`, opened with `dlopen` (no link-time
//! dependency), driven through its matmul API with every operand in the native layout.
//!
//! Where the runtime's documentation stops, the backend does what is known to work (the vendor's
//! demo, rk-llama.cpp) and nothing else:
//! - **Opening** ([`open_with`]): the library must be of SDK 2.0 or newer; its version string is read
//!   from the file (the matmul API has no version query) and logged, and an older one, or one without
//!   `rknn_create_mem2` / `rknn_mem_sync`, is refused with a message naming both. A first matmul
//!   context must be creatable and report its tile sizes; when the runtime returns -1 there (no NPU),
//!   the error names the library and what this machine shows of the rknpu driver and its device node.
//!   Each core is then tried with `rknn_matmul_set_core_mask`: on a single-core chip (RK3566/RK3568,
//!   where the call returns -1) every GEMM runs on the one core with no mask, decided here, once.
//! - **Memory**: `rknn_create_mem2` on a small per-domain allocation context (memory belongs to a
//!   context, and a context to an IOMMU domain); driver flag CACHEABLE maps to the runtime's
//!   cacheable allocation, anything else to non-cacheable. Syncs are `rknn_mem_sync`.
//! - **Operands at an offset** ([`mem`]): A and B at an offset are bound through views
//!   (`rknn_create_mem_from_fd`) made once per (buffer, offset) and destroyed just before their
//!   buffer, never earlier, so imports do not grow with the number of runs. C at an offset (the
//!   slices of a GEMM split over cores, whose offsets change with M) goes through a spare staging
//!   buffer instead, copied into C when the submit finishes. Offsets the C API's `int32_t` cannot
//!   hold (2 GiB and beyond) are staged too, never wrapped.
//! - **Contexts** ([`ctx`]): one per (K, N, core, domain) and M range: with the dynamic-shape API
//!   (`rknn_matmul_create_dynamic_shape`, or 2.0's `_dyn_shape`) a context serves
//!   [`Config::dynamic_m`] consecutive M values, so prefill's many row counts reuse a handful of
//!   contexts; without it (or with `dynamic_m = 0`), one context per M. Each context's reported
//!   tensor dims, sizes and types are checked against the layout the packer writes. Contexts created
//!   are counted in [`crate::npu::Report::contexts_created`].
//! - **Threads**: `rknn_matmul_set_io_mem` (and `set_dynamic_shape`) is not documented as
//!   thread-safe, so all binding in the process happens under one lock; only `rknn_matmul_run`
//!   overlaps across contexts, as in rk-llama.cpp. Each context is driven by one thread at a time.
//! - `run_i8`: the N-tiles are split over the enabled cores, one context per core, run concurrently
//!   by the submit's shares. Chain: the GEMMs one after another on one core. Stream: the GEMMs
//!   spread over the cores. Chain and stream keep the NPU envelope of the emulator, so the engine
//!   behaves the same on every backend.
//!
//! `unsafe` lives here (and in [`sys`], [`ctx`], [`mem`]) only, each block with its reason.

mod ctx;
mod diag;
mod mem;
mod sys;

use super::exec;
use super::{
    storage_as, Backend, BackendKind, Buffer, CoreMask, Elem, Error, Job, Primitive, Report,
    Result, Storage, Submit,
};
use crate::layout::Tiles;
use crate::sync::lock;
use ctx::{CreateError, MatmulCtx};
use mem::{Mem, RknnStorage, Spares};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use sys::{Api, TensorMem};

/// Largest K of one `run_i8` here. The runtime takes up to 10240, but above 8192 it wants B split
/// into K-segments of its own layout; deeper GEMMs get [`Error::Envelope`], and the engine sums
/// them from depth segments of at most this K (`Device::max_k`).
const MAX_K: usize = 8192;
/// Matmul contexts kept before unused ones are destroyed (the board timeline model of
/// `ork-probe model` counts creations with the same rule).
pub const CONTEXT_CACHE: usize = 256;

/// Settings of the rknn backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The runtime library; `None`: `librknnrt.so`, then `/usr/lib`, `/usr/lib64`.
    pub lib: Option<String>,
    /// M values one dynamic-shape context covers (1..=W, W+1..=2W, ...), at most 512; 0: one context
    /// per M (also what a runtime without the dynamic-shape API gets).
    pub dynamic_m: usize,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            lib: None,
            dynamic_m: DEFAULT_DYNAMIC_M,
        }
    }
}

/// Default of [`Config::dynamic_m`]: prefill's rows per expert mostly fall in the first bucket or
/// two, and a context declares only this many shapes up front.
pub const DEFAULT_DYNAMIC_M: usize = 64;

/// What this machine shows of the rknpu driver's device nodes (`rknpu device nodes:
/// /dev/dri/renderD129 opens`, or which DRM nodes exist and their drivers), for the board check
/// and error messages.
pub fn device_nodes() -> String {
    diag::device_nodes(
        std::path::Path::new("/sys/class/drm"),
        std::path::Path::new("/dev"),
    )
}

/// A runtime error code as an [`Error`].
fn check(what: &str, code: i32) -> Result<()> {
    if code == sys::SUCC {
        Ok(())
    } else {
        Err(Error::Device(format!(
            "{what} failed with {code} ({})",
            diag::code_name(code)
        )))
    }
}

/// What buffers and submits share: the runtime, the per-domain allocation contexts and the lock
/// every binding takes.
struct Shared {
    api: Arc<Api>,
    alloc_ctx: Mutex<HashMap<u32, Arc<Mutex<MatmulCtx>>>>,
    bind: Mutex<()>,
}

impl Shared {
    fn alloc_ctx(&self, domain: u32) -> std::result::Result<Arc<Mutex<MatmulCtx>>, CreateError> {
        let mut map = lock(&self.alloc_ctx);
        if let Some(c) = map.get(&domain) {
            return Ok(Arc::clone(c));
        }
        let c = Arc::new(Mutex::new(MatmulCtx::create(
            &self.api,
            1..=1,
            false,
            32,
            32,
            domain,
            None,
        )?));
        map.insert(domain, Arc::clone(&c));
        Ok(c)
    }

    fn alloc(&self, bytes: usize, cacheable: bool, sram: bool, domain: u32) -> Result<Mem> {
        let ctx = self.alloc_ctx(domain)?;
        Mem::alloc(&self.api, ctx, bytes, cacheable, sram, domain)
    }
}

/// Which M a context serves: exactly one, or the `b`-th range of `dynamic_m` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Rows {
    Exact(usize),
    Bucket(usize),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct CtxKey {
    rows: Rows,
    k: usize,
    n: usize,
    core: usize,
    domain: u32,
}

/// The rknn backend.
pub struct Rknn {
    shared: Arc<Shared>,
    tiles: Tiles,
    /// The NPU cores contexts are pinned to; empty on a single-core chip (no core masks at all).
    pinned: Vec<usize>,
    /// [`Config::dynamic_m`] where the runtime has dynamic shapes, else 0.
    dynamic_m: usize,
    contexts: Mutex<HashMap<CtxKey, Arc<Mutex<MatmulCtx>>>>,
    spares: Spares,
}

/// [`open_with`] the default settings and the library at `path` (or the default names).
pub fn open(path: Option<&str>) -> Result<Box<dyn Backend>> {
    open_with(&Config {
        lib: path.map(String::from),
        ..Config::default()
    })
}

/// Opens the runtime and checks that it answers (see the module documentation).
pub fn open_with(config: &Config) -> Result<Box<dyn Backend>> {
    let api = Arc::new(Api::open(config.lib.as_deref()).map_err(Error::Device)?);
    let shared = Arc::new(Shared {
        api: Arc::clone(&api),
        alloc_ctx: Mutex::new(HashMap::new()),
        bind: Mutex::new(()),
    });
    let probe = shared.alloc_ctx(0).map_err(|e| match e {
        CreateError::Refused { code, .. } => Error::Device(diag::no_device(&api.describe(), code)),
        CreateError::Failed(e) => e,
    })?;
    let probe = lock(&probe);
    let tiles = probe.tiles()?;
    probe.check_layout(&tiles)?;
    let pinned: Vec<usize> = (0..CoreMask::CORES)
        .filter(|&c| {
            // SAFETY: probe.ctx is a live context of this runtime.
            unsafe { (api.matmul_set_core_mask)(probe.ctx, sys::CORE_0 << c) == sys::SUCC }
        })
        .collect();
    drop(probe);
    let dynamic_m = if api.dynamic.is_some() {
        config.dynamic_m.min(sys::MAX_DYNAMIC_SHAPES)
    } else {
        0
    };
    log::info!(
        "rknn: {} librknnrt {}; {}; {}; tiles {tiles:?}",
        api.describe(),
        api.version
            .as_deref()
            .unwrap_or("(version string not found)"),
        match pinned.len() {
            0 => "one NPU core (core masks refused: single-core chip)".to_string(),
            n => format!("{n} NPU cores"),
        },
        if dynamic_m > 0 {
            format!("dynamic-shape contexts of {dynamic_m} M values")
        } else if api.dynamic.is_none() {
            "no dynamic shapes in this runtime: one context per M".to_string()
        } else {
            "one context per M".to_string()
        },
    );
    Ok(Box::new(Rknn {
        shared,
        tiles,
        pinned,
        dynamic_m,
        contexts: Mutex::new(HashMap::new()),
        spares: Spares::default(),
    }))
}

impl Rknn {
    fn alloc<T: Send + Sync + 'static>(
        &self,
        len: usize,
        flags: u32,
        domain: u32,
    ) -> Result<RknnStorage<T>> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .filter(|&b| b > 0 && b <= u32::MAX as usize)
            .ok_or_else(|| {
                Error::InvalidArgument(format!("rknn buffers hold 1 to 4 GiB, not {len} elements"))
            })?;
        let cacheable = flags & super::flags::CACHEABLE != 0;
        let sram = flags & super::flags::TRY_ALLOC_SRAM != 0;
        let mem = self.shared.alloc(bytes, cacheable, sram, domain)?;
        Ok(RknnStorage::new(mem, len))
    }

    /// The context for `m` rows of a K×N GEMM on `core`, and whether it was created now.
    fn context(
        &self,
        m: usize,
        k: usize,
        n: usize,
        core: usize,
        domain: u32,
    ) -> Result<(Arc<Mutex<MatmulCtx>>, bool)> {
        let w = self.dynamic_m;
        let rows = (m - 1).checked_div(w).map_or(Rows::Exact(m), Rows::Bucket);
        let key = CtxKey {
            rows,
            k,
            n,
            core,
            domain,
        };
        let mut map = lock(&self.contexts);
        if let Some(c) = map.get(&key) {
            return Ok((Arc::clone(c), false));
        }
        if map.len() >= CONTEXT_CACHE {
            map.retain(|_, c| Arc::strong_count(c) > 1);
        }
        let ms = match rows {
            Rows::Bucket(b) => b * w + 1..=(b + 1) * w,
            Rows::Exact(m) => m..=m,
        };
        let pin = (!self.pinned.is_empty()).then_some(core);
        let c = MatmulCtx::create(&self.shared.api, ms, w > 0, k, n, domain, pin)?;
        c.check_layout(&self.tiles)?;
        let c = Arc::new(Mutex::new(c));
        map.insert(key, Arc::clone(&c));
        Ok((c, true))
    }

    /// The cores a submit may use: those asked for that the chip has (all it has if none).
    fn cores(&self, asked: CoreMask) -> Vec<usize> {
        if self.pinned.is_empty() {
            return vec![0];
        }
        let both: Vec<usize> = asked
            .cores()
            .into_iter()
            .filter(|c| self.pinned.contains(c))
            .collect();
        if both.is_empty() {
            self.pinned.clone()
        } else {
            both
        }
    }
}

/// One runtime matmul: its context (one core), its rows and its three operands (tensor_mem, bytes).
struct RunTask {
    ctx: Arc<Mutex<MatmulCtx>>,
    m: usize,
    operands: [(*mut TensorMem, usize); 3],
}

/// Staging buffers a submit holds; back to the spares when it ends, however it ends.
struct Staged<'a> {
    spares: &'a Spares,
    inputs: Vec<Mem>,
    /// Output slices: the buffer the runtime writes and where its `len` elements go in C.
    outputs: Vec<(Mem, usize, usize)>,
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

struct RknnJob<'a> {
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

/// An operand: a buffer and an element range of it.
struct Operand<'b, T: Elem> {
    buf: &'b Buffer<T>,
    offset: usize,
    len: usize,
}

impl Rknn {
    /// The tensor_mem to bind for an input: the buffer or its view, or a staged copy.
    fn bind_input(&self, op: Operand<'_, i8>, staged: &mut Staged<'_>) -> Result<*mut TensorMem> {
        let s = storage_as::<RknnStorage<i8>, i8>(op.buf.storage())?;
        if let Some(mem) = s.mem.binding(op.offset)? {
            return Ok(mem);
        }
        let mut copy = self.stage(op.len, op.buf.domain())?;
        let src = &op.buf.as_slice()[op.offset..op.offset + op.len];
        for (d, &s) in copy.cpu_bytes_mut().iter_mut().zip(src) {
            *d = s as u8;
        }
        copy.sync(sys::SYNC_TO_DEVICE)?;
        let mem = copy.tensor_ptr();
        staged.inputs.push(copy);
        Ok(mem)
    }

    /// The tensor_mem to bind for an output slice: C itself at its start, else a staging buffer.
    fn bind_output(&self, op: Operand<'_, i32>, staged: &mut Staged<'_>) -> Result<*mut TensorMem> {
        let s = storage_as::<RknnStorage<i32>, i32>(op.buf.storage())?;
        if op.offset == 0 {
            return Ok(s.mem.tensor_ptr());
        }
        let out = self.stage(4 * op.len, op.buf.domain())?;
        let mem = out.tensor_ptr();
        staged.outputs.push((out, op.offset, op.len));
        Ok(mem)
    }

    fn stage(&self, bytes: usize, domain: u32) -> Result<Mem> {
        self.spares
            .take(bytes, domain, |b| self.shared.alloc(b, true, false, domain))
    }
}

impl Backend for Rknn {
    fn kind(&self) -> BackendKind {
        BackendKind::Rknn
    }

    fn tiles(&self) -> Tiles {
        self.tiles
    }

    fn max_k(&self) -> usize {
        MAX_K
    }

    fn offloads(&self) -> bool {
        true
    }

    fn alloc_i8(&self, len: usize, flags: u32, domain: u32) -> Result<Box<dyn Storage<i8>>> {
        Ok(Box::new(self.alloc::<i8>(len, flags, domain)?))
    }

    fn alloc_i32(&self, len: usize, flags: u32, domain: u32) -> Result<Box<dyn Storage<i32>>> {
        Ok(Box::new(self.alloc::<i32>(len, flags, domain)?))
    }

    fn threads(&self) -> usize {
        self.pinned.len().max(1)
    }

    fn runtime_version(&self) -> Option<String> {
        self.shared.api.version.clone()
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
        let cores = self.cores(cores);
        let mut units: Vec<Vec<RunTask>> = Vec::new();
        let mut report = Report::default();
        let mut staged = Staged {
            spares: &self.spares,
            inputs: Vec::new(),
            outputs: Vec::new(),
        };
        for (gi, g) in gemms.into_iter().enumerate() {
            let envelope = match primitive {
                Primitive::RunI8 => g.k <= MAX_K,
                _ => super::in_stream_envelope(g.k),
            };
            if !envelope {
                let reason = format!("K={} outside the {} envelope", g.k, primitive.name());
                return Err(Error::Envelope { primitive, reason });
            }
            for found in [g.a.domain(), g.b.domain()] {
                if found != domain {
                    return Err(Error::DomainMismatch {
                        expected: domain,
                        found,
                    });
                }
            }
            let a_len = g.m * g.k;
            let a = self.bind_input(
                Operand {
                    buf: g.a,
                    offset: g.a_offset,
                    len: a_len,
                },
                &mut staged,
            )?;
            let splits = match primitive {
                Primitive::RunI8 => exec::split_channels(&tiles, 0, g.n, &cores),
                Primitive::ChainI8 => vec![(cores[0], 0, g.n)],
                Primitive::StreamI8 => vec![(cores[gi % cores.len()], 0, g.n)],
            };
            for (core, n0, n1) in splits {
                let np = n1 - n0;
                let (ctx, created) = self.context(g.m, g.k, np, core, domain)?;
                report.contexts_created += u64::from(created);
                let b = Operand {
                    buf: g.b,
                    offset: g.b_offset + n0 * g.k,
                    len: g.k * np,
                };
                let c_op = Operand {
                    buf: &*c,
                    offset: g.c_offset + n0 * g.m,
                    len: g.m * np,
                };
                let operands = [
                    (a, a_len),
                    (self.bind_input(b, &mut staged)?, g.k * np),
                    (self.bind_output(c_op, &mut staged)?, 4 * g.m * np),
                ];
                let task = RunTask {
                    ctx,
                    m: g.m,
                    operands,
                };
                report.tasks_per_core[core] += 1;
                report.bytes += (g.m * g.k + g.k * np + 4 * g.m * np) as u64;
                // Chain: everything on one unit (one core, in order); otherwise a unit per run.
                match (primitive, units.last_mut()) {
                    (Primitive::ChainI8, Some(u)) => u.push(task),
                    _ => units.push(vec![task]),
                }
            }
            report.macs += g.macs();
        }
        Ok(Box::new(RknnJob {
            bind: &self.shared.bind,
            units,
            next: AtomicUsize::new(0),
            failure: Mutex::new(None),
            c,
            staged,
            report,
        }))
    }
}
