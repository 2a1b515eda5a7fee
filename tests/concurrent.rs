//! Several calls at once on one context (the context is `Sync`): single-caller calls and
//! cooperative calls on 2 and 3 threads, each with its own tensors, repeated so that they share
//! the expert cache, the spare buffers and the joining list; every result exact. Contexts with
//! prefetch threads side by side, announcing pairs and running dense calls. Cooperative calls
//! whose threads disagree. Small shapes: this is one of the tests `.ci/tsan.sh` runs under
//! ThreadSanitizer.
mod mmid;

use mmid::*;
use ork_moe::ffi::*;
use ork_moe::quant::GgmlType;
use ork_moe::testutil::Rng;
use std::ffi::c_void;
use std::sync::{Barrier, Condvar, Mutex};
use std::time::Duration;

const ROUNDS: usize = 6;

fn concurrent_calls(mt_mode: u32) {
    let ctx = context(ORK_BACKEND_EMU, 0, ORK_MIN_ROWS_DECLINE, mt_mode);
    let shapes = [
        (GgmlType::Q4_0, [256, 64, 6, 2, 6, 1]),
        (GgmlType::Q4_K, [512, 96, 4, 3, 5, 3]),
        (GgmlType::Q8_0, [96, 33, 5, 2, 7, 2]),
    ];
    let mut calls: Vec<Owned> = shapes
        .iter()
        .enumerate()
        .map(|(i, &(ty, shape))| Owned::contiguous(ty, shape, &mut Rng::new(i as u64)))
        .collect();
    let want: Vec<Vec<Expected>> = calls.iter().map(|c| expected(&c.d, &c.memory())).collect();
    let ctx_addr = ctx as usize;
    std::thread::scope(|s| {
        for (i, (c, want)) in calls.iter_mut().zip(&want).enumerate() {
            s.spawn(move || {
                let ctx = ctx_addr as *mut ork_ctx;
                for round in 0..ROUNDS {
                    c.dst.bytes_mut().fill(SENTINEL);
                    let codes = match i {
                        0 => vec![(call(ctx, &c.d), last_error())],
                        _ => call_mt(ctx, &c.d, i + 1),
                    };
                    assert!(
                        codes.iter().all(|(rc, _)| *rc == ORK_OK),
                        "caller {i}, round {round}: {codes:?}"
                    );
                    if let Err(e) = check_dst(&c.dst, c.d.dst.addr, want) {
                        panic!("caller {i}, round {round}: {e}");
                    }
                }
            });
        }
    });
    let mut stats = ork_stats::default();
    assert_eq!(ork_ctx_stats(ctx, &mut stats), ORK_OK);
    assert_eq!(stats.handled, (ROUNDS * shapes.len()) as u64);
    ork_ctx_free(ctx);
}

#[test]
fn concurrent_calls_share_one_cooperative_context() {
    concurrent_calls(ORK_MT_COOP);
}

#[test]
fn concurrent_calls_share_one_leader_context() {
    concurrent_calls(ORK_MT_LEADER);
}

/// A context on the emulator with `prefetch` prefetch threads and no cache, so that the calls take
/// announced experts from the staging area or inflate them themselves.
fn prefetch_context(prefetch: u32) -> *mut ork_ctx {
    // SAFETY: all zeroes is an ork_config (integers, floats and NULL strings).
    let mut cfg: ork_config = unsafe { std::mem::zeroed() };
    cfg.struct_size = size_of::<ork_config>() as u32;
    ork_config_default(&mut cfg);
    cfg.dispatch = ORK_DISPATCH_ALWAYS;
    cfg.backend = ORK_BACKEND_EMU;
    cfg.min_rows = 0;
    cfg.cache_bytes = 0;
    cfg.prefetch_threads = prefetch;
    cfg.mt_mode = ORK_MT_COOP;
    let ctx = ork_ctx_new(&cfg);
    assert!(!ctx.is_null(), "ork_ctx_new: {}", last_error());
    ctx
}

