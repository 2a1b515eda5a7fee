//! The configuration (`ork_config`, its defaults) and the context built from it.
//!
//! Every field comes from its setting's row in [`crate::config::settings!`], which also gives the
//! environment variable: [`to_c_config`] and [`apply_c_config`] are expanded from those rows.

use super::log::*;
#[cfg(doc)]
use super::prefetch::ork_prefetch;
use super::{guard, invalid, ork_ctx};
use crate::config::spelling::*;
use crate::moe::cache::{Policy, Verify};
use crate::moe::{Config, Dispatch, Engine, Error, MtMode, SmallBatch};
use crate::npu::emu::FaultPlan;
use crate::npu::BackendChoice;
use log::LevelFilter;
use std::ffi::{c_char, CStr, OsStr};
use std::os::unix::ffi::OsStrExt;

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

/// `ork_config.dispatch`: the library takes every op it can ...
pub const ORK_DISPATCH_ALWAYS: u32 = 0;
/// ... none ...
pub const ORK_DISPATCH_NEVER: u32 = 1;
/// ... or, per class of op, the faster path as measured (`ork_observe`; the default).
pub const ORK_DISPATCH_AUTO: u32 = 2;

/// `ork_config.simd`: the kernel path (`ORK_SIMD`); a path this CPU lacks fails `ork_ctx_new`.
pub const ORK_SIMD_BEST: u32 = 0;
pub const ORK_SIMD_SCALAR: u32 = 1;
pub const ORK_SIMD_SSSE3: u32 = 2;
pub const ORK_SIMD_AVX2: u32 = 3;
pub const ORK_SIMD_AVX512: u32 = 4;
pub const ORK_SIMD_NEON: u32 = 5;
pub const ORK_SIMD_DOTPROD: u32 = 6;

/// Context configuration. Set `struct_size`, fill it with `ork_config_default`, then change
/// fields. Each field has an environment variable (README), which `ork_config_default` reads.
///
/// The struct grows at its end only: fields past `struct_size` take `ork_config_default` values,
/// so a caller built against an older header keeps working (the smallest `ork_config` of ABI
/// version 1 ends after `cache_verify`: 40 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ork_config {
    /// `sizeof(ork_config)` as the caller knows it; set it before `ork_config_default`.
    pub struct_size: u32,
    /// `ORK_BACKEND_*`.
    pub backend: i32,
    /// NPU cores bitmask (1..7).
    pub core_mask: u32,
    /// Expert cache budget in bytes.
    pub cache_bytes: u64,
    /// Average rows per used expert below which a call goes to `min_rows_mode`. Under
    /// `ORK_DISPATCH_AUTO` with `ORK_MIN_ROWS_DECLINE`: tokens below which a call is declined
    /// unmeasured, as is one of under 2 rows per expert; every other call is measured.
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
    /// `ORK_DISPATCH_*`.
    pub dispatch: u32,
    /// For tests and benchmarks only: µs of real wall time the emulator adds to every submit.
    pub emu_slow_us: u32,
}

/// The bytes of the smallest `ork_config` of ABI version 1 (the fields up to `cache_verify`),
/// which `ork_config_default` writes for a `struct_size` of 0.
const SMALLEST_CONFIG: usize = std::mem::offset_of!(ork_config, mt_mode);

/// The least `struct_size` a caller may give: `struct_size` and `backend`.
const LEAST_STRUCT_SIZE: usize = std::mem::offset_of!(ork_config, core_mask);

/// An `ork_config` member as its setting's spelling holds it ([`CField::C`]): numbers as they
/// are, C strings as text.
trait Member<T> {
    fn value(self) -> T;
    fn member(value: T) -> Self;
}

impl<T> Member<T> for T {
    fn value(self) -> T {
        self
    }
    fn member(value: T) -> T {
        value
    }
}

impl Member<CText> for *const c_char {
    fn value(self) -> CText {
        // SAFETY: a non-NULL string field of the caller's ork_config is a NUL-terminated string,
        // valid during `ork_ctx_new`, by contract.
        let text = (!self.is_null()).then(|| unsafe { CStr::from_ptr(self) })?;
        Some(OsStr::from_bytes(text.to_bytes()).to_os_string())
    }
    /// NULL: `ork_config_default` leaves strings to the environment (their spellings report
    /// `None`).
    fn member(_: CText) -> Self {
        std::ptr::null()
    }
}

