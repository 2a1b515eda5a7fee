//! Row-level reference dequantization.

use super::blocks::*;
use super::codebooks::*;
use super::kquants::*;
use super::nonlinear::*;
use super::{GgmlType, QuantError};

/// Dequantizes one row of `B` blocks (`bytes`) into `out` (`out.len()` weights).
pub fn dequantize_blocks<B: Block>(bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let n_blocks = check_row(B::TYPE, bytes.len(), out.len())?;
    for i in 0..n_blocks {
        B::read(&bytes[i * B::BYTES..]).dequantize(&mut out[i * B::ELEMS..(i + 1) * B::ELEMS]);
    }
    Ok(())
}

/// Dequantizes one row of `k = out.len()` weights of type `ty` stored in `bytes`.
/// F32 and F16 rows are converted too, so callers can treat every weight type alike.
pub fn dequantize_row(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    match ty {
        GgmlType::F32 => {
            check_row(ty, bytes.len(), out.len())?;
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes(b.try_into().expect("4 bytes"));
            }
            Ok(())
        }
        GgmlType::F16 => {
            check_row(ty, bytes.len(), out.len())?;
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = super::fp16::f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
            Ok(())
        }
        GgmlType::Q4_0 => dequantize_blocks::<BlockQ4_0>(bytes, out),
        GgmlType::Q4_1 => dequantize_blocks::<BlockQ4_1>(bytes, out),
        GgmlType::Q5_0 => dequantize_blocks::<BlockQ5_0>(bytes, out),
        GgmlType::Q8_0 => dequantize_blocks::<BlockQ8_0>(bytes, out),
        GgmlType::Q4_K => dequantize_blocks::<BlockQ4K>(bytes, out),
        GgmlType::Q6_K => dequantize_blocks::<BlockQ6K>(bytes, out),
        GgmlType::Q5_1 => dequantize_blocks::<BlockQ5_1>(bytes, out),
        GgmlType::Q2_K => dequantize_blocks::<BlockQ2K>(bytes, out),
        GgmlType::Q3_K => dequantize_blocks::<BlockQ3K>(bytes, out),
        GgmlType::Q5_K => dequantize_blocks::<BlockQ5K>(bytes, out),
        GgmlType::IQ2_XXS => dequantize_blocks::<BlockIq2Xxs>(bytes, out),
        GgmlType::IQ2_XS => dequantize_blocks::<BlockIq2Xs>(bytes, out),
        GgmlType::IQ2_S => dequantize_blocks::<BlockIq2S>(bytes, out),
        GgmlType::IQ3_XXS => dequantize_blocks::<BlockIq3Xxs>(bytes, out),
        GgmlType::IQ3_S => dequantize_blocks::<BlockIq3S>(bytes, out),
        GgmlType::IQ1_S => dequantize_blocks::<BlockIq1S>(bytes, out),
        GgmlType::IQ1_M => dequantize_blocks::<BlockIq1M>(bytes, out),
        GgmlType::IQ4_NL => dequantize_blocks::<BlockIq4Nl>(bytes, out),
        GgmlType::IQ4_XS => dequantize_blocks::<BlockIq4Xs>(bytes, out),
        GgmlType::MXFP4 => dequantize_blocks::<BlockMxfp4>(bytes, out),
    }
}

