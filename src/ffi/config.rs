//! The configuration (`ork_config`, its defaults) and the context built from it.

use super::log::*;
use super::{guard, invalid, ork_ctx};
use crate::isa::Isa;
use crate::moe::cache::{Policy, Verify};
use crate::moe::outliers::Rule;
use crate::moe::{Config, Engine, Error, MtMode, SmallBatch};
use crate::npu::{BackendChoice, CoreMask};
use std::ffi::{c_char, CStr};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

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
    if r == super::ORK_OK {
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
