//! `ORK_DISPATCH` through the C ABI: the verdicts that follow from the times `ork_observe`
//! reports for ggml's path, the same answer on every thread of a cooperative call, and `never`;
//! the verdicts a context remembers for the next one (`ORK_DISPATCH_CACHE`).
//! The library's own times are real, so ggml's reported times sit far on either side of them.

mod mmid;

use mmid::*;
use ork_moe::ffi::*;
use ork_moe::moe::dispatch::memory::parse;
use ork_moe::moe::dispatch::OpClass;
use ork_moe::moe::{Config, Dispatch, Engine};
use ork_moe::npu::emu::{self, FaultPlan};
use ork_moe::npu::Device;
use ork_moe::quant::GgmlType;
use ork_moe::testutil::Rng;
use std::ffi::{c_char, c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, Once};

/// K, N, experts, slots, tokens, activation rows per token.
const SHAPE: [usize; 6] = [64, 32, 4, 2, 24, 1];
/// ggml's reported times: slower than any run of the library here, and instantaneous.
const SLOW: f64 = 1000.0;
const INSTANT: f64 = 0.0;

fn context_with(dispatch: u32) -> *mut ork_ctx {
    context_slowed(dispatch, 0)
}

fn context_slowed(dispatch: u32, emu_slow_us: u32) -> *mut ork_ctx {
    context_full(dispatch, emu_slow_us, 0)
}

fn context_full(dispatch: u32, emu_slow_us: u32, min_rows: u32) -> *mut ork_ctx {
    // These contexts start undecided: no verdict of another test or run is read.
    static NO_CACHE: Once = Once::new();
    NO_CACHE.call_once(|| std::env::set_var("ORK_DISPATCH_CACHE", "off"));
    // SAFETY: all zeroes is an ork_config (integers, floats and NULL strings).
    let mut cfg: ork_config = unsafe { std::mem::zeroed() };
    cfg.struct_size = size_of::<ork_config>() as u32;
    ork_config_default(&mut cfg);
    cfg.backend = ORK_BACKEND_EMU;
    cfg.min_rows = min_rows;
    cfg.cache_verify = ORK_CACHE_VERIFY_FULL;
    cfg.mt_mode = ORK_MT_COOP;
    cfg.dispatch = dispatch;
    cfg.emu_slow_us = emu_slow_us;
    let ctx = ork_ctx_new(&cfg);
    assert!(!ctx.is_null(), "ork_ctx_new: {}", last_error());
    ctx
}

fn observe(ctx: *mut ork_ctx, d: &Descs, seconds: f64) -> ork_result {
    let null = std::ptr::null();
    let (w, b, ids, dst) = (d.w.c(), d.b.c(), d.ids.c(), d.dst.c());
    ork_observe(ctx, &w, null, &b, &ids, &dst, null, seconds)
}

/// `calls` calls of one case, each on `nth` threads (0: the single-caller entry); after each
/// declined one, ggml's time `ggml` is reported. Every call's code, the same on every thread.
fn run(ctx: *mut ork_ctx, c: &mut Owned, nth: usize, ggml: f64, calls: usize) -> Vec<ork_result> {
    let want = expected(&c.d, &c.memory());
    (0..calls)
        .map(|i| {
            c.dst.bytes_mut().fill(SENTINEL);
            let rc = if nth == 0 {
                call(ctx, &c.d)
            } else {
                let all = call_mt(ctx, &c.d, nth);
                assert!(
                    all.iter().all(|(rc, _)| *rc == all[0].0),
                    "call {i}: {all:?}"
                );
                all[0].0
            };
            match rc {
                ORK_OK => check_dst(&c.dst, c.d.dst.addr, &want)
                    .unwrap_or_else(|e| panic!("call {i}: {e}")),
                ORK_NOT_HANDLED => {
                    assert!(
                        c.dst.bytes().iter().all(|&x| x == SENTINEL),
                        "call {i} wrote dst"
                    );
                    assert_eq!(observe(ctx, &c.d, ggml), ORK_OK, "{}", last_error());
                }
                rc => panic!("call {i}: {rc}: {}", last_error()),
            }
            rc
        })
        .collect()
}

