//! The interleave transposes with Advanced SIMD (part of every aarch64 CPU), for every aarch64
//! kernel path; the same steps as the x86 version (`zip1`/`zip2` are SSE2's unpacks). Zips only
//! move bytes, so the result is [`super::Scalar`]'s exactly.

use super::{halves_checked_once, Chunks, Scalar, Span};
use std::arch::aarch64::*;

pub(super) struct Neon;

impl Chunks for Neon {
    #[inline(always)]
    fn untangle<const R: usize, const C: usize>(src: &[u8], out: &mut [u8], span: &Span) {
        if (C >= 4 && span.len.is_multiple_of(16)) || (R, C, span.len) == (8, 1, 16) {
            // SAFETY: Advanced SIMD is part of every aarch64 CPU (the target's baseline); the attribute only
            // lets the transpose use the intrinsics.
            unsafe { transpose::<R, C>(src, out, span) };
        } else if (C, span.len, span.flip) == (2, 2, 0) {
            halves_checked_once::<R>(src, out, span);
        } else {
            Scalar::untangle::<R, C>(src, out, span);
        }
    }
}

/// [`Chunks::untangle`] for 4- and 8-byte chunks (any multiple of 16 bytes per row) and for 16
/// one-byte chunks of 8 rows: per step, `R` vectors in, 16 bytes of every row out.
#[inline]
#[target_feature(enable = "neon")]
fn transpose<const R: usize, const C: usize>(src: &[u8], out: &mut [u8], span: &Span) {
    let (src_end, out_end) = span.ends(R);
    assert!(
        src.len() >= src_end && out.len() >= out_end,
        "the span lies inside the group"
    );
    let flip = vdupq_n_u8(span.flip);
    for x in 0..span.blocks {
        for step in 0..span.len / 16 {
            let v: [uint8x16_t; R] = std::array::from_fn(|i| {
                let from = x * span.packed_block + span.packed + (step * R + i) * 16;
                // SAFETY: `from + 16 <= src_end <= src.len()` (asserted above); unaligned load.
                let x = unsafe { vld1q_u8(src.as_ptr().add(from)) };
                veorq_u8(x, flip)
            });
            let mut put = |j: usize, row: uint8x16_t| {
                let to = j * span.row_bytes + x * span.block_bytes + span.plain + step * 16;
                // SAFETY: `to + 16 <= out_end <= out.len()` (asserted above); unaligned store.
                unsafe { vst1q_u8(out.as_mut_ptr().add(to), row) };
            };
            match C {
                // Vector i holds chunk i / (R/4) of rows 4·(i % (R/4))..+4.
                4 => {
                    for h in 0..R / 4 {
                        let q = R / 4;
                        let rows = transpose4x4(v[h], v[h + q], v[h + 2 * q], v[h + 3 * q]);
                        for (j, row) in rows.into_iter().enumerate() {
                            put(4 * h + j, row);
                        }
                    }
                }
                // Vector i holds chunk i / (R/2) of rows 2·(i % (R/2)), +1.
                8 => {
                    for m in 0..R / 2 {
                        let (a, b) = (u64s(v[m]), u64s(v[m + R / 2]));
                        put(2 * m, vreinterpretq_u8_u64(vzip1q_u64(a, b)));
                        put(2 * m + 1, vreinterpretq_u8_u64(vzip2q_u64(a, b)));
                    }
                }
                1 => {
                    for (j, row) in bytes8x16(&v[..8]).into_iter().enumerate() {
                        put(j, row);
                    }
                }
                _ => unreachable!("no SIMD transpose for {C}-byte chunks"),
            }
        }
    }
}

#[inline]
#[target_feature(enable = "neon")]
fn u64s(v: uint8x16_t) -> uint64x2_t {
    vreinterpretq_u64_u8(v)
}

/// The 4×4 transpose of 32-bit lanes: result `j` holds lane `j` of `a`, `b`, `c`, `d`.
#[inline]
#[target_feature(enable = "neon")]
fn transpose4x4(a: uint8x16_t, b: uint8x16_t, c: uint8x16_t, d: uint8x16_t) -> [uint8x16_t; 4] {
    let (a, b, c, d) = (
        vreinterpretq_u32_u8(a),
        vreinterpretq_u32_u8(b),
        vreinterpretq_u32_u8(c),
        vreinterpretq_u32_u8(d),
    );
    let (ab0, ab1) = (
        vreinterpretq_u64_u32(vzip1q_u32(a, b)),
        vreinterpretq_u64_u32(vzip2q_u32(a, b)),
    );
    let (cd0, cd1) = (
        vreinterpretq_u64_u32(vzip1q_u32(c, d)),
        vreinterpretq_u64_u32(vzip2q_u32(c, d)),
    );
    [
        vzip1q_u64(ab0, cd0),
        vzip2q_u64(ab0, cd0),
        vzip1q_u64(ab1, cd1),
        vzip2q_u64(ab1, cd1),
    ]
    .map(|v| vreinterpretq_u8_u64(v))
}

/// 16 one-byte chunks of 8 rows (vector `k` holds chunks `2k` and `2k + 1`, 8 bytes each) into
/// the 16 bytes of each row: pair each row's two chunks of a vector as a 16-bit lane, then
/// transpose the 8×8 16-bit lanes as two 4×4 transposes of 32-bit lane pairs.
#[inline]
#[target_feature(enable = "neon")]
fn bytes8x16(v: &[uint8x16_t]) -> [uint8x16_t; 8] {
    let pairs: [uint16x8_t; 8] =
        std::array::from_fn(|k| vreinterpretq_u16_u8(vzip1q_u8(v[k], vextq_u8(v[k], v[k], 8))));
    let lo = |m: usize| vreinterpretq_u8_u16(vzip1q_u16(pairs[2 * m], pairs[2 * m + 1]));
    let hi = |m: usize| vreinterpretq_u8_u16(vzip2q_u16(pairs[2 * m], pairs[2 * m + 1]));
    let rows0 = transpose4x4(lo(0), lo(1), lo(2), lo(3));
    let rows4 = transpose4x4(hi(0), hi(1), hi(2), hi(3));
    std::array::from_fn(|j| if j < 4 { rows0[j] } else { rows4[j - 4] })
}