/// The bytes of one `ork_config` field: an integer, a float or a pointer, none with padding.
fn field_bytes<T: Copy>(field: &T) -> &[u8] {
    // SAFETY: `field` is a live, initialized scalar of `size_of::<T>()` bytes without padding.
    unsafe { std::slice::from_raw_parts((field as *const T).cast::<u8>(), size_of::<T>()) }
}

/// The `ork_config` side of the settings table: [`to_c_config`] and [`apply_c_config`].
macro_rules! c_side {
    ($($name:ident $(as $($field:ident),+)? { $($row:tt)* })*) => {
        /// `cfg` as an `ork_config` of this library's size.
        #[allow(unused_parens)]
        fn to_c_config(cfg: &Config) -> ork_config {
            $(c_row!(to_c cfg [$($($field),+)?] $($row)*);)*
            ork_config {
                struct_size: size_of::<ork_config>() as u32,
                $($($($field: Member::member($field),)+)?)*
            }
        }

        /// Every field of `c` as its offset and bytes, `struct_size` first: what
        /// `ork_config_default` copies, so the padding between fields (uninitialized in `c`) is
        /// never read.
        fn c_config_fields(c: &ork_config) -> Vec<(usize, &[u8])> {
            vec![
                (std::mem::offset_of!(ork_config, struct_size), field_bytes(&c.struct_size)),
                $($($((std::mem::offset_of!(ork_config, $field), field_bytes(&c.$field)),)+)?)*
            ]
        }

        /// `cfg` with the fields of `c` applied; `Err` names the field.
        #[allow(unused_parens)]
        fn apply_c_config(c: &ork_config, cfg: &mut Config) -> Result<(), String> {
            $(c_row!(apply c cfg [$($($field),+)?] $($row)*);)*
            Ok(())
        }
    };
}

/// One row's part of [`to_c_config`] (`let` its fields) or [`apply_c_config`].
macro_rules! c_row {
    ($step:ident $($arg:ident)+ [] $($environment_only:tt)*) => {};
    (to_c $cfg:ident [$($field:ident),+] default: $default:literal, meaning: $meaning:literal, value: $($place:ident).+, $($how:tt)*) => {
        let ($($field),+) = CField::to_c(&c_spelling!($($how)*), &$cfg.$($place).+);
    };
    (apply $c:ident $cfg:ident [$($field:ident),+] default: $default:literal, meaning: $meaning:literal, value: $($place:ident).+, $($how:tt)*) => {
        CField::apply_c(
            &c_spelling!($($how)*),
            stringify!($($field),+),
            ($(Member::value($c.$field)),+),
            &mut $cfg.$($place).+,
        )?;
    };
}

/// A row's spelling in C: its codes over its words, or the spelling itself.
macro_rules! c_spelling {
    (words: [$($word:literal = $code:ident => $value:expr),+ $(,)?] $(,)?) => {
        Coded {
            codes: &[$(($code, $word)),+],
            spelling: &Words(&[$(($word, $value)),+]),
        }
    };
    (parse: $spelling:expr, codes: [$($code:ident = $word:literal),+ $(,)?] $(,)?) => {
        Coded {
            codes: &[$(($code, $word)),+],
            spelling: &$spelling,
        }
    };
    (parse: $spelling:expr, auto: $auto:expr $(,)?) => {
        AutoCode { auto: $auto }
    };
    (parse: $spelling:expr $(,)?) => {
        $spelling
    };
}

crate::config::settings!(c_side);

/// The environment's configuration, a bad variable as INVALID_ARGUMENT.
fn env_config() -> Result<Config, Error> {
    crate::config::from_env().map_err(|e| invalid(&e))
}

/// `cfg`'s `struct_size`, its first field, read without assuming more of the struct.
///
/// # Safety
/// `cfg` is non-NULL and points to at least 4 readable bytes.
unsafe fn struct_size(cfg: *const ork_config) -> usize {
    // SAFETY: the first field, within the 4 bytes the caller guarantees; the caller's struct
    // may be shorter than this library's, so no place of a whole ork_config is formed.
    unsafe { cfg.cast::<u32>().read_unaligned() as usize }
}

