//! The C ABI (`include/ork_moe.h`, generated from this file by cbindgen).
//!
//! Conventions, as in rustls-ffi:
//! - every export runs inside [`guard`] (or its pointer-returning twin), so no panic crosses the
//!   boundary: a caught panic becomes `ORK_INTERNAL_ERROR`;
//! - every pointer is checked for NULL before use; failures set a thread-local message
//!   ([`ork_last_error`]);
//! - result codes are plain `uint32_t` constants with fixed values; integers from C are matched,
//!   never transmuted into Rust enums;
//! - the context is a `Box` owned by the caller between `ork_ctx_new` and `ork_ctx_free`, shared
//!   by reference otherwise (it is safe to use from several threads at once).
//!
//! Tensor memory is the caller's: each descriptor's data must be valid for the bytes its `ne`/`nb`
//! span (what ggml's own kernels assume too) and stay unchanged, and `dst` unread, during a call.

// The C names (`ork_tensor`, `ork_result`, ...) are the API.
#![allow(non_camel_case_types)]
// The exports are called from C, where `unsafe` means nothing; their pointer contract is stated
// once above and in each function's comment, and every dereference has its SAFETY note.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use crate::moe::cache::Verify;
use crate::moe::desc::TensorDesc;
use crate::moe::{Config, Engine, Error, ErrorKind, Inputs, MtMode, SmallBatch};
use crate::npu::{BackendChoice, BackendKind};
use crate::quant::{dequantize_row, GgmlType};
use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::AtomicU32;

/// Result of every fallible call.
pub type ork_result = u32;
/// Done: `dst` holds the result.
pub const ORK_OK: ork_result = 0;
/// Valid but not taken (weight type, layout, small batch): run your own path. `dst` untouched.
pub const ORK_NOT_HANDLED: ork_result = 1;
/// Inconsistent descriptors or data (NULL, shapes, ids out of range). `dst` untouched, except for
/// NaN/Inf weight scales, which are only seen while inflating (then `dst` may be partly written).
pub const ORK_INVALID_ARGUMENT: ork_result = 2;
/// The device failed; `dst` may be partly written.
pub const ORK_DEVICE_ERROR: ork_result = 3;
/// Out of memory (host or NPU IOMMU domain); `dst` may be partly written.
pub const ORK_OUT_OF_MEMORY: ork_result = 4;
/// A bug: a panic was caught at the boundary.
pub const ORK_INTERNAL_ERROR: ork_result = 5;

/// Version of this ABI; bumped on incompatible changes.
pub const ORK_ABI_VERSION: u32 = 1;

/// `ork_config.backend` values.
pub const ORK_BACKEND_AUTO: i32 = 0;
pub const ORK_BACKEND_EMU: i32 = 1;
pub const ORK_BACKEND_RKNN: i32 = 2;
pub const ORK_BACKEND_CPU: i32 = 3;

/// `ork_config.min_rows_mode`: calls below `min_rows` rows per expert are declined
/// (`ORK_NOT_HANDLED`) ...
pub const ORK_MIN_ROWS_DECLINE: u32 = 0;
/// ... or run on the CPU int8 kernels.
pub const ORK_MIN_ROWS_CPU: u32 = 1;

/// `ork_config.cache_verify`: a cache hit re-hashes 17 sampled blocks of the expert ...
pub const ORK_CACHE_VERIFY_SAMPLED: u32 = 0;
/// ... or all of its bytes.
pub const ORK_CACHE_VERIFY_FULL: u32 = 1;

/// `ork_config.mt_mode`: `ork_mul_mat_id_mt` shares the work among the caller's threads ...
pub const ORK_MT_COOP: u32 = 0;
/// ... or caller thread 0 runs the call on the library's pool while the others wait in the barrier.
pub const ORK_MT_LEADER: u32 = 1;

