//! Several calls at once on one context (the context is `Sync`): single-caller calls and
//! cooperative calls on 2 and 3 threads, each with its own tensors, repeated so that they share
//! the expert cache, the spare buffers and the joining list; every result exact. Small shapes:
//! this is one of the tests `.ci/tsan.sh` runs under ThreadSanitizer.
mod mmid;

use mmid::*;
use ork_moe::ffi::*;
use ork_moe::quant::GgmlType;
use ork_moe::testutil::Rng;

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
