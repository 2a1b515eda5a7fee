//! The one place that reads the process environment: every `ORK_*` setting, parsed once into the
//! typed [`Config`] a context passes down (`Engine::new`, `Device::open`). Nothing below this
//! module and the C boundary reads the environment.
//!
//! One rule for bad values: an unset or empty variable means its default; anything else that does
//! not parse is an error naming the variable, its value and what it expects (`ork_ctx_new` returns
//! NULL with the message in `ork_last_error`; the probe exits with status 2). A valid value that
//! this machine cannot honour (`ORK_SIMD=avx512` on a CPU without it) is an error too.
//!
//! [`VARS`] is the table of variables; README's environment table is checked against it.

use crate::isa::Isa;
use crate::moe::cache::{Policy, Verify};
use crate::moe::outliers::Rule;
use crate::moe::{Config, MtMode, SmallBatch};
use crate::npu::board::Settings;
use crate::npu::emu::FaultPlan;
use crate::npu::{BackendChoice, CoreMask};
use std::path::PathBuf;

/// One environment variable: its name, its default as README shows it, what it means, and how a
/// value is applied to a [`Config`].
pub struct Var {
    pub name: &'static str,
    pub default: &'static str,
    pub meaning: &'static str,
    apply: fn(&mut Config, &str) -> Result<(), String>,
}

