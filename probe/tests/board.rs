//! `ork-probe board --quick` end to end, on the emulator and on the stand-in runtime
//! (tests/standin), and its profile loaded back: by the library's configuration
//! (`ORK_EMU_PROFILE`) into the emulator's cost model, and by `ork-probe model --profile`, each
//! giving the figures the same parameters give when set directly.

#[path = "../../tests/npu_util/mod.rs"]
mod npu_util;
#[path = "../../tests/standin/mod.rs"]
mod standin;

use npu_util::{slow_target, Case};
use ork_moe::npu::{flags, Device};
use ork_probe::timeline::params::index;
use ork_probe::timeline::{profile, Origin, SPECS};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The probe binary, through the target's runner when cargo has one (qemu for aarch64: a test
/// process under qemu-user cannot exec a foreign binary by itself).
fn probe() -> Command {
    let runner = std::env::vars()
        .find(|(k, _)| k.starts_with("CARGO_TARGET_") && k.ends_with("_RUNNER"))
        .map(|(_, v)| v);
    let exe = env!("CARGO_BIN_EXE_ork-probe");
    let mut cmd = match runner.as_deref().map(str::split_whitespace) {
        Some(mut words) => {
            let mut c = Command::new(words.next().expect("a runner command"));
            c.args(words).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    // The checks choose their backend explicitly; nothing of the caller's environment leaks in.
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("ORK_") || k == "RKNN_STANDIN") {
        cmd.env_remove(k);
    }
    cmd
}

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("board-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `ork-probe board --quick --json --profile DIR/profile.json` with `env`; its output, the
/// profile's text and the profile parsed.
fn board(dir: &Path, env: &[(&str, &str)]) -> (Output, String, Value) {
    let profile = dir.join("profile.json");
    let out = probe()
        .args(["board", "--quick", "--json", "--profile"])
        .arg(&profile)
        .envs(env.iter().copied())
        .output()
        .expect("run ork-probe");
    let text = std::fs::read_to_string(&profile).unwrap_or_else(|e| {
        panic!(
            "no profile ({e}); stderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let parsed: Value = serde_json::from_str(&text).expect("the profile is JSON");
    let printed: Value = serde_json::from_slice(&out.stdout).expect("--json prints JSON");
    assert_eq!(printed, parsed, "--json prints the profile");
    (out, text, parsed)
}

fn num(v: &Value, key: &str) -> f64 {
    v.get(key)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{key} is a number"))
}

fn names(v: &Value, key: &str) -> Vec<String> {
    match v.get(key) {
        Some(Value::Array(items)) => items
            .iter()
            .map(|x| x.as_str().expect("a name").to_string())
            .collect(),
        _ => panic!("{key} is a list"),
    }
}

fn rows<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    match v.get(key) {
        Some(Value::Array(items)) => items,
        _ => panic!("{key} is a list"),
    }
}

/// What every profile holds, and what the model needs to load it.
fn check_profile(v: &Value, text: &str, backend: &str) {
    assert_eq!(v.get("backend").and_then(Value::as_str), Some(backend));
    assert!(v.get("runtime_version").and_then(Value::as_str).is_some());
    for key in [
        "cores",
        "run_us_floor",
        "context_create_us",
        "core_tops",
        "dram_gbps",
        "inflate_gbps_big_core",
    ] {
        assert!(num(v, key) > 0.0, "{key}");
    }
    let measured = names(v, "measured");
    for key in [
        "run_us_floor",
        "core_tops",
        "dram_gbps",
        "inflate_gbps_big_core",
        "memcpy_gbps_big_core",
    ] {
        assert!(measured.iter().any(|m| m == key), "{key} measured");
    }
    // Every parameter is either measured or kept, with the reason.
    let Some(Value::Object(kept)) = v.get("not_measured") else {
        panic!("not_measured is an object");
    };
    for s in SPECS {
        let is_kept = kept.contains_key(s.name);
        assert!(
            measured.iter().any(|m| m == s.name) != is_kept,
            "{} is measured or kept",
            s.name
        );
    }
    let shapes = rows(v, "shapes");
    for (role, k) in [
        ("gate/up", 2048.0),
        ("down", 768.0),
        ("gate+up pair", 2048.0),
    ] {
        assert!(
            shapes
                .iter()
                .any(|r| r.get("role").and_then(Value::as_str) == Some(role) && num(r, "k") == k),
            "{role} row"
        );
    }
    // The quantities that decide the modelled prefill.
    let together = v
        .get("dram_gbps_cpu_npu_concurrent")
        .expect("dram_gbps_cpu_npu_concurrent");
    assert!(num(together, "npu") > 0.0 && num(together, "cpu") >= 0.0);
    assert!((num(together, "total") - num(together, "cpu") - num(together, "npu")).abs() < 1e-9);
    let runs = rows(v, "run_us_vs_m");
    for (m, k, n) in [(16.0, 2048.0, 768.0), (128.0, 768.0, 2048.0)] {
        assert!(
            runs.iter().any(|r| num(r, "m") == m
                && num(r, "k") == k
                && num(r, "n") == n
                && num(r, "cores") == 1.0
                && num(r, "us") > 0.0),
            "run_us_vs_m {m}x{k}x{n}"
        );
    }
    let syncs = rows(v, "sync_us_vs_bytes");
    assert!(syncs.len() >= 2);
    assert!(syncs
        .iter()
        .all(|r| num(r, "us") >= 0.0 && r.get("core_type").and_then(Value::as_str).is_some()));
    assert!(v.get("dmc_governor").and_then(Value::as_str).is_some());
    assert!(v.get("kernel_version").and_then(Value::as_str).is_some());
    assert!(v.get("rknpu_driver_version").is_some());
    assert_eq!(rows(v, "thermal").len(), 0, "no --sustained: no samples");
    let loaded = profile::read(text, "profile.json").expect("the model loads it");
    assert_eq!(loaded.params.dram_gbps, num(v, "dram_gbps"));
    // The run measurements replace the floor and the throughput: core_tops always (the time
    // grows with M), run_us_floor unless the line's intercept is below zero.
    let origin = |name: &str| &loaded.origins[index(name).unwrap()];
    assert!(
        matches!(origin("core_tops"), Origin::ProfileFit { .. }),
        "{:?} {:?}",
        origin("core_tops"),
        loaded.rejected_fits
    );
    match origin("run_us_floor") {
        Origin::ProfileFit { .. } => assert!(loaded.params.run_us_floor >= 0.0),
        _ => {
            let why = &loaded.rejected_fits.iter().find(|r| r.0 == "run_us_floor");
            assert!(why.expect("a reason").1.contains("negative"), "{why:?}");
            assert_eq!(loaded.params.run_us_floor, num(v, "run_us_floor"));
        }
    }
}

fn all_exact(v: &Value) -> bool {
    v.get("all_bit_exact")
        .and_then(Value::as_bool)
        .expect("all_bit_exact")
}

/// The modelled time of one submit on an emulator with `cfg`'s cost model.
fn modelled_submit_us(cfg: &ork_moe::moe::Config) -> f64 {
    let mut device = cfg.device.clone();
    device.backend = ork_moe::npu::BackendChoice::Emu;
    let dev = Device::open(&device).unwrap();
    let case = Case::random(64, 2048, 768, 5);
    let (a, b, mut c) = case.upload(&dev, flags::CPU_FILLED, 0);
    let report = dev.run_i8(case.matmul(&a, &b), &mut c).unwrap();
    report.modelled_us.expect("modelled")
}

/// `ork-probe model --json` of one small case with `args`: its one row.
fn model(args: &[String]) -> Vec<(String, Value)> {
    let out = probe()
        .args([
            "model",
            "--layers",
            "1",
            "--ubatches",
            "1",
            "--ubatch",
            "128",
        ])
        .args(["--types", "q4_0", "--cache-mb", "64", "--json"])
        .args(args)
        .output()
        .expect("run ork-probe model");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    match serde_json::from_slice(&out.stdout).unwrap() {
        Value::Array(mut rows) if rows.len() == 1 => match rows.remove(0) {
            Value::Object(fields) => fields.into_iter().collect(),
            _ => panic!("a row is an object"),
        },
        other => panic!("one row: {other:?}"),
    }
}

#[test]
fn on_the_emulator_its_profile_models_like_the_same_parameters_given_directly() {
    let dir = scratch("emu");
    let (out, text, v) = board(&dir, &[("ORK_BACKEND", "emu")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    check_profile(&v, &text, "emu");
    assert!(all_exact(&v));
    assert_eq!(
        v.get("runtime_version").and_then(Value::as_str),
        Some("emulator")
    );
    assert_eq!(num(&v, "cores"), 3.0);
    let figures = v.get("npu_figures").and_then(Value::as_str).unwrap();
    assert!(figures.starts_with("emulated"), "{figures}");
    // The emulator creates no matmul contexts: the model's value is kept, with the reason.
    assert!(!names(&v, "measured")
        .iter()
        .any(|m| m == "context_create_us"));

    // Through the library's configuration: ORK_EMU_PROFILE against the four ORK_EMU_* variables
    // set to the profile's values.
    let path = dir.join("profile.json");
    let vars: HashMap<String, String> =
        HashMap::from([("ORK_EMU_PROFILE".into(), path.display().to_string())]);
    let from_profile = ork_moe::config::from_lookup(|k| vars.get(k).cloned()).unwrap();
    let direct: HashMap<String, String> = [
        ("ORK_EMU_SUBMIT_US", "run_us_floor"),
        ("ORK_EMU_TASK_US", "task_us"),
        ("ORK_EMU_CORE_TOPS", "core_tops"),
        ("ORK_EMU_DRAM_GBPS", "dram_gbps"),
    ]
    .into_iter()
    .map(|(var, key)| (var.to_string(), num(&v, key).to_string()))
    .collect();
    let given = ork_moe::config::from_lookup(|k| direct.get(k).cloned()).unwrap();
    assert_eq!(from_profile.device.emu.cost, given.device.emu.cost);
    assert_eq!(
        from_profile.device.emu.cost.submit_us,
        num(&v, "run_us_floor")
    );
    assert_eq!(
        modelled_submit_us(&from_profile),
        modelled_submit_us(&given)
    );
    assert_ne!(
        modelled_submit_us(&from_profile),
        modelled_submit_us(&ork_moe::moe::Config::default()),
        "this machine's figures are not the model's defaults"
    );

    // Through `ork-probe model`: --profile against every parameter given with --param, the
    // fitted ones at their fits and the others at the profile's values.
    let profiled = model(&["--profile".into(), path.display().to_string()]);
    let loaded = profile::read(&text, "profile.json").unwrap();
    let params: Vec<String> = SPECS
        .iter()
        .zip(&loaded.origins)
        .flat_map(|(s, origin)| {
            let value = loaded.params.get(s.name).unwrap();
            if !matches!(origin, Origin::ProfileFit { .. }) {
                assert_eq!(value, num(&v, s.name), "{}", s.name);
            }
            ["--param".into(), format!("{}={value}", s.name)]
        })
        .collect();
    let given = model(&params);
    // The range varies what the profile kept from the model and never what was measured or
    // given on the command line, so it differs between the two: compared apart.
    let range = |k: &str| {
        k.starts_with("range_")
            || k == "sensitivity"
            || k.ends_with("_low")
            || k.ends_with("_mid")
            || k.ends_with("_high")
    };
    let modelled = |fields: &[(String, Value)]| -> Vec<(String, Value)> {
        fields
            .iter()
            .filter(|(k, _)| !k.starts_with("measured_") && k != "board_profile" && !range(k))
            .cloned()
            .collect()
    };
    let (a, b) = (modelled(&profiled), modelled(&given));
    assert!(a.iter().any(|(k, _)| k == "modelled_prefill_tokps"));
    assert_eq!(a, b);
    let varied = |fields: &[(String, Value)], name: &str| {
        let (_, sets) = fields
            .iter()
            .find(|(k, _)| k == "range_parameters")
            .unwrap();
        !sets[name].is_null()
    };
    // core_tops was measured, leftover_cpu_factor kept from the model.
    assert!(!varied(&profiled, "core_tops") && varied(&profiled, "leftover_cpu_factor"));
    assert!(!varied(&given, "core_tops") && !varied(&given, "leftover_cpu_factor"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn on_the_standin_runtime_it_measures_contexts_and_reports_the_runtime() {
    let lib = standin::build(standin::Sdk::V2_3);
    let dir = scratch("standin");
    let env = [("ORK_BACKEND", "rknn"), ("ORK_RKNN_LIB", lib)];
    let (out, text, v) = board(&dir, &env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    check_profile(&v, &text, "rknn");
    assert!(all_exact(&v));
    assert_eq!(
        v.get("runtime_version").and_then(Value::as_str),
        Some("2.3.2 (ork-moe stand-in)")
    );
    assert_eq!(num(&v, "cores"), 3.0);
    assert!(names(&v, "measured")
        .iter()
        .any(|m| m == "context_create_us"));
    let figures = v.get("npu_figures").and_then(Value::as_str).unwrap();
    assert!(figures.contains("stand-in"), "{figures}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_single_core_npu_is_found_and_a_wrong_result_fails_the_check() {
    // Under qemu (the aarch64 CI runs) every probe run takes ten times as long: these two
    // variants are left to the x86-64 run.
    if slow_target() {
        eprintln!("skipped on a slow target: the x86-64 run covers it");
        return;
    }
    let lib = standin::build(standin::Sdk::V2_3);
    let dir = scratch("one-core");
    let env = [
        ("ORK_BACKEND", "rknn"),
        ("ORK_RKNN_LIB", lib),
        ("RKNN_STANDIN", "cores=1"),
    ];
    let (out, _, v) = board(&dir, &env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(num(&v, "cores"), 1.0);
    assert_eq!(rows(&v, "npu_cores").len(), 1);

    // The stand-in gets one output value of its 40th run wrong: a timed run, not a first one.
    let env = [
        ("ORK_BACKEND", "rknn"),
        ("ORK_RKNN_LIB", lib),
        ("RKNN_STANDIN", "fail=wrong:40"),
    ];
    let (out, _, v) = board(&dir, &env);
    assert_eq!(
        out.status.code(),
        Some(1),
        "exit status 1 on a wrong result"
    );
    assert!(!all_exact(&v));
    let wrong = rows(&v, "shapes")
        .iter()
        .filter(|r| r.get("bit_exact").and_then(Value::as_bool) == Some(false))
        .count();
    assert_eq!(wrong, 1);
    std::fs::remove_dir_all(&dir).unwrap();
}
