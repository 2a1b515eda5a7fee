//! The C ABI (`include/ork_moe.h`, generated from this file by cbindgen).
//!
//! Conventions, as in rustls-ffi:
//! - every export runs inside [`guard`], so no panic crosses the boundary: a caught panic becomes
//!   `ORK_INTERNAL_ERROR` (exports returning a pointer or nothing map that to NULL / no effect);
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

use crate::isa::Isa;
use crate::moe::cache::{Policy, Verify};
use crate::moe::desc::{weight_format, TensorDesc, DENSE_IDS, GGML_TYPE_I32};
use crate::moe::outliers::Rule;
use crate::moe::{
    Config, Engine, Error, ErrorKind, HeldBytes, HeldWeights, Inputs, MtMode, PairInputs, Plan,
    SmallBatch,
};
use crate::npu::{BackendChoice, BackendKind, CoreMask};
use crate::quant::{dequantize_row, GgmlType};
use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, RwLock};

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

/// Version of this ABI; bumped on incompatible changes. Compatible additions keep it, and a
/// caller asks for them: the weight layout codes (`ORK_TYPE_*`) extend version 1, and a library
/// that predates a code declines it by construction (`ork_supports_type` returns 0, the calls
/// return `ORK_NOT_HANDLED`), so a caller offers a layout only where `ork_supports_type` says 1,
/// and a caller that never passes one is unaffected.
pub const ORK_ABI_VERSION: u32 = 1;

/// Weight layouts in `ork_tensor.type` (weights only): ggml's type id in the low 16 bits, and
/// for a tensor ggml-cpu has repacked (a `CPU_REPACK` buffer) the layout's rows per interleaved
/// group from this bit ...
pub const ORK_LAYOUT_ROWS_SHIFT: i32 = 16;
/// ... and its bytes per interleaved chunk from this one (below 128); 0 above the type id is
/// ggml's plain blocks. The layout is ggml's `tensor_traits<block, chunk, rows, ...>`, named
/// `<type>_<rows>x<chunk>` (docs/REPACK.md); the codes below are the ones the library reads.
pub const ORK_LAYOUT_CHUNK_SHIFT: i32 = 24;
/// `q4_0_4x4`: Q4_0 repacked for NEON with dotprod (the RK3588's Cortex-A76).
pub const ORK_TYPE_Q4_0_4X4: i32 = 2 | 4 << ORK_LAYOUT_ROWS_SHIFT | 4 << ORK_LAYOUT_CHUNK_SHIFT;
/// `q4_0_4x8`: NEON with i8mm.
pub const ORK_TYPE_Q4_0_4X8: i32 = 2 | 4 << ORK_LAYOUT_ROWS_SHIFT | 8 << ORK_LAYOUT_CHUNK_SHIFT;
/// `q4_0_8x8`: AVX2, or SVE-256 with i8mm.
pub const ORK_TYPE_Q4_0_8X8: i32 = 2 | 8 << ORK_LAYOUT_ROWS_SHIFT | 8 << ORK_LAYOUT_CHUNK_SHIFT;
/// `q8_0_4x4`: NEON with dotprod.
pub const ORK_TYPE_Q8_0_4X4: i32 = 8 | 4 << ORK_LAYOUT_ROWS_SHIFT | 4 << ORK_LAYOUT_CHUNK_SHIFT;
/// `q8_0_4x8`: NEON with i8mm.
pub const ORK_TYPE_Q8_0_4X8: i32 = 8 | 4 << ORK_LAYOUT_ROWS_SHIFT | 8 << ORK_LAYOUT_CHUNK_SHIFT;
/// `q4_K_8x4`: NEON with dotprod.
pub const ORK_TYPE_Q4_K_8X4: i32 = 12 | 8 << ORK_LAYOUT_ROWS_SHIFT | 4 << ORK_LAYOUT_CHUNK_SHIFT;
/// `q4_K_8x8`: AVX2, or NEON with i8mm.
pub const ORK_TYPE_Q4_K_8X8: i32 = 12 | 8 << ORK_LAYOUT_ROWS_SHIFT | 8 << ORK_LAYOUT_CHUNK_SHIFT;
/// `q6_K_8x4`: NEON with dotprod.
pub const ORK_TYPE_Q6_K_8X4: i32 = 14 | 8 << ORK_LAYOUT_ROWS_SHIFT | 4 << ORK_LAYOUT_CHUNK_SHIFT;
/// `q6_K_8x8`: NEON with i8mm.
pub const ORK_TYPE_Q6_K_8X8: i32 = 14 | 8 << ORK_LAYOUT_ROWS_SHIFT | 8 << ORK_LAYOUT_CHUNK_SHIFT;

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

/// `ork_config.cache_policy`: a full cache keeps what it holds and streams new experts (replacing
/// only entries gone stale) ...
pub const ORK_CACHE_PIN: u32 = 0;
/// ... or evicts the least recently used.
pub const ORK_CACHE_LRU: u32 = 1;

/// `ork_config.mt_mode`: `ork_mul_mat_id_mt` shares the work among the caller's threads ...
pub const ORK_MT_COOP: u32 = 0;
/// ... or caller thread 0 runs the call on the library's pool while the others wait in the barrier.
pub const ORK_MT_LEADER: u32 = 1;

