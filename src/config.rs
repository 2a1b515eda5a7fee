//! The one place that reads the process environment: every `ORK_*` setting, parsed once into the
//! typed [`Config`] a context passes down (`Engine::new`, `Device::open`). Nothing below this
//! module and the C boundary reads the environment.
//!
//! One rule for bad values: an unset or empty variable means its default; anything else that does
//! not parse is an error naming the variable, its value and what it expects (`ork_ctx_new` returns
//! NULL with the message in `ork_last_error`; the probe exits with status 2). A valid value that
//! this machine cannot honour (`ORK_SIMD=avx512` on a CPU without it) is an error too.
//!
//! [`settings!`] declares every setting once. [`VARS`], the environment's side, is expanded from it
//! here, and the `ork_config` side in `ffi::config`; README's environment table is checked against
//! [`VARS`].

pub mod spelling;

use crate::moe::cache::{Policy, Verify};
use crate::moe::{Config, Dispatch, MtMode, SmallBatch};
use crate::npu::emu::FaultPlan;
use crate::npu::BackendChoice;
use log::LevelFilter;
use spelling::*;
use std::path::PathBuf;

/// Every setting of a context, once, in README's order. A row:
///
/// ```text
/// VARIABLE as field, ... {            the ork_config fields that carry it; no `as`: environment only
///     default: "...",                 README's default
///     meaning: "...",                 README's meaning
///     value: config.field,            where the value goes in a Config
///     parse: Spelling,                how it is written (a `spelling` type), in text and in C; or
///     words: ["word" = ORK_CODE => value, ...],   one of these words, the field holding the code;
///     codes: [ORK_CODE = "word", ...],    after `parse:`: the field's codes of the spelling's words;
///     auto: ORK_CODE,                 after `parse: AutoOr`: the field's code of `auto`;
///     apply: |config, text| ...,      instead of `value` and `parse`: a variable that sets several
/// }                                       fields (environment only)
/// ```
///
/// `$emit` receives the rows. `ffi::config` builds `ork_config` from them as one struct literal, so
/// the compiler checks that every field but `struct_size` has its row: no setting is `ork_config`
/// only.
macro_rules! settings { ($emit:ident) => { $emit! {
    ORK_BACKEND as backend {
        default: "auto",
        meaning: "`auto` (librknnrt if it loads and answers, else `emu`), `emu`, `rknn`, `cpu`",
        value: device.backend,
        words: [
            "auto" = ORK_BACKEND_AUTO => BackendChoice::Auto,
            "emu" = ORK_BACKEND_EMU => BackendChoice::Emu,
            "rknn" = ORK_BACKEND_RKNN => BackendChoice::Rknn,
            "cpu" = ORK_BACKEND_CPU => BackendChoice::Cpu,
        ],
    }
    ORK_RKNN_LIB as rknn_lib {
        default: "librknnrt.so",
        meaning: "path of the Rockchip runtime",
        value: device.rknn.lib,
        parse: Text,
    }
    ORK_RKNN_DYNAMIC_M as rknn_dynamic_m {
        default: "64",
        meaning: "row counts one dynamic-shape matmul context of the runtime covers (1..=W, W+1..=2W, ...; at most 512); 0: one context per row count",
        value: device.rknn.dynamic_m,
        parse: AtMost(512),
    }
    ORK_CORE_MASK as core_mask {
        default: "7",
        meaning: "NPU cores to use (bit mask of the 3 cores, 1..7, decimal or 0x)",
        value: device.core_mask,
        parse: CoreBits,
    }
    ORK_CACHE_MB as cache_bytes {
        default: "1024",
        meaning: "budget of the inflated-expert cache, MiB",
        value: cache_bytes,
        parse: MiB,
    }
    ORK_CACHE_POLICY as cache_policy {
        default: "pin",
        meaning: "when the cache is full: `pin` (keep what is held, stream the rest, replace entries gone stale) or `lru`",
        value: cache_policy,
        words: [
            "pin" = ORK_CACHE_PIN => Policy::Pin,
            "lru" = ORK_CACHE_LRU => Policy::Lru,
        ],
    }
    ORK_CACHE_VERIFY as cache_verify {
        default: "sampled",
        meaning: "`sampled` or `full`: how much of an expert's bytes a cache hit re-checks",
        value: cache_verify,
        words: [
            "sampled" = ORK_CACHE_VERIFY_SAMPLED => Verify::Sampled,
            "full" = ORK_CACHE_VERIFY_FULL => Verify::Full,
        ],
    }
    ORK_MIN_ROWS as min_rows {
        default: "8",
        meaning: "mean rows per used expert below which a call is not sent to the NPU; under `ORK_DISPATCH=auto` with `decline`, tokens below which a call is declined without measuring it (as one of under 2 rows per expert is), every larger call measured",
        value: min_rows,
        parse: Whole,
    }
    ORK_MIN_ROWS_MODE as min_rows_mode {
        default: "decline",
        meaning: "below the threshold: `decline` (`ORK_NOT_HANDLED`) or `cpu` (CPU int8 path)",
        value: small_batch,
        words: [
            "decline" = ORK_MIN_ROWS_DECLINE => SmallBatch::Decline,
            "cpu" = ORK_MIN_ROWS_CPU => SmallBatch::Cpu,
        ],
    }
    ORK_THREADS as n_threads {
        default: "0",
        meaning: "threads per call of the library's own pool and of the CPU-executed backends' submits; 0 = all cores (never more than the cores)",
        value: device.host.threads,
        parse: Threads,
    }
    ORK_MT_MODE as mt_mode {
        default: "coop",
        meaning: "how `ork_mul_mat_id_mt` uses the caller's threads: `coop` (each takes a share of the work) or `leader` (thread 0 runs the call on the library's pool, the others wait in the caller's barrier)",
        value: mt_mode,
        words: [
            "coop" = ORK_MT_COOP => MtMode::Coop,
            "leader" = ORK_MT_LEADER => MtMode::Leader,
        ],
    }
    ORK_OUTLIERS as outlier_factor, outlier_max {
        default: "6:8",
        meaning: "outlier split of activation rows: `F:M` takes up to M channels above F times the row's RMS out of the int8 row into an f32 correction, `off` disables it (docs/ACCURACY.md)",
        value: outliers,
        parse: Outliers,
    }
    ORK_SUBMITTERS as submitters {
        default: "auto",
        meaning: "threads that submit the GEMMs, one per NPU core, while the caller's threads prepare experts and scatter: `auto` (one per enabled core on `rknn`, none on `emu`/`cpu`, whose GEMMs are CPU work) or a number (0: the caller's threads submit)",
        value: submitters,
        parse: AutoOr,
        auto: -1,
    }
    ORK_PREFETCH as prefetch_threads {
        default: "auto",
        meaning: "threads that inflate the experts of the calls a patched llama.cpp announces at each graph's start, ahead of them, while ggml runs what lies between the calls; a dense call's threads also take their jobs while they wait for its NPU runs. `auto`: one on each CPU of `ORK_PREFETCH_CPUS`, else one on each core of the slowest type when the process may run on none of them (the RK3588's A55s under `taskset -c 4-7`), else none; 0: none",
        value: prefetch_threads,
        parse: AutoOr,
        auto: ORK_PREFETCH_AUTO,
    }
    ORK_PREFETCH_CPUS {
        default: "",
        meaning: "CPUs the prefetch threads run on, e.g. `0-3` (the RK3588's A55s) or `0,2`; empty: as `ORK_PREFETCH=auto` picks them, else wherever the process may run",
        value: prefetch_cpus,
        parse: Parsed(crate::cpus::parse_list),
    }
    ORK_PREFETCH_MB as prefetch_bytes {
        default: "1024",
        meaning: "inflated experts the prefetch threads may hold ahead of their calls, MiB",
        value: prefetch_bytes,
        parse: MiB,
    }
    ORK_DENSE as dense {
        default: "1",
        meaning: "`1`: dense matmuls a patched llama.cpp offers (a prefill's attention projections, `ork_mul_mat_mt`) are taken like a call with one expert; `0`: declined, ggml runs them",
        value: dense,
        parse: Bool {
            words: &[("1", true), ("0", false)],
            want: "1 or 0",
        },
    }
    ORK_DISPATCH as dispatch {
        default: "auto",
        meaning: "which ops the library takes: `always` (every op it can), `never` (none: ggml runs them all) or `auto` (per class of op, the faster of the library's path and ggml's, measured in the running process: a patched llama.cpp reports ggml's times through `ork_observe`; docs/ENGINE.md)",
        value: dispatch,
        words: [
            "always" = ORK_DISPATCH_ALWAYS => Dispatch::Always,
            "never" = ORK_DISPATCH_NEVER => Dispatch::Never,
            "auto" = ORK_DISPATCH_AUTO => Dispatch::Auto,
        ],
    }
    ORK_DISPATCH_CACHE {
        default: "$XDG_CACHE_HOME/ork-moe/dispatch",
        meaning: "where `ORK_DISPATCH=auto` remembers its verdicts between runs, so a second run starts decided: a file (a small text file per machine, keyed by backend, runtime and library version; one a different key left is replaced) or `off`; unset: `ork-moe/dispatch` in `$XDG_CACHE_HOME`, else in `~/.cache`",
        apply: |c, v| {
            c.dispatch_cache = (!v.eq_ignore_ascii_case("off")).then(|| PathBuf::from(v));
            Ok(())
        },
    }
    ORK_MOE_STATS {
        default: "0",
        meaning: "anything but `0`: when the process exits, each class of op's `ORK_DISPATCH=auto` verdict with both times is printed to stderr (the ggml patch, which reads it too, prints the counters)",
        apply: |c, v| {
            c.print_verdicts = v != "0";
            Ok(())
        },
    }
    ORK_SIMD as simd {
        default: "best",
        meaning: "kernel path: `best`, `scalar`, `ssse3`, `avx2`, `avx512`, `neon`, `dotprod` (must exist on this CPU)",
        value: device.host.isa,
        parse: KernelPath,
        codes: [
            ORK_SIMD_BEST = "best",
            ORK_SIMD_SCALAR = "scalar",
            ORK_SIMD_SSSE3 = "ssse3",
            ORK_SIMD_AVX2 = "avx2",
            ORK_SIMD_AVX512 = "avx512",
            ORK_SIMD_NEON = "neon",
            ORK_SIMD_DOTPROD = "dotprod",
        ],
    }
    ORK_LOG as log_level {
        default: "warn",
        meaning: "most verbose log level: `off`, `error`, `warn`, `info` (the backend chosen), `debug` (every call), `trace`",
        value: log_level,
        words: [
            "off" = ORK_LOG_OFF => LevelFilter::Off,
            "error" = ORK_LOG_ERROR => LevelFilter::Error,
            "warn" = ORK_LOG_WARN => LevelFilter::Warn,
            "info" = ORK_LOG_INFO => LevelFilter::Info,
            "debug" = ORK_LOG_DEBUG => LevelFilter::Debug,
            "trace" = ORK_LOG_TRACE => LevelFilter::Trace,
        ],
    }
    ORK_EMU_PROFILE {
        default: "",
        meaning: "emulator cost model: a board profile (the JSON `ork-probe board` writes) whose NPU figures `run_us_floor`, `task_us`, `core_tops`, `dram_gbps` replace the defaults of the four variables below, which still override it (unset: none)",
        apply: |c, v| {
            let text = std::fs::read_to_string(v)
                .map_err(|e| format!("a readable board profile ({e})"))?;
            c.device.emu.cost = crate::npu::emu::CostModel::from_profile(&text)
                .map_err(|e| format!("a board profile ({v}: {e})"))?;
            c.device.emu.profile = Some(PathBuf::from(v));
            Ok(())
        },
    }
    ORK_EMU_SUBMIT_US as emu_submit_us {
        default: "100",
        meaning: "emulator cost model: fixed cost of one submit, µs (modelled times only)",
        value: device.emu.cost.submit_us,
        parse: Number { positive: false },
    }
    ORK_EMU_TASK_US as emu_task_us {
        default: "2",
        meaning: "emulator cost model: set-up cost of one task on an NPU core, µs",
        value: device.emu.cost.task_us,
        parse: Number { positive: false },
    }
    ORK_EMU_CORE_TOPS as emu_core_tops {
        default: "0.4",
        meaning: "emulator cost model: sustained int8 TOPS of one NPU core",
        value: device.emu.cost.core_tops,
        parse: Number { positive: true },
    }
    ORK_EMU_DRAM_GBPS as emu_dram_gbps {
        default: "15",
        meaning: "emulator cost model: DRAM bandwidth the NPU gets, GB/s",
        value: device.emu.cost.dram_gbps,
        parse: Number { positive: true },
    }
    ORK_EMU_STRICT as emu_strict {
        default: "1",
        meaning: "`0`: a cacheable input the CPU wrote but did not sync is read stale with a warning, as the board would, not an error (and every rewritten buffer's old contents are kept for it)",
        value: device.emu.strict,
        parse: FLAG,
    }
    ORK_EMU_PER_TASK as emu_per_task {
        default: "0",
        meaning: "`1`: the emulator runs every planned hardware task's rows on their own (slower, same bits; exercises the task plan)",
        value: device.emu.per_task,
        parse: FLAG,
    }
    ORK_EMU_SLOW_US as emu_slow_us {
        default: "0",
        meaning: "for tests and benchmarks only: µs of real wall time the emulator adds to every submit (makes the library's path slower for real, e.g. to see `ORK_DISPATCH=auto` decline it)",
        value: device.emu.slow_us,
        parse: Whole,
    }
    ORK_EMU_FAULTS as emu_faults {
        default: "",
        meaning: "faults the emulator injects, for tests: `op:N` or `op:N+` (that one and every later one), comma-separated, `op` one of `alloc`, `domain_full`, `run`, `sync_to_device`, `sync_from_device`, N counting from 1 per kind (unset: none)",
        value: device.emu.faults,
        parse: Parsed(FaultPlan::parse),
    }
    ORK_EMU_DUMP as emu_dump_dir {
        default: "",
        meaning: "folder to dump every submit's A, B and C into (unset: no dump)",
        value: device.emu.dump,
        parse: Folder,
    }
}}}
pub(crate) use settings;