fn case() -> Owned {
    Owned::contiguous(GgmlType::Q4_0, SHAPE, &mut Rng::new(27))
}

/// ggml's path is tried twice, then the library's: two warm-up calls and two that give times; the
/// class is decided.
const WARM_UP: [ork_result; 6] = [
    ORK_NOT_HANDLED,
    ORK_NOT_HANDLED,
    ORK_OK,
    ORK_OK,
    ORK_OK,
    ORK_OK,
];

#[test]
fn under_auto_only_decode_sized_calls_are_declined_from_metadata() {
    // 4 experts, 2 slots: `tokens / 2` rows per expert, rounded up; min_rows 8.
    let shape = |tokens| [64, 32, 4, 2, tokens, 1];
    let ctx = context_full(ORK_DISPATCH_AUTO, 0, 8);
    // Fewer than 8 tokens, or 1 row per expert: declined by the check, before any measuring.
    for tokens in [1, 2, 7] {
        let c = Owned::contiguous(GgmlType::Q4_0, shape(tokens), &mut Rng::new(5));
        assert_eq!(check(ctx, &c.d), ORK_NOT_HANDLED, "{tokens} tokens");
        assert!(
            last_error().contains("a decode-sized call"),
            "{}",
            last_error()
        );
        assert_eq!(call(ctx, &c.d), ORK_NOT_HANDLED, "{tokens} tokens");
    }
    // 8 tokens are 4 rows per expert, below min_rows: `always` declines them, `auto` measures
    // them as any class (ggml's path twice, then the library's).
    let mut c = Owned::contiguous(GgmlType::Q4_0, shape(8), &mut Rng::new(5));
    assert_eq!(check(ctx, &c.d), ORK_OK, "{}", last_error());
    let codes = run(ctx, &mut c, 0, SLOW, 10);
    assert_eq!(codes[..WARM_UP.len()], WARM_UP);
    assert!(
        codes.iter().skip(WARM_UP.len()).all(|&rc| rc == ORK_OK),
        "{codes:?}"
    );
    ork_ctx_free(ctx);
    let ctx = context_full(ORK_DISPATCH_ALWAYS, 0, 8);
    assert_eq!(check(ctx, &c.d), ORK_NOT_HANDLED);
    assert!(
        last_error().contains("below min_rows 8"),
        "{}",
        last_error()
    );
    ork_ctx_free(ctx);
}

#[test]
fn auto_takes_a_class_where_ggml_is_slower_and_declines_it_where_ggml_is_faster() {
    for nth in [0, 3] {
        let ctx = context_with(ORK_DISPATCH_AUTO);
        let mut c = case();
        let codes = run(ctx, &mut c, nth, SLOW, 40);
        assert_eq!(codes[..WARM_UP.len()], WARM_UP, "nth {nth}");
        assert!(
            codes[WARM_UP.len()..].iter().all(|&rc| rc == ORK_OK),
            "nth {nth}: {codes:?}"
        );
        ork_ctx_free(ctx);

        // Declined once decided, but for the library's path explored within the budget: a
        // share of the class's measured time, which its warm-up calls dominate (the longer,
        // the busier the machine), so the explorations right after the verdict number from none
        // to many. They stop, and the class stays declined.
        let ctx = context_with(ORK_DISPATCH_AUTO);
        let mut c = case();
        let mut codes = run(ctx, &mut c, nth, INSTANT, 40);
        let settled = [ORK_NOT_HANDLED; 10];
        while !codes.ends_with(&settled) && codes.len() < 4000 {
            codes.extend(run(ctx, &mut c, nth, INSTANT, 10));
        }
        assert_eq!(codes[..WARM_UP.len()], WARM_UP, "nth {nth}");
        let after = &codes[WARM_UP.len()..];
        let explored = after.iter().take_while(|&&rc| rc == ORK_OK).count();
        assert!(
            after[explored..].iter().all(|&rc| rc == ORK_NOT_HANDLED)
                && explored + 10 <= after.len(),
            "nth {nth}: {codes:?}"
        );
        let mut s = ork_stats::default();
        assert_eq!(ork_ctx_stats(ctx, &mut s), ORK_OK);
        let (calls, handled) = (codes.len() as u64, 4 + explored as u64);
        assert_eq!(
            (s.calls, s.handled, s.declined),
            (calls, handled, calls - handled),
            "nth {nth}"
        );
        ork_ctx_free(ctx);
    }
}