/// `ork_config.prefetch_threads`: as `ORK_PREFETCH=auto` (the default) picks them.
pub const ORK_PREFETCH_AUTO: u32 = u32::MAX;

/// `ork_config.simd`: the kernel path (`ORK_SIMD`); a path this CPU lacks fails `ork_ctx_new`.
pub const ORK_SIMD_BEST: u32 = 0;
pub const ORK_SIMD_SCALAR: u32 = 1;
pub const ORK_SIMD_SSSE3: u32 = 2;
pub const ORK_SIMD_AVX2: u32 = 3;
pub const ORK_SIMD_AVX512: u32 = 4;
pub const ORK_SIMD_NEON: u32 = 5;
pub const ORK_SIMD_DOTPROD: u32 = 6;

/// Log levels: `ork_config.log_level` (the most verbose one delivered) and the `level` argument
/// of an `ork_log_callback`.
pub const ORK_LOG_OFF: u32 = 0;
pub const ORK_LOG_ERROR: u32 = 1;
pub const ORK_LOG_WARN: u32 = 2;
pub const ORK_LOG_INFO: u32 = 3;
pub const ORK_LOG_DEBUG: u32 = 4;
pub const ORK_LOG_TRACE: u32 = 5;

/// A tensor as ggml describes it (flat: no ggml types).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ork_tensor {
    /// `enum ggml_type` numbering (F32 0, Q4_0 2, Q4_1 3, Q5_0 6, Q8_0 8, Q4_K 12, Q6_K 14, I32 26);
    /// for the weights (`as`) also a layout code, `ORK_TYPE_*`: ggml's repacked bytes, `ne`
    /// and `nb` as ggml keeps them (those of the plain tensor). A layout code whose `ne[1]` is
    /// not a multiple of its rows, or whose `nb[1]` is not one plain row's bytes, is
    /// `ORK_INVALID_ARGUMENT` (ggml never repacks such a tensor); an unknown code
    /// `ORK_NOT_HANDLED`.
    pub r#type: i32,
    /// Elements per dimension, ggml order.
    pub ne: [i64; 4],
    /// Strides in bytes, ggml order.
    pub nb: [usize; 4],
    pub data: *mut c_void,
    /// Optional (NULL ok), e.g. "blk.0.ffn_gate_exps.weight": part of the expert cache key.
    pub name: *const c_char,
}

/// Context configuration. Fill it with `ork_config_default`, then change fields. Each field has
/// an environment variable (README), which `ork_config_default` reads.
///
/// The struct grows at its end only: fields past `struct_size` take `ork_config_default` values,
/// so a caller built against an older header keeps working (the fields up to `mt_mode` are the
/// first version's, 48 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ork_config {
    /// `sizeof(ork_config)` as the caller knows it.
    pub struct_size: u32,
    /// `ORK_BACKEND_*`.
    pub backend: i32,
    /// NPU cores bitmask (1..7).
    pub core_mask: u32,
    /// Expert cache budget in bytes.
    pub cache_bytes: u64,
    /// Average rows per used expert below which a call goes to `min_rows_mode`.
    pub min_rows: u32,
    /// Threads per call of `ork_mul_mat_id`'s own pool, and of a submit on the CPU-executed
    /// backends (0 = all cores; never more than the cores).
    pub n_threads: u32,
    /// `ORK_MIN_ROWS_*`.
    pub min_rows_mode: u32,
    /// `ORK_CACHE_VERIFY_*`.
    pub cache_verify: u32,
    /// `ORK_MT_*`.
    pub mt_mode: u32,
    /// The emulator's cost model of the RK3588 (modelled times only): fixed cost per submit, µs ...
    pub emu_submit_us: f64,
    /// ... set-up cost per task, µs ...
    pub emu_task_us: f64,
    /// ... sustained int8 TOPS per NPU core (> 0) ...
    pub emu_core_tops: f64,
    /// ... and the DRAM bandwidth the NPU gets, GB/s (> 0).
    pub emu_dram_gbps: f64,
    /// Path of librknnrt; NULL: the environment's (`ORK_RKNN_LIB`) or the runtime's default names.
    /// Read during `ork_ctx_new` only.
    pub rknn_lib: *const c_char,
    /// Folder the emulator dumps every submit's buffers into; NULL: the environment's
    /// (`ORK_EMU_DUMP`) or none. Read during `ork_ctx_new` only.
    pub emu_dump_dir: *const c_char,
    /// `ORK_SIMD_*`.
    pub simd: u32,
    /// `ORK_LOG_*`: the most verbose level delivered (process-wide: the last context created sets it).
    pub log_level: u32,
    /// Non-zero (the default): a cacheable input the CPU wrote but did not sync is an emulator error.
    pub emu_strict: u32,
    /// Non-zero: the emulator runs every planned hardware task on its own (slower, same bits).
    pub emu_per_task: u32,
    /// `ORK_CACHE_PIN` or `ORK_CACHE_LRU`.
    pub cache_policy: u32,
    /// The outlier split: at most this many channels per activation row ...
    pub outlier_max: u32,
    /// ... above this multiple of the row's RMS are computed in f32; 0 turns the split off.
    pub outlier_factor: f64,
    /// Submitter threads (`ORK_SUBMITTERS`): -1 = auto (one per NPU core on rknn), else a count.
    pub submitters: i32,
    /// Faults the emulator injects (`ORK_EMU_FAULTS` syntax); NULL: the environment's or none.
    /// Read during `ork_ctx_new` only.
    pub emu_faults: *const c_char,
    /// Row counts one dynamic-shape context of librknnrt covers (0: one context per row count).
    pub rknn_dynamic_m: u32,
    /// Prefetch threads (`ORK_PREFETCH`, [`ork_prefetch`]); 0: none; `ORK_PREFETCH_AUTO`: one per
    /// CPU of `ORK_PREFETCH_CPUS`, else one per idle core of the slowest type (the RK3588's A55s
    /// when the host runs on the A76s only), else none. Their CPUs come from `ORK_PREFETCH_CPUS`
    /// or that rule only.
    pub prefetch_threads: u32,
    /// Inflated experts the prefetch threads may hold ahead of their calls, in bytes.
    pub prefetch_bytes: u64,
    /// Non-zero (the default): dense matmuls (`ork_mul_mat`) are taken; 0 declines them.
    pub dense: u32,
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

