//! Per-row symmetric int8 quantization of the f32 activations.
//!
//! For a row `x` with `amax = max |x_i|`: `scale = amax / 127` and `q_i = rte(x_i · 127 / amax)`,
//! clamped to [-127, 127] (symmetric: -128 is never produced),
//! where `rte` rounds half to even (what NEON's `vcvtnq` and ggml's NEON quantizer do; a fixed rule
//! makes every backend see the same int8 inputs). Defined edge cases:
//! - `amax == 0`: `scale = 0`, all `q = 0`: the row's outputs are exact zeros;
//! - any NaN or ±Inf in the row: `scale = NaN`, all `q = 0`: every output of that row is NaN, the
//!   other rows are unaffected (int8 cannot carry the infinity, so no partial answer is pretended);
//! - tiny rows (`amax < 2⁻⁶⁴`): the quants are those of the row scaled by an exact power of two
//!   `2ᴱ` (`amax·2ᴱ ∈ [1, 2)`), and the scale comes back split, [`RowScale`]`{ scale: amax·2ᴱ/127,
//!   exp2: −E }`. Folding it into one f32 (`amax/127`, what [`quantize_row`] returns) loses
//!   resolution: for `amax ≈ 1e-40` that scale is a subnormal with ~10 significant bits, and the
//!   scatter's `row_scale · chan_scale` (`≈ 1e-45`) a subnormal of a few bits or zero, i.e.
//!   errors of 1 % to 100 % per output (`ork-probe accuracy`'s `tiny` case). [`RowScale::output`]
//!   multiplies normal numbers and applies `2^exp2` last, so only the output's own rounding remains.
//!   (ggml returns zeros for such rows: its Q8_0 scale rounds to fp16 0, its Q8_K scale overflows.)
//!
//! Levers against outlier channels (docs/ACCURACY.md): `super::segments` and `super::outliers`.

/// Adding and subtracting 1.5·2²³ rounds an f32 of magnitude < 2²² to the nearest integer, ties to
/// even, in the default rounding mode; unlike `round_ties_even` it vectorizes on every target.
const RTE_MAGIC: f32 = 12_582_912.0;

/// `rte(v)` clamped to ±127, as an i8. The clamp comes first (the same result, since ±127 are
/// integers) and the integer is then read from the low mantissa bits of `v + 1.5·2²³`: no
/// float-to-int conversion, whose saturating `as` semantics kept this loop scalar.
#[inline]
fn to_i8(v: f32) -> i8 {
    let v = if v > 127.0 { 127.0 } else { v };
    let v = if v < -127.0 { -127.0 } else { v };
    ((v + RTE_MAGIC).to_bits() as i32 - RTE_MAGIC.to_bits() as i32) as i8
}

/// Rows with `amax` below this are scaled by a power of two first (exactly) and get a split scale.
const TINY: f32 = 5.421_011e-20; // 2⁻⁶⁴

/// A row's scale: the row's int32 results times `scale · 2^exp2`. `exp2` is 0 except for tiny rows
/// (`amax < 2⁻⁶⁴`), whose `scale` is then normal (`≥ 2⁻⁷`) and `exp2 ∈ [−149, −64]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowScale {
    pub scale: f32,
    pub exp2: i32,
}

impl RowScale {
    /// `2^exp2`, the factor the scatter applies last (1 for every row but tiny ones).
    pub fn post(self) -> f32 {
        pow2(self.exp2)
    }

    /// `scale · 2^exp2` as one f32 (what [`quantize_row`] returns): exact for `exp2 == 0`, a
    /// possibly subnormal rounding otherwise.
    pub fn folded(self) -> f32 {
        self.scale * pow2(self.exp2)
    }

    /// The f32 result of int32 `c` in a channel of scale `chan`: `c · (scale · chan)` (the
    /// scatter's expression, bit for bit, when `exp2 == 0`), then `· 2^exp2`, one rounding.
    #[inline]
    pub fn output(self, c: i32, chan: f32) -> f32 {
        let v = c as f32 * (self.scale * chan);
        if self.exp2 == 0 {
            v
        } else {
            v * pow2(self.exp2)
        }
    }
}

/// `2^e` as an f32, exact for `−149 ≤ e ≤ 127` (subnormal below −126).
fn pow2(e: i32) -> f32 {
    debug_assert!((-149..=127).contains(&e));
    if e >= -126 {
        f32::from_bits(((e + 127) as u32) << 23)
    } else {
        f32::from_bits(1u32 << (e + 149))
    }
}

/// Quantizes `x` into `out[..x.len()]` and returns the row scale folded into one f32
/// ([`RowScale::folded`]); `out[x.len()..]` (K padding) is zeroed.
pub fn quantize_row(x: &[f32], out: &mut [i8]) -> f32 {
    quantize_row_scaled(x, out).folded()
}

/// Quantizes `x` into `out[..x.len()]` and returns its [`RowScale`]; `out[x.len()..]` (K
/// padding) is zeroed.
pub fn quantize_row_scaled(x: &[f32], out: &mut [i8]) -> RowScale {
    quantize_row_with(x, RowMax::of(x), out)
}

/// A row's largest magnitude, and whether every value is finite: what its quantization needs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowMax {
    /// `max |x_i|` over the row (0 for an empty row; meaningless when not `finite`).
    pub amax: f32,
    pub finite: bool,
}

