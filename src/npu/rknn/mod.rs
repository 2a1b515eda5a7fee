//! The real backend: the vendor runtime `librknnrt.so`, opened with `dlopen` (no link-time
//! dependency), driven through its matmul API with every operand in the native layout.
//!
//! - Memory: `rknn_create_mem2` on a small per-domain matmul context (memory belongs to a
//!   context, and a context to an IOMMU domain); driver flag CACHEABLE maps to the runtime's
//!   cacheable allocation, anything else to non-cacheable. Syncs are `rknn_mem_sync`.
//! - Operands at an offset inside a buffer are handed over as `rknn_create_mem_from_fd` views of
//!   the buffer's dma-buf.
//! - `run_i8`: the N-tiles are split over the enabled cores, one matmul context per core
//!   (`rknn_matmul_set_core_mask` with a single core: some runtimes refuse multi-core masks), run
//!   concurrently by the submit's shares. Chain: the GEMMs one after another on one core. Stream:
//!   the GEMMs spread over the cores. Chain and stream keep the NPU envelope of the emulator, so
//!   the engine behaves the same on every backend.
//! - Contexts are cached per (M, K, N, core, domain).
//!
//! `unsafe` lives here (and in [`sys`]) only, each block with its reason.

mod sys;

use super::exec;
use super::{
    storage_as, Backend, BackendKind, Buffer, CoreMask, Error, Job, Primitive, Report, Result,
    Storage, Submit,
};
use crate::layout::Tiles;
use crate::sync::lock;
use std::any::Any;
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use sys::{Api, Context, IoAttr, MatmulInfo, TensorAttr, TensorMem};

/// Largest K of one `run_i8` here. The runtime takes up to 10240, but above 8192 it wants B split
/// into K-segments of its own layout; deeper GEMMs get [`Error::Envelope`], and the engine sums
/// them from depth segments of at most this K (`Device::max_k`).
const MAX_K: usize = 8192;
/// Matmul contexts kept before unused ones are destroyed.
const CONTEXT_CACHE: usize = 256;

/// A runtime error code as an [`Error`].
fn check(what: &str, code: i32) -> Result<()> {
    if code == sys::SUCC {
        Ok(())
    } else {
        Err(Error::Device(format!("{what} failed with {code}")))
    }
}

/// One matmul context and the tensor attributes the runtime gave it.
struct MatmulCtx {
    api: Arc<Api>,
    ctx: Context,
    io: Box<IoAttr>,
}

// SAFETY: a context handle is an integer the runtime accepts from any thread; every use goes
// through a Mutex, so one context is never driven by two threads at once.
unsafe impl Send for MatmulCtx {}

impl MatmulCtx {
    fn create(
        api: &Arc<Api>,
        m: usize,
        k: usize,
        n: usize,
        domain: u32,
        core: Option<usize>,
    ) -> Result<MatmulCtx> {
        let mut info = MatmulInfo::int8_native(m, k, n, domain);
        let mut io = Box::new(IoAttr::zeroed());
        let mut ctx: Context = 0;
        // SAFETY: all three pointers are valid and writable for their C types (layouts checked in sys).
        check("rknn_matmul_create", unsafe {
            (api.matmul_create)(&mut ctx, &mut info, &mut *io)
        })?;
        let made = MatmulCtx {
            api: Arc::clone(api),
            ctx,
            io,
        };
        let types = (made.io.a.ty, made.io.b.ty, made.io.c.ty);
        if types != (sys::TENSOR_INT8, sys::TENSOR_INT8, sys::TENSOR_INT32) {
            return Err(Error::Device(format!(
                "int8 matmul reports tensor types {types:?}"
            )));
        }
        if let Some(core) = core {
            // SAFETY: ctx was just created by this runtime.
            check("rknn_matmul_set_core_mask", unsafe {
                (api.matmul_set_core_mask)(ctx, 1 << core)
            })?;
        }
        Ok(made)
    }

