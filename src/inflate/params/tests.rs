//! The scan's helpers against their definitions.

use super::arith::rne_i32;
use super::*;
use crate::quant::fp16::f16_to_f32;
use crate::quant::{q4k_scale_min, K_SCALE_SIZE};
use sets::Sets;

#[test]
fn finite_half_conversion_is_exact() {
    for h in (0..=u16::MAX).filter(|h| h & 0x7c00 != 0x7c00) {
        assert_eq!(
            finite_half_to_f32(h).to_bits(),
            f16_to_f32(h).to_bits(),
            "{h:#06x}"
        );
    }
}

#[test]
fn q4k_scales_mins_agrees_with_the_reference_decoder() {
    let mut rng = crate::testutil::Rng::new(9);
    for _ in 0..1000 {
        let mut packed = [0u8; K_SCALE_SIZE];
        rng.fill_bytes(&mut packed);
        let (sc, mn) = q4k_scales_mins(&packed);
        for j in 0..8 {
            assert_eq!(
                (sc[j], mn[j]),
                q4k_scale_min(j, &packed),
                "{packed:?} sub-block {j}"
            );
        }
    }
}

#[test]
fn rne_i32_rounds_half_to_even() {
    let mut rng = crate::testutil::Rng::new(3);
    let fixed = [
        0.5f32, 1.5, 2.5, -0.5, -1.5, 3.49, -3.51, 32767.5, 32768.4, -0.0, 127.5,
    ];
    let random = (0..10_000).map(|_| rng.uniform(-40_000.0, 40_000.0));
    for x in fixed.into_iter().chain(random) {
        assert_eq!(rne_i32(x), x.round_ties_even() as i32, "{x}");
    }
}

#[test]
fn rescale_types_map_their_largest_code_to_127_with_the_smallest_stretch() {
    for ty in GgmlType::ALL {
        let Some(Sets {
            method: sets::Method::Rescale { c_max },
            ..
        }) = Sets::of(ty)
        else {
            continue;
        };
        let (k, unit) = (code_scale(ty), sets::rescale_unit(ty, c_max));
        // A set at the row's largest scale (e_j = E_n = 1) and its extreme codes.
        let m = multiplier(1.0, unit) as i32;
        assert_eq!((k * c_max * m + (1 << 14)) >> 15, 127, "{ty:?}");
        assert_eq!((-k * c_max * m + (1 << 14)) >> 15, -127, "{ty:?}");
        assert!(
            k * c_max <= i16::MAX as i32,
            "{ty:?}: codes fit 16-bit lanes"
        );
        let unit_with = |k: i32| (127 << 15) as f32 / (k * c_max) as f32;
        assert!(unit_with(k) <= 32768.0, "{ty:?}");
        assert!(
            k == 1 || unit_with(k - 1) > 32768.0,
            "{ty:?}: not the smallest stretch"
        );
    }
}