/// This thread's last failure, kept as the error until [`ork_last_error`] asks for its text: a
/// declined call (every decode step's) allocates and formats nothing.
#[derive(Default)]
struct LastError {
    pending: Option<Error>,
    text: CString,
}

thread_local! {
    static LAST_ERROR: RefCell<LastError> = RefCell::default();
}

fn set_last_error(e: Error) {
    LAST_ERROR.with(|l| l.borrow_mut().pending = Some(e));
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

/// The panic boundary of every export.
fn guard(f: impl FnOnce() -> Result<(), Error>) -> ork_result {
    let e = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => return ORK_OK,
        Ok(Err(e)) => e,
        Err(p) => Error::from_panic(p),
    };
    let kind = e.kind;
    set_last_error(e);
    code(kind)
}

fn invalid(msg: &str) -> Error {
    Error::new(ErrorKind::InvalidArgument, msg)
}

const BACKENDS: [(i32, BackendChoice); 4] = [
    (ORK_BACKEND_AUTO, BackendChoice::Auto),
    (ORK_BACKEND_EMU, BackendChoice::Emu),
    (ORK_BACKEND_RKNN, BackendChoice::Rknn),
    (ORK_BACKEND_CPU, BackendChoice::Cpu),
];
const SMALL_BATCH: [(u32, SmallBatch); 2] = [
    (ORK_MIN_ROWS_DECLINE, SmallBatch::Decline),
    (ORK_MIN_ROWS_CPU, SmallBatch::Cpu),
];
const POLICY: [(u32, Policy); 2] = [(ORK_CACHE_PIN, Policy::Pin), (ORK_CACHE_LRU, Policy::Lru)];
const VERIFY: [(u32, Verify); 2] = [
    (ORK_CACHE_VERIFY_SAMPLED, Verify::Sampled),
    (ORK_CACHE_VERIFY_FULL, Verify::Full),
];
const MT_MODES: [(u32, MtMode); 2] = [(ORK_MT_COOP, MtMode::Coop), (ORK_MT_LEADER, MtMode::Leader)];
const SIMD: [(u32, Isa); 6] = [
    (ORK_SIMD_SCALAR, Isa::Scalar),
    (ORK_SIMD_SSSE3, Isa::Ssse3),
    (ORK_SIMD_AVX2, Isa::Avx2),
    (ORK_SIMD_AVX512, Isa::Avx512),
    (ORK_SIMD_NEON, Isa::Neon),
    (ORK_SIMD_DOTPROD, Isa::NeonDot),
];
const LOG_LEVELS: [(u32, log::LevelFilter); 6] = [
    (ORK_LOG_OFF, log::LevelFilter::Off),
    (ORK_LOG_ERROR, log::LevelFilter::Error),
    (ORK_LOG_WARN, log::LevelFilter::Warn),
    (ORK_LOG_INFO, log::LevelFilter::Info),
    (ORK_LOG_DEBUG, log::LevelFilter::Debug),
    (ORK_LOG_TRACE, log::LevelFilter::Trace),
];

/// The C code of `value` in `table` (every Rust value has one).
fn code_of<C: Copy, T: PartialEq>(table: &[(C, T)], value: &T) -> C {
    table
        .iter()
        .find(|(_, t)| t == value)
        .map(|&(c, _)| c)
        .expect("every value has a C code")
}

/// The value of C code `c` in `table`, or an error naming the field.
fn value_of<C: PartialEq + std::fmt::Display, T: Copy>(
    table: &[(C, T)],
    c: C,
    field: &str,
) -> Result<T, Error> {
    table
        .iter()
        .find(|(k, _)| *k == c)
        .map(|&(_, t)| t)
        .ok_or_else(|| invalid(&format!("config: unknown {field} {c}")))
}