impl RowMax {
    pub fn of(x: &[f32]) -> RowMax {
        // Eight independent lanes with compare-and-select (not `f32::max`, whose NaN rule blocks
        // vectorization); non-finite values are caught by their exponent bits instead.
        let mut lanes = [0f32; 8];
        let mut exp_all_ones = 0u32;
        let mut chunks = x.chunks_exact(8);
        for c in &mut chunks {
            for j in 0..8 {
                let a = c[j].abs();
                lanes[j] = if a > lanes[j] { a } else { lanes[j] };
                exp_all_ones |= ((c[j].to_bits() & 0x7f80_0000) == 0x7f80_0000) as u32;
            }
        }
        for &v in chunks.remainder() {
            lanes[0] = if v.abs() > lanes[0] {
                v.abs()
            } else {
                lanes[0]
            };
            exp_all_ones |= ((v.to_bits() & 0x7f80_0000) == 0x7f80_0000) as u32;
        }
        let amax = lanes
            .into_iter()
            .fold(0f32, |m, a| if a > m { a } else { m });
        RowMax {
            amax,
            finite: exp_all_ones == 0,
        }
    }
}

/// [`quantize_row_scaled`] with the row's [`RowMax`] already known (`max` must be `x`'s).
pub fn quantize_row_with(x: &[f32], max: RowMax, out: &mut [i8]) -> RowScale {
    let (body, pad) = out.split_at_mut(x.len());
    pad.fill(0);
    let RowMax { amax, finite } = max;
    let plain = |scale| RowScale { scale, exp2: 0 };
    if !finite {
        body.fill(0);
        return plain(f32::NAN);
    }
    if amax == 0.0 {
        body.fill(0);
        return plain(0.0);
    }
    if amax >= TINY {
        let inv = 127.0 / amax;
        for (q, &v) in body.iter_mut().zip(x) {
            *q = to_i8(v * inv);
        }
        return plain(amax / 127.0);
    }
    // e = −⌊log2 amax⌋ ∈ [65, 149], so amax·2^e ∈ [1, 2); 2^e = 2⁶⁴·2^(e−64), both f32, and
    // every product below is exact (a power of two, no overflow, normal results).
    let bits = amax.to_bits();
    let floor_log2 = if bits >> 23 != 0 {
        (bits >> 23) as i32 - 127
    } else {
        -149 + 31 - bits.leading_zeros() as i32
    };
    let e = -floor_log2;
    let (lo, hi) = (pow2(64), pow2(e - 64));
    let amax_s = amax * lo * hi;
    let inv = 127.0 / amax_s;
    for (q, &v) in body.iter_mut().zip(x) {
        *q = to_i8(v * lo * hi * inv);
    }
    RowScale {
        scale: amax_s / 127.0,
        exp2: -e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn to_i8_is_round_ties_even_then_clamp() {
        let reference = |v: f32| v.round_ties_even().clamp(-127.0, 127.0) as i8;
        let mut v = -140.0f32;
        while v <= 140.0 {
            assert_eq!(to_i8(v), reference(v), "{v}");
            v += 0.0625;
        }
        for v in [
            0.5f32,
            -0.5,
            126.5,
            -126.5,
            127.49,
            -127.5,
            127.000_01,
            1e-30,
            -1e-30,
            0.499_999_97,
            1e6,
            -1e6,
        ] {
            assert_eq!(to_i8(v), reference(v), "{v}");
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

    #[test]
    fn tiny_rows_keep_int8_resolution_through_the_output() {
        let mut rng = crate::testutil::Rng::new(2);
        for magnitude in [1e-40f32, 3e-45, 1e-30, 2e-20] {
            let x: Vec<f32> = (0..64)
                .map(|_| rng.uniform(-1.0, 1.0) * magnitude)
                .collect();
            // The same row scaled by 2¹⁰⁰ takes the ordinary path: same quants, same scale up
            // to that power of two.
            let big: Vec<f32> = x
                .iter()
                .map(|&v| v * 2f32.powi(50) * 2f32.powi(50))
                .collect();
            let (mut q, mut qb) = (vec![0i8; 64], vec![0i8; 64]);
            let rs = quantize_row_scaled(&x, &mut q);
            let rb = quantize_row_scaled(&big, &mut qb);
            assert_eq!(q, qb, "{magnitude:e}");
            assert_eq!(rb.exp2, 0);
            assert!((-149..=-64).contains(&rs.exp2) && rs.scale >= 2f32.powi(-7));
            assert_eq!(rs.scale, rb.scale * pow2(-rs.exp2 - 100), "{magnitude:e}");
            // One output: int32 12345 in a channel of scale 0.06 (a Q4 weight row's s_n).
            let exact = 12345.0 * (rb.scale as f64 / 2f64.powi(100)) * 0.06f32 as f64;
            let rel = |v: f32| ((v as f64 - exact) / exact).abs();
            let ulp = 2f64.powi(-149) / exact; // the output's own resolution when subnormal
            assert!(
                rel(rs.output(12345, 0.06)) <= 2.0 * 2f64.powi(-24) + ulp,
                "{magnitude:e}"
            );
            if magnitude <= 1e-40 {
                // The folded scale in the scatter's expression: a few significant bits left.
                let folded = 12345.0 * (rs.folded() * 0.06);
                assert!(rel(folded) > 1e-3, "{magnitude:e}: {}", rel(folded));
            }
        }
    }
}