/// A tensor as ggml describes it (flat: no ggml types).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ork_tensor {
    /// `enum ggml_type` numbering (F32 0, Q4_0 2, Q4_1 3, Q5_0 6, Q8_0 8, Q4_K 12, Q6_K 14, I32 26).
    pub r#type: i32,
    /// Elements per dimension, ggml order.
    pub ne: [i64; 4],
    /// Strides in bytes, ggml order.
    pub nb: [usize; 4],
    pub data: *mut c_void,
    /// Optional (NULL ok), e.g. "blk.0.ffn_gate_exps.weight": part of the expert cache key.
    pub name: *const c_char,
}

/// Context configuration. Fill it with `ork_config_default`, then change fields.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ork_config {
    /// `sizeof(ork_config)`: fields past it take `ork_config_default` values, so the struct can grow.
    pub struct_size: u32,
    /// `ORK_BACKEND_*`.
    pub backend: i32,
    /// NPU cores bitmask (1..7).
    pub core_mask: u32,
    /// Expert cache budget in bytes.
    pub cache_bytes: u64,
    /// Average rows per used expert below which a call goes to `min_rows_mode`.
    pub min_rows: u32,
    /// Threads of `ork_mul_mat_id`'s own pool (0 = all cores).
    pub n_threads: u32,
    /// `ORK_MIN_ROWS_*`.
    pub min_rows_mode: u32,
    /// `ORK_CACHE_VERIFY_*`.
    pub cache_verify: u32,
    /// `ORK_MT_*`.
    pub mt_mode: u32,
}

/// The caller's threads for `ork_mul_mat_id_mt`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ork_threads {
    pub ith: i32,
    pub nth: i32,
    /// A full barrier across the `nth` threads (ggml_barrier); may be NULL only when `nth == 1`.
    pub barrier: Option<unsafe extern "C" fn(arg: *mut c_void)>,
    pub barrier_arg: *mut c_void,
    /// Optional shared scratch; unused by this version (per-call state lives in the context).
    pub scratch: *mut c_void,
    pub scratch_size: usize,
}

/// Counters since `ork_ctx_new`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ork_stats {
    pub calls: u64,
    pub handled: u64,
    pub declined: u64,
    pub rows: u64,
    pub experts_inflated: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub cache_evictions: u64,
    /// Bytes of native int8 B written by inflation.
    pub bytes_inflated: u64,
    pub submits_run_i8: u64,
    pub submits_stream: u64,
    pub submits_chain: u64,
    /// GEMMs of small batches run on the CPU (`ORK_MIN_ROWS_CPU`).
    pub cpu_gemms: u64,
    /// Cost model of the RK3588 (emulator), not a measurement.
    pub modelled_npu_us: f64,
    /// `ORK_BACKEND_*` of the backend in use.
    pub backend: i32,
}

/// Opaque context.
pub struct ork_ctx {
    engine: Engine,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

fn code(kind: ErrorKind) -> ork_result {
    match kind {
        ErrorKind::NotHandled => ORK_NOT_HANDLED,
        ErrorKind::InvalidArgument => ORK_INVALID_ARGUMENT,
        ErrorKind::DeviceError => ORK_DEVICE_ERROR,
        ErrorKind::OutOfMemory => ORK_OUT_OF_MEMORY,
        ErrorKind::Internal => ORK_INTERNAL_ERROR,
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    let s = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned());
    format!(
        "internal error (panic): {}",
        s.unwrap_or_else(|| "unknown".into())
    )
}

/// The panic boundary of every `ork_result` export.
fn guard(f: impl FnOnce() -> Result<(), Error>) -> ork_result {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => ORK_OK,
        Ok(Err(e)) => {
            set_last_error(&e.message);
            code(e.kind)
        }
        Err(p) => {
            set_last_error(&panic_message(&*p));
            ORK_INTERNAL_ERROR
        }
    }
}

fn invalid(msg: &str) -> Error {
    Error::new(ErrorKind::InvalidArgument, msg)
}