fn to_c_config(c: &Config) -> ork_config {
    let d = &c.device;
    ork_config {
        struct_size: size_of::<ork_config>() as u32,
        backend: code_of(&BACKENDS, &d.backend),
        core_mask: d.core_mask.0 as u32,
        cache_bytes: c.cache_bytes,
        min_rows: c.min_rows,
        n_threads: d.host.threads as u32,
        min_rows_mode: code_of(&SMALL_BATCH, &c.small_batch),
        cache_verify: code_of(&VERIFY, &c.cache_verify),
        mt_mode: code_of(&MT_MODES, &c.mt_mode),
        emu_submit_us: d.emu.cost.submit_us,
        emu_task_us: d.emu.cost.task_us,
        emu_core_tops: d.emu.cost.core_tops,
        emu_dram_gbps: d.emu.cost.dram_gbps,
        // Strings stay with the environment: NULL means "the environment's value or the default".
        rknn_lib: std::ptr::null(),
        emu_dump_dir: std::ptr::null(),
        simd: code_of(&SIMD, &d.host.isa),
        log_level: code_of(&LOG_LEVELS, &c.log_level),
        emu_strict: d.emu.strict as u32,
        emu_per_task: d.emu.per_task as u32,
        cache_policy: code_of(&POLICY, &c.cache_policy),
        outlier_max: c.outliers.map_or(0, |r| r.max_channels as u32),
        outlier_factor: c.outliers.map_or(0.0, |r| r.factor as f64),
        submitters: c.submitters.map_or(-1, |n| n as i32),
        emu_faults: std::ptr::null(),
        rknn_dynamic_m: d.rknn.dynamic_m as u32,
        prefetch_threads: c.prefetch_threads.map_or(ORK_PREFETCH_AUTO, |n| n as u32),
        prefetch_bytes: c.prefetch_bytes,
        dense: c.dense as u32,
    }
}

/// A C path, or `None` for NULL.
fn path(p: *const c_char) -> Option<PathBuf> {
    // SAFETY: a non-NULL path is a NUL-terminated string, by contract, read only during the call.
    let bytes = (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_bytes())?;
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(bytes)))
}

/// `base` (the environment's configuration) with the fields of `c` applied.
fn from_c_config(c: &ork_config, base: Config) -> Result<Config, Error> {
    let mut cfg = base;
    let d = &mut cfg.device;
    d.backend = value_of(&BACKENDS, c.backend, "backend")?;
    d.core_mask = u8::try_from(c.core_mask)
        .ok()
        .filter(|m| (1..=7).contains(m))
        .map(CoreMask)
        .ok_or_else(|| {
            invalid(&format!(
                "config: core_mask {:#x} is not in 1..7",
                c.core_mask
            ))
        })?;
    d.host.threads = crate::config::threads(c.n_threads as usize);
    d.host.isa = match c.simd {
        ORK_SIMD_BEST => Isa::best(),
        code => {
            let isa = value_of(&SIMD, code, "simd")?;
            crate::config::simd(isa.name()).map_err(|e| invalid(&format!("config: simd {e}")))?
        }
    };
    let cost = &mut d.emu.cost;
    for (field, x, positive) in [
        ("emu_submit_us", c.emu_submit_us, false),
        ("emu_task_us", c.emu_task_us, false),
        ("emu_core_tops", c.emu_core_tops, true),
        ("emu_dram_gbps", c.emu_dram_gbps, true),
    ] {
        if !x.is_finite() || x < 0.0 || (positive && x == 0.0) {
            return Err(invalid(&format!("config: {field} = {x} is out of range")));
        }
    }
    (cost.submit_us, cost.task_us) = (c.emu_submit_us, c.emu_task_us);
    (cost.core_tops, cost.dram_gbps) = (c.emu_core_tops, c.emu_dram_gbps);
    if let Some(p) = path(c.rknn_lib) {
        d.rknn.lib = Some(p.to_string_lossy().into_owned());
    }
    d.rknn.dynamic_m = Some(c.rknn_dynamic_m as usize)
        .filter(|&w| w <= 512)
        .ok_or_else(|| {
            invalid(&format!(
                "config: rknn_dynamic_m {} > 512",
                c.rknn_dynamic_m
            ))
        })?;
    if let Some(p) = path(c.emu_dump_dir) {
        d.emu.dump = Some(p);
    }
    if let Some(spec) = path(c.emu_faults) {
        let spec = spec.to_string_lossy();
        d.emu.faults = crate::npu::emu::FaultPlan::parse(&spec)
            .map_err(|e| invalid(&format!("config: emu_faults {spec:?}: expected {e}")))?;
    }
    d.emu.strict = c.emu_strict != 0;
    d.emu.per_task = c.emu_per_task != 0;
    cfg.cache_bytes = c.cache_bytes;
    cfg.min_rows = c.min_rows;
    cfg.small_batch = value_of(&SMALL_BATCH, c.min_rows_mode, "min_rows_mode")?;
    cfg.cache_verify = value_of(&VERIFY, c.cache_verify, "cache_verify")?;
    cfg.cache_policy = value_of(&POLICY, c.cache_policy, "cache_policy")?;
    cfg.submitters = match c.submitters {
        -1 => None,
        n => Some(
            usize::try_from(n)
                .map_err(|_| invalid(&format!("config: submitters {n}: -1 (auto) or a count")))?,
        ),
    };
    cfg.outliers = match (c.outlier_factor, c.outlier_max) {
        (0.0, _) => None,
        (f, max) if f.is_finite() && f > 0.0 && max > 0 => Some(Rule {
            factor: f as f32,
            max_channels: max as usize,
        }),
        (f, max) => {
            return Err(invalid(&format!(
                "config: outlier_factor {f} / outlier_max {max}: a factor above 0 and at least one channel, or factor 0 (off)"
            )))
        }
    };
    cfg.mt_mode = value_of(&MT_MODES, c.mt_mode, "mt_mode")?;
    cfg.prefetch_threads = match c.prefetch_threads {
        ORK_PREFETCH_AUTO => None,
        n => Some(n as usize),
    };
    cfg.prefetch_bytes = c.prefetch_bytes;
    cfg.dense = c.dense != 0;
    cfg.log_level = value_of(&LOG_LEVELS, c.log_level, "log_level")?;
    Ok(cfg)
}

