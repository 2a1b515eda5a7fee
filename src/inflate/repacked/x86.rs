//! The interleave transposes with SSE2 (part of every x86-64 CPU), for every x86 kernel path: each
//! step loads `R` vectors of 16 bytes and stores 16 bytes of each of the `R` rows. Unpack
//! instructions only move bytes, so the result is [`super::Scalar`]'s exactly.

use super::{halves_checked_once, Chunks, Scalar, Span};
use crate::quant::K_SCALE_SIZE;
use std::arch::x86_64::*;

pub(super) struct Sse2;

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

    #[inline(always)]
    fn q4k_scales(packings: &[u8; 8 * K_SCALE_SIZE], out: &mut [u8], row_bytes: usize) {
        assert!(
            out.len() >= 7 * row_bytes + K_SCALE_SIZE,
            "eight rows of scales"
        );
        if is_x86_feature_detected!("ssse3") {
            // SAFETY: SSSE3 was just detected; `out` holds the eight rows' 12 bytes (asserted).
            unsafe { q4k_scales(packings, out, row_bytes) }
        } else {
            Scalar::q4k_scales(packings, out, row_bytes)
        }
    }
}

/// [`Chunks::q4k_scales`] four packings (or rows) per vector, one per 32-bit lane, as the
/// aarch64 version (`neon.rs`): each packing's words decoded into its rows' 6-bit scales and
/// mins, one `pshufb` per vector to turn packings into rows, then `q4k_pack`'s encoding on the
/// rows' lanes. Byte moves and masks only, so the bytes are the reference's.
///
/// # Safety
/// The CPU has SSSE3, and `out` holds eight rows' 12 bytes `row_bytes` apart (at least
/// `7·row_bytes + 12` bytes).
#[inline]
#[target_feature(enable = "ssse3")]
unsafe fn q4k_scales(packings: &[u8; 8 * K_SCALE_SIZE], out: &mut [u8], row_bytes: usize) {
    // Lane `s` of `transposed(v)` holds byte `s` of every lane of `v`.
    let transpose = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    let transposed = |v: __m128i| _mm_shuffle_epi8(v, transpose);
    let mask = |m: i32| _mm_set1_epi32(m);
    let (low6, low4, top2) = (mask(0x3f3f_3f3f), mask(0x0f0f_0f0f), mask(0x0303_0303));
    let half = |at: usize| {
        // Word `k` (bytes 4k..4k + 4) of the four packings from `at`, one packing per lane.
        let word = |k: usize| {
            let d = |p: usize| {
                let from = at + p * K_SCALE_SIZE + 4 * k;
                i32::from_le_bytes(packings[from..from + 4].try_into().expect("4 bytes"))
            };
            _mm_setr_epi32(d(0), d(1), d(2), d(3))
        };
        let (w0, w1, w2) = (word(0), word(1), word(2));
        let high = |w: __m128i| _mm_slli_epi32::<4>(_mm_and_si128(_mm_srli_epi32::<6>(w), top2));
        [
            _mm_and_si128(w0, low6),
            _mm_or_si128(_mm_and_si128(w2, low4), high(w0)),
            _mm_and_si128(w1, low6),
            _mm_or_si128(_mm_and_si128(_mm_srli_epi32::<4>(w2), low4), high(w1)),
        ]
        .map(transposed)
    };
    let ([s03, s47, m03, m47], [t03, t47, n03, n47]) = (half(0), half(48));
    // Byte-wise shifts from 32-bit ones and masks (SSE has no 8-bit shifts).
    let top_of = |b: __m128i| _mm_and_si128(_mm_slli_epi32::<2>(b), mask(0xc0c0_c0c0_u32 as i32));
    let low_of = |b: __m128i| _mm_and_si128(b, mask(0x0f0f_0f0f));
    let nibble_up =
        |b: __m128i| _mm_and_si128(_mm_slli_epi32::<4>(b), mask(0xf0f0_f0f0_u32 as i32));
    let base = out.as_mut_ptr();
    let store = |r0: usize, a: __m128i, b: __m128i, am: __m128i, bm: __m128i| {
        // Sub-blocks 0..4 keep six bits plus the top two of 4..8; the last word holds 4..8's low
        // nibbles (scale | min << 4).
        let w0 = _mm_or_si128(a, top_of(b));
        let w1 = _mm_or_si128(am, top_of(bm));
        let w2 = _mm_or_si128(low_of(b), nibble_up(bm));
        let (lo, hi) = (_mm_unpacklo_epi32(w0, w1), _mm_unpackhi_epi32(w0, w1));
        let thirds = [
            w2,
            _mm_srli_si128::<4>(w2),
            _mm_srli_si128::<8>(w2),
            _mm_srli_si128::<12>(w2),
        ];
        let pairs = [lo, _mm_srli_si128::<8>(lo), hi, _mm_srli_si128::<8>(hi)];
        for (j, (pair, third)) in pairs.into_iter().zip(thirds).enumerate() {
            // SAFETY: row `r0 + j < 8` has 12 bytes at `at` (the caller's promise): 8 + 4
            // bytes, unaligned.
            unsafe {
                let at = base.add((r0 + j) * row_bytes);
                _mm_storel_epi64(at.cast(), pair);
                at.add(8)
                    .cast::<i32>()
                    .write_unaligned(_mm_cvtsi128_si32(third));
            }
        }
    };
    store(0, s03, t03, m03, n03);
    store(4, s47, t47, m47, n47);
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