/// Contexts with prefetch threads side by side, each announcing pairs and running them with dense
/// calls between (whose threads may take the prefetch jobs), single and cooperative, then a fence;
/// every result exact.
#[test]
fn concurrent_contexts_prefetch_and_run_dense_and_pair_calls() {
    let contexts = [
        prefetch_context(1),
        prefetch_context(2),
        prefetch_context(0),
    ];
    std::thread::scope(|s| {
        for (i, &ctx) in contexts.iter().enumerate() {
            let ctx = ctx as usize;
            s.spawn(move || {
                let ctx = ctx as *mut ork_ctx;
                let rng = &mut Rng::new(10 + i as u64);
                let mut pair = Pair::contiguous(GgmlType::Q4_0, [256, 64, 6, 2, 8, 1], rng);
                let mut dense = Owned::contiguous(GgmlType::Q8_0, [128, 96, 1, 1, 24, 1], rng);
                let (want_pair, want_dense) =
                    (pair.expected(), expected(&dense.d, &dense.memory()));
                let [a, b, d] = dense.d.as_dense();
                for round in 0..ROUNDS {
                    assert_eq!(pair.announce(ctx), ORK_OK, "{}", last_error());
                    dense.dst.bytes_mut().fill(SENTINEL);
                    let codes = match round % 2 {
                        0 => vec![(ork_mul_mat(ctx, &a.c(), &b.c(), &d.c()), last_error())],
                        _ => on_threads(ctx, 2, move |ctx, th| {
                            ork_mul_mat_mt(ctx, &a.c(), &b.c(), &d.c(), th)
                        }),
                    };
                    assert!(
                        codes.iter().all(|(rc, _)| *rc == ORK_OK),
                        "dense: {codes:?}"
                    );
                    check_dst(&dense.dst, dense.d.dst.addr, &want_dense).unwrap();
                    pair.clear();
                    let codes = match round % 3 {
                        0 => vec![(pair.call(ctx), last_error())],
                        n => pair.call_mt(ctx, n + 1),
                    };
                    assert!(codes.iter().all(|(rc, _)| *rc == ORK_OK), "pair: {codes:?}");
                    pair.check(&want_pair).unwrap();
                    assert_eq!(ork_prefetch_fence(ctx), ORK_OK);
                }
            });
        }
    });
    for ctx in contexts {
        ork_ctx_free(ctx);
    }
}

/// A barrier of `target` threads that gives up after 200 ms (a caller's bug).
struct GivingUp {
    target: usize,
    state: Mutex<(usize, u64)>,
    all_came: Condvar,
}

unsafe extern "C" fn giving_up_wait(arg: *mut c_void) {
    // SAFETY: `arg` is the `GivingUp` of `disagreeing`, alive until its threads are joined.
    let b = unsafe { &*(arg as *const GivingUp) };
    let mut st = b.state.lock().unwrap();
    let generation = st.1;
    st.0 += 1;
    if st.0 == b.target {
        *st = (0, generation + 1);
        b.all_came.notify_all();
        return;
    }
    let limit = Duration::from_millis(200);
    let (mut st, _) = b
        .all_came
        .wait_timeout_while(st, limit, |st| st.1 == generation)
        .unwrap();
    if st.1 == generation {
        st.0 -= 1;
    }
}

unsafe extern "C" fn std_barrier_wait(arg: *mut c_void) {
    // SAFETY: `arg` is the `Barrier` of `disagreeing`, alive until its threads are joined.
    unsafe { (*(arg as *const Barrier)).wait() };
}