fn backend_choice(b: i32) -> Option<BackendChoice> {
    Some(match b {
        ORK_BACKEND_AUTO => BackendChoice::Auto,
        ORK_BACKEND_EMU => BackendChoice::Emu,
        ORK_BACKEND_RKNN => BackendChoice::Rknn,
        ORK_BACKEND_CPU => BackendChoice::Cpu,
        _ => return None,
    })
}

fn to_c_config(c: &Config) -> ork_config {
    ork_config {
        struct_size: size_of::<ork_config>() as u32,
        backend: match c.backend {
            BackendChoice::Auto => ORK_BACKEND_AUTO,
            BackendChoice::Emu => ORK_BACKEND_EMU,
            BackendChoice::Rknn => ORK_BACKEND_RKNN,
            BackendChoice::Cpu => ORK_BACKEND_CPU,
        },
        core_mask: c.core_mask as u32,
        cache_bytes: c.cache_bytes,
        min_rows: c.min_rows,
        n_threads: c.n_threads,
        min_rows_mode: match c.small_batch {
            SmallBatch::Decline => ORK_MIN_ROWS_DECLINE,
            SmallBatch::Cpu => ORK_MIN_ROWS_CPU,
        },
        cache_verify: match c.cache_verify {
            Verify::Sampled => ORK_CACHE_VERIFY_SAMPLED,
            Verify::Full => ORK_CACHE_VERIFY_FULL,
        },
        mt_mode: match c.mt_mode {
            MtMode::Coop => ORK_MT_COOP,
            MtMode::Leader => ORK_MT_LEADER,
        },
    }
}

fn from_c_config(c: &ork_config) -> Result<Config, Error> {
    Ok(Config {
        backend: backend_choice(c.backend)
            .ok_or_else(|| invalid(&format!("config: unknown backend {}", c.backend)))?,
        core_mask: u8::try_from(c.core_mask)
            .ok()
            .filter(|m| (1..=7).contains(m))
            .ok_or_else(|| {
                invalid(&format!(
                    "config: core_mask {:#x} is not in 1..7",
                    c.core_mask
                ))
            })?,
        cache_bytes: c.cache_bytes,
        min_rows: c.min_rows,
        n_threads: c.n_threads,
        small_batch: match c.min_rows_mode {
            ORK_MIN_ROWS_DECLINE => SmallBatch::Decline,
            ORK_MIN_ROWS_CPU => SmallBatch::Cpu,
            m => return Err(invalid(&format!("config: unknown min_rows_mode {m}"))),
        },
        cache_verify: match c.cache_verify {
            ORK_CACHE_VERIFY_SAMPLED => Verify::Sampled,
            ORK_CACHE_VERIFY_FULL => Verify::Full,
            v => return Err(invalid(&format!("config: unknown cache_verify {v}"))),
        },
        mt_mode: match c.mt_mode {
            ORK_MT_COOP => MtMode::Coop,
            ORK_MT_LEADER => MtMode::Leader,
            m => return Err(invalid(&format!("config: unknown mt_mode {m}"))),
        },
    })
}

/// Fills `out` with the defaults, then the environment's overrides (`ORK_BACKEND`,
/// `ORK_CORE_MASK`, `ORK_CACHE_MB`, `ORK_MIN_ROWS`, `ORK_MIN_ROWS_MODE`, `ORK_THREADS`,
/// `ORK_CACHE_VERIFY`, `ORK_MT_MODE`). NULL is ignored.
#[no_mangle]
pub extern "C" fn ork_config_default(out: *mut ork_config) {
    let _ = guard(|| {
        if out.is_null() {
            return Err(invalid("ork_config_default: out is NULL"));
        }
        let c = to_c_config(&Config::default().with_env());
        // SAFETY: `out` is non-NULL and, by contract, points to a writable ork_config.
        unsafe { out.write(c) };
        Ok(())
    });
}