/// The environment's configuration, a bad variable as INVALID_ARGUMENT.
fn env_config() -> Result<Config, Error> {
    crate::config::from_env().map_err(|e| invalid(&e))
}

/// Fills `out` with the defaults and the environment's settings (README lists the variables). A
/// variable with a bad value is left at its default here; `ork_ctx_new` reports it. NULL is
/// ignored.
#[no_mangle]
pub extern "C" fn ork_config_default(out: *mut ork_config) {
    let _ = guard(|| {
        if out.is_null() {
            return Err(invalid("ork_config_default: out is NULL"));
        }
        let c = to_c_config(&env_config().unwrap_or_default());
        // SAFETY: `out` is non-NULL and, by contract, points to a writable ork_config.
        unsafe { out.write(c) };
        Ok(())
    });
}

/// Creates a context. `cfg` NULL means `ork_config_default`. Returns NULL on failure (see
/// `ork_last_error`), among them a bad value of any `ORK_*` variable. Free it with `ork_ctx_free`.
#[no_mangle]
pub extern "C" fn ork_ctx_new(cfg: *const ork_config) -> *mut ork_ctx {
    let mut ctx = std::ptr::null_mut();
    let r = guard(|| {
        let env = env_config()?;
        let mut full = to_c_config(&env);
        if !cfg.is_null() {
            // SAFETY: `cfg` is non-NULL and points to at least `struct_size` bytes, the first field.
            let size = unsafe { (*cfg).struct_size } as usize;
            if size < size_of::<u32>() * 2 {
                return Err(invalid(&format!("config: struct_size {size} is too small")));
            }
            let n = size.min(size_of::<ork_config>());
            // SAFETY: copies the first `n` bytes the caller declared valid into a whole
            // ork_config; every bit pattern is a valid value of its integer, float and pointer
            // fields (pointers are only read as C strings when non-NULL, by contract).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    cfg as *const u8,
                    &mut full as *mut ork_config as *mut u8,
                    n,
                )
            };
        }
        let config = from_c_config(&full, env)?;
        log_install(config.log_level);
        let engine = Engine::new(config)?;
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
    // Names key the cache only: read for a call that runs ([`Call::inputs`]), not by a check.
    Ok(TensorDesc {
        ty: t.r#type,
        ne: t.ne,
        nb: t.nb,
        addr: t.data as usize,
        name: None,
    })
}

/// The tensor's name, if it has one in UTF-8. `t` was checked non-NULL by [`desc`].
fn name<'a>(t: *const ork_tensor) -> Option<&'a str> {
    // SAFETY: `t` points to a readable ork_tensor, by contract (checked non-NULL before).
    let p = unsafe { (*t).name };
    // SAFETY: a non-NULL name is a NUL-terminated string, by contract.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_str().ok())?
}

/// The descriptors of one call: `as`, `b`, `ids`, `dst`, and for a pair the second `as` and `dst`.
struct Call<'a> {
    w: TensorDesc<'a>,
    b: TensorDesc<'a>,
    ids: TensorDesc<'a>,
    dst: TensorDesc<'a>,
    pair: Option<(TensorDesc<'a>, TensorDesc<'a>)>,
    /// A dense matmul ([`Engine::plan_dense`]), whose `ids` is the engine's one routed id.
    dense: bool,
    /// The weight descriptors, whose names [`Call::inputs`] reads.
    weights: [*const ork_tensor; 2],
}

