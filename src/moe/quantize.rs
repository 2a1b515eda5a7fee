//! Per-row symmetric int8 quantization of the f32 activations.
//!
//! For a row `x` with `amax = max |x_i|`: `scale = amax / 127` and `q_i = rte(x_i · 127 / amax)`,
//! clamped to [-127, 127] (symmetric: -128 is never produced),
//! where `rte` rounds half to even (what NEON's `vcvtnq` and ggml's NEON quantizer do; a fixed rule
//! makes every backend see the same int8 inputs). Defined edge cases:
//! - `amax == 0`: `scale = 0`, all `q = 0`: the row's outputs are exact zeros;
//! - any NaN or ±Inf in the row: `scale = NaN`, all `q = 0`: every output of that row is NaN, the
//!   other rows are unaffected (int8 cannot carry the infinity, so no partial answer is pretended);
//! - tiny `amax` (below ~3.7e-37, where `127 / amax` overflows f32): the factor is kept in f64, so
//!   subnormal rows still quantize to full int8 resolution.

/// Adding and subtracting 1.5·2²³ rounds an f32 of magnitude < 2²² to the nearest integer, ties to
/// even, in the default rounding mode; unlike `round_ties_even` it vectorizes on every target.
const RTE_MAGIC: f32 = 12_582_912.0;

#[inline]
fn round_ties_even_small(v: f32) -> f32 {
    (v + RTE_MAGIC) - RTE_MAGIC
}

/// Quantizes `x` into `out[..x.len()]` and returns the row scale; `out[x.len()..]` (K padding)
/// is zeroed.
pub fn quantize_row(x: &[f32], out: &mut [i8]) -> f32 {
    let (body, pad) = out.split_at_mut(x.len());
    pad.fill(0);
    let mut amax = 0f32;
    let mut finite = true;
    for &v in x {
        amax = amax.max(v.abs());
        finite &= v.is_finite();
    }
    if !finite {
        body.fill(0);
        return f32::NAN;
    }
    if amax == 0.0 {
        body.fill(0);
        return 0.0;
    }
    let inv = 127.0 / amax;
    if inv.is_finite() {
        for (q, &v) in body.iter_mut().zip(x) {
            *q = round_ties_even_small(v * inv).clamp(-127.0, 127.0) as i8;
        }
    } else {
        let inv = 127.0 / amax as f64;
        for (q, &v) in body.iter_mut().zip(x) {
            *q = round_ties_even_small((v as f64 * inv) as f32).clamp(-127.0, 127.0) as i8;
        }
    }
    amax / 127.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_rounding_equals_round_ties_even_in_range() {
        let mut v = -130.0f32;
        while v <= 130.0 {
            assert_eq!(round_ties_even_small(v), v.round_ties_even(), "{v}");
            v += 0.125;
        }
        for v in [
            0.5f32, 1.5, 2.5, -0.5, -2.5, 126.5, -126.5, 0.49999997, 1e-30,
        ] {
            assert_eq!(round_ties_even_small(v), v.round_ties_even(), "{v}");
        }
    }

    #[test]
    fn scale_and_ties() {
        let x = [127.0f32, -63.5, 0.5, 1.5, -127.0, 0.0];
        let mut q = [9i8; 8];
        let s = quantize_row(&x, &mut q);
        assert_eq!(s, 1.0);
        assert_eq!(q, [127, -64, 0, 2, -127, 0, 0, 0]);
    }

    #[test]
    fn every_value_within_half_a_step() {
        let x: Vec<f32> = (0..300)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 0.37)
            .collect();
        let mut q = vec![0i8; 320];
        let s = quantize_row(&x, &mut q);
        for (&v, &qi) in x.iter().zip(&q) {
            assert!((v - qi as f32 * s).abs() <= 0.5001 * s, "{v} {qi} {s}");
        }
        assert!(q[300..].iter().all(|&p| p == 0));
    }

    #[test]
    fn zero_non_finite_and_tiny_rows() {
        let mut q = [5i8; 4];
        assert_eq!(quantize_row(&[0.0, -0.0, 0.0, 0.0], &mut q), 0.0);
        assert_eq!(q, [0; 4]);
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut q = [5i8; 4];
            assert!(quantize_row(&[1.0, bad, 2.0, 3.0], &mut q).is_nan());
            assert_eq!(q, [0; 4]);
        }
        let tiny = 1e-38f32; // 127 / tiny overflows f32
        let mut q = [0i8; 3];
        let s = quantize_row(&[tiny, -tiny, 0.0], &mut q);
        assert_eq!(q, [127, -127, 0]);
        assert!(s > 0.0 && s < tiny);
    }
}
