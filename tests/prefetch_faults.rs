//! Faults where prefetch works, through the C ABI:
//! - a device fault (allocation, full domain, cache flush) in a prefetch thread's job: the call
//!   that follows inflates the expert itself and is exact; a fault that persists gives the call
//!   the documented code with `dst` old-or-final;
//! - a job whose inflate fails (a NaN weight scale): the call gets `INVALID_ARGUMENT` for it, as
//!   without prefetch, and a call that does not use that expert is exact;
//! - faults on the board's path (the stand-in runtime, slow runs) while a dense call's threads
//!   take prefetch jobs as they wait: the exact result or the documented code, and the runtime
//!   holds nothing once the context is gone.
//!
//! Never a hang (each case ends, or the test's harness times it out), and the emulator's domain
//! accounting is back to zero once the context is freed.
mod mmid;
mod standin;

use mmid::*;
use ork_moe::ffi::*;
use ork_moe::moe::{Config, Dispatch, Engine};
use ork_moe::npu::emu::{self, FaultPlan, Monitor};
use ork_moe::npu::{rknn, BackendChoice, Device, DeviceConfig};
use ork_moe::quant::GgmlType;
use ork_moe::testutil::Rng;
use standin::{Sdk, Standin};
use std::time::{Duration, Instant};

const PREFETCH_THREADS: usize = 2;

/// A context on a fresh emulator with `faults`, prefetch threads and no cache (every expert a
/// call does not find staged it inflates itself), and the emulator's monitor.
fn prefetching(faults: &str) -> (*mut ork_ctx, Monitor) {
    let (device, monitor) = Device::emu_monitored(emu::Config {
        faults: FaultPlan::parse(faults).unwrap(),
        ..emu::Config::default()
    });
    let config = Config {
        min_rows: 0,
        cache_bytes: 0,
        prefetch_threads: Some(PREFETCH_THREADS),
        dispatch: Dispatch::Always,
        ..Config::default()
    };
    let engine = Engine::with_device(config, device).expect("engine");
    (ork_ctx_from_engine(engine), monitor)
}

fn announce(ctx: *mut ork_ctx, d: &Descs) -> ork_result {
    let null = std::ptr::null();
    ork_prefetch(ctx, &d.w.c(), null, &d.b.c(), &d.ids.c(), &d.dst.c(), null)
}

/// Waits until `done` holds (the prefetch threads run on their own); a minute fails the test.
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed().as_secs() < 60, "never: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Until the prefetch threads are idle with nothing queued.
fn wait_prefetch_idle(ctx: *mut ork_ctx) {
    let engine = ork_ctx_engine(ctx).unwrap();
    wait_until("prefetch idle", || {
        let s = engine.prefetch_stats();
        s.queued == 0 && s.waiting == PREFETCH_THREADS as u64
    });
}

#[test]
fn a_device_fault_in_a_prefetch_job_leaves_the_call_exact() {
    let mut c = Owned::contiguous(GgmlType::Q4_0, [256, 64, 8, 2, 16, 1], &mut Rng::new(1));
    let want = expected(&c.d, &c.memory());
    for (faults, persists) in [
        ("alloc:1", false),
        ("alloc:3", false),
        ("domain_full:2", false),
        ("sync_to_device:1", false),
        ("sync_to_device:4", false),
        ("alloc:2+", true),
        ("sync_to_device:1+", true),
    ] {
        let (ctx, monitor) = prefetching(faults);
        assert_eq!(announce(ctx, &c.d), ORK_OK, "{faults}: {}", last_error());
        // Nothing but the prefetch threads uses the device yet: the fault is theirs.
        wait_until(faults, || monitor.ops().injected >= 1);
        c.dst.bytes_mut().fill(SENTINEL);
        let rc = call(ctx, &c.d);
        let msg = last_error();
        if persists {
            let code = [ORK_DEVICE_ERROR, ORK_OUT_OF_MEMORY];
            assert!(code.contains(&rc), "{faults}: {rc} {msg}");
            check_old_or_final(&c.dst, c.d.dst.addr, &want).unwrap();
        } else {
            assert_eq!(rc, ORK_OK, "{faults}: {msg}");
            check_dst(&c.dst, c.d.dst.addr, &want).unwrap_or_else(|e| panic!("{faults}: {e}"));
            assert_eq!(monitor.ops().injected, 1, "{faults}");
        }
        assert_eq!(ork_prefetch_fence(ctx), ORK_OK);
        ork_ctx_free(ctx);
        assert_eq!(
            monitor.domain_used(),
            [0; 8],
            "{faults}: device memory leaked"
        );
    }
}