#[test]
fn never_declines_everything_and_always_ignores_the_times() {
    let ctx = context_with(ORK_DISPATCH_NEVER);
    let mut c = case();
    assert!(run(ctx, &mut c, 0, INSTANT, 3)
        .iter()
        .all(|&rc| rc == ORK_NOT_HANDLED));
    assert!(last_error().contains("ORK_DISPATCH"), "{}", last_error());
    assert!(run(ctx, &mut c, 2, INSTANT, 3)
        .iter()
        .all(|&rc| rc == ORK_NOT_HANDLED));
    ork_ctx_free(ctx);

    let ctx = context_with(ORK_DISPATCH_ALWAYS);
    for _ in 0..5 {
        assert_eq!(observe(ctx, &c.d, INSTANT), ORK_OK);
    }
    assert!(run(ctx, &mut c, 0, INSTANT, 5)
        .iter()
        .all(|&rc| rc == ORK_OK));
    ork_ctx_free(ctx);
}

#[test]
fn observe_rejects_what_is_no_time_and_no_call() {
    let ctx = context_with(ORK_DISPATCH_AUTO);
    let c = case();
    for bad in [-1.0, f64::NAN, f64::INFINITY] {
        assert_eq!(observe(ctx, &c.d, bad), ORK_INVALID_ARGUMENT, "{bad}");
        assert!(last_error().contains("seconds"), "{}", last_error());
    }
    assert_eq!(
        observe(std::ptr::null_mut(), &c.d, 1.0),
        ORK_INVALID_ARGUMENT
    );
    let mut d = c.d;
    d.w.ty = 9999;
    assert_ne!(observe(ctx, &d, 1.0), ORK_OK);
    ork_ctx_free(ctx);
}

#[test]
fn an_emulator_made_slower_for_real_is_declined_where_ggml_is_faster() {
    // Every submit sleeps 20 ms: a call takes at least that; ggml reports 5 ms.
    let ctx = context_slowed(ORK_DISPATCH_ALWAYS, 20_000);
    let mut c = case();
    let start = std::time::Instant::now();
    assert_eq!(run(ctx, &mut c, 0, INSTANT, 1), [ORK_OK]);
    assert!(start.elapsed() >= std::time::Duration::from_millis(20));
    ork_ctx_free(ctx);

    let ctx = context_slowed(ORK_DISPATCH_AUTO, 20_000);
    let codes = run(ctx, &mut c, 2, 0.005, 12);
    assert_eq!(codes[..WARM_UP.len()], WARM_UP);
    assert!(
        codes[WARM_UP.len()..]
            .iter()
            .all(|&rc| rc == ORK_NOT_HANDLED),
        "{codes:?}"
    );
    ork_ctx_free(ctx);
}