/// One environment variable: its name, its default as README shows it, what it means, the
/// `ork_config` fields that carry it (none: environment only), and how a value is applied to a
/// [`Config`].
pub struct Var {
    pub name: &'static str,
    pub default: &'static str,
    pub meaning: &'static str,
    pub fields: &'static [&'static str],
    apply: fn(&mut Config, &str) -> Result<(), String>,
}

/// The environment's side of [`settings!`]: one [`Var`] per row.
macro_rules! env_vars {
    ($($name:ident $(as $($field:ident),+)? { $($row:tt)* })*) => {
        &[$(env_var!($name [$($($field),+)?] $($row)*)),*]
    };
}

macro_rules! env_var {
    ($name:ident [$($field:ident),*] default: $default:literal, meaning: $meaning:literal, $($how:tt)*) => {
        Var {
            name: stringify!($name),
            default: $default,
            meaning: $meaning,
            fields: &[$(stringify!($field)),*],
            apply: env_apply!($($how)*),
        }
    };
}

/// A row's `apply`: its value parsed into its place (the C codes left to the C side).
macro_rules! env_apply {
    (value: $($place:ident).+, words: [$($word:literal = $code:ident => $value:expr),+ $(,)?] $(,)?) => {
        |c, v| {
            c.$($place).+ = Words(&[$(($word, $value)),+]).parse(v)?;
            Ok(())
        }
    };
    (value: $($place:ident).+, parse: $spelling:expr $(, codes: [$($codes:tt)*])? $(, auto: $auto:expr)? $(,)?) => {
        |c, v| {
            c.$($place).+ = $spelling.parse(v)?;
            Ok(())
        }
    };
    (apply: $apply:expr $(,)?) => {
        $apply
    };
}