    /// Tile sizes from the attributes: B native `(N/bn, K/bk, bn, bk)`, A `(K/ak, M, ak)`,
    /// C `(N/cn, M, cn)`.
    fn tiles(&self) -> Result<Tiles> {
        let dim = |t: &TensorAttr, i: usize| {
            (t.n_dims as usize > i && t.dims[i] > 0).then_some(t.dims[i] as usize)
        };
        let io = &self.io;
        let (b_n, b_k) = dim(&io.b, 2)
            .zip(dim(&io.b, 3))
            .ok_or_else(|| Error::Device("the runtime reported no native B tile sizes".into()))?;
        let d = Tiles::RK3588;
        Ok(Tiles {
            a_k: dim(&io.a, 2).unwrap_or(d.a_k),
            b_n,
            b_k,
            c_n: dim(&io.c, 2).unwrap_or(d.c_n),
            align: d.align.max(b_n).max(b_k),
        })
    }
}

impl Drop for MatmulCtx {
    fn drop(&mut self) {
        // SAFETY: ctx is live and owned by this value; nothing uses it after the drop.
        let code = unsafe { (self.api.matmul_destroy)(self.ctx) };
        if code != sys::SUCC {
            log::warn!("rknn_matmul_destroy failed with {code}");
        }
    }
}

type CtxKey = (usize, usize, usize, usize, u32);

/// What buffers and submits share: the runtime and the per-domain allocation contexts.
struct Shared {
    api: Arc<Api>,
    alloc_ctx: Mutex<HashMap<u32, Arc<Mutex<MatmulCtx>>>>,
}

impl Shared {
    fn alloc_ctx(&self, domain: u32) -> Result<Arc<Mutex<MatmulCtx>>> {
        let mut map = lock(&self.alloc_ctx);
        if let Some(c) = map.get(&domain) {
            return Ok(Arc::clone(c));
        }
        let c = Arc::new(Mutex::new(MatmulCtx::create(
            &self.api, 1, 32, 32, domain, None,
        )?));
        map.insert(domain, Arc::clone(&c));
        Ok(c)
    }
}

/// A runtime buffer (`rknn_tensor_mem`) seen as `len` elements of `T`.
pub struct RknnStorage<T> {
    api: Arc<Api>,
    ctx: Arc<Mutex<MatmulCtx>>,
    mem: NonNull<TensorMem>,
    len: usize,
    cacheable: bool,
    _elem: std::marker::PhantomData<T>,
}

// SAFETY: the storage owns its rknn_tensor_mem exclusively; the CPU mapping is plain memory, and
// shared access only reads it (&self) while writes need &mut self.
unsafe impl<T: Send> Send for RknnStorage<T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for RknnStorage<T> {}

impl<T> RknnStorage<T> {
    fn mem(&self) -> &TensorMem {
        // SAFETY: mem came from rknn_create_mem2 and lives until Drop.
        unsafe { self.mem.as_ref() }
    }

    fn sync(&self, mode: i32) -> Result<()> {
        if !self.cacheable {
            return Ok(());
        }
        let ctx = lock(&self.ctx);
        // SAFETY: ctx and mem are live objects of this runtime.
        check("rknn_mem_sync", unsafe {
            (self.api.mem_sync)(ctx.ctx, self.mem.as_ptr(), mode)
        })
    }
}

impl<T> Drop for RknnStorage<T> {
    fn drop(&mut self) {
        let ctx = lock(&self.ctx);
        // SAFETY: mem was created on ctx and is not used after this.
        let code = unsafe { (self.api.destroy_mem)(ctx.ctx, self.mem.as_ptr()) };
        if code != sys::SUCC {
            log::warn!("rknn_destroy_mem failed with {code}");
        }
    }
}