impl<'a> Call<'a> {
    fn single(
        w: *const ork_tensor,
        b: *const ork_tensor,
        ids: *const ork_tensor,
        dst: *const ork_tensor,
    ) -> Result<Call<'a>, Error> {
        Ok(Call {
            w: desc(w, "as")?,
            b: desc(b, "b")?,
            ids: desc(ids, "ids")?,
            dst: desc(dst, "dst")?,
            pair: None,
            dense: false,
            weights: [w, w],
        })
    }

    fn dense(
        w: *const ork_tensor,
        b: *const ork_tensor,
        dst: *const ork_tensor,
    ) -> Result<Call<'a>, Error> {
        // Only `ids.addr` is read ([`Call::inputs`]); the plan takes its extent from
        // `dense_as_mul_mat_id`'s descriptor.
        let ids = TensorDesc {
            ty: GGML_TYPE_I32,
            ne: [1; 4],
            nb: [4; 4],
            addr: DENSE_IDS.as_ptr() as usize,
            name: None,
        };
        Ok(Call {
            w: desc(w, "as")?,
            b: desc(b, "b")?,
            ids,
            dst: desc(dst, "dst")?,
            pair: None,
            dense: true,
            weights: [w, w],
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn pair(
        w0: *const ork_tensor,
        w1: *const ork_tensor,
        b: *const ork_tensor,
        ids: *const ork_tensor,
        dst0: *const ork_tensor,
        dst1: *const ork_tensor,
    ) -> Result<Call<'a>, Error> {
        let mut call = Call::single(w0, b, ids, dst0)?;
        call.pair = Some((desc(w1, "as1")?, desc(dst1, "dst1")?));
        call.weights[1] = w1;
        Ok(call)
    }

    fn plan(&self, engine: &Engine) -> Result<Plan, Error> {
        match &self.pair {
            None if self.dense => engine.plan_dense(&self.w, &self.b, &self.dst),
            None => engine.plan(&self.w, &self.b, &self.ids, &self.dst),
            Some((w1, d1)) => engine.plan_pair(&self.w, w1, &self.b, &self.ids, &self.dst, d1),
        }
    }

    /// Views of the tensors over the extents validation computed for `plan`.
    fn inputs(&self, plan: &Plan) -> Inputs<'a> {
        let p = &plan.problem;
        // Validation checked every pointer non-NULL, 4-byte alignment of the f32/i32 tensors, that
        // each extent fits the address space, and that no dst overlaps an input or the other dst;
        // the caller guarantees each tensor's memory is valid for its extent during the call and
        // that nothing else accesses a dst meanwhile. AtomicU32 has the size and alignment of f32.
        let bytes = |d: &TensorDesc, len: usize| {
            // SAFETY: as above.
            unsafe { std::slice::from_raw_parts(d.addr as *const u8, len) }
        };
        let out = |d: &TensorDesc, len: usize| {
            // SAFETY: as above.
            unsafe { std::slice::from_raw_parts(d.addr as *const AtomicU32, len / 4) }
        };
        // SAFETY: as above.
        let (b, ids) = unsafe {
            (
                std::slice::from_raw_parts(self.b.addr as *const f32, p.b_extent / 4),
                std::slice::from_raw_parts(self.ids.addr as *const i32, p.ids_extent / 4),
            )
        };
        let pair = match (&self.pair, &plan.pair) {
            (Some((w1, d1)), Some(p1)) => Some(PairInputs {
                weights: bytes(w1, p1.w_extent),
                name: name(self.weights[1]),
                dst: out(d1, p1.dst_extent),
            }),
            _ => None,
        };
        Inputs {
            weights: bytes(&self.w, p.w_extent),
            name: name(self.weights[0]),
            b,
            ids,
            dst: out(&self.dst, p.dst_extent),
            pair,
        }
    }
}

/// The caller's threads, checked.
fn threads(th: *const ork_threads) -> Result<ork_threads, Error> {
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
    Ok(th)
}

/// Runs `call` on the library's pool (`th` None) or cooperatively on the caller's threads.
fn run(ctx: *const ork_ctx, call: Result<Call, Error>, th: Option<ork_threads>) -> ork_result {
    guard(|| {
        let ctx = ctx_ref(ctx)?;
        let call = call?;
        let plan = call.plan(&ctx.engine).inspect_err(|e| {
            // One count per call: by its first thread.
            if e.kind == ErrorKind::NotHandled && th.is_none_or(|t| t.ith == 0) {
                ctx.engine.note_declined();
            }
        })?;
        let io = call.inputs(&plan);
        let Some(th) = th else {
            return ctx.engine.run(plan, &io).map(drop);
        };
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
        Call::single(as_, b, ids, dst)?
            .plan(&ctx_ref(ctx)?.engine)
            .map(drop)
    })
}

/// Whether weights of this ggml type, or layout code (`ORK_TYPE_*`), can ever be handled: a
/// decision that holds for the tensor's lifetime. 1 or 0.
#[no_mangle]
pub extern "C" fn ork_supports_type(ggml_type: i32) -> i32 {
    weight_format(ggml_type).is_some() as i32
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
    run(ctx, Call::single(as_, b, ids, dst), None)
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
    match threads(th) {
        Ok(th) => run(ctx, Call::single(as_, b, ids, dst), Some(th)),
        Err(e) => guard(|| Err(e)),
    }
}

/// Check of a pair: two `MUL_MAT_ID`s of one input (`b`, `ids`), e.g. a MoE FFN's gate and up,
/// with weights `as0`, `as1` of one type and shape and outputs `dst0`, `dst1`. `ORK_OK` if
/// [`ork_mul_mat_id_pair`] would compute both (each expert's two weight matrices as one GEMM);
/// otherwise the caller runs them as two calls. Metadata only, same answer on every thread.
#[no_mangle]
pub extern "C" fn ork_mul_mat_id_pair_check(
    ctx: *const ork_ctx,
    as0: *const ork_tensor,
    as1: *const ork_tensor,
    b: *const ork_tensor,
    ids: *const ork_tensor,
    dst0: *const ork_tensor,
    dst1: *const ork_tensor,
) -> ork_result {
    guard(|| {
        let call = Call::pair(as0, as1, b, ids, dst0, dst1)?;
        call.plan(&ctx_ref(ctx)?.engine).map(drop)
    })
}

