//! `ORK_DISPATCH` through the C ABI: the verdicts that follow from the times `ork_observe`
//! reports for ggml's path, the same answer on every thread of a cooperative call, and `never`.
//! The library's own times are real, so ggml's reported times sit far on either side of them.

mod mmid;

use mmid::*;
use ork_moe::ffi::*;
use ork_moe::moe::{Config, Dispatch, Engine};
use ork_moe::npu::emu::{self, FaultPlan};
use ork_moe::npu::Device;
use ork_moe::quant::GgmlType;
use ork_moe::testutil::Rng;

/// K, N, experts, slots, tokens, activation rows per token.
const SHAPE: [usize; 6] = [64, 32, 4, 2, 24, 1];
/// ggml's reported times: slower than any run of the library here, and instantaneous.
const SLOW: f64 = 1000.0;
const INSTANT: f64 = 0.0;

fn context_with(dispatch: u32) -> *mut ork_ctx {
    context_slowed(dispatch, 0)
}

fn context_slowed(dispatch: u32, emu_slow_us: u32) -> *mut ork_ctx {
    // SAFETY: all zeroes is an ork_config (integers, floats and NULL strings).
    let mut cfg: ork_config = unsafe { std::mem::zeroed() };
    cfg.struct_size = size_of::<ork_config>() as u32;
    ork_config_default(&mut cfg);
    cfg.backend = ORK_BACKEND_EMU;
    cfg.min_rows = 0;
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

/// ggml's path is tried twice, then the library's until it has two times: the class is decided.
const WARM_UP: [ork_result; 4] = [ORK_NOT_HANDLED, ORK_NOT_HANDLED, ORK_OK, ORK_OK];

#[test]
fn auto_takes_a_class_where_ggml_is_slower_and_declines_it_where_ggml_is_faster() {
    for nth in [0, 3] {
        let ctx = context_with(ORK_DISPATCH_AUTO);
        let mut c = case();
        let codes = run(ctx, &mut c, nth, SLOW, 40);
        assert_eq!(codes[..4], WARM_UP, "nth {nth}");
        assert!(
            codes[4..].iter().all(|&rc| rc == ORK_OK),
            "nth {nth}: {codes:?}"
        );
        ork_ctx_free(ctx);

        let ctx = context_with(ORK_DISPATCH_AUTO);
        let mut c = case();
        let codes = run(ctx, &mut c, nth, INSTANT, 40);
        assert_eq!(codes[..4], WARM_UP, "nth {nth}");
        assert!(
            codes[4..].iter().all(|&rc| rc == ORK_NOT_HANDLED),
            "nth {nth}: {codes:?}"
        );
        let mut s = ork_stats::default();
        assert_eq!(ork_ctx_stats(ctx, &mut s), ORK_OK);
        assert_eq!((s.calls, s.handled, s.declined), (40, 2, 38), "nth {nth}");
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
    assert_eq!(codes[..4], WARM_UP);
    assert!(
        codes[4..].iter().all(|&rc| rc == ORK_NOT_HANDLED),
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
