//! The types whose 4-bit codes index a table of 16 values: IQ4_NL and IQ4_XS (`kvalues_iq4nl`)
//! and MXFP4 (E2M1 values, doubled, with a power-of-two E8M0 block scale).

use super::blocks::{byte_block, half, Block, QK32, QK_K};
use super::grids::{KVALUES_IQ4NL, KVALUES_MXFP4};
use super::GgmlType;

byte_block! {
    /// `block_iq4_nl`: 32 weights `d * kvalues_iq4nl[q]`, low nibbles first (as Q4_0).
    BlockIq4Nl, 18 {
        d: 2,
        qs: QK32 / 2,
    }
}

byte_block! {
    /// `block_iq4_xs`: 256 weights in 8 sub-blocks of 32, `d*(ls[j] - 32) * kvalues_iq4nl[q]`
    /// with 6-bit `ls` (see [`iq4xs_scale`]).
    BlockIq4Xs, 136 {
        d: 2,
        scales_h: 2,
        scales_l: QK_K / 64,
        qs: QK_K / 2,
    }
}

byte_block! {
    /// `block_mxfp4`: 32 weights `kvalues_mxfp4[q] * 2^(e - 128)` (the E8M0 scale halved, since
    /// the values are doubled), low nibbles first.
    BlockMxfp4, 17 {
        e: 1,
        qs: QK32 / 2,
    }
}

/// Sub-block `ib` (0..8) of an IQ4_XS super-block: its 6-bit scale `ls` (`ls - 32` multiplies `d`).
#[inline]
pub fn iq4xs_scale(ib: usize, scales_h: [u8; 2], scales_l: &[u8; 4]) -> i32 {
    let high = (u16::from_le_bytes(scales_h) >> (2 * ib)) & 3;
    let low = (scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f;
    (low as u16 | (high << 4)) as i32
}

/// The largest E8M0 byte whose MXFP4 block ggml dequantizes to finite weights whatever its
/// codes: `12·2^(252 - 128)` fits f32, while 253 and 254 overflow to infinity for codes of
/// magnitude 8 and 4 and up, and 255 is NaN to ggml's row validation.
pub const MXFP4_E8M0_FINITE_MAX: u8 = 252;

/// ggml's `ggml_e8m0_to_fp32_half`: `2^(x - 128)` for an E8M0 byte `x` (255 included, which
/// ggml's row validation rejects as NaN but its dequantization maps to `2^127`).
#[inline]
pub fn e8m0_to_f32_half(x: u8) -> f32 {
    if x < 2 {
        // 2^-128 and 2^-127: subnormal.
        f32::from_bits(0x0020_0000 << x)
    } else {
        f32::from_bits((x as u32 - 1) << 23)
    }
}

impl Block for BlockIq4Nl {
    const TYPE: GgmlType = GgmlType::IQ4_NL;
    const ELEMS: usize = QK32;
    const BYTES: usize = 18;

    fn read(b: &[u8]) -> Self {
        Self::read_fields(b)
    }
    fn write(&self, out: &mut [u8]) {
        self.write_fields(out)
    }
    fn dequantize(&self, y: &mut [f32]) {
        let d = half(self.d);
        for j in 0..16 {
            y[j] = d * KVALUES_IQ4NL[(self.qs[j] & 0x0f) as usize] as f32;
            y[j + 16] = d * KVALUES_IQ4NL[(self.qs[j] >> 4) as usize] as f32;
        }
    }
}

impl Block for BlockIq4Xs {
    const TYPE: GgmlType = GgmlType::IQ4_XS;
    const ELEMS: usize = QK_K;
    const BYTES: usize = 136;

    fn read(b: &[u8]) -> Self {
        Self::read_fields(b)
    }
    fn write(&self, out: &mut [u8]) {
        self.write_fields(out)
    }
    fn dequantize(&self, y: &mut [f32]) {
        let d = half(self.d);
        for (ib, (qs, y)) in self
            .qs
            .chunks_exact(16)
            .zip(y.chunks_exact_mut(32))
            .enumerate()
        {
            let ls = iq4xs_scale(ib, self.scales_h, &self.scales_l);
            let dl = d * (ls - 32) as f32;
            for j in 0..16 {
                y[j] = dl * KVALUES_IQ4NL[(qs[j] & 0x0f) as usize] as f32;
                y[j + 16] = dl * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
            }
        }
    }
}

impl Block for BlockMxfp4 {
    const TYPE: GgmlType = GgmlType::MXFP4;
    const ELEMS: usize = QK32;
    const BYTES: usize = 17;

    fn read(b: &[u8]) -> Self {
        Self::read_fields(b)
    }
    fn write(&self, out: &mut [u8]) {
        self.write_fields(out)
    }
    fn dequantize(&self, y: &mut [f32]) {
        let d = e8m0_to_f32_half(self.e[0]);
        for j in 0..16 {
            y[j] = KVALUES_MXFP4[(self.qs[j] & 0x0f) as usize] as f32 * d;
            y[j + 16] = KVALUES_MXFP4[(self.qs[j] >> 4) as usize] as f32 * d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0_half_is_a_power_of_two_for_every_byte() {
        for x in 0..=255u8 {
            assert_eq!(e8m0_to_f32_half(x) as f64, 2f64.powi(x as i32 - 128), "{x}");
        }
    }
}