/// Every variable the library reads, in README's order.
pub const VARS: &[Var] = settings!(env_vars);

/// The defaults with every set variable of the process environment applied.
pub fn from_env() -> Result<Config, String> {
    from_lookup(|name| std::env::var(name).ok())
}

/// [`from_env`] over any source of variables (tests use a map).
pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
    let mut c = Config {
        dispatch_cache: default_dispatch_cache(&get),
        ..Config::default()
    };
    for var in VARS {
        let Some(raw) = get(var.name) else { continue };
        let v = raw.trim();
        if v.is_empty() {
            continue;
        }
        (var.apply)(&mut c, v).map_err(|want| format!("{}={raw:?}: expected {want}", var.name))?;
    }
    Ok(c)
}

/// `ORK_DISPATCH_CACHE` when unset: in the XDG cache folder (`$XDG_CACHE_HOME`, an absolute
/// path, else `$HOME/.cache`); `None` when there is neither.
fn default_dispatch_cache(get: &impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let xdg = get("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute());
    let home = || {
        get("HOME")
            .filter(|h| !h.is_empty())
            .map(|h| PathBuf::from(h).join(".cache"))
    };
    Some(xdg.or_else(home)?.join("ork-moe").join("dispatch"))
}

/// `n` threads per call, 0 meaning every core; never more than the cores. Counting them starts no
/// thread (the pool starts at its first call).
pub fn threads(n: usize) -> usize {
    let cores = crate::pool::cores();
    if n == 0 {
        cores
    } else {
        n.min(cores)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::Isa;
    use crate::moe::outliers::Rule;
    use crate::npu::CoreMask;
    use std::collections::HashMap;

    fn parse(vars: &[(&str, &str)]) -> Result<Config, String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        from_lookup(|name| map.get(name).cloned())
    }

    #[test]
    fn every_documented_default_is_the_default() {
        for var in VARS {
            let documented = match var.name {
                // Defaults that are no value of the variable: the runtime's default names, no dump.
                "ORK_RKNN_LIB" | "ORK_EMU_DUMP" | "ORK_EMU_FAULTS" | "ORK_EMU_PROFILE"
                | "ORK_DISPATCH_CACHE" => continue,
                _ => parse(&[(var.name, var.default)]),
            };
            assert_eq!(documented, Ok(Config::default()), "{}", var.name);
        }
    }

    #[test]
    fn values_reach_their_fields() {
        let c = parse(&[
            ("ORK_BACKEND", "CPU"),
            ("ORK_CORE_MASK", "0x5"),
            ("ORK_CACHE_MB", "3"),
            ("ORK_MIN_ROWS_MODE", "cpu"),
            ("ORK_THREADS", "1"),
            ("ORK_SIMD", "scalar"),
            ("ORK_LOG", "debug"),
            ("ORK_EMU_CORE_TOPS", "1.5"),
            ("ORK_EMU_STRICT", "0"),
            ("ORK_EMU_DUMP", "/tmp/d"),
            ("ORK_MIN_ROWS", " "),
            ("ORK_OUTLIERS", "4:16"),
            ("ORK_PREFETCH", "4"),
            ("ORK_PREFETCH_CPUS", "4-5,0"),
            ("ORK_PREFETCH_MB", "512"),
        ])
        .unwrap();
        assert_eq!(c.device.backend, BackendChoice::Cpu);
        assert_eq!(c.device.core_mask, CoreMask(5));
        assert_eq!(c.cache_bytes, 3 << 20);
        assert_eq!(c.small_batch, SmallBatch::Cpu);
        assert_eq!(c.device.host.threads, 1);
        assert_eq!(c.device.host.isa, Isa::Scalar);
        assert_eq!(c.log_level, log::LevelFilter::Debug);
        assert_eq!(c.device.emu.cost.core_tops, 1.5);
        assert!(!c.device.emu.strict);
        assert_eq!(c.device.emu.dump, Some(PathBuf::from("/tmp/d")));
        assert_eq!(c.min_rows, Config::default().min_rows, "blank is unset");
        assert_eq!(c.prefetch_threads, Some(4));
        assert_eq!(c.prefetch_cpus, vec![0, 4, 5]);
        assert_eq!(c.prefetch_bytes, 512 << 20);
        assert_eq!(
            c.outliers,
            Some(Rule {
                factor: 4.0,
                max_channels: 16
            })
        );
        assert_eq!(parse(&[("ORK_OUTLIERS", "OFF")]).unwrap().outliers, None);
    }

    #[test]
    fn bad_values_are_errors_that_name_the_variable() {
        for (name, value) in [
            ("ORK_BACKEND", "npu"),
            ("ORK_CORE_MASK", "8"),
            ("ORK_CACHE_MB", "-1"),
            ("ORK_CACHE_MB", "99999999999999999"),
            ("ORK_THREADS", "two"),
            ("ORK_SIMD", "mmx"),
            ("ORK_EMU_CORE_TOPS", "0"),
            ("ORK_EMU_SUBMIT_US", "NaN"),
            ("ORK_EMU_STRICT", "maybe"),
            ("ORK_LOG", "loud"),
            ("ORK_OUTLIERS", "6"),
            ("ORK_OUTLIERS", "6:0"),
            ("ORK_PREFETCH", "-1"),
            ("ORK_PREFETCH_CPUS", "3-1"),
            ("ORK_PREFETCH_CPUS", "a"),
            ("ORK_EMU_PROFILE", "/nonexistent/board.json"),
        ] {
            let e = parse(&[(name, value)]).unwrap_err();
            assert!(e.starts_with(&format!("{name}=")), "{e}");
            assert!(e.contains("expected"), "{e}");
        }
    }

    #[test]
    fn the_dispatch_cache_is_in_the_xdg_cache_folder_a_chosen_file_or_off() {
        let file = |vars: &[(&str, &str)]| parse(vars).unwrap().dispatch_cache;
        let cache = |p: &str| Some(PathBuf::from(p).join("ork-moe/dispatch"));
        assert_eq!(file(&[]), None, "no home, no cache");
        assert_eq!(file(&[("HOME", "/home/u")]), cache("/home/u/.cache"));
        let both = [("HOME", "/home/u"), ("XDG_CACHE_HOME", "/var/c")];
        assert_eq!(file(&both), cache("/var/c"));
        let relative = [("HOME", "/home/u"), ("XDG_CACHE_HOME", "c")];
        assert_eq!(file(&relative), cache("/home/u/.cache"));
        let chosen = [("HOME", "/home/u"), ("ORK_DISPATCH_CACHE", "/tmp/v")];
        assert_eq!(file(&chosen), Some(PathBuf::from("/tmp/v")));
        for off in ["off", "OFF"] {
            assert_eq!(file(&[("HOME", "/h"), ("ORK_DISPATCH_CACHE", off)]), None);
        }
    }

    #[test]
    fn a_board_profile_sets_the_emulator_cost_model_and_the_variables_override_it() {
        use crate::npu::emu::CostModel;
        let dir = std::env::temp_dir().join(format!("ork-config-profile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("board.json");
        let profile = r#"{"backend": "rknn", "run_us_floor": 61.5, "task_us": 3.0,
            "core_tops": 0.9, "cores": 3.0, "shapes": [{"k": 2048, "n": 768}]}"#;
        std::fs::write(&path, profile).unwrap();
        let file = path.to_str().unwrap();
        let c = parse(&[("ORK_EMU_PROFILE", file)]).unwrap();
        let expected = CostModel {
            submit_us: 61.5,
            task_us: 3.0,
            core_tops: 0.9,
            ..CostModel::default()
        };
        assert_eq!(c.device.emu.cost, expected);
        assert_eq!(c.device.emu.profile.as_deref(), Some(path.as_path()));
        let c = parse(&[("ORK_EMU_PROFILE", file), ("ORK_EMU_CORE_TOPS", "1.5")]).unwrap();
        assert_eq!(c.device.emu.cost.core_tops, 1.5);
        assert_eq!(c.device.emu.cost.submit_us, 61.5);
        std::fs::write(&path, r#"{"core_tops": "fast"}"#).unwrap();
        let e = parse(&[("ORK_EMU_PROFILE", file)]).unwrap_err();
        assert!(e.contains("core_tops is not a number"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn readme_environment_table_matches() {
        let readme = include_str!("../README.md");
        let rows: Vec<(String, String, String)> = readme
            .lines()
            .filter_map(|l| l.strip_prefix("| `ORK_"))
            .map(|rest| {
                let mut cells = rest.split('|').map(str::trim);
                let name = format!("ORK_{}", cells.next().unwrap_or("").trim_end_matches('`'));
                let default = cells.next().unwrap_or("").trim_matches('`').to_string();
                let meaning = cells.next().unwrap_or("").to_string();
                (name, default, meaning)
            })
            .collect();
        let vars: Vec<(String, String, String)> = VARS
            .iter()
            .map(|v| {
                (
                    v.name.to_string(),
                    v.default.to_string(),
                    v.meaning.to_string(),
                )
            })
            .collect();
        assert_eq!(
            rows, vars,
            "README's environment table and config::VARS differ"
        );
    }

    #[test]
    fn readme_names_the_ork_config_fields_of_each_variable() {
        let readme = include_str!("../README.md");
        for row in readme.lines().filter(|l| l.starts_with("| `ORK_")) {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let name = cells[1].trim_matches('`');
            let var = VARS.iter().find(|v| v.name == name).expect("a variable");
            let named: Vec<String> = var.fields.iter().map(|f| format!("`{f}`")).collect();
            match var.fields {
                [] => assert!(!cells[4].starts_with('`'), "{name}: environment only"),
                _ => assert_eq!(cells[4], named.join(", "), "{name}"),
            }
        }
    }
}
