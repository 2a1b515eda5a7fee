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
//! `unsafe` lives here (and in [`sys`], [`ctx`], [`mem`], [`job`]) only, each block with its
//! reason.

mod bind;
mod ctx;
mod diag;
mod job;
mod mem;
mod sys;

use crate::layout::Tiles;
use crate::npu::backend::{Backend, Job};
use crate::npu::error::{Error, Result};
use crate::npu::flags;
use crate::npu::kinds::{BackendKind, CoreMask};
use crate::npu::storage::{Alloc, Storage};
use crate::npu::submit::{Report, Submit};
use crate::sync::lock;
use bind::Runs;
use ctx::{CreateError, MatmulCtx};
use job::{RknnJob, Staged};
use mem::{Mem, RknnStorage, Spares};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use sys::Api;

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
        let cacheable = flags & flags::CACHEABLE != 0;
        let sram = flags & flags::TRY_ALLOC_SRAM != 0;
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

impl Alloc for Rknn {
    fn alloc_i8(&self, len: usize, flags: u32, domain: u32) -> Result<Box<dyn Storage<i8>>> {
        Ok(Box::new(self.alloc::<i8>(len, flags, domain)?))
    }

    fn alloc_i32(&self, len: usize, flags: u32, domain: u32) -> Result<Box<dyn Storage<i32>>> {
        Ok(Box::new(self.alloc::<i32>(len, flags, domain)?))
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
        let cores = self.cores(cores);
        let mut runs = Runs {
            units: Vec::new(),
            staged: Staged::new(&self.spares),
            report: Report::default(),
        };
        for (gi, g) in gemms.into_iter().enumerate() {
            bind::check_gemm(primitive, &g, c.domain())?;
            let splits = bind::channel_splits(primitive, gi, g.n, &tiles, &cores);
            self.bind_gemm(primitive, &g, &splits, c, &mut runs)?;
        }
        let Runs {
            units,
            staged,
            report,
        } = runs;
        let job = RknnJob::new(&self.shared.bind, units, c, staged, report);
        Ok(Box::new(job))
    }
}