/// Weight `i` of one block of `ty` (`block` at least one block long, `i < ty.block_elems()`),
/// with the same operations as [`dequantize_row`], so the same bits: for the types the engine
/// takes ([`GgmlType::QUANTIZED`]) one weight without dequantizing the whole block (a few
/// operations instead of 32 or 256); the others dequantize the block and pick the weight.
#[inline]
pub fn dequantize_element(ty: GgmlType, block: &[u8], i: usize) -> f32 {
    let half = |at: usize| super::fp16::f16_to_f32(u16::from_le_bytes([block[at], block[at + 1]]));
    match ty {
        GgmlType::F32 => f32::from_le_bytes([block[0], block[1], block[2], block[3]]),
        GgmlType::F16 => half(0),
        GgmlType::Q4_0 => {
            let q = block[2 + i % 16];
            let c = if i < 16 { q & 0x0f } else { q >> 4 } as i32 - 8;
            c as f32 * half(0)
        }
        GgmlType::Q4_1 => {
            let q = block[4 + i % 16];
            let c = if i < 16 { q & 0x0f } else { q >> 4 } as i32;
            c as f32 * half(0) + half(2)
        }
        GgmlType::Q5_0 => {
            let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
            let q = block[6 + i % 16] as u32;
            let lo = if i < 16 { q & 0x0f } else { q >> 4 };
            let c = (lo | (((qh >> i) & 1) << 4)) as i32 - 16;
            c as f32 * half(0)
        }
        GgmlType::Q8_0 => block[2 + i] as i8 as f32 * half(0),
        GgmlType::Q4_K => {
            let (chunk, l) = (i / 64, i % 64);
            let scales: &[u8; K_SCALE_SIZE] = block[4..16].try_into().expect("12 bytes");
            let (sc, m) = q4k_scale_min(2 * chunk + l / 32, scales);
            let q = block[16 + chunk * 32 + l % 32];
            let c = if l < 32 { q & 0x0f } else { q >> 4 };
            half(0) * sc as f32 * c as f32 - half(2) * m as f32
        }
        GgmlType::Q6_K => {
            let (h, j) = (i / 128, i % 128);
            let (quarter, l) = (j / 32, j % 32);
            let ql = block[h * 64 + l + 32 * (quarter % 2)];
            let lo = if quarter < 2 { ql & 0x0f } else { ql >> 4 };
            let hi = (block[128 + h * 32 + l] >> (2 * quarter)) & 3;
            let c = (lo | (hi << 4)) as i32 - 32;
            let sc = block[192 + h * 8 + l / 16 + 2 * quarter] as i8;
            half(208) * sc as f32 * c as f32
        }
        _ => {
            let mut weights = [0f32; QK_K];
            let weights = &mut weights[..ty.block_elems()];
            dequantize_row(ty, &block[..ty.block_bytes()], weights).expect("one whole block");
            weights[i]
        }
    }
}

/// Checks that `n_bytes` holds exactly a row of `k` weights of `ty`; returns the block count.
pub fn check_row(ty: GgmlType, n_bytes: usize, k: usize) -> Result<usize, QuantError> {
    let expected = ty
        .row_bytes(k)
        .ok_or(QuantError::RowNotWholeBlocks { ty, k })?;
    if n_bytes != expected {
        return Err(QuantError::WrongByteLength {
            expected,
            got: n_bytes,
        });
    }
    Ok(k / ty.block_elems())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::fp16::f32_to_f16;

    #[test]
    fn q4_0_by_hand() {
        let mut qs = [0u8; 16];
        qs[0] = 0xf0; // weight 0 = 0 - 8, weight 16 = 15 - 8
        qs[1] = 0x98;
        let blk = BlockQ4_0 {
            d: f32_to_f16(0.5).to_le_bytes(),
            qs,
        };
        let mut y = [0f32; 32];
        blk.dequantize(&mut y);
        assert_eq!(
            (y[0], y[16], y[1], y[17], y[2]),
            (-4.0, 3.5, 0.0, 0.5, -4.0)
        );
    }

    #[test]
    fn q4k_scale_min_unpacks_high_bits() {
        let mut s = [0u8; 12];
        s[0] = 0xc0 | 5; // sc[0] = 5, high bits of sc[4] = 3
        s[4] = 0x80 | 7; // m[0] = 7, high bits of m[4] = 2
        s[8] = 0x9a; // low nibble of sc[4] = 0xa, of m[4] = 0x9
        assert_eq!(q4k_scale_min(0, &s), (5, 7));
        assert_eq!(q4k_scale_min(4, &s), (0x3a, 0x29));
    }

    #[test]
    fn dequantize_element_is_dequantize_row_bit_for_bit() {
        let mut rng = crate::testutil::Rng::new(12);
        for ty in GgmlType::QUANTIZED.into_iter().chain(GgmlType::SCALAR_ONLY) {
            let k = 2 * ty.block_elems();
            let bytes = rng.blocks(ty, 2, 0.05);
            let mut row = vec![0f32; k];
            dequantize_row(ty, &bytes, &mut row).unwrap();
            for i in 0..k {
                let b = &bytes[i / ty.block_elems() * ty.block_bytes()..];
                let e = dequantize_element(ty, b, i % ty.block_elems());
                assert_eq!(e.to_bits(), row[i].to_bits(), "{} weight {i}", ty.name());
            }
        }
    }

    #[test]
    fn row_length_errors() {
        let mut out = [0f32; 40];
        assert_eq!(
            dequantize_row(GgmlType::Q4_0, &[0u8; 18], &mut out),
            Err(QuantError::RowNotWholeBlocks {
                ty: GgmlType::Q4_0,
                k: 40
            })
        );
        assert_eq!(
            dequantize_row(GgmlType::Q4_0, &[0u8; 17], &mut out[..32]),
            Err(QuantError::WrongByteLength {
                expected: 18,
                got: 17
            })
        );
    }
}