/// Creates a context. `cfg` NULL means `ork_config_default`. Returns NULL on failure (see
/// `ork_last_error`). Free it with `ork_ctx_free`.
#[no_mangle]
pub extern "C" fn ork_ctx_new(cfg: *const ork_config) -> *mut ork_ctx {
    let mut ctx = std::ptr::null_mut();
    let r = guard(|| {
        // A host process that set up no logger of its own still gets RUST_LOG (default: warnings).
        let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
            .try_init();
        let mut full = to_c_config(&Config::default().with_env());
        if !cfg.is_null() {
            // SAFETY: `cfg` is non-NULL and points to at least `struct_size` bytes, the first field.
            let size = unsafe { (*cfg).struct_size } as usize;
            if size < size_of::<u32>() * 2 {
                return Err(invalid(&format!("config: struct_size {size} is too small")));
            }
            let n = size.min(size_of::<ork_config>());
            // SAFETY: copies the first `n` bytes the caller declared valid into a whole
            // ork_config; every bit pattern is a valid value of its integer fields.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    cfg as *const u8,
                    &mut full as *mut ork_config as *mut u8,
                    n,
                )
            };
        }
        let engine = Engine::new(from_c_config(&full)?)?;
        ctx = ork_ctx_from_engine(engine);
        Ok(())
    });
    if r == ORK_OK {
        ctx
    } else {
        std::ptr::null_mut()
    }
}

/// Rust only (not in the C header): a context around an engine the caller built, e.g. on an
/// emulator with injected faults. Free it with `ork_ctx_free`.
pub fn ork_ctx_from_engine(engine: Engine) -> *mut ork_ctx {
    Box::into_raw(Box::new(ork_ctx { engine }))
}

/// Frees a context (NULL is a no-op). No call may be running on it.
#[no_mangle]
pub extern "C" fn ork_ctx_free(ctx: *mut ork_ctx) {
    let _ = guard(|| {
        if !ctx.is_null() {
            // SAFETY: `ctx` came from `ork_ctx_new` and is freed once, by contract.
            drop(unsafe { Box::from_raw(ctx) });
        }
        Ok(())
    });
}

fn ctx_ref<'a>(ctx: *const ork_ctx) -> Result<&'a ork_ctx, Error> {
    // SAFETY: a non-NULL `ctx` is a live context from `ork_ctx_new`, by contract.
    unsafe { ctx.as_ref() }.ok_or_else(|| invalid("ctx is NULL"))
}

fn desc<'a>(t: *const ork_tensor, what: &str) -> Result<TensorDesc<'a>, Error> {
    // SAFETY: a non-NULL descriptor points to a readable ork_tensor, by contract.
    let t = unsafe { t.as_ref() }.ok_or_else(|| invalid(&format!("{what}: descriptor is NULL")))?;
    let name = if t.name.is_null() {
        None
    } else {
        // SAFETY: a non-NULL name is a NUL-terminated string, by contract.
        unsafe { CStr::from_ptr(t.name) }.to_str().ok()
    };
    Ok(TensorDesc {
        ty: t.r#type,
        ne: t.ne,
        nb: t.nb,
        addr: t.data as usize,
        name,
    })
}

type Descs<'a> = [TensorDesc<'a>; 4];

fn descs<'a>(
    w: *const ork_tensor,
    b: *const ork_tensor,
    ids: *const ork_tensor,
    dst: *const ork_tensor,
) -> Result<Descs<'a>, Error> {
    Ok([
        desc(w, "as")?,
        desc(b, "b")?,
        desc(ids, "ids")?,
        desc(dst, "dst")?,
    ])
}