/// Runs `entry` on one thread per `(ith, nth)` of `threads`, sharing a barrier of `barrier_of`
/// threads (one that gives up with `gives_up`); each thread's code and message.
fn disagreeing(
    ctx: *mut ork_ctx,
    threads: &[(i32, i32)],
    (barrier_of, gives_up): (usize, bool),
    entry: impl Fn(*mut ork_ctx, &ork_threads) -> ork_result + Copy + Send,
) -> Vec<(ork_result, String)> {
    let std_barrier = Barrier::new(barrier_of);
    let giving_up = GivingUp {
        target: barrier_of,
        state: Mutex::new((0, 0)),
        all_came: Condvar::new(),
    };
    let (wait, arg): (unsafe extern "C" fn(*mut c_void), usize) = if gives_up {
        (giving_up_wait, &giving_up as *const GivingUp as usize)
    } else {
        (std_barrier_wait, &std_barrier as *const Barrier as usize)
    };
    let ctx = ctx as usize;
    std::thread::scope(|s| {
        let handles: Vec<_> = threads
            .iter()
            .map(|&(ith, nth)| {
                s.spawn(move || {
                    let th = ork_threads {
                        ith,
                        nth,
                        barrier: Some(wait),
                        barrier_arg: arg as *mut c_void,
                        scratch: std::ptr::null_mut(),
                        scratch_size: 0,
                    };
                    (entry(ctx as *mut ork_ctx, &th), last_error())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Threads of one cooperative call that disagree, and what their message says.
#[derive(Clone, Copy)]
struct Disagreement {
    says: &'static str,
    /// Each thread's `(ith, nth)`.
    threads: &'static [(i32, i32)],
    /// Threads the barrier waits for, and whether it gives up.
    barrier: (usize, bool),
}

/// Threads of one cooperative call that disagree (another nth, one ith twice, a thread too many,
/// one that never comes while the barrier gives up): `INVALID_ARGUMENT` naming it on every
/// thread, `dst` untouched, and the context's next call exact. Every `_mt` entry, coop and leader.
#[test]
fn threads_that_disagree_fail_alike_and_write_nothing() {
    let cases = [
        Disagreement {
            says: "another nth",
            threads: &[(0, 3), (1, 2), (2, 3)],
            barrier: (3, false),
        },
        Disagreement {
            says: "two threads passed ith = 1",
            threads: &[(0, 3), (1, 3), (1, 3)],
            barrier: (3, false),
        },
        Disagreement {
            says: "two threads passed ith = 0",
            threads: &[(0, 3), (1, 3), (2, 3), (0, 3)],
            barrier: (4, false),
        },
        Disagreement {
            says: "ith 1 never came",
            threads: &[(0, 3), (2, 3)],
            barrier: (3, true),
        },
    ];
    let mut pair = Pair::contiguous(GgmlType::Q4_0, [256, 64, 6, 2, 8, 1], &mut Rng::new(20));
    let want = pair.expected();
    let [w0, w1, b, ids, d0, d1] = pair.descs();
    let mut dense = Owned::contiguous(GgmlType::Q4_0, [256, 64, 1, 1, 8, 1], &mut Rng::new(21));
    let [da, db, dd] = dense.d.as_dense();
    for mt_mode in [ORK_MT_COOP, ORK_MT_LEADER] {
        let ctx = context(ORK_BACKEND_EMU, 0, ORK_MIN_ROWS_DECLINE, mt_mode);
        for entry in 0..3 {
            for Disagreement {
                says,
                threads,
                barrier,
            } in cases
            {
                let what = format!("mt_mode {mt_mode}, entry {entry}, {says}");
                pair.clear();
                dense.dst.bytes_mut().fill(SENTINEL);
                let codes = disagreeing(ctx, threads, barrier, move |ctx, th| match entry {
                    0 => ork_mul_mat_id_mt(ctx, &w0.c(), &b.c(), &ids.c(), &d0.c(), th),
                    1 => ork_mul_mat_mt(ctx, &da.c(), &db.c(), &dd.c(), th),
                    _ => ork_mul_mat_id_pair_mt(
                        ctx,
                        &w0.c(),
                        &w1.c(),
                        &b.c(),
                        &ids.c(),
                        &d0.c(),
                        &d1.c(),
                        th,
                    ),
                });
                for (rc, msg) in &codes {
                    assert_eq!(*rc, ORK_INVALID_ARGUMENT, "{what}: {codes:?}");
                    assert!(
                        msg.starts_with("threads: ") && msg.contains(says),
                        "{what}: {msg}"
                    );
                }
                let sentinel = |a: &Arena| a.bytes().iter().all(|&x| x == SENTINEL);
                let dsts = [&pair.gate.dst, &pair.up.dst, &dense.dst];
                assert!(dsts.into_iter().all(sentinel), "{what}: dst written");
                // Nothing waits for the threads that were missing: the next call is exact.
                if entry == 2 {
                    let codes = pair.call_mt(ctx, 3);
                    assert!(
                        codes.iter().all(|(rc, _)| *rc == ORK_OK),
                        "{what}: {codes:?}"
                    );
                    pair.check(&want).unwrap_or_else(|e| panic!("{what}: {e}"));
                }
            }
        }
        ork_ctx_free(ctx);
    }
}