/// Every variable the library reads, in README's order.
pub const VARS: &[Var] = &[
    Var {
        name: "ORK_BACKEND",
        default: "auto",
        meaning: "`auto` (librknnrt if it loads and answers, else `emu`), `emu`, `rknn`, `cpu`",
        apply: |c, v| {
            c.device.backend = BackendChoice::parse(v).ok_or("auto, emu, rknn or cpu")?;
            Ok(())
        },
    },
    Var {
        name: "ORK_RKNN_LIB",
        default: "librknnrt.so",
        meaning: "path of the Rockchip runtime",
        apply: |c, v| {
            c.device.rknn.lib = Some(v.to_string());
            Ok(())
        },
    },
    Var {
        name: "ORK_RKNN_DYNAMIC_M",
        default: "64",
        meaning: "row counts one dynamic-shape matmul context of the runtime covers (1..=W, W+1..=2W, ...; at most 512); 0: one context per row count",
        apply: |c, v| {
            let w: usize = v.parse().map_err(|_| "a whole number, at most 512")?;
            c.device.rknn.dynamic_m = Some(w).filter(|&w| w <= 512).ok_or("at most 512")?;
            Ok(())
        },
    },
    Var {
        name: "ORK_CORE_MASK",
        default: "7",
        meaning: "NPU cores to use (bit mask of the 3 cores, 1..7, decimal or 0x)",
        apply: |c, v| {
            let mask = match v.strip_prefix("0x") {
                Some(hex) => u8::from_str_radix(hex, 16).ok(),
                None => v.parse().ok(),
            };
            c.device.core_mask = CoreMask(mask.filter(|m| (1..=7).contains(m)).ok_or("1..7")?);
            Ok(())
        },
    },
    Var {
        name: "ORK_CACHE_MB",
        default: "1024",
        meaning: "budget of the inflated-expert cache, MiB",
        apply: |c, v| {
            let mb: u64 = v.parse().map_err(|_| "a whole number of MiB")?;
            c.cache_bytes = mb.checked_mul(1 << 20).ok_or("a smaller number of MiB")?;
            Ok(())
        },
    },
    Var {
        name: "ORK_CACHE_POLICY",
        default: "pin",
        meaning: "when the cache is full: `pin` (keep what is held, stream the rest, replace entries gone stale) or `lru`",
        apply: |c, v| {
            c.cache_policy = word(v, &[("pin", Policy::Pin), ("lru", Policy::Lru)])?;
            Ok(())
        },
    },
    Var {
        name: "ORK_CACHE_VERIFY",
        default: "sampled",
        meaning: "`sampled` or `full`: how much of an expert's bytes a cache hit re-checks",
        apply: |c, v| {
            c.cache_verify = word(v, &[("sampled", Verify::Sampled), ("full", Verify::Full)])?;
            Ok(())
        },
    },
    Var {
        name: "ORK_MIN_ROWS",
        default: "8",
        meaning: "mean rows per used expert below which a call is not sent to the NPU",
        apply: |c, v| {
            c.min_rows = v.parse().map_err(|_| "a whole number")?;
            Ok(())
        },
    },
    Var {
        name: "ORK_MIN_ROWS_MODE",
        default: "decline",
        meaning: "below the threshold: `decline` (`ORK_NOT_HANDLED`) or `cpu` (CPU int8 path)",
        apply: |c, v| {
            let modes = [("decline", SmallBatch::Decline), ("cpu", SmallBatch::Cpu)];
            c.small_batch = word(v, &modes)?;
            Ok(())
        },
    },
    Var {
        name: "ORK_THREADS",
        default: "0",
        meaning: "threads per call of the library's own pool and of the CPU-executed backends' submits; 0 = all cores (never more than the cores)",
        apply: |c, v| {
            let n: usize = v.parse().map_err(|_| "a whole number (0: all cores)")?;
            c.device.host.threads = threads(n);
            Ok(())
        },
    },
    Var {
        name: "ORK_MT_MODE",
        default: "coop",
        meaning: "how `ork_mul_mat_id_mt` uses the caller's threads: `coop` (each takes a share of the work) or `leader` (thread 0 runs the call on the library's pool, the others wait in the caller's barrier)",
        apply: |c, v| {
            c.mt_mode = word(v, &[("coop", MtMode::Coop), ("leader", MtMode::Leader)])?;
            Ok(())
        },
    },
    Var {
        name: "ORK_OUTLIERS",
        default: "6:8",
        meaning: "outlier split of activation rows: `F:M` takes up to M channels above F times the row's RMS out of the int8 row into an f32 correction, `off` disables it (docs/ACCURACY.md)",
        apply: |c, v| {
            c.outliers = outliers(v)?;
            Ok(())
        },
    },
    Var {
        name: "ORK_SUBMITTERS",
        default: "auto",
        meaning: "threads that submit the GEMMs, one per NPU core, while the caller's threads prepare experts and scatter: `auto` (one per enabled core on `rknn`, none on `emu`/`cpu`, whose GEMMs are CPU work) or a number (0: the caller's threads submit)",
        apply: |c, v| {
            c.submitters = match v {
                "auto" => None,
                n => Some(n.parse().map_err(|_| "auto or a whole number")?),
            };
            Ok(())
        },
    },
    Var {
        name: "ORK_PREFETCH",
        default: "auto",
        meaning: "threads that inflate the experts of the calls a patched llama.cpp announces at each graph's start, ahead of them, while ggml runs what lies between the calls; a dense call's threads also take their jobs while they wait for its NPU runs. `auto`: one on each CPU of `ORK_PREFETCH_CPUS`, else one on each core of the slowest type when the process may run on none of them (the RK3588's A55s under `taskset -c 4-7`), else none; 0: none",
        apply: |c, v| {
            c.prefetch_threads = match v {
                "auto" => None,
                n => Some(n.parse().map_err(|_| "auto or a whole number of threads")?),
            };
            Ok(())
        },
    },
    Var {
        name: "ORK_PREFETCH_CPUS",
        default: "",
        meaning: "CPUs the prefetch threads run on, e.g. `0-3` (the RK3588's A55s) or `0,2`; empty: as `ORK_PREFETCH=auto` picks them, else wherever the process may run",
        apply: |c, v| {
            c.prefetch_cpus = crate::cpus::parse_list(v)?;
            Ok(())
        },
    },
    Var {
        name: "ORK_PREFETCH_MB",
        default: "1024",
        meaning: "inflated experts the prefetch threads may hold ahead of their calls, MiB",
        apply: |c, v| {
            let mb: u64 = v.parse().map_err(|_| "a whole number of MiB")?;
            c.prefetch_bytes = mb.checked_mul(1 << 20).ok_or("a smaller number of MiB")?;
            Ok(())
        },
    },
    Var {
        name: "ORK_DENSE",
        default: "1",
        meaning: "`1`: dense matmuls a patched llama.cpp offers (a prefill's attention projections, `ork_mul_mat_mt`) are taken like a call with one expert; `0`: declined, ggml runs them",
        apply: |c, v| {
            c.dense = word(v, &[("1", true), ("0", false)])?;
            Ok(())
        },
    },
    Var {
        name: "ORK_SIMD",
        default: "best",
        meaning: "kernel path: `best`, `scalar`, `ssse3`, `avx2`, `avx512`, `neon`, `dotprod` (must exist on this CPU)",
        apply: |c, v| {
            c.device.host.isa = simd(v)?;
            Ok(())
        },
    },
    Var {
        name: "ORK_LOG",
        default: "warn",
        meaning: "most verbose log level: `off`, `error`, `warn`, `info` (the backend chosen), `debug` (every call), `trace`",
        apply: |c, v| {
            c.log_level = v
                .parse()
                .map_err(|_| "off, error, warn, info, debug or trace")?;
            Ok(())
        },
    },
    Var {
        name: "ORK_EMU_PROFILE",
        default: "",
        meaning: "emulator cost model: a board profile (the JSON `ork-probe board` writes) whose NPU figures `run_us_floor`, `task_us`, `core_tops`, `dram_gbps` replace the defaults of the four variables below, which still override it (unset: none)",
        apply: |c, v| {
            let text = std::fs::read_to_string(v)
                .map_err(|e| format!("a readable board profile ({e})"))?;
            let settings = Settings::from_profile(&text, v)
                .map_err(|e| format!("a board profile ({e})"))?;
            c.device.emu.cost = settings.params.npu_cost();
            c.device.emu.profile = Some(PathBuf::from(v));
            Ok(())
        },
    },
    Var {
        name: "ORK_EMU_SUBMIT_US",
        default: "100",
        meaning: "emulator cost model: fixed cost of one submit, µs (modelled times only)",
        apply: |c, v| {
            c.device.emu.cost.submit_us = number(v, false)?;
            Ok(())
        },
    },
    Var {
        name: "ORK_EMU_TASK_US",
        default: "2",
        meaning: "emulator cost model: set-up cost of one task on an NPU core, µs",
        apply: |c, v| {
            c.device.emu.cost.task_us = number(v, false)?;
            Ok(())
        },
    },
    Var {
        name: "ORK_EMU_CORE_TOPS",
        default: "0.4",
        meaning: "emulator cost model: sustained int8 TOPS of one NPU core",
        apply: |c, v| {
            c.device.emu.cost.core_tops = number(v, true)?;
            Ok(())
        },
    },
    Var {
        name: "ORK_EMU_DRAM_GBPS",
        default: "15",
        meaning: "emulator cost model: DRAM bandwidth the NPU gets, GB/s",
        apply: |c, v| {
            c.device.emu.cost.dram_gbps = number(v, true)?;
            Ok(())
        },
    },
    Var {
        name: "ORK_EMU_STRICT",
        default: "1",
        meaning: "`0`: a cacheable input the CPU wrote but did not sync is read stale with a warning, as the board would, not an error (and every rewritten buffer's old contents are kept for it)",
        apply: |c, v| {
            c.device.emu.strict = flag(v)?;
            Ok(())
        },
    },
    Var {
        name: "ORK_EMU_PER_TASK",
        default: "0",
        meaning: "`1`: the emulator runs every planned hardware task's rows on their own (slower, same bits; exercises the task plan)",
        apply: |c, v| {
            c.device.emu.per_task = flag(v)?;
            Ok(())
        },
    },
    Var {
        name: "ORK_EMU_FAULTS",
        default: "",
        meaning: "faults the emulator injects, for tests: `op:N` or `op:N+` (that one and every later one), comma-separated, `op` one of `alloc`, `domain_full`, `run`, `sync_to_device`, `sync_from_device`, N counting from 1 per kind (unset: none)",
        apply: |c, v| {
            c.device.emu.faults = FaultPlan::parse(v)?;
            Ok(())
        },
    },
    Var {
        name: "ORK_EMU_DUMP",
        default: "",
        meaning: "folder to dump every submit's A, B and C into (unset: no dump)",
        apply: |c, v| {
            c.device.emu.dump = Some(PathBuf::from(v));
            Ok(())
        },
    },
];

