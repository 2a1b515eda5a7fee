//! Row-level reference dequantization.

use super::blocks::*;
use super::codebooks::*;
use super::grids::{IQ1S_DELTA, KVALUES_IQ4NL, KVALUES_MXFP4};
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
/// with the same operations as [`dequantize_row`], so the same bits: one weight without
/// dequantizing the whole block (a few operations instead of 32 or 256).
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
        GgmlType::Q5_1 => {
            let qh = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
            let q = block[8 + i % 16] as u32;
            let lo = if i < 16 { q & 0x0f } else { q >> 4 };
            (lo | ((qh >> i) & 1) << 4) as f32 * half(0) + half(2)
        }
        GgmlType::Q5_K => {
            let (chunk, l) = (i / 64, i % 64);
            let scales: &[u8; K_SCALE_SIZE] = block[4..16].try_into().expect("12 bytes");
            let (sc, m) = q4k_scale_min(2 * chunk + l / 32, scales);
            let q = block[48 + chunk * 32 + l % 32];
            let lo = if l < 32 { q & 0x0f } else { q >> 4 };
            let hi = if block[16 + l % 32] & (1 << (2 * chunk + l / 32)) != 0 {
                16
            } else {
                0
            };
            half(0) * sc as f32 * (lo + hi) as f32 - half(2) * m as f32
        }
        GgmlType::Q2_K => {
            let sc = block[i / 16];
            let q = (block[16 + 32 * (i / 128) + i % 32] >> (2 * (i % 128 / 32))) & 3;
            half(80) * (sc & 0x0f) as f32 * q as f32 - half(82) * (sc >> 4) as f32
        }
        GgmlType::Q3_K => {
            let (n, j) = (i / 128, i % 128 / 32);
            let q = ((block[32 + 32 * n + i % 32] >> (2 * j)) & 3) as i32;
            let high = block[i % 32] & (1 << (4 * n + j)) != 0;
            let c = q - if high { 0 } else { 4 };
            let scales = q3k_scales(block[96..108].try_into().expect("12 bytes"));
            half(108) * scales[i / 16] as f32 * c as f32
        }
        GgmlType::IQ4_NL => {
            let q = block[2 + i % 16];
            let q = if i < 16 { q & 0x0f } else { q >> 4 };
            half(0) * KVALUES_IQ4NL[q as usize] as f32
        }
        GgmlType::IQ4_XS => {
            let (ib, j) = (i / 32, i % 32);
            let ls = iq4xs_scale(ib, [block[2], block[3]], block[4..8].try_into().expect("4"));
            let q = block[8 + 16 * ib + j % 16];
            let q = if j < 16 { q & 0x0f } else { q >> 4 };
            half(0) * (ls - 32) as f32 * KVALUES_IQ4NL[q as usize] as f32
        }
        GgmlType::MXFP4 => {
            let q = block[1 + i % 16];
            let q = if i < 16 { q & 0x0f } else { q >> 4 };
            KVALUES_MXFP4[q as usize] as f32 * e8m0_to_f32_half(block[0])
        }
        GgmlType::IQ2_XXS
        | GgmlType::IQ2_XS
        | GgmlType::IQ2_S
        | GgmlType::IQ3_XXS
        | GgmlType::IQ3_S
        | GgmlType::IQ1_S
        | GgmlType::IQ1_M => codebook_element(ty, block, i),
    }
}

/// [`dequantize_element`] of the codebook types: the weight's group and its sub-block's scale
/// through the blocks' accessors, with ggml's products in ggml's order.
fn codebook_element(ty: GgmlType, block: &[u8], i: usize) -> f32 {
    let (ib, l, j) = (i / 32, i % 32 / 8, i % 8);
    let signed = |db: f32, (grid, signs): ([u8; 8], u8)| {
        db * grid[j] as f32 * if signs & (1 << j) != 0 { -1.0 } else { 1.0 }
    };
    let half = |h: [u8; 2]| super::fp16::f16_to_f32(u16::from_le_bytes(h));
    let nibble = |sc: u8| if l < 2 { sc & 0x0f } else { sc >> 4 };
    match ty {
        GgmlType::IQ2_XXS => {
            let b = BlockIq2Xxs::read(block);
            signed(
                half(b.d) * (0.5 + b.scale(ib) as f32) * 0.25,
                b.group(ib, l),
            )
        }
        GgmlType::IQ2_XS => {
            let b = BlockIq2Xs::read(block);
            let db = half(b.d) * (0.5 + nibble(b.scales[ib]) as f32) * 0.25;
            signed(db, b.group(ib, l))
        }
        GgmlType::IQ2_S => {
            let b = BlockIq2S::read(block);
            let db = half(b.d) * (0.5 + nibble(b.scales[ib]) as f32) * 0.25;
            signed(db, b.group(ib, l))
        }
        GgmlType::IQ3_XXS => {
            let b = BlockIq3Xxs::read(block);
            signed(half(b.d) * (0.5 + b.scale(ib) as f32) * 0.5, b.group(ib, l))
        }
        GgmlType::IQ3_S => {
            let b = BlockIq3S::read(block);
            signed(half(b.d) * (1 + 2 * b.scale(ib)) as f32, b.group(ib, l))
        }
        GgmlType::IQ1_S => {
            let b = BlockIq1S::read(block);
            let (scale, negative) = b.scale(ib);
            let delta = if negative { -IQ1S_DELTA } else { IQ1S_DELTA };
            half(b.d) * (2 * scale + 1) as f32 * (b.group(ib, l)[j] as f32 + delta)
        }
        GgmlType::IQ1_M => {
            let b = BlockIq1M::read(block);
            let d = super::fp16::f16_to_f32(iq1m_scale(&b.scales));
            let (grid, negative) = b.group(ib, l);
            let delta = if negative { -IQ1S_DELTA } else { IQ1S_DELTA };
            d * (2 * b.scale(ib, l / 2) + 1) as f32 * (grid[j] as f32 + delta)
        }
        _ => unreachable!("a codebook type"),
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
        for ty in GgmlType::QUANTIZED {
            let k = 24 * ty.block_elems();
            let bytes = rng.blocks(ty, 24, 0.05);
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