impl<T: Send + Sync + 'static> Storage<T> for RknnStorage<T> {
    fn cpu(&self) -> &[T] {
        // SAFETY: the runtime maps at least len·size_of::<T>() bytes at virt_addr (checked at
        // creation), page-aligned, until destroy_mem in Drop; &self keeps the mapping alive and
        // no &mut exists meanwhile.
        unsafe { std::slice::from_raw_parts(self.mem().virt_addr as *const T, self.len) }
    }

    fn cpu_mut(&mut self) -> &mut [T] {
        // SAFETY: as in cpu(); &mut self makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.mem().virt_addr as *mut T, self.len) }
    }

    fn sync_to_device(&mut self) -> Result<()> {
        self.sync(sys::SYNC_TO_DEVICE)
    }

    fn sync_from_device(&mut self) -> Result<()> {
        self.sync(sys::SYNC_FROM_DEVICE)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// The rknn backend.
pub struct Rknn {
    shared: Arc<Shared>,
    tiles: Tiles,
    contexts: Mutex<HashMap<CtxKey, Arc<Mutex<MatmulCtx>>>>,
}

/// Opens the runtime at `path` (or the default names) and checks that it answers: a matmul
/// context must be creatable and report its tile sizes.
pub fn open(path: Option<&str>) -> Result<Box<dyn Backend>> {
    let api = Arc::new(Api::open(path).map_err(Error::Device)?);
    let shared = Arc::new(Shared {
        api,
        alloc_ctx: Mutex::new(HashMap::new()),
    });
    let tiles = lock(&*shared.alloc_ctx(0)?).tiles()?;
    log::debug!("rknn runtime {} answers; tiles {tiles:?}", shared.api.path);
    Ok(Box::new(Rknn {
        shared,
        tiles,
        contexts: Mutex::new(HashMap::new()),
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
        let mut rk_flags = if cacheable {
            sys::MEM_CACHEABLE
        } else {
            sys::MEM_NON_CACHEABLE
        };
        if flags & super::flags::TRY_ALLOC_SRAM != 0 {
            rk_flags |= sys::MEM_TRY_ALLOC_SRAM;
        }
        let api = Arc::clone(&self.shared.api);
        let ctx = self.shared.alloc_ctx(domain)?;
        // SAFETY: ctx is a live context of this runtime.
        let mem = unsafe { (api.create_mem2)(lock(&ctx).ctx, bytes as u64, rk_flags) };
        let mem = NonNull::new(mem).ok_or(Error::OutOfMemory {
            domain,
            requested: bytes as u64,
            available: 0,
        })?;
        let storage = RknnStorage {
            api,
            ctx,
            mem,
            len,
            cacheable,
            _elem: std::marker::PhantomData,
        };
        let m = storage.mem();
        if m.virt_addr.is_null() || (m.size as usize) < bytes {
            return Err(Error::Device(format!(
                "rknn_create_mem2 returned {} bytes at {:?}",
                m.size, m.virt_addr
            )));
        }
        Ok(storage)
    }

    fn context(
        &self,
        m: usize,
        k: usize,
        n: usize,
        core: usize,
        domain: u32,
    ) -> Result<Arc<Mutex<MatmulCtx>>> {
        let key = (m, k, n, core, domain);
        let mut map = lock(&self.contexts);
        if let Some(c) = map.get(&key) {
            return Ok(Arc::clone(c));
        }
        if map.len() >= CONTEXT_CACHE {
            map.retain(|_, c| Arc::strong_count(c) > 1);
        }
        let c = Arc::new(Mutex::new(MatmulCtx::create(
            &self.shared.api,
            m,
            k,
            n,
            domain,
            Some(core),
        )?));
        map.insert(key, Arc::clone(&c));
        Ok(c)
    }
}

/// An operand region: a buffer's `rknn_tensor_mem` and a byte range in it.
#[derive(Clone, Copy, Debug)]
struct Region {
    mem: *mut TensorMem,
    offset: usize,
    bytes: usize,
}

impl Region {
    fn of<T: super::Elem>(buf: &Buffer<T>, offset: usize, len: usize) -> Result<Region> {
        let s = storage_as::<RknnStorage<T>, T>(buf.storage())?;
        let size = std::mem::size_of::<T>();
        Ok(Region {
            mem: s.mem.as_ptr(),
            offset: offset * size,
            bytes: len * size,
        })
    }
}

/// One runtime matmul: its context (one core) and its three operand regions.
struct RunTask {
    ctx: Arc<Mutex<MatmulCtx>>,
    a: Region,
    b: Region,
    c: Region,
}

struct RknnJob<'a> {
    api: Arc<Api>,
    /// Runs per share unit: a unit's runs go one after another on one core.
    units: Vec<Vec<RunTask>>,
    next: AtomicUsize,
    failure: Mutex<Option<Error>>,
    /// The submit's output, borrowed exclusively while the runs write it.
    _c: &'a mut Buffer<i32>,
    report: Report,
}

// SAFETY: the raw tensor_mem pointers refer to buffers borrowed for 'a (A and B shared, C
// exclusively through `c`); the runtime only reads A/B and writes disjoint C regions, each
// context is used under its Mutex.
unsafe impl Send for RknnJob<'_> {}
// SAFETY: as above.
unsafe impl Sync for RknnJob<'_> {}

impl RknnJob<'_> {
    fn run_one(&self, t: &RunTask) -> Result<()> {
        let ctx = lock(&t.ctx);
        let mut views = Vec::with_capacity(3);
        let result = (|| {
            for (region, attr) in [(t.a, &ctx.io.a), (t.b, &ctx.io.b), (t.c, &ctx.io.c)] {
                if region.bytes < attr.size as usize {
                    return Err(Error::Device(format!(
                        "runtime wants {} bytes, operand has {}",
                        attr.size, region.bytes
                    )));
                }
                // SAFETY: region.mem is a live tensor_mem of a borrowed buffer.
                let parent = unsafe { &*region.mem };
                let mem = if region.offset == 0 {
                    region.mem
                } else {
                    // SAFETY: a view of the parent's dma-buf at an offset inside it (validated
                    // against the buffer length before planning); destroyed below.
                    let v = unsafe {
                        (self.api.create_mem_from_fd)(
                            ctx.ctx,
                            parent.fd,
                            parent.virt_addr,
                            region.bytes as u32,
                            region.offset as i32,
                        )
                    };
                    if v.is_null() {
                        return Err(Error::Device("rknn_create_mem_from_fd failed".into()));
                    }
                    views.push(v);
                    v
                };
                let attr = attr as *const TensorAttr as *mut TensorAttr;
                // SAFETY: mem and attr are live; the runtime reads attr (it takes a non-const
                // pointer but documents it as input) and records mem for the next run.
                check("rknn_matmul_set_io_mem", unsafe {
                    (self.api.matmul_set_io_mem)(ctx.ctx, mem, attr)
                })?;
            }
            // SAFETY: ctx has all three operands set.
            check("rknn_matmul_run", unsafe { (self.api.matmul_run)(ctx.ctx) })
        })();
        for v in views {
            // SAFETY: created above on this ctx, no longer used.
            unsafe { (self.api.destroy_mem)(ctx.ctx, v) };
        }
        result
    }
}

impl Job for RknnJob<'_> {
    fn run_share(&self, _ith: usize, _nth: usize) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(unit) = self.units.get(i) else {
                return;
            };
            for t in unit {
                if let Err(e) = self.run_one(t) {
                    lock(&self.failure).get_or_insert(e);
                    return;
                }
            }
        }
    }

    fn finish(self: Box<Self>) -> Result<Report> {
        match lock(&self.failure).take() {
            Some(e) => Err(e),
            None => Ok(self.report.clone()),
        }
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

    fn alloc_i8(&self, len: usize, flags: u32, domain: u32) -> Result<Box<dyn Storage<i8>>> {
        Ok(Box::new(self.alloc::<i8>(len, flags, domain)?))
    }

    fn alloc_i32(&self, len: usize, flags: u32, domain: u32) -> Result<Box<dyn Storage<i32>>> {
        Ok(Box::new(self.alloc::<i32>(len, flags, domain)?))
    }

    fn threads(&self) -> usize {
        CoreMask::CORES
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
        let cores = cores.cores();
        let mut units: Vec<Vec<RunTask>> = Vec::new();
        let mut report = Report::default();
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
            let a = Region::of(g.a, g.a_offset, g.m * g.k)?;
            let splits = match primitive {
                Primitive::RunI8 => exec::split_channels(&tiles, 0, g.n, &cores),
                Primitive::ChainI8 => vec![(cores[0], 0, g.n)],
                Primitive::StreamI8 => vec![(cores[gi % cores.len()], 0, g.n)],
            };
            for (core, n0, n1) in splits {
                let np = n1 - n0;
                let task = RunTask {
                    ctx: self.context(g.m, g.k, np, core, domain)?,
                    a,
                    b: Region::of(g.b, g.b_offset + n0 * g.k, g.k * np)?,
                    c: Region::of(&*c, g.c_offset + n0 * g.m, g.m * np)?,
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
            api: Arc::clone(&self.shared.api),
            units,
            next: AtomicUsize::new(0),
            failure: Mutex::new(None),
            _c: c,
            report,
        }))
    }
}