/// The defaults with every set variable of the process environment applied.
pub fn from_env() -> Result<Config, String> {
    from_lookup(|name| std::env::var(name).ok())
}

/// [`from_env`] over any source of variables (tests use a map).
pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
    let mut c = Config::default();
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

/// The kernel path `name` (`best` or an [`Isa`] name) if this CPU has it.
pub fn simd(name: &str) -> Result<Isa, String> {
    if name.eq_ignore_ascii_case("best") {
        return Ok(Isa::best());
    }
    let available = || {
        let names: Vec<_> = Isa::available().iter().map(|i| i.name()).collect();
        format!("one of best, {}", names.join(", "))
    };
    match Isa::from_name(name) {
        Some(isa) if isa.is_available() => Ok(isa),
        Some(isa) => Err(format!(
            "a path this CPU has ({} is not: {})",
            isa.name(),
            available()
        )),
        None => Err(available()),
    }
}

/// `off`, or `FACTOR:MAX` (a factor above 0, at least one channel).
pub fn outliers(v: &str) -> Result<Option<Rule>, String> {
    if v.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    let want = "off or FACTOR:MAX, e.g. 6:8";
    let (f, m) = v.split_once(':').ok_or(want)?;
    let factor = number(f.trim(), true).map_err(|_| want)?;
    let max_channels: usize = m.trim().parse().map_err(|_| want)?;
    if max_channels == 0 {
        return Err(want.into());
    }
    Ok(Some(Rule {
        factor: factor as f32,
        max_channels,
    }))
}

