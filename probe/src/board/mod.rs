//! `ork-probe board`: the one command a user with an RK3588 runs. It reports the runtime, the
//! rknpu driver, the NPU cores, the CPU clusters and the memory setup; checks every primitive at
//! the A3B shapes bit for bit against the CPU int8 reference; times what the board model prices
//! (docs/BOARD-MODEL.md); and writes a board profile: the model's parameters with every measured
//! one replaced (`measured` lists them; the others keep the model's value, each with the reason in
//! `not_measured`), plus the per-shape rows and the raw timings. `ork-probe model --profile FILE`
//! models with all of them, `ORK_EMU_PROFILE=FILE` gives the emulator's cost model its NPU ones.
//!
//! On the emulator the same steps run; every NPU figure is then this machine's CPU work, and the
//! profile says so (`npu_figures`).

mod cpu;
mod npu;
mod system;

use super::json;
use super::options::Options;
use ork_moe::moe::Config;
use ork_moe::npu::BackendKind;
use ork_probe::timeline::{profile, Params, ProfileInfo, SPECS};
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// How long the check spends: `--quick` keeps it to seconds (CI, the stand-in runtime).
#[derive(Clone, Copy, Debug)]
pub struct Effort {
    pub quick: bool,
}

impl Effort {
    pub fn pick(self, quick: usize, full: usize) -> usize {
        if self.quick {
            quick
        } else {
            full
        }
    }
}

/// One GEMM (or one submit of two) checked against the reference, with its times in µs.
pub struct Check {
    pub role: String,
    pub k: usize,
    pub n: usize,
    pub m: usize,
    pub primitive: String,
    pub npu_us: f64,
    pub npu_min_us: f64,
    pub npu_max_us: f64,
    /// The CPU int8 GEMM on one thread and on all of them (the per-shape rows).
    pub cpu1_us: Option<f64>,
    pub cpun_us: Option<f64>,
    /// The emulator's cost model of the board (emu only; modelled, never measured).
    pub modelled_us: Option<f64>,
    pub bit_exact: bool,
}