/// `dst0 = mul_mat_id(as0, b, ids)` and `dst1 = mul_mat_id(as1, b, ids)` in one call, on the
/// library's own pool. Results are bit for bit those of two `ork_mul_mat_id` calls.
#[no_mangle]
pub extern "C" fn ork_mul_mat_id_pair(
    ctx: *mut ork_ctx,
    as0: *const ork_tensor,
    as1: *const ork_tensor,
    b: *const ork_tensor,
    ids: *const ork_tensor,
    dst0: *const ork_tensor,
    dst1: *const ork_tensor,
) -> ork_result {
    run(ctx, Call::pair(as0, as1, b, ids, dst0, dst1), None)
}

/// The cooperative form of [`ork_mul_mat_id_pair`] (as [`ork_mul_mat_id_mt`]).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn ork_mul_mat_id_pair_mt(
    ctx: *mut ork_ctx,
    as0: *const ork_tensor,
    as1: *const ork_tensor,
    b: *const ork_tensor,
    ids: *const ork_tensor,
    dst0: *const ork_tensor,
    dst1: *const ork_tensor,
    th: *const ork_threads,
) -> ork_result {
    match threads(th) {
        Ok(th) => run(ctx, Call::pair(as0, as1, b, ids, dst0, dst1), Some(th)),
        Err(e) => guard(|| Err(e)),
    }
}

/// Check of a dense matmul, ggml's `MUL_MAT` of a weight matrix: `dst = a^T · b` with `a` [K, N]
/// weights (a type or layout code as `as` of [`ork_mul_mat_id`]), `b` [K, T] f32, `dst` [N, T]
/// f32, all 2-D. It runs as a `MUL_MAT_ID` with one expert that every token routes to, so the
/// same rules decide (`ORK_MIN_ROWS` counts T); batched operands are `ORK_NOT_HANDLED`, and so is
/// every call with `ORK_DENSE=0`. Metadata only, same answer on every thread.
#[no_mangle]
pub extern "C" fn ork_mul_mat_check(
    ctx: *const ork_ctx,
    a: *const ork_tensor,
    b: *const ork_tensor,
    dst: *const ork_tensor,
) -> ork_result {
    guard(|| {
        Call::dense(a, b, dst)?
            .plan(&ctx_ref(ctx)?.engine)
            .map(drop)
    })
}

/// The dense matmul of [`ork_mul_mat_check`] on the library's own pool. Single caller.
#[no_mangle]
pub extern "C" fn ork_mul_mat(
    ctx: *mut ork_ctx,
    a: *const ork_tensor,
    b: *const ork_tensor,
    dst: *const ork_tensor,
) -> ork_result {
    run(ctx, Call::dense(a, b, dst), None)
}

/// The cooperative form of [`ork_mul_mat`] (as [`ork_mul_mat_id_mt`]).
#[no_mangle]
pub extern "C" fn ork_mul_mat_mt(
    ctx: *mut ork_ctx,
    a: *const ork_tensor,
    b: *const ork_tensor,
    dst: *const ork_tensor,
    th: *const ork_threads,
) -> ork_result {
    match threads(th) {
        Ok(th) => run(ctx, Call::dense(a, b, dst), Some(th)),
        Err(e) => guard(|| Err(e)),
    }
}

/// `as` memory the host keeps valid until `ork_prefetch_fence` returns ([`ork_prefetch`]'s
/// contract); the engine drops every one of these before its fence returns.
struct HostWeights {
    addr: usize,
    len: usize,
}

impl HeldBytes for HostWeights {
    fn bytes(&self) -> &[u8] {
        // SAFETY: validation checked the pointer non-NULL and its extent within the address
        // space; the host keeps the memory valid and unchanged until the fence, by contract.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }
}

/// Announces a `MUL_MAT_ID` call (or a pair: `as1` and `dst1` non-NULL, as
/// [`ork_mul_mat_id_pair`]) that will come, so that the library's prefetch threads
/// (`ORK_PREFETCH`) inflate its experts while the host computes what comes before it. Metadata
/// only: `b`, `ids` and `dst` are not read, and the call itself must still be made. The host
/// keeps the weights of every call it announces valid and unchanged until
/// [`ork_prefetch_fence`] returns (e.g. announce a graph's calls at its start, fence at its end).
/// `ORK_OK` when queued or when there is nothing to do (a small batch; without prefetch threads
/// nothing is checked), `ORK_NOT_HANDLED` for a call the library would decline,
/// `ORK_INVALID_ARGUMENT` for bad descriptors.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn ork_prefetch(
    ctx: *mut ork_ctx,
    as0: *const ork_tensor,
    as1: *const ork_tensor,
    b: *const ork_tensor,
    ids: *const ork_tensor,
    dst0: *const ork_tensor,
    dst1: *const ork_tensor,
) -> ork_result {
    guard(|| {
        let ctx = ctx_ref(ctx)?;
        if !ctx.engine.prefetching() {
            return Ok(());
        }
        let call = if as1.is_null() && dst1.is_null() {
            Call::single(as0, b, ids, dst0)?
        } else {
            Call::pair(as0, as1, b, ids, dst0, dst1)?
        };
        let plan = call.plan(&ctx.engine)?;
        let descs = [Some(&call.w), call.pair.as_ref().map(|(w, _)| w)];
        let weights = plan
            .problems()
            .zip(descs.into_iter().flatten())
            .zip(call.weights)
            .map(|((p, d), t)| HeldWeights {
                data: Arc::new(HostWeights {
                    addr: d.addr,
                    len: p.w_extent,
                }),
                name: name(t).map(str::to_owned),
            })
            .collect();
        ctx.engine.prefetch(plan, weights)
    })
}