/// Device faults while `auto` decides a class (ggml's path explored, the library's first timed
/// calls) and after: every call gives the exact result, or declines with `dst` untouched, or
/// fails with the documented device code and `dst` old or final, on every thread alike; a failed
/// call is not taken as a time; the emulator holds no device memory once the context is freed.
#[test]
fn device_faults_while_auto_explores_give_the_exact_result_or_the_documented_code() {
    for faults in [
        "alloc:1",
        "run:1",
        "sync_from_device:2",
        "run:3+",
        "alloc:1+",
    ] {
        let (device, monitor) = Device::emu_monitored(emu::Config {
            faults: FaultPlan::parse(faults).unwrap(),
            ..emu::Config::default()
        });
        let config = Config {
            min_rows: 0,
            cache_bytes: 0,
            dispatch: Dispatch::Auto,
            ..Config::default()
        };
        let ctx = ork_ctx_from_engine(Engine::with_device(config, device).expect("engine"));
        let mut c = case();
        let want = expected(&c.d, &c.memory());
        let (mut exact, mut failed) = (0, 0);
        for i in 0..16 {
            c.dst.bytes_mut().fill(SENTINEL);
            let all = call_mt(ctx, &c.d, 1 + i % 2);
            let rc = all[0].0;
            assert!(
                all.iter().all(|(r, _)| *r == rc),
                "{faults}: call {i}: {all:?}"
            );
            match rc {
                ORK_OK => {
                    check_dst(&c.dst, c.d.dst.addr, &want)
                        .unwrap_or_else(|e| panic!("{faults}: call {i}: {e}"));
                    exact += 1;
                }
                ORK_NOT_HANDLED => {
                    assert!(
                        c.dst.bytes().iter().all(|&x| x == SENTINEL),
                        "{faults}: call {i}"
                    );
                    assert_eq!(observe(ctx, &c.d, SLOW), ORK_OK, "{}", last_error());
                }
                ORK_DEVICE_ERROR | ORK_OUT_OF_MEMORY => {
                    check_old_or_final(&c.dst, c.d.dst.addr, &want)
                        .unwrap_or_else(|e| panic!("{faults}: call {i}: {e}"));
                    failed += 1;
                }
                rc => panic!("{faults}: call {i}: {rc}: {}", last_error()),
            }
        }
        assert!(
            monitor.ops().injected >= 1,
            "{faults}: no fault was injected"
        );
        assert!(failed >= 1, "{faults}: no call saw its fault");
        if !faults.ends_with('+') {
            // ggml reported as slower: once the fault is past, the class is the library's.
            assert!(exact >= 8, "{faults}: {exact} exact calls");
        }
        ork_ctx_free(ctx);
        assert_eq!(
            monitor.domain_used(),
            [0; 8],
            "{faults}: device memory leaked"
        );
    }
}

/// A context on the emulator under `auto` configured from `vars` as from the environment, with
/// `XDG_CACHE_HOME` at `cache`.
fn context_in(cache: &Path, vars: &[(&str, &str)]) -> *mut ork_ctx {
    let xdg = cache.to_str().unwrap();
    let mut all = vec![
        ("XDG_CACHE_HOME", xdg),
        ("ORK_BACKEND", "emu"),
        ("ORK_MIN_ROWS", "0"),
        ("ORK_CACHE_VERIFY", "full"),
        ("ORK_DISPATCH", "auto"),
    ];
    all.extend_from_slice(vars);
    let config = ork_moe::config::from_lookup(|name| {
        all.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.to_string())
    })
    .unwrap();
    ork_ctx_from_engine(Engine::new(config).expect("engine"))
}

/// An empty folder of its own.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ork-dispatch-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Where a context with `XDG_CACHE_HOME` at `cache` remembers its verdicts.
fn cache_file(cache: &Path) -> PathBuf {
    cache.join("ork-moe/dispatch")
}

