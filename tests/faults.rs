//! Injected device faults (the emulator's `FaultPlan`) through the C ABI: for every fault kind,
//! at several points of a call, and for every entry point (single caller; cooperative on 1..4
//! threads sharing a `std::sync::Barrier` through the C callback; led by thread 0):
//! The same with the GEMMs on submitter threads (`Config::submitters`, the board's phase 2).
//! - every thread returns the documented code (`DEVICE_ERROR`; `OUT_OF_MEMORY` for a full domain);
//! - `dst` holds, element by element, either its old bytes or the exact result (`mmid::expected`),
//!   never anything else (results are written only from finished, synced GEMMs);
//! - the next call on the same context is OK and bit-exact (a one-off fault leaves nothing behind);
//! - nothing leaks: the emulator's domain accounting is back to zero once the context is freed.
mod mmid;

use mmid::*;
use ork_moe::ffi::*;
use ork_moe::moe::{Config, Dispatch, Engine, MtMode};
use ork_moe::npu::emu::{self, Fault, FaultOp, FaultPlan, Monitor, OpCounts};
use ork_moe::npu::Device;
use ork_moe::quant::GgmlType;
use ork_moe::testutil::Rng;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entry {
    Single,
    Coop(usize),
    Led(usize),
    /// Cooperative, with the GEMMs on three submitter threads (as on the board).
    Piped(usize),
}

const ENTRIES: [Entry; 9] = [
    Entry::Single,
    Entry::Coop(1),
    Entry::Coop(2),
    Entry::Coop(3),
    Entry::Coop(4),
    Entry::Led(2),
    Entry::Led(3),
    Entry::Piped(1),
    Entry::Piped(3),
];

const OPS: [FaultOp; 5] = [
    FaultOp::Alloc,
    FaultOp::DomainFull,
    FaultOp::Run,
    FaultOp::SyncToDevice,
    FaultOp::SyncFromDevice,
];

const SUBMITTERS: usize = 3;

/// A context on a fresh emulator with `faults`, and the emulator's monitor.
fn faulty_context(entry: Entry, faults: FaultPlan) -> (*mut ork_ctx, Monitor) {
    let (device, monitor) = Device::emu_monitored(emu::Config {
        faults,
        ..emu::Config::default()
    });
    let config = Config {
        min_rows: 0,
        mt_mode: match entry {
            Entry::Led(_) => MtMode::Leader,
            _ => MtMode::Coop,
        },
        submitters: match entry {
            Entry::Piped(_) => Some(SUBMITTERS),
            _ => None,
        },
        dispatch: Dispatch::Always,
        ..Config::default()
    };
    let engine = Engine::with_device(config, device).expect("engine");
    (ork_ctx_from_engine(engine), monitor)
}

/// The codes (with messages) every calling thread returned.
fn run(ctx: *mut ork_ctx, d: &Descs, entry: Entry) -> Vec<(ork_result, String)> {
    match entry {
        Entry::Single => vec![(call(ctx, d), last_error())],
        Entry::Coop(nth) | Entry::Led(nth) | Entry::Piped(nth) => call_mt(ctx, d, nth),
    }
}

/// How many of `op`'s operations a clean call surely does.
fn sure_count(ops: &OpCounts, op: FaultOp) -> u64 {
    match op {
        // A fresh context's first B, A and C: how many more depends on how soon the threads
        // hand finished experts' buffers back to the spares.
        FaultOp::Alloc | FaultOp::DomainFull => ops.allocs.min(3),
        FaultOp::Run => ops.runs,
        FaultOp::SyncToDevice => ops.syncs_to_device,
        FaultOp::SyncFromDevice => ops.syncs_from_device,
    }
}

