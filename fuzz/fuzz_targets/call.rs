//! Whole `ork_mul_mat_id` calls built from fuzz input: the property test's case generator
//! (`tests/mmid/case.rs`: shapes, strides, permuted and broadcast views, deliberate breaks,
//! thresholds) with the input as its source of choices and raw input bytes as weights (NaN and
//! infinite scales included), run through one of the entry points and checked the same way:
//! codes agree with the check and with the case's reasons, accepted results exact against the
//! independent reference and inside the f64 bound, `dst` sentinels intact.
#![no_main]

mod common;
#[path = "../../tests/mmid/mod.rs"]
mod mmid;

use common::Bytes;
use libfuzzer_sys::fuzz_target;
use mmid::case::{random_case, run_case, Draw, Entry};
use ork_moe::ffi::*;
use ork_moe::quant::GgmlType;
use std::collections::HashMap;
use std::sync::Mutex;

impl Draw for Bytes<'_> {
    fn below(&mut self, n: usize) -> usize {
        Bytes::below(self, n)
    }

    fn normal(&mut self) -> f32 {
        self.byte() as i8 as f32 / 16.0
    }

    fn blocks(&mut self, ty: GgmlType, n_blocks: usize) -> Vec<u8> {
        self.take(n_blocks * ty.block_bytes())
    }
}

fuzz_target!(|data: &[u8]| {
    // Contexts live across inputs (their caches see buffers reused at the same addresses).
    static CONTEXTS: Mutex<Option<HashMap<(i32, u32, bool, u32), usize>>> = Mutex::new(None);
    let mut b = Bytes::new(data);
    let backend = if b.below(4) == 0 {
        ORK_BACKEND_CPU
    } else {
        ORK_BACKEND_EMU
    };
    let kind = b.below(3);
    let entry = match kind {
        0 => Entry::Single,
        _ => Entry::Threads(1 + b.below(3)),
    };
    let mt_mode = if kind == 2 {
        ORK_MT_LEADER
    } else {
        ORK_MT_COOP
    };
    let mut case = random_case(&mut b);
    let ctx = {
        let mut map = CONTEXTS.lock().unwrap();
        let key = (backend, case.min_rows, case.cpu_mode, mt_mode);
        *map.get_or_insert_with(HashMap::new)
            .entry(key)
            .or_insert_with(|| {
                let mode = if case.cpu_mode {
                    ORK_MIN_ROWS_CPU
                } else {
                    ORK_MIN_ROWS_DECLINE
                };
                mmid::context(backend, case.min_rows, mode, mt_mode) as usize
            })
    } as *mut ork_ctx;
    if let Err(e) = run_case(ctx, &mut case, entry) {
        panic!("{e}");
    }
});