/// What the check found: parameters measured (value, how) or kept (why), the checks, and raw
/// timings for the JSON.
#[derive(Default)]
pub struct Findings {
    measured: Vec<(&'static str, f64, String)>,
    kept: Vec<(&'static str, String)>,
    pub checks: Vec<Check>,
    timings: Map<String, Value>,
}

impl Findings {
    /// Parameter `name` measured as `value`; a value the model cannot use (zero, infinite) is
    /// kept from the model instead, with the reason.
    pub fn set(&mut self, name: &'static str, value: f64, how: impl Into<String>) {
        self.measured.retain(|(n, _, _)| *n != name);
        self.kept.retain(|(n, _)| *n != name);
        match Params::default().set(name, value) {
            Ok(()) => self.measured.push((name, value, how.into())),
            Err(e) => self
                .kept
                .push((name, format!("measured {e}: {}", how.into()))),
        }
    }

    /// Parameter `name` not measured, and why.
    pub fn keep(&mut self, name: &'static str, why: impl Into<String>) {
        self.measured.retain(|(n, _, _)| *n != name);
        self.kept.retain(|(n, _)| *n != name);
        self.kept.push((name, why.into()));
    }

    /// A raw timing for the JSON's `timings`.
    pub fn num(&mut self, name: &str, v: f64) {
        self.timings.insert(name.to_string(), v.into());
    }

    /// The model's parameters with those measured so far.
    pub fn params_so_far(&self) -> Params {
        let mut p = Params::default();
        for (name, v, _) in &self.measured {
            p.set(name, *v).expect("checked when set");
        }
        p
    }
}

/// Parameters no step of the check measures, and why.
const NOT_MEASURED: [(&str, &str); 8] = [
    (
        "task_us",
        "no figure of its own: a run's per-task set-up is inside run_us_floor and the throughput runs",
    ),
    (
        "domain_mb",
        "not probed: filling an IOMMU domain takes about 4 GiB of device memory",
    ),
    (
        "lookup_us",
        "an expert-cache hit is timed by `ork-probe moe` (warm cache), not here",
    ),
    (
        "elementwise_gelems_big_core",
        "ggml's element-wise ops are llama.cpp's work, not the library's",
    ),
    (
        "cpu_only_reference_tokps",
        "llama.cpp's CPU-only prefill: run llama-bench (docs/BOARD.md section 4) and give it with --param",
    ),
    (
        "reference_context",
        "the prompt length of cpu_only_reference_tokps",
    ),
    (
        "mul_mat_id_share",
        "MUL_MAT_ID's share of llama.cpp's CPU-only prefill needs perf over llama-bench (docs/BOARD-MODEL.md)",
    ),
    ("dense_weight_bytes", "a property of the model file"),
];

/// Parameters that describe the NPU: on the emulator, this machine's CPU measured them.
const NPU_PARAMS: [&str; 8] = [
    "cores",
    "run_us_floor",
    "context_create_us",
    "buffer_create_us",
    "sync_us",
    "sync_gbps",
    "core_tops",
    "dram_gbps",
];

/// The default `--profile`.
const DEFAULT_PROFILE: &str = "board-profile.json";

/// Everything the check reports besides the parameters.
struct Report {
    backend: BackendKind,
    runtime: String,
    driver: system::Driver,
    cpus: system::Cpus,
    memory: Vec<(String, String)>,
    host: Vec<(String, String)>,
    cores: Vec<usize>,
    inflate: Vec<cpu::InflateRow>,
    seconds: f64,
    quick: bool,
    emu_profile: Option<PathBuf>,
}

impl Report {
    /// The test stand-in of librknnrt (tests/standin), which says so in its version string.
    fn stand_in(&self) -> bool {
        self.backend == BackendKind::Rknn && self.runtime.contains("stand-in")
    }

    /// The NPU figures are not a board's.
    fn emulated(&self) -> bool {
        self.backend != BackendKind::Rknn || self.stand_in()
    }

    fn npu_figures(&self) -> &'static str {
        if self.stand_in() {
            "not a board's: the runtime is ork-moe's test stand-in of librknnrt, a CPU reference GEMM"
        } else if self.emulated() {
            "emulated: the NPU is this machine's CPU, so every NPU figure is its wall time, not the board's"
        } else {
            "measured through librknnrt on this machine's NPU"
        }
    }
}

pub fn run(opts: &Options, cfg: &Config) -> Result<ExitCode, String> {
    let started = Instant::now();
    let effort = Effort { quick: opts.quick };
    let (dev, cpu_dev) = super::gemm::devices(cfg)?;
    let backend = dev.backend();
    if backend == BackendKind::Cpu {
        return Err(
            "the board check measures an NPU backend: --backend rknn (on the board) or emu".into(),
        );
    }
    let runtime = match backend {
        BackendKind::Rknn => dev
            .runtime_version()
            .unwrap_or_else(|| "unknown (no \"librknnrt version\" string in the library)".into()),
        _ => "emulator".into(),
    };
    let cpus = system::cpus();
    let isa = cfg.device.host.isa;
    eprintln!(
        "board: backend {} ({runtime}), kernel path {}, {}",
        backend.name(),
        isa.name(),
        if effort.quick { "quick" } else { "full" }
    );
    let mut f = Findings::default();
    let cores = npu::usable_cores(&dev, &mut f)?;
    npu::measure(&dev, &cpu_dev, isa, &cores, effort, &mut f)?;
    let inflate = cpu::inflate(isa, &cpus, effort, &mut f)?;
    cpu::memory(&cpus, effort, &mut f)?;
    cpu::stages(cfg, &cpus, effort, &mut f)?;
    match cpus.little() {
        Some(_) => {
            let big = cpus.big().cpus.len();
            let all = cpus.all().len();
            let how = "CPUs of the fastest core type, and of the others (cpu_capacity, CPU part)";
            f.set("big_cores", big as f64, how);
            f.set("little_cores", (all - big) as f64, how);
        }
        None => {
            for name in ["big_cores", "little_cores"] {
                f.keep(
                    name,
                    "one core type on this machine: the RK3588's split is kept",
                );
            }
        }
    }
    for (name, why) in NOT_MEASURED {
        f.keep(name, why);
    }
    for s in SPECS {
        let known =
            f.measured.iter().any(|m| m.0 == s.name) || f.kept.iter().any(|k| k.0 == s.name);
        if !known {
            f.keep(s.name, "not measured by the board check");
        }
    }
    let report = Report {
        backend,
        runtime,
        driver: system::driver(),
        cpus,
        memory: system::memory(),
        host: system::host(),
        cores,
        inflate,
        seconds: started.elapsed().as_secs_f64(),
        quick: effort.quick,
        emu_profile: cfg.device.emu.profile.clone(),
    };
    let all_exact =
        f.checks.iter().all(|c| c.bit_exact) && report.inflate.iter().all(|r| r.bit_exact);
    let params = f.params_so_far();
    let info = ProfileInfo {
        path: String::new(),
        backend: backend.name().into(),
        runtime_version: report.runtime.clone(),
        all_bit_exact: Some(all_exact),
        measured: Some(f.measured.iter().map(|m| m.0.to_string()).collect()),
    };
    let mut fields = profile::fields(&params, &info);
    fields.extend(extras(&report, &f));
    let profile = json::text(&Value::Object(fields));
    let path = opts
        .profile
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_PROFILE));
    std::fs::write(&path, format!("{profile}\n"))
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    if opts.json {
        println!("{profile}");
    } else {
        print_report(&report, &f, &params, all_exact, &path);
    }
    eprintln!(
        "board: wrote {} in {:.1} s; all bit-exact: {all_exact}",
        path.display(),
        report.seconds
    );
    Ok(if all_exact {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The profile's fields beyond the parameters: what was found, how each parameter was measured or
/// why not, the checks and the raw timings. Counts are written as floats, as every number of the
/// profile.
fn extras(r: &Report, f: &Findings) -> Map<String, Value> {
    let pairs = |v: &[(String, String)]| -> Map<String, Value> {
        v.iter()
            .map(|(k, x)| (k.clone(), x.as_str().into()))
            .collect()
    };
    let floats = |v: &[usize]| -> Vec<f64> { v.iter().map(|&x| x as f64).collect() };
    let clusters: Vec<Value> = r
        .cpus
        .clusters
        .iter()
        .map(|c| {
            json!({
                "cpus": floats(&c.cpus),
                "part": c.part,
                "capacity": c.capacity.map(f64::from),
                "max_mhz": c.max_mhz.map(f64::from),
            })
        })
        .collect();
    let checks: Vec<Value> = f
        .checks
        .iter()
        .map(|c| {
            json!({
                "role": c.role,
                "k": c.k as f64,
                "n": c.n as f64,
                "m": c.m as f64,
                "primitive": c.primitive,
                "npu_us": c.npu_us,
                "npu_min_us": c.npu_min_us,
                "npu_max_us": c.npu_max_us,
                "cpu1_us": c.cpu1_us,
                "cpun_us": c.cpun_us,
                "modelled_rk3588_us": c.modelled_us,
                "bit_exact": c.bit_exact,
            })
        })
        .collect();
    let inflate: Vec<Value> = r
        .inflate
        .iter()
        .map(|x| {
            json!({
                "type": x.ty.name(),
                "k": 2048.0,
                "n": 768.0,
                "bit_exact": x.bit_exact,
                "big_core_gbps": x.big_gbps,
                "little_core_gbps": x.little_gbps,
            })
        })
        .collect();
    let how: Map<String, Value> = f
        .measured
        .iter()
        .map(|(n, _, how)| (n.to_string(), how.as_str().into()))
        .collect();
    let why: Map<String, Value> = f
        .kept
        .iter()
        .map(|(n, why)| (n.to_string(), why.as_str().into()))
        .collect();
    [
        ("npu_figures", json!(r.npu_figures())),
        ("quick", json!(r.quick)),
        ("seconds", json!(r.seconds)),
        ("driver_version", json!(r.driver.version)),
        ("driver_source", json!(r.driver.source)),
        ("device_nodes", json!(r.driver.nodes)),
        ("npu_cores", json!(floats(&r.cores))),
        ("cpu_clusters", json!(clusters)),
        ("memory", json!(pairs(&r.memory))),
        ("host", json!(pairs(&r.host))),
        (
            "emu_cost_profile",
            json!(r.emu_profile.as_ref().map(|p| p.display().to_string())),
        ),
        ("how_measured", json!(how)),
        ("not_measured", json!(why)),
        ("timings", json!(f.timings)),
        ("inflate", json!(inflate)),
        ("shapes", json!(checks)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

fn print_report(
    r: &Report,
    f: &Findings,
    params: &Params,
    all_exact: bool,
    path: &std::path::Path,
) {
    println!(
        "ork-probe board ({}): backend {}; NPU figures {}",
        if r.quick { "quick" } else { "full" },
        r.backend.name(),
        r.npu_figures()
    );
    println!("  runtime       {}", r.runtime);
    if let Some(p) = &r.emu_profile {
        println!(
            "  emulator cost model from the board profile {}",
            p.display()
        );
    }
    println!(
        "  rknpu driver  {} ({})",
        r.driver.version.as_deref().unwrap_or("unknown"),
        r.driver.source
    );
    println!("  device nodes  {}", r.driver.nodes);
    println!(
        "  NPU cores     {} usable: {}",
        r.cores.len(),
        r.cores
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    match r.cpus.little() {
        Some(l) => println!(
            "  CPU           big: {}; little: {}",
            r.cpus.big().describe(),
            l.describe()
        ),
        None => println!(
            "  CPU           one core type: {} (big and little are the same core here: the \
             little-core figures are not measured)",
            r.cpus.big().describe()
        ),
    }
    let kv = |v: &[(String, String)]| {
        v.iter()
            .map(|(k, x)| format!("{k} {x}"))
            .collect::<Vec<_>>()
            .join("; ")
    };
    println!("  memory        {}", kv(&r.memory));
    println!("  host          {}", kv(&r.host));
    println!();
    println!(
        "checks, bit for bit against the CPU int8 reference (times in µs, medians; cpu1/cpuN: the \
         CPU int8 GEMM on 1 and all threads{})",
        if r.emulated() {
            "; rk3588_model: the emulator's cost model, not a measurement"
        } else {
            ""
        }
    );
    println!(
        "{:<20} {:>5} {:>5} {:>4}  {:<22} {:>10} {:>21} {:>9} {:>9} {:>12}  exact",
        "role",
        "k",
        "n",
        "m",
        "primitive",
        "npu_us",
        "min-max",
        "cpu1_us",
        "cpuN_us",
        "rk3588_model"
    );
    let or_dash = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.1}"));
    for c in &f.checks {
        println!(
            "{:<20} {:>5} {:>5} {:>4}  {:<22} {:>10.1} {:>21} {:>9} {:>9} {:>12}  {}",
            c.role,
            c.k,
            c.n,
            c.m,
            c.primitive,
            c.npu_us,
            format!("{:.1}-{:.1}", c.npu_min_us, c.npu_max_us),
            or_dash(c.cpu1_us),
            or_dash(c.cpun_us),
            or_dash(c.modelled_us),
            c.bit_exact
        );
    }
    println!();
    println!(
        "inflate of a 2048x768 expert from ggml's layout here, weights out of cache (the kernel \
         path against the scalar reference; GB/s of int8 written):"
    );
    for x in &r.inflate {
        println!(
            "  {:<9} exact {:<5}  big core {:>6.2}  little core {}",
            cpu::ggml_layout(x.ty).name(x.ty),
            x.bit_exact,
            x.big_gbps,
            x.little_gbps.map_or("-".into(), |v| format!("{v:.2}"))
        );
    }
    println!();
    println!(
        "board model parameters (measured: replaces the model's value; kept: the model's value{})",
        if r.emulated() {
            "; [this machine]: an NPU figure of the emulator, not the board's"
        } else {
            ""
        }
    );
    for s in SPECS {
        let v = params.get(s.name).expect("every spec has a field");
        let line = match f.measured.iter().find(|m| m.0 == s.name) {
            Some((_, _, how)) => {
                let mark = if r.emulated() && NPU_PARAMS.contains(&s.name) {
                    " [this machine]"
                } else {
                    ""
                };
                format!("measured{mark}: {how}")
            }
            None => {
                let why = f.kept.iter().find(|k| k.0 == s.name).map_or("", |k| &k.1);
                format!("kept: {why}")
            }
        };
        println!("  {:<28} {:>10.4} {:<12} {line}", s.name, v, s.unit);
    }
    println!();
    println!(
        "wrote {}: {} parameters measured, {} kept from the model; all bit-exact: {}; {:.1} s",
        path.display(),
        f.measured.len(),
        f.kept.len(),
        if all_exact { "yes" } else { "NO" },
        r.seconds
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn findings_keep_what_the_model_cannot_use() {
        let mut f = Findings::default();
        f.set("core_tops", 0.8, "a run");
        f.set("sync_gbps", 0.0, "a flat sync");
        f.keep("task_us", "no figure");
        assert_eq!(f.params_so_far().core_tops, 0.8);
        assert_eq!(f.params_so_far().sync_gbps, Params::default().sync_gbps);
        assert!(f
            .kept
            .iter()
            .any(|k| k.0 == "sync_gbps" && k.1.contains("out of range")));
        f.set("task_us", 3.0, "later");
        assert!(f.kept.iter().all(|k| k.0 != "task_us"));
        assert_eq!(f.measured.len(), 2);
    }
}