/// Views of the tensors over the extents validation computed.
fn inputs<'a>(d: &Descs<'a>, p: &crate::moe::desc::Problem) -> Inputs<'a> {
    // SAFETY: validation checked every pointer non-NULL, 4-byte alignment of the f32/i32 tensors,
    // that each extent fits the address space, and that dst overlaps no input; the caller
    // guarantees each tensor's memory is valid for its extent during the call and that nothing
    // else accesses dst meanwhile. AtomicU32 has the size and alignment of f32.
    unsafe {
        Inputs {
            weights: std::slice::from_raw_parts(d[0].addr as *const u8, p.w_extent),
            name: d[0].name,
            b: std::slice::from_raw_parts(d[1].addr as *const f32, p.b_extent / 4),
            ids: std::slice::from_raw_parts(d[2].addr as *const i32, p.ids_extent / 4),
            dst: std::slice::from_raw_parts(d[3].addr as *const AtomicU32, p.dst_extent / 4),
        }
    }
}

/// Metadata-only check (no tensor data read): `ORK_OK` if the call would be handled,
/// `ORK_NOT_HANDLED` if the caller must run its own path, `ORK_INVALID_ARGUMENT` for inconsistent
/// descriptors. Same answer on every thread.
#[no_mangle]
pub extern "C" fn ork_mul_mat_id_check(
    ctx: *const ork_ctx,
    as_: *const ork_tensor,
    b: *const ork_tensor,
    ids: *const ork_tensor,
    dst: *const ork_tensor,
) -> ork_result {
    guard(|| {
        let ctx = ctx_ref(ctx)?;
        let d = descs(as_, b, ids, dst)?;
        ctx.engine.plan(&d[0], &d[1], &d[2], &d[3]).map(drop)
    })
}

/// Whether weights of this ggml type can ever be handled (a load-time decision). 1 or 0.
#[no_mangle]
pub extern "C" fn ork_supports_type(ggml_type: i32) -> i32 {
    let supported = GgmlType::from_id(ggml_type).is_some_and(|t| GgmlType::QUANTIZED.contains(&t));
    supported as i32
}

/// `dst[:, slot, token] = as[:, :, ids[slot, token]]^T · b[:, slot % b.ne[1], token]`, on the
/// library's own thread pool. Single caller.
#[no_mangle]
pub extern "C" fn ork_mul_mat_id(
    ctx: *mut ork_ctx,
    as_: *const ork_tensor,
    b: *const ork_tensor,
    ids: *const ork_tensor,
    dst: *const ork_tensor,
) -> ork_result {
    guard(|| {
        let ctx = ctx_ref(ctx)?;
        let d = descs(as_, b, ids, dst)?;
        let plan = ctx
            .engine
            .plan(&d[0], &d[1], &d[2], &d[3])
            .inspect_err(|e| {
                if e.kind == ErrorKind::NotHandled {
                    ctx.engine.note_declined();
                }
            })?;
        let io = inputs(&d, &plan.problem);
        ctx.engine.run(plan, &io).map(drop)
    })
}

/// Cooperative form: ALL `th->nth` threads call it with identical tensors. Phase 1 (routing,
/// activation quantization) is split by `th->ith`, then `th->barrier`, then phase 2 hands
/// experts out through an atomic counter, then `th->barrier` once more so that every thread
/// returns the same code. Accept / decline depends on metadata only.
#[no_mangle]
pub extern "C" fn ork_mul_mat_id_mt(
    ctx: *mut ork_ctx,
    as_: *const ork_tensor,
    b: *const ork_tensor,
    ids: *const ork_tensor,
    dst: *const ork_tensor,
    th: *const ork_threads,
) -> ork_result {
    guard(|| {
        let ctx = ctx_ref(ctx)?;
        // SAFETY: a non-NULL `th` points to a readable ork_threads, by contract.
        let th = *unsafe { th.as_ref() }.ok_or_else(|| invalid("threads: descriptor is NULL"))?;
        if th.nth < 1 || th.ith < 0 || th.ith >= th.nth {
            return Err(invalid(&format!(
                "threads: ith {} / nth {} out of range",
                th.ith, th.nth
            )));
        }
        if th.barrier.is_none() && th.nth > 1 {
            return Err(invalid("threads: barrier is NULL with nth > 1"));
        }
        let d = descs(as_, b, ids, dst)?;
        let plan = ctx
            .engine
            .plan(&d[0], &d[1], &d[2], &d[3])
            .inspect_err(|e| {
                if e.kind == ErrorKind::NotHandled && th.ith == 0 {
                    ctx.engine.note_declined();
                }
            })?;
        let io = inputs(&d, &plan.problem);
        let mut barrier = || {
            if let Some(f) = th.barrier {
                // SAFETY: the caller's barrier function with the caller's argument.
                unsafe { f(th.barrier_arg) }
            }
        };
        ctx.engine
            .run_mt(plan, &io, th.ith as usize, th.nth as usize, &mut barrier)
            .map(drop)
    })
}