/// One of `choices`' words, any case.
fn word<T: Copy>(v: &str, choices: &[(&'static str, T)]) -> Result<T, String> {
    let lower = v.to_ascii_lowercase();
    choices
        .iter()
        .find(|(w, _)| *w == lower)
        .map(|&(_, t)| t)
        .ok_or_else(|| {
            let words: Vec<_> = choices.iter().map(|(w, _)| *w).collect();
            words.join(" or ")
        })
}

fn flag(v: &str) -> Result<bool, &'static str> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Ok(true),
        "0" | "false" | "off" | "no" => Ok(false),
        _ => Err("0 or 1"),
    }
}

/// A finite number, at least 0 (or above 0 when `positive`).
fn number(v: &str, positive: bool) -> Result<f64, &'static str> {
    let x: f64 = v.parse().map_err(|_| "a number")?;
    match (x.is_finite(), positive) {
        (true, true) if x > 0.0 => Ok(x),
        (true, false) if x >= 0.0 => Ok(x),
        (_, true) => Err("a number above 0"),
        (_, false) => Err("a number of at least 0"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
                "ORK_RKNN_LIB" | "ORK_EMU_DUMP" | "ORK_EMU_FAULTS" | "ORK_EMU_PROFILE" => continue,
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
    fn a_board_profile_sets_the_emulator_cost_model_and_the_variables_override_it() {
        use crate::npu::board::{Params, ProfileInfo};
        let dir = std::env::temp_dir().join(format!("ork-config-profile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("board.json");
        let mut p = Params::default();
        for (name, v) in [("run_us_floor", 61.5), ("task_us", 3.0), ("core_tops", 0.9)] {
            p.set(name, v).unwrap();
        }
        std::fs::write(&path, p.to_profile(&ProfileInfo::default())).unwrap();
        let file = path.to_str().unwrap();
        let c = parse(&[("ORK_EMU_PROFILE", file)]).unwrap();
        assert_eq!(c.device.emu.cost, p.npu_cost());
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
}