/// Fills `out` with the defaults and the environment's settings (README lists the variables),
/// writing only the first `out->struct_size` bytes: set `struct_size = sizeof(ork_config)` first,
/// so that a caller built against an older, shorter `ork_config` gets only the fields it has. A
/// `struct_size` of 0 (a zeroed struct) stands for the smallest `ork_config` of ABI version 1,
/// whose fields end after `cache_verify` (40 bytes); 1 to 7 (less than `struct_size` and
/// `backend`) writes nothing and sets `ork_last_error`; more than this library's
/// `sizeof(ork_config)` writes that size. On return `struct_size` holds the bytes written. A
/// variable with a bad value is left at its default here; `ork_ctx_new` reports it. NULL is
/// ignored.
#[no_mangle]
pub extern "C" fn ork_config_default(out: *mut ork_config) {
    let _ = guard(|| {
        if out.is_null() {
            return Err(invalid("ork_config_default: out is NULL"));
        }
        // SAFETY: `out` is non-NULL and its first field is readable, by contract.
        let n = match unsafe { struct_size(out) } {
            0 => SMALLEST_CONFIG,
            n if n < LEAST_STRUCT_SIZE => {
                return Err(invalid(&format!("config: struct_size {n} is too small")))
            }
            n => n.min(size_of::<ork_config>()),
        };
        let mut c = to_c_config(&env_config().unwrap_or_default());
        c.struct_size = n as u32;
        // The fields that end within `n` bytes, padding as zeros.
        let mut bytes = vec![0u8; n];
        for (offset, field) in c_config_fields(&c) {
            if let Some(place) = bytes.get_mut(offset..offset + field.len()) {
                place.copy_from_slice(field);
            }
        }
        // SAFETY: `out` is writable for its `struct_size` bytes (or, for 0, for the smallest
        // ork_config a caller has), by contract; `n` is no more than that. Bytes are copied
        // without forming a place of the caller's possibly shorter struct.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.cast::<u8>(), n) };
        Ok(())
    });
}

/// Creates a context. `cfg` NULL means `ork_config_default`. Returns NULL on failure (see
/// `ork_last_error`), among them a bad value of any `ORK_*` variable. Free it with `ork_ctx_free`.
#[no_mangle]
pub extern "C" fn ork_ctx_new(cfg: *const ork_config) -> *mut ork_ctx {
    let mut ctx = std::ptr::null_mut();
    let r = guard(|| {
        let mut config = env_config()?;
        let mut full = to_c_config(&config);
        if !cfg.is_null() {
            // SAFETY: `cfg` is non-NULL and points to at least `struct_size` bytes, the first field.
            let size = unsafe { struct_size(cfg) };
            if size < LEAST_STRUCT_SIZE {
                return Err(invalid(&format!("config: struct_size {size} is too small")));
            }
            let n = size.min(size_of::<ork_config>());
            // SAFETY: copies the first `n` bytes the caller declared valid into a whole
            // ork_config; every bit pattern is a valid value of its integer, float and pointer
            // fields (pointers are only read as C strings when non-NULL, by contract).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    cfg.cast::<u8>(),
                    (&mut full as *mut ork_config).cast::<u8>(),
                    n,
                )
            };
        }
        apply_c_config(&full, &mut config).map_err(|e| invalid(&format!("config: {e}")))?;
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
    let ctx = Box::into_raw(Box::new(ork_ctx { engine }));
    super::exit::watch_until_exit(ctx);
    ctx
}

/// Rust only (not in the C header): the engine behind a context, e.g. for its prefetch
/// statistics; `None` for NULL.
pub fn ork_ctx_engine<'a>(ctx: *const ork_ctx) -> Option<&'a Engine> {
    // SAFETY: a non-NULL `ctx` is a live context from `ork_ctx_new` or `ork_ctx_from_engine`,
    // which the caller keeps alive while it uses the engine.
    unsafe { ctx.as_ref() }.map(|c| &c.engine)
}