/// Message of the last failed call on this thread ("" if none). Valid until the next failing
/// call on this thread.
#[no_mangle]
pub extern "C" fn ork_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// The library version, e.g. "0.1.0" (static string).
#[no_mangle]
pub extern "C" fn ork_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr() as *const c_char
}

/// `ORK_ABI_VERSION` of the library actually loaded.
#[no_mangle]
pub extern "C" fn ork_abi_version() -> u32 {
    ORK_ABI_VERSION
}

/// Copies the context's counters into `out`.
#[no_mangle]
pub extern "C" fn ork_ctx_stats(ctx: *const ork_ctx, out: *mut ork_stats) -> ork_result {
    guard(|| {
        let ctx = ctx_ref(ctx)?;
        if out.is_null() {
            return Err(invalid("ork_ctx_stats: out is NULL"));
        }
        let s = ctx.engine.stats();
        let c = ork_stats {
            calls: s.calls,
            handled: s.handled,
            declined: s.declined,
            rows: s.rows,
            experts_inflated: s.experts_inflated,
            cache_hits: s.cache_hits,
            cache_misses: s.cache_misses,
            cache_evictions: s.cache_evictions,
            bytes_inflated: s.bytes_inflated,
            submits_run_i8: s.submits_run_i8,
            submits_stream: s.submits_stream,
            submits_chain: s.submits_chain,
            cpu_gemms: s.cpu_gemms,
            modelled_npu_us: s.modelled_npu_us,
            backend: match s.backend {
                Some(BackendKind::Emu) => ORK_BACKEND_EMU,
                Some(BackendKind::Rknn) => ORK_BACKEND_RKNN,
                Some(BackendKind::Cpu) => ORK_BACKEND_CPU,
                None => ORK_BACKEND_AUTO,
            },
        };
        // SAFETY: `out` is non-NULL and points to a writable ork_stats, by contract.
        unsafe { out.write(c) };
        Ok(())
    })
}

/// Test helper: dequantizes one row of `k` weights of `ggml_type` (any type the library knows,
/// F32/F16 included) from `src` to f32 `dst`, exactly as ggml's `dequantize_row_*` does.
#[no_mangle]
pub extern "C" fn ork_dequantize_row(
    ggml_type: i32,
    src: *const c_void,
    dst: *mut f32,
    k: i64,
) -> ork_result {
    guard(|| {
        let ty = GgmlType::from_id(ggml_type)
            .ok_or_else(|| invalid(&format!("unknown type id {ggml_type}")))?;
        let k = usize::try_from(k).map_err(|_| invalid("k is negative"))?;
        let row_bytes = ty.row_bytes(k).ok_or_else(|| {
            invalid(&format!(
                "k = {k} is not a multiple of {}'s block size",
                ty.name()
            ))
        })?;
        if src.is_null() || dst.is_null() {
            return Err(invalid("src or dst is NULL"));
        }
        // SAFETY: non-NULL, and by contract `src` holds one row (`row_bytes`) and `dst` `k` floats.
        let (src, out) = unsafe {
            (
                std::slice::from_raw_parts(src as *const u8, row_bytes),
                std::slice::from_raw_parts_mut(dst, k),
            )
        };
        dequantize_row(ty, src, out).map_err(|e| invalid(&e.to_string()))
    })
}