/// After this returns the library reads none of the weights announced before it
/// ([`ork_prefetch`]): queued experts are dropped and those being inflated are waited for.
/// Experts inflated already stay for their calls.
#[no_mangle]
pub extern "C" fn ork_prefetch_fence(ctx: *mut ork_ctx) -> ork_result {
    guard(|| {
        ctx_ref(ctx)?.engine.prefetch_fence();
        Ok(())
    })
}

/// Message of the last failed call on this thread ("" if none). Valid until the next failing
/// call on this thread.
#[no_mangle]
pub extern "C" fn ork_last_error() -> *const c_char {
    LAST_ERROR.with(|l| {
        let mut l = l.borrow_mut();
        if let Some(e) = l.pending.take() {
            l.text = CString::new(e.message().replace('\0', " ")).unwrap_or_default();
        }
        l.text.as_ptr()
    })
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

/// Receives the library's log lines: `level` is `ORK_LOG_ERROR` .. `ORK_LOG_TRACE`, `message` one
/// line without a newline, valid only during the call. Called from any of the library's or the
/// caller's threads, possibly at the same time.
pub type ork_log_callback =
    Option<unsafe extern "C" fn(user: *mut c_void, level: u32, message: *const c_char)>;

/// Where log lines go: the host's callback, or stderr when it set none.
struct LogSink {
    callback: ork_log_callback,
    /// The callback's `user` pointer, kept as an address so the sink is `Sync`.
    user: usize,
}

static LOG_SINK: RwLock<LogSink> = RwLock::new(LogSink {
    callback: None,
    user: 0,
});

/// The library's `log` backend. Installed into the library's own copy of the `log` crate (the
/// cdylib links its own), never into a host's: a Rust program that links the rlib and has a
/// logger keeps it, and its logger gets the lines.
struct HostLogger;

impl log::Log for HostLogger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &log::Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let msg = r.args().to_string();
        let sink = LOG_SINK.read().unwrap_or_else(|e| e.into_inner());
        match sink.callback {
            Some(callback) => {
                let line = CString::new(msg.replace('\0', " ")).unwrap_or_default();
                let level = code_of(&LOG_LEVELS, &r.level().to_level_filter());
                // SAFETY: the host's callback with its own user pointer, as it registered them;
                // `line` outlives the call.
                unsafe { callback(sink.user as *mut c_void, level, line.as_ptr()) }
            }
            None => eprintln!(
                "ork-moe: {}: {msg}",
                r.level().as_str().to_ascii_lowercase()
            ),
        }
    }

    fn flush(&self) {}
}

static LOGGER: HostLogger = HostLogger;

/// Routes the library's log lines to stderr, or to the callback of [`ork_set_log_callback`], at
/// most as verbose as `level`. `ork_ctx_new` calls it; Rust tools on the rlib (the probe) call it
/// instead of installing a logger of their own.
pub fn log_install(level: log::LevelFilter) {
    // Fails only when a logger is already set: ours, or a Rust host's own, which then gets the lines.
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(level);
}

/// Sends the library's log lines to `callback` (e.g. a host's logger: the ggml patch forwards
/// them to ggml's log) instead of stderr; NULL goes back to stderr. Which levels are delivered is
/// `ork_config.log_level` (`ORK_LOG`) of the context created last.
#[no_mangle]
pub extern "C" fn ork_set_log_callback(callback: ork_log_callback, user: *mut c_void) {
    let _ = guard(|| {
        *LOG_SINK.write().unwrap_or_else(|e| e.into_inner()) = LogSink {
            callback,
            user: user as usize,
        };
        let _ = log::set_logger(&LOGGER);
        Ok(())
    });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inflate::Layout;
    use crate::moe::desc::{weight_code, LAYOUT_CHUNK_SHIFT, LAYOUT_ROWS_SHIFT};

    #[test]
    fn the_headers_layout_codes_are_the_engines() {
        let shifts = (ORK_LAYOUT_ROWS_SHIFT as u32, ORK_LAYOUT_CHUNK_SHIFT as u32);
        assert_eq!(shifts, (LAYOUT_ROWS_SHIFT, LAYOUT_CHUNK_SHIFT));
        let header = [
            ORK_TYPE_Q4_0_4X4,
            ORK_TYPE_Q4_0_4X8,
            ORK_TYPE_Q4_0_8X8,
            ORK_TYPE_Q8_0_4X4,
            ORK_TYPE_Q8_0_4X8,
            ORK_TYPE_Q4_K_8X4,
            ORK_TYPE_Q4_K_8X8,
            ORK_TYPE_Q6_K_8X4,
            ORK_TYPE_Q6_K_8X8,
        ];
        let engine = Layout::REPACKED.map(|(ty, layout)| weight_code(ty, layout));
        assert_eq!(header, engine);
        assert!(header.iter().all(|&code| ork_supports_type(code) == 1));
    }
}