#[test]
fn a_second_context_starts_from_the_verdicts_the_first_remembered() {
    let dir = scratch("second");
    for (ggml, verdict) in [(SLOW, ORK_OK), (INSTANT, ORK_NOT_HANDLED)] {
        let _ = std::fs::remove_file(cache_file(&dir));
        let ctx = context_in(&dir, &[]);
        let mut c = case();
        let codes = run(ctx, &mut c, 0, ggml, 8);
        assert_eq!(codes[..WARM_UP.len()], WARM_UP);
        // Saved as soon as the class is decided, not only when the context ends.
        let text = std::fs::read_to_string(cache_file(&dir)).expect("saved");
        assert!(text.starts_with("ork-moe dispatch verdicts 1\n"), "{text}");
        ork_ctx_free(ctx);

        let ctx = context_in(&dir, &[]);
        let codes = run(ctx, &mut c, 3, ggml, 40);
        assert!(codes.iter().all(|&rc| rc == verdict), "{codes:?}");
        ork_ctx_free(ctx);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn off_remembers_nothing() {
    let dir = scratch("off");
    for _ in 0..2 {
        let ctx = context_in(&dir, &[("ORK_DISPATCH_CACHE", "off")]);
        let codes = run(ctx, &mut case(), 0, SLOW, 8);
        assert_eq!(codes[..WARM_UP.len()], WARM_UP);
        ork_ctx_free(ctx);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A cache file's key and the path of each class.
fn verdicts_of(text: &str) -> (String, Vec<(OpClass, &'static str)>) {
    let (key, read) = parse(text).expect("a valid cache file");
    (key, read.iter().map(|(c, r)| (*c, r.path.name())).collect())
}

fn verdicts(file: &Path) -> (String, Vec<(OpClass, &'static str)>) {
    verdicts_of(&std::fs::read_to_string(file).unwrap())
}

static WARNINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Keeps the warnings.
unsafe extern "C" fn keep_warnings(_user: *mut c_void, level: u32, message: *const c_char) {
    // SAFETY: a line the library passes, valid during the call.
    let line = unsafe { CStr::from_ptr(message) }.to_string_lossy();
    if level == ORK_LOG_WARN {
        WARNINGS.lock().unwrap().push(line.into_owned());
    }
}

#[test]
fn a_file_for_another_key_or_damaged_is_not_used_and_is_replaced() {
    log_install(::log::LevelFilter::Warn);
    ork_set_log_callback(Some(keep_warnings), std::ptr::null_mut());
    let dir = scratch("damaged");
    let file = cache_file(&dir);
    let ctx = context_in(&dir, &[]);
    run(ctx, &mut case(), 0, SLOW, 8);
    ork_ctx_free(ctx);
    let good = std::fs::read_to_string(&file).unwrap();
    let other_version = good.replace(" library=", " library=0.0.0-");
    assert_ne!(other_version, good);
    let damaged = [
        good[..good.len() - 3].to_owned(),
        good.replace("class routed", "class routed "),
        "\u{0}\u{ff}garbage".to_owned(),
    ];
    for (i, text) in std::iter::once(&other_version).chain(&damaged).enumerate() {
        std::fs::write(&file, text).unwrap();
        let ctx = context_in(&dir, &[]);
        let codes = run(ctx, &mut case(), 0, SLOW, 8);
        assert_eq!(codes[..WARM_UP.len()], WARM_UP, "{text:?}");
        ork_ctx_free(ctx);
        let warned = WARNINGS
            .lock()
            .unwrap()
            .iter()
            .filter(|w| w.contains(&format!("ignoring the cache file {}", file.display())))
            .count();
        assert_eq!(
            warned, i,
            "one warning per damaged file, none for another key"
        );
        // Replaced by this context's verdicts (its own times, so compared without them).
        assert_eq!(verdicts(&file), verdicts_of(&good));
    }
    ork_set_log_callback(None, std::ptr::null_mut());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Set in the child process of [`verdicts_are_printed_at_exit_with_ork_moe_stats`]: the folder
/// of its cache.
const CHILD: &str = "ORK_DISPATCH_TEST_CHILD";

/// The child's part: decides a class on a context it never frees, then exits.
#[test]
fn child_leaves_a_decided_context_to_the_exit() {
    let Some(dir) = std::env::var_os(CHILD) else {
        return;
    };
    let ctx = context_in(Path::new(&dir), &[("ORK_MOE_STATS", "1")]);
    assert_eq!(run(ctx, &mut case(), 0, SLOW, 8)[..WARM_UP.len()], WARM_UP);
}

#[test]
fn verdicts_are_printed_at_exit_with_ork_moe_stats() {
    let dir = scratch("exit");
    // Under an emulator (.ci/aarch64-test.sh) the child runs under the same one.
    let runner = std::env::var("ORK_TEST_RUNNER").unwrap_or_default();
    let mut words = runner.split_whitespace();
    let exe = std::env::current_exe().unwrap();
    let mut child = match words.next() {
        Some(program) => {
            let mut c = std::process::Command::new(program);
            c.args(words).arg(&exe);
            c
        }
        None => std::process::Command::new(&exe),
    };
    let out = child
        .args(["--exact", "child_leaves_a_decided_context_to_the_exit"])
        .env(CHILD, &dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let printed: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("ork-moe dispatch: "))
        .collect();
    assert_eq!(printed.len(), 1, "{stderr}");
    assert!(
        printed[0].starts_with(
            "ork-moe dispatch: routed type 2 K=64 N=32 rows/expert 8..15: library (library "
        ),
        "{stderr}"
    );
    assert!(
        printed[0].contains(" samples, ggml 20833333.333 µs/row of 2)"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
