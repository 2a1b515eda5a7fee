//! The log callback (`ork_set_log_callback`) set, unset and replaced from inside itself and from
//! other threads while calls run on several contexts at once (prefetch threads announcing and
//! inflating, dense and pair calls, single and cooperative), at `ORK_LOG=debug`, where every
//! call writes a line: nothing hangs, every result is exact. Its own test binary, since the log
//! level and the callback are the process's; one of the tests `.ci/tsan.sh` runs under
//! ThreadSanitizer.
mod mmid;

use mmid::*;
use ork_moe::ffi::*;
use ork_moe::quant::GgmlType;
use ork_moe::testutil::Rng;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

const ROUNDS: usize = 4;

static LINES: AtomicUsize = AtomicUsize::new(0);

/// Counts the line, and checks it is one line of text.
unsafe extern "C" fn counting(_user: *mut c_void, level: u32, message: *const c_char) {
    // SAFETY: the library passes a NUL-terminated line, valid during the call.
    let line = unsafe { CStr::from_ptr(message) }.to_str().unwrap();
    assert!((ORK_LOG_ERROR..=ORK_LOG_TRACE).contains(&level) && !line.contains('\n'));
    LINES.fetch_add(1, Ordering::Relaxed);
}

/// Replaces itself on every line: with [`counting`], with nothing and then itself again, or with
/// itself.
unsafe extern "C" fn replacing(user: *mut c_void, level: u32, message: *const c_char) {
    // SAFETY: as the library called this one.
    unsafe { counting(user, level, message) };
    match LINES.load(Ordering::Relaxed) % 3 {
        0 => ork_set_log_callback(Some(counting), user),
        1 => {
            ork_set_log_callback(None, std::ptr::null_mut());
            ork_set_log_callback(Some(replacing), user);
        }
        _ => ork_set_log_callback(Some(replacing), user),
    }
}

fn debug_context(prefetch_threads: u32) -> *mut ork_ctx {
    // SAFETY: all zeroes is an ork_config (integers, floats and NULL strings).
    let mut cfg: ork_config = unsafe { std::mem::zeroed() };
    cfg.struct_size = size_of::<ork_config>() as u32;
    ork_config_default(&mut cfg);
    cfg.dispatch = ORK_DISPATCH_ALWAYS;
    cfg.backend = ORK_BACKEND_EMU;
    cfg.min_rows = 0;
    cfg.cache_bytes = 0;
    cfg.prefetch_threads = prefetch_threads;
    cfg.mt_mode = ORK_MT_COOP;
    cfg.log_level = ORK_LOG_DEBUG;
    let ctx = ork_ctx_new(&cfg);
    assert!(!ctx.is_null(), "ork_ctx_new: {}", last_error());
    ctx
}

/// One context's calls: announced pairs, dense calls (exact, declined, refused), pairs.
fn calls(ctx: *mut ork_ctx, seed: u64) {
    let rng = &mut Rng::new(seed);
    let mut pair = Pair::contiguous(GgmlType::Q4_0, [128, 64, 4, 2, 8, 1], rng);
    let mut dense = Owned::contiguous(GgmlType::Q8_0, [64, 32, 1, 1, 16, 1], rng);
    let (want_pair, want_dense) = (pair.expected(), expected(&dense.d, &dense.memory()));
    let [a, b, d] = dense.d.as_dense();
    let batched = Tensor {
        ne: [64, 8, 2, 1],
        ..b
    };
    for round in 0..ROUNDS {
        assert_eq!(pair.announce(ctx), ORK_OK, "{}", last_error());
        dense.dst.bytes_mut().fill(SENTINEL);
        let rc = match round % 2 {
            0 => vec![(ork_mul_mat(ctx, &a.c(), &b.c(), &d.c()), last_error())],
            _ => on_threads(ctx, 2, move |ctx, th| {
                ork_mul_mat_mt(ctx, &a.c(), &b.c(), &d.c(), th)
            }),
        };
        assert!(rc.iter().all(|(rc, _)| *rc == ORK_OK), "dense: {rc:?}");
        check_dst(&dense.dst, dense.d.dst.addr, &want_dense).unwrap();
        let declined = ork_mul_mat(ctx, &a.c(), &batched.c(), &d.c());
        assert_eq!(declined, ORK_NOT_HANDLED);
        let refused = ork_mul_mat(ctx, &a.c(), &b.c(), std::ptr::null());
        assert_eq!(refused, ORK_INVALID_ARGUMENT);
        pair.clear();
        let rc = match round % 2 {
            0 => vec![(pair.call(ctx), last_error())],
            _ => pair.call_mt(ctx, 2),
        };
        assert!(rc.iter().all(|(rc, _)| *rc == ORK_OK), "pair: {rc:?}");
        pair.check(&want_pair).unwrap();
        assert_eq!(ork_prefetch_fence(ctx), ORK_OK);
    }
}

#[test]
fn the_callback_replaced_from_inside_itself_and_other_threads_while_calls_run() {
    let contexts = [debug_context(1), debug_context(0)];
    // From inside itself, on the calling thread.
    ork_set_log_callback(Some(replacing), std::ptr::null_mut());
    calls(contexts[1], 1);
    // A line per call: announced, dense (handled, declined, refused), pair.
    let lines = LINES.load(Ordering::Relaxed);
    assert!(lines >= ROUNDS * 5, "{lines} lines");
    // And from other threads at once.
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for switcher in 0..2 {
            let stop = &stop;
            s.spawn(move || {
                let mut i = switcher;
                while !stop.load(Ordering::Relaxed) {
                    match i % 3 {
                        0 => ork_set_log_callback(Some(counting), std::ptr::null_mut()),
                        1 => ork_set_log_callback(None, std::ptr::null_mut()),
                        _ => ork_set_log_callback(Some(replacing), std::ptr::null_mut()),
                    }
                    i += 1;
                    std::thread::yield_now();
                }
            });
        }
        let callers: Vec<_> = contexts
            .iter()
            .enumerate()
            .map(|(i, &ctx)| {
                let ctx = ctx as usize;
                s.spawn(move || calls(ctx as *mut ork_ctx, 2 + i as u64))
            })
            .collect();
        for c in callers {
            c.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
    });
    ork_set_log_callback(None, std::ptr::null_mut());
    for ctx in contexts {
        ork_ctx_free(ctx);
    }
}