#[test]
fn a_prefetch_job_whose_inflate_fails_leaves_the_call_its_error() {
    let ty = GgmlType::Q4_0;
    let mut c = Owned::contiguous(ty, [256, 64, 8, 2, 16, 1], &mut Rng::new(2));
    // Expert 3's first block has a NaN scale, and token 0 routes to it.
    let expert_bytes = ty.row_bytes(256).unwrap() * 64;
    c.w.bytes_mut()[3 * expert_bytes..3 * expert_bytes + 2].copy_from_slice(&[0x00, 0x7e]);
    let slot1 = c.d.ids.addr - c.ids.addr() + 4;
    c.ids.put_i32(slot1, 3);
    let want = expected(&c.d, &c.memory());
    assert!(want.iter().any(|e| e.bits.is_none()));
    let (ctx, monitor) = prefetching("");
    assert_eq!(announce(ctx, &c.d), ORK_OK, "{}", last_error());
    wait_prefetch_idle(ctx);
    let s = ork_ctx_engine(ctx).unwrap().prefetch_stats();
    assert_eq!(s.staged, 7, "every expert but the broken one: {s:?}");
    assert_eq!(call(ctx, &c.d), ORK_INVALID_ARGUMENT);
    assert!(
        last_error().contains("NaN or infinite scale"),
        "{}",
        last_error()
    );
    check_old_or_final(&c.dst, c.d.dst.addr, &want).unwrap();
    // Routed elsewhere, the same weights give an exact call.
    for t in 0..16 {
        for s in 0..2 {
            c.ids.put_i32(4 * (2 * t + s), [0, 5][s]);
        }
    }
    let want = expected(&c.d, &c.memory());
    c.dst.bytes_mut().fill(SENTINEL);
    assert_eq!(call(ctx, &c.d), ORK_OK, "{}", last_error());
    check_dst(&c.dst, c.d.dst.addr, &want).unwrap();
    assert_eq!(ork_prefetch_fence(ctx), ORK_OK);
    ork_ctx_free(ctx);
    assert_eq!(monitor.domain_used(), [0; 8]);
}

/// A context on the stand-in runtime at `lib` (the board's path: submitter threads, one per
/// core) with one prefetch thread.
fn on_runtime(lib: &str) -> *mut ork_ctx {
    let config = Config {
        device: DeviceConfig {
            backend: BackendChoice::Rknn,
            rknn: rknn::Config {
                lib: Some(lib.into()),
                ..rknn::Config::default()
            },
            ..DeviceConfig::default()
        },
        min_rows: 0,
        cache_bytes: 0,
        prefetch_threads: Some(1),
        dispatch: Dispatch::Always,
        ..Config::default()
    };
    ork_ctx_from_engine(Engine::new(config).expect("the stand-in opens"))
}

#[test]
fn faults_while_a_dense_calls_threads_help_the_prefetch() {
    // Announced: some 300 distinct experts of 512 (64 tokens, 8 each), more than the prefetch
    // thread inflates before the dense call's threads first wait for a run. A handful would race:
    // a fast prefetch thread takes them all while the call still prepares.
    let later = Owned::contiguous(GgmlType::Q4_0, [256, 256, 512, 8, 64, 1], &mut Rng::new(3));
    let mut dense = Owned::contiguous(GgmlType::Q4_0, [512, 256, 1, 1, 40, 1], &mut Rng::new(4));
    let want = expected(&dense.d, &dense.memory());
    let [a, b, d] = dense.d.as_dense().map(|t| t.c());
    let mut absorbed = 0;
    for kind in ["alloc", "sync"] {
        for nth in [1, 2, 3, 5, 8, 13, 21, 34] {
            let spec = format!("run_us=50000,fail={kind}:{nth}");
            let s = Standin::new(Sdk::V2_3, &spec);
            let ctx = on_runtime(&s.path);
            assert_eq!(announce(ctx, &later.d), ORK_OK, "{spec}: {}", last_error());
            dense.dst.bytes_mut().fill(SENTINEL);
            let rc = ork_mul_mat(ctx, &a, &b, &d);
            let msg = last_error();
            match rc {
                ORK_OK => {
                    check_dst(&dense.dst, dense.d.dst.addr, &want)
                        .unwrap_or_else(|e| panic!("{spec}: {e}"));
                    let helped = ork_ctx_engine(ctx).unwrap().prefetch_stats().helped;
                    assert!(helped > 0, "{spec}: the waiting threads took no job");
                    absorbed += (s.counters().faults_injected == 1) as usize;
                }
                ORK_DEVICE_ERROR | ORK_OUT_OF_MEMORY => {
                    check_old_or_final(&dense.dst, dense.d.dst.addr, &want)
                        .unwrap_or_else(|e| panic!("{spec}: {e}"));
                }
                _ => panic!("{spec}: {rc} {msg}"),
            }
            // The fault was one-off: the next dense call is exact.
            dense.dst.bytes_mut().fill(SENTINEL);
            assert_eq!(
                ork_mul_mat(ctx, &a, &b, &d),
                ORK_OK,
                "{spec}: {}",
                last_error()
            );
            check_dst(&dense.dst, dense.d.dst.addr, &want).unwrap();
            assert_eq!(ork_prefetch_fence(ctx), ORK_OK);
            ork_ctx_free(ctx);
            let n = s.counters();
            let live = (n.live_buffers, n.live_views, n.live_contexts, n.violations);
            assert_eq!(live, (0, 0, 0, 0), "{spec}: {n:?}");
        }
    }
    // Some faults hit prefetch work (a helping thread's or the prefetch thread's), which the
    // dense call never saw.
    assert!(absorbed > 0, "no fault was absorbed by prefetch work");
}
