//! `ork_mul_mat_id_check` predicts the call: over random valid and invalid descriptors (shapes,
//! strides, permuted and broadcast views, types and repacked layouts, min_rows thresholds, all three
//! entry points),
//! - the check's code is one that the case's own reasons allow (worked out here by brute force
//!   over the elements, not by the library): OK only for a call with no reason to decline,
//!   INVALID_ARGUMENT only for a call that is really invalid;
//! - every entry point returns the check's code (the one exception being out-of-range ids, data
//!   that only the call reads: OK from the check, INVALID_ARGUMENT from the call);
//! - an accepted call's outputs equal the int8 path bit for bit and lie within the quantization
//!   bound of the f64 product, and nothing else in any buffer changes; a refused call changes
//!   no byte anywhere.
mod mmid;

use mmid::case::{random_case, run_case, Entry, Reason};
use mmid::*;
use ork_moe::ffi::*;
use ork_moe::testutil::Rng;
use std::collections::HashMap;

const CASES: usize = 1500;

#[test]
fn check_predicts_call_on_random_descriptors() {
    let mut rng = Rng::new(0x14);
    let mut contexts: HashMap<(i32, u32, bool, u32), *mut ork_ctx> = HashMap::new();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let (mut accepted, mut deep, mut repacked, mut entries) = (0usize, 0usize, 0usize, [0usize; 3]);
    for case_no in 0..CASES {
        let mut c = random_case(&mut rng);
        let backend = if rng.below(4) == 0 {
            ORK_BACKEND_CPU
        } else {
            ORK_BACKEND_EMU
        };
        let kind = rng.below(3);
        let mt_mode = if kind == 2 {
            ORK_MT_LEADER
        } else {
            ORK_MT_COOP
        };
        let entry = match kind {
            0 => Entry::Single,
            _ => Entry::Threads(1 + rng.below(4)),
        };
        entries[kind] += 1;
        let ctx = *contexts
            .entry((backend, c.min_rows, c.cpu_mode, mt_mode))
            .or_insert_with(|| {
                let mode = if c.cpu_mode {
                    ORK_MIN_ROWS_CPU
                } else {
                    ORK_MIN_ROWS_DECLINE
                };
                context(backend, c.min_rows, mode, mt_mode)
            });
        for r in &c.reasons {
            let (Reason::Invalid(s) | Reason::Declined(s) | Reason::MaybeInvalid(s)) = r;
            *seen.entry(s).or_default() += 1;
        }
        match run_case(ctx, &mut c, entry) {
            Ok(code) => {
                accepted += (code == ORK_OK) as usize;
                deep += (code == ORK_OK && c.d.w.ne[0] > 8192) as usize;
                repacked += (code == ORK_OK && c.d.w.ty >> ORK_LAYOUT_ROWS_SHIFT != 0) as usize;
            }
            Err(e) => panic!("case {case_no}: {e}"),
        }
    }
    for ctx in contexts.into_values() {
        ork_ctx_free(ctx);
    }
    println!(
        "{accepted} of {CASES} accepted ({deep} deeper than 8192, {repacked} repacked); entries \
         {entries:?}; reasons seen: {seen:?}"
    );
    // Every kind of case occurred, and a fair share was computed, deep K and repacked included.
    assert!(
        accepted > CASES / 5 && deep > 0 && repacked > 0,
        "{accepted}, {deep}, {repacked}"
    );
    for must in [
        "weight rows overlap",
        "activation rows overlap",
        "dst elements overlap",
        "dst shares bytes with b",
        "dst interleaves with b",
        "below min_rows",
        "overflowing as",
        "repacked rows not whole groups",
        "repacked rows not packed",
    ] {
        assert!(seen.contains_key(must), "no case of {must}: {seen:?}");
    }
}