/// Frees a context (NULL is a no-op). No call may be running on it.
#[no_mangle]
pub extern "C" fn ork_ctx_free(ctx: *mut ork_ctx) {
    let _ = guard(|| {
        if !ctx.is_null() {
            super::exit::forget(ctx);
            // SAFETY: `ctx` came from `ork_ctx_new` and is freed once, by contract.
            drop(unsafe { Box::from_raw(ctx) });
        }
        Ok(())
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::ork_last_error;
    use std::collections::HashMap;
    use std::ffi::CString;

    fn from_vars(vars: &[(&str, &str)]) -> Config {
        let map: HashMap<&str, &str> = vars.iter().copied().collect();
        crate::config::from_lookup(|name| map.get(name).map(|v| v.to_string())).unwrap()
    }

    fn last_error() -> String {
        // SAFETY: a NUL-terminated string, valid until the next failing call on this thread.
        unsafe { CStr::from_ptr(ork_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn every_field_carries_its_setting_both_ways() {
        let mut vars = vec![
            ("ORK_BACKEND", "cpu"),
            ("ORK_RKNN_DYNAMIC_M", "128"),
            ("ORK_CORE_MASK", "5"),
            ("ORK_CACHE_MB", "3"),
            ("ORK_CACHE_POLICY", "lru"),
            ("ORK_CACHE_VERIFY", "full"),
            ("ORK_MIN_ROWS", "3"),
            ("ORK_MIN_ROWS_MODE", "cpu"),
            ("ORK_MT_MODE", "leader"),
            ("ORK_OUTLIERS", "4:16"),
            ("ORK_OUTLIERS", "off"),
            ("ORK_SUBMITTERS", "2"),
            ("ORK_PREFETCH", "4"),
            ("ORK_PREFETCH", "0"),
            ("ORK_PREFETCH_MB", "512"),
            ("ORK_DENSE", "0"),
            ("ORK_DISPATCH", "never"),
            ("ORK_DISPATCH", "always"),
            ("ORK_LOG", "debug"),
            ("ORK_EMU_SUBMIT_US", "61.5"),
            ("ORK_EMU_TASK_US", "0"),
            ("ORK_EMU_CORE_TOPS", "1.5"),
            ("ORK_EMU_DRAM_GBPS", "30"),
            ("ORK_EMU_STRICT", "0"),
            ("ORK_EMU_PER_TASK", "1"),
            ("ORK_EMU_SLOW_US", "2000"),
        ];
        // Values that differ from the defaults on this machine only.
        if crate::pool::cores() > 1 {
            vars.push(("ORK_THREADS", "1"));
        }
        let best = crate::isa::Isa::best();
        if let Some(isa) = crate::isa::Isa::available()
            .into_iter()
            .find(|&i| i != best)
        {
            vars.push(("ORK_SIMD", isa.name()));
        }
        for (var, value) in vars {
            let cfg = from_vars(&[(var, value)]);
            assert_ne!(cfg, Config::default(), "{var}={value} is the default");
            let mut back = Config::default();
            apply_c_config(&to_c_config(&cfg), &mut back).unwrap();
            assert_eq!(back, cfg, "{var}={value} through ork_config");
        }
        let defaults = to_c_config(&Config::default());
        assert_eq!(defaults.prefetch_threads, ORK_PREFETCH_AUTO);
        assert_eq!(defaults.submitters, -1);
        assert_eq!(defaults.simd, to_c_config(&from_vars(&[])).simd);
    }

    #[test]
    fn c_strings_are_applied_and_null_keeps_the_environments() {
        let env = from_vars(&[
            ("ORK_RKNN_LIB", "/env/librknnrt.so"),
            ("ORK_EMU_DUMP", "/env/dump"),
            ("ORK_EMU_FAULTS", "run:3"),
        ]);
        let mut c = to_c_config(&env);
        assert!(c.rknn_lib.is_null() && c.emu_dump_dir.is_null() && c.emu_faults.is_null());
        let mut kept = env.clone();
        apply_c_config(&c, &mut kept).unwrap();
        assert_eq!(kept, env);
        let (lib, dump, faults) = (
            CString::new("/c/librknnrt.so").unwrap(),
            CString::new("/c/dump").unwrap(),
            CString::new("alloc:1+").unwrap(),
        );
        (c.rknn_lib, c.emu_dump_dir, c.emu_faults) = (lib.as_ptr(), dump.as_ptr(), faults.as_ptr());
        let mut set = env.clone();
        apply_c_config(&c, &mut set).unwrap();
        let from_c = from_vars(&[
            ("ORK_RKNN_LIB", "/c/librknnrt.so"),
            ("ORK_EMU_DUMP", "/c/dump"),
            ("ORK_EMU_FAULTS", "alloc:1+"),
        ]);
        assert_eq!(set, from_c);
    }

    #[test]
    fn bad_fields_are_errors_that_name_the_field() {
        let faults = CString::new("explode:1").unwrap();
        type Spoil = fn(&mut ork_config);
        let cases: [(Spoil, &str); 10] = [
            (|c| c.backend = 42, "unknown backend 42"),
            (|c| c.mt_mode = 7, "unknown mt_mode 7"),
            (|c| c.simd = 99, "unknown simd 99"),
            (|c| c.log_level = 6, "unknown log_level 6"),
            (|c| c.core_mask = 8, "core_mask 8: expected 1..7"),
            (
                |c| c.rknn_dynamic_m = 513,
                "rknn_dynamic_m 513: expected at most 512",
            ),
            (
                |c| c.emu_core_tops = 0.0,
                "emu_core_tops 0.0: expected a number above 0",
            ),
            (
                |c| c.emu_submit_us = f64::NAN,
                "emu_submit_us NaN: expected",
            ),
            (
                |c| c.outlier_max = 0,
                "outlier_factor, outlier_max (6.0, 0): expected",
            ),
            (
                |c| c.submitters = -2,
                "submitters -2: expected -1 (auto) or a count",
            ),
        ];
        for (spoil, message) in cases {
            let mut c = to_c_config(&Config::default());
            spoil(&mut c);
            let e = apply_c_config(&c, &mut Config::default()).unwrap_err();
            assert!(e.starts_with(message), "{e}");
        }
        let mut c = to_c_config(&Config::default());
        c.emu_faults = faults.as_ptr();
        let e = apply_c_config(&c, &mut Config::default()).unwrap_err();
        assert!(e.starts_with("emu_faults \"explode:1\": expected"), "{e}");
    }

    /// `ork_config_default` into a buffer of `struct_size` = `size`, the rest marked.
    fn default_into(size: u32) -> [u8; 2 * size_of::<ork_config>()] {
        let mut buf = [0xa5u8; 2 * size_of::<ork_config>()];
        buf[..4].copy_from_slice(&size.to_ne_bytes());
        ork_config_default(buf.as_mut_ptr().cast());
        buf
    }

    #[test]
    fn ork_config_default_writes_struct_size_bytes() {
        let full = default_into(size_of::<ork_config>() as u32);
        let whole = size_of::<ork_config>();
        // The padding before cache_bytes is written, as zeros (never copied from a value).
        let pad = std::mem::offset_of!(ork_config, core_mask) + 4;
        assert_eq!(
            full[pad..std::mem::offset_of!(ork_config, cache_bytes)],
            [0; 4]
        );
        for (size, written) in [
            (0, SMALLEST_CONFIG),
            (8, 8),
            (13, 13),
            (48, 48),
            (1000, whole),
        ] {
            let buf = default_into(size);
            assert_eq!(
                buf[..4],
                (written as u32).to_ne_bytes(),
                "struct_size {size}"
            );
            assert_eq!(buf[4..written], full[4..written], "struct_size {size}");
            assert!(
                buf[written..].iter().all(|&b| b == 0xa5),
                "struct_size {size}"
            );
        }
        assert_eq!(SMALLEST_CONFIG, 40);
        for size in 1..LEAST_STRUCT_SIZE as u32 {
            let buf = default_into(size);
            assert!(buf[4..].iter().all(|&b| b == 0xa5), "struct_size {size}");
            assert!(last_error().contains(&format!("struct_size {size} is too small")));
        }
    }
}