fn check_shape(ty: GgmlType, shape: [usize; 6], seed: u64) {
    let mut call_data = Owned::contiguous(ty, shape, &mut Rng::new(seed));
    let d = call_data.d;
    let exp = expected(&d, &call_data.memory());

    let mut partial = 0;
    for entry in ENTRIES {
        let (ctx, monitor) = faulty_context(entry, FaultPlan::default());
        call_data.dst.bytes_mut().fill(SENTINEL);
        let codes = run(ctx, &d, entry);
        assert!(
            codes.iter().all(|(rc, _)| *rc == ORK_OK),
            "{entry:?}: {codes:?}"
        );
        check_dst(&call_data.dst, d.dst.addr, &exp).unwrap();
        let ops = monitor.ops();
        ork_ctx_free(ctx);
        assert_eq!(monitor.domain_used(), [0; 8], "{entry:?}: clean run leaked");

        for op in OPS {
            let sure = sure_count(&ops, op);
            assert!(sure >= 2, "{entry:?} {op:?}: {ops:?}");
            let mut points = vec![1, 2, sure.div_ceil(2), sure];
            points.dedup();
            let want = if op == FaultOp::DomainFull {
                ORK_OUT_OF_MEMORY
            } else {
                ORK_DEVICE_ERROR
            };
            for (nth, onwards) in points.into_iter().map(|p| (p, false)).chain([(1, true)]) {
                let what = format!(
                    "{ty:?} {shape:?} {entry:?}, {op:?} {nth}{}",
                    ["", "+"][onwards as usize]
                );
                let plan = FaultPlan(vec![Fault { op, nth, onwards }]);
                let (ctx, monitor) = faulty_context(entry, plan);
                call_data.dst.bytes_mut().fill(SENTINEL);
                let codes = run(ctx, &d, entry);
                for (rc, msg) in &codes {
                    assert_eq!(*rc, want, "{what}: {codes:?}");
                    let names_it = msg.contains("injected fault") || msg.contains("out of memory");
                    assert!(names_it, "{what}: message {msg:?}");
                }
                let fired = monitor.ops().injected;
                assert!(
                    fired == 1 || (onwards && fired >= 1),
                    "{what}: {fired} injected"
                );
                if let Err(e) = check_old_or_final(&call_data.dst, d.dst.addr, &exp) {
                    panic!("{what}: {e}");
                }
                let dst = call_data.dst.bytes();
                partial += exp.iter().any(|e| dst[e.off..e.off + 4] != [SENTINEL; 4]) as usize;
                // The next call on the same context: OK and bit-exact after a one-off fault,
                // the same code again while the fault persists.
                call_data.dst.bytes_mut().fill(SENTINEL);
                let again = run(ctx, &d, entry);
                if onwards {
                    assert!(
                        again.iter().all(|(rc, _)| *rc == want),
                        "{what}: next {again:?}"
                    );
                } else {
                    assert!(
                        again.iter().all(|(rc, _)| *rc == ORK_OK),
                        "{what}: next {again:?}"
                    );
                    let next = check_dst(&call_data.dst, d.dst.addr, &exp);
                    assert!(next.is_ok(), "{what}: next call: {next:?}");
                }
                ork_ctx_free(ctx);
                assert_eq!(
                    monitor.domain_used(),
                    [0; 8],
                    "{what}: device memory leaked"
                );
            }
        }
    }
    // Faults late in a call find part of dst already final: that case was exercised.
    assert!(partial > 0, "no fault left a partly written dst");
}

#[test]
fn faults_on_run_i8_calls() {
    // K = 256: outside the stream envelope (run_i8); a broadcast activation row.
    check_shape(GgmlType::Q4_0, [256, 96, 8, 4, 8, 1], 1);
}

#[test]
fn faults_on_stream_calls() {
    // K = 512: stream_i8; one activation row per slot.
    check_shape(GgmlType::Q4_K, [512, 64, 6, 2, 12, 2], 2);
}

#[test]
fn faults_on_deep_k_calls() {
    // K = 10272: beyond one emulated run_i8 (10240), summed from depth segments.
    check_shape(GgmlType::Q4_0, [10272, 32, 4, 2, 4, 1], 3);
}

#[test]
fn domain_too_small_for_one_expert_is_out_of_memory() {
    let call_data = Owned::contiguous(GgmlType::Q8_0, [256, 64, 4, 2, 4, 1], &mut Rng::new(3));
    let (device, monitor) = Device::emu_monitored(emu::Config {
        domain_bytes: 8 << 10,
        ..emu::Config::default()
    });
    let config = Config {
        min_rows: 0,
        dispatch: Dispatch::Always,
        ..Config::default()
    };
    let ctx = ork_ctx_from_engine(Engine::with_device(config, device).unwrap());
    for entry in [Entry::Single, Entry::Coop(3)] {
        let codes = run(ctx, &call_data.d, entry);
        assert!(
            codes.iter().all(|(rc, _)| *rc == ORK_OUT_OF_MEMORY),
            "{codes:?}"
        );
        assert!(call_data.dst.bytes().iter().all(|&b| b == SENTINEL));
    }
    ork_ctx_free(ctx);
    assert_eq!(monitor.domain_used(), [0; 8]);
}

#[test]
fn a_streaming_call_holds_the_buffers_of_the_experts_in_flight_only() {
    // 64 experts, all used, none cached: each B is 64 KiB, 4 MiB for all of them.
    let call_data = Owned::contiguous(GgmlType::Q4_0, [256, 256, 64, 8, 64, 1], &mut Rng::new(4));
    let all_b = 64 * 256 * 256;
    for entry in [Entry::Coop(1), Entry::Coop(2), Entry::Piped(3)] {
        let (device, monitor) = Device::emu_monitored(emu::Config::default());
        let config = Config {
            min_rows: 0,
            cache_bytes: 0,
            submitters: matches!(entry, Entry::Piped(_)).then_some(SUBMITTERS),
            dispatch: Dispatch::Always,
            ..Config::default()
        };
        let ctx = ork_ctx_from_engine(Engine::with_device(config, device).unwrap());
        let codes = run(ctx, &call_data.d, entry);
        assert!(codes.iter().all(|(rc, _)| *rc == ORK_OK), "{codes:?}");
        ork_ctx_free(ctx);
        // In flight: an expert per caller thread, and per submitter the ones prepared ahead
        // (3) and the one running, with their A and C.
        let peak = monitor.domain_peak()[0];
        assert!(peak < all_b as u64 / 2, "{entry:?}: {peak} bytes at once");
    }
}
