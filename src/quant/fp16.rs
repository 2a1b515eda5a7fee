//! IEEE-754 binary16 <-> binary32, bit-exact, without relying on F16C or Rust's unstable `f16`.
//!
//! Every binary16 value is exactly representable in binary32, so [`f16_to_f32`] is exact for all
//! inputs, subnormals, infinities and NaNs included (NaN payloads are kept, shifted into place).

/// Converts the binary16 bit pattern `h` to f32 exactly.
#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let mant = (h & 0x03ff) as u32;
    let bits = match (exp, mant) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal: value = mant * 2^-24; normalise it for binary32.
            let shift = mant.leading_zeros() - 21; // bring the top set bit to bit 10
            let mant_norm = (mant << shift) & 0x03ff;
            let exp32 = 127 - 15 + 1 - shift;
            sign | (exp32 << 23) | (mant_norm << 13)
        }
        (0x1f, _) => sign | 0x7f80_0000 | (mant << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (mant << 13),
    };
    f32::from_bits(bits)
}

/// Converts `x` to the nearest binary16 (ties to even), saturating to infinity on overflow and
/// keeping NaN a (quiet) NaN. Used to build test blocks and by quantizers.
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let mant = bits & 0x007f_ffff;
    if exp == 0xff {
        return sign
            | 0x7c00
            | if mant != 0 {
                0x0200 | (mant >> 13) as u16
            } else {
                0
            };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        // Result is subnormal (or zero): shift the full significand right with round-to-even.
        if e < -10 {
            return sign;
        }
        let full = mant | 0x0080_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rem = full & ((1u32 << shift) - 1);
        let mut out = full >> shift;
        if rem > half || (rem == half && (out & 1) == 1) {
            out += 1;
        }
        return sign | out as u16;
    }
    let mut out = ((e as u32) << 10) | (mant >> 13);
    let rem = mant & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && (out & 1) == 1) {
        out += 1; // may carry into the exponent, which is exactly right (up to infinity)
    }
    sign | out as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_finite_half_round_trips() {
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            if f.is_nan() {
                assert!(f32_to_f16(f) & 0x7c00 == 0x7c00 && f32_to_f16(f) & 0x03ff != 0);
                continue;
            }
            assert_eq!(f32_to_f16(f), h, "half {h:#06x} -> {f:e}");
        }
    }

    #[test]
    fn known_values() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x03ff), 1023.0 * 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert_eq!(f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(f32_to_f16(65520.0), 0x7c00); // rounds up past the largest finite half
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3c00); // tie to even
        assert_eq!(f32_to_f16(2f32.powi(-25)), 0x0000); // tie to even, down to zero
        assert_eq!(f32_to_f16(2f32.powi(-25) * 1.5), 0x0001);
    }
}
