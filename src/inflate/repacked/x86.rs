//! The interleave transposes with SSE2 (part of every x86-64 CPU), for every x86 kernel path: each
//! step loads `R` vectors of 16 bytes and stores 16 bytes of each of the `R` rows. Unpack
//! instructions only move bytes, so the result is [`super::Scalar`]'s exactly.

use super::{halves_checked_once, Chunks, Scalar, Span};
use std::arch::x86_64::*;

pub(super) struct Sse2;

/// [`super::prefetch`]: every cache line of `bytes`, into all levels.
#[inline]
pub(super) fn prefetch(bytes: &[u8]) {
    for line in bytes.chunks(64) {
        // SAFETY: a prefetch is a hint that never faults and changes nothing a program can observe;
        // SSE is part of every x86-64 CPU.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) }
    }
}

impl Chunks for Sse2 {
    #[inline(always)]
    fn untangle<const R: usize, const C: usize>(src: &[u8], out: &mut [u8], span: &Span) {
        if (C >= 4 && span.len.is_multiple_of(16)) || (R, C, span.len) == (8, 1, 16) {
            // SAFETY: SSE2 is part of every x86-64 CPU (the target's baseline); the attribute only
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
#[target_feature(enable = "sse2")]
fn transpose<const R: usize, const C: usize>(src: &[u8], out: &mut [u8], span: &Span) {
    let (src_end, out_end) = span.ends(R);
    assert!(
        src.len() >= src_end && out.len() >= out_end,
        "the span lies inside the group"
    );
    let flip = _mm_set1_epi8(span.flip as i8);
    for x in 0..span.blocks {
        for step in 0..span.len / 16 {
            let v: [__m128i; R] = std::array::from_fn(|i| {
                let from = x * span.packed_block + span.packed + (step * R + i) * 16;
                // SAFETY: `from + 16 <= src_end <= src.len()` (asserted above); unaligned load.
                let x = unsafe { _mm_loadu_si128(src.as_ptr().add(from).cast()) };
                _mm_xor_si128(x, flip)
            });
            let mut put = |j: usize, row: __m128i| {
                let to = j * span.row_bytes + x * span.block_bytes + span.plain + step * 16;
                // SAFETY: `to + 16 <= out_end <= out.len()` (asserted above); unaligned store.
                unsafe { _mm_storeu_si128(out.as_mut_ptr().add(to).cast(), row) };
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
                        put(2 * m, _mm_unpacklo_epi64(v[m], v[m + R / 2]));
                        put(2 * m + 1, _mm_unpackhi_epi64(v[m], v[m + R / 2]));
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

/// The 4×4 transpose of 32-bit lanes: result `j` holds lane `j` of `a`, `b`, `c`, `d`.
#[inline]
#[target_feature(enable = "sse2")]
fn transpose4x4(a: __m128i, b: __m128i, c: __m128i, d: __m128i) -> [__m128i; 4] {
    let (ab0, ab1) = (_mm_unpacklo_epi32(a, b), _mm_unpackhi_epi32(a, b));
    let (cd0, cd1) = (_mm_unpacklo_epi32(c, d), _mm_unpackhi_epi32(c, d));
    [
        _mm_unpacklo_epi64(ab0, cd0),
        _mm_unpackhi_epi64(ab0, cd0),
        _mm_unpacklo_epi64(ab1, cd1),
        _mm_unpackhi_epi64(ab1, cd1),
    ]
}

/// 16 one-byte chunks of 8 rows (vector `k` holds chunks `2k` and `2k + 1`, 8 bytes each) into
/// the 16 bytes of each row: pair each row's two chunks of a vector as a 16-bit lane, then
/// transpose the 8×8 16-bit lanes as two 4×4 transposes of 32-bit lane pairs.
#[inline]
#[target_feature(enable = "sse2")]
fn bytes8x16(v: &[__m128i]) -> [__m128i; 8] {
    let pairs: [__m128i; 8] =
        std::array::from_fn(|k| _mm_unpacklo_epi8(v[k], _mm_srli_si128(v[k], 8)));
    let lo = |m: usize| _mm_unpacklo_epi16(pairs[2 * m], pairs[2 * m + 1]);
    let hi = |m: usize| _mm_unpackhi_epi16(pairs[2 * m], pairs[2 * m + 1]);
    let rows0 = transpose4x4(lo(0), lo(1), lo(2), lo(3));
    let rows4 = transpose4x4(hi(0), hi(1), hi(2), hi(3));
    std::array::from_fn(|j| if j < 4 { rows0[j] } else { rows4[j - 4] })
}
