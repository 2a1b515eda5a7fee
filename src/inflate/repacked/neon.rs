//! The interleave transposes with Advanced SIMD (part of every aarch64 CPU), for every aarch64
//! kernel path; the same steps as the x86 version (`zip1`/`zip2` are SSE2's unpacks). Zips only
//! move bytes, so the result is [`super::Scalar`]'s exactly.

use super::{halves_checked_once, Chunks, Scalar, Span};
use crate::quant::K_SCALE_SIZE;
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

    #[inline(always)]
    fn q4k_scales(packings: &[u8; 8 * K_SCALE_SIZE], out: &mut [u8], row_bytes: usize) {
        assert!(
            out.len() >= 7 * row_bytes + K_SCALE_SIZE,
            "eight rows of scales"
        );
        // SAFETY: Advanced SIMD is part of every aarch64 CPU; `out` holds the eight rows' 12
        // bytes (asserted above).
        unsafe { q4k_scales(packings, out, row_bytes) }
    }
}

/// [`Chunks::q4k_scales`] four packings (or rows) per vector, one per 32-bit lane: each
/// packing's words decoded into its rows' 6-bit scales and mins (the word operations of
/// `q4k_scales_mins`, lane by lane), a 4×4 byte transpose per vector turns packings into rows,
/// and the encoding of `q4k_pack` runs on the rows' lanes. Byte moves and masks only, so the
/// bytes are the reference's.
///
/// # Safety
/// `out` holds eight rows' 12 bytes `row_bytes` apart (at least `7·row_bytes + 12` bytes).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn q4k_scales(packings: &[u8; 8 * K_SCALE_SIZE], out: &mut [u8], row_bytes: usize) {
    // Lane `s` of `transposed(v)` holds byte `s` of every lane of `v`.
    const TRANSPOSE: [u8; 16] = [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15];
    // SAFETY: `TRANSPOSE` is 16 readable bytes.
    let transpose = unsafe { vld1q_u8(TRANSPOSE.as_ptr()) };
    let transposed = |v: uint32x4_t| vqtbl1q_u8(vreinterpretq_u8_u32(v), transpose);
    let (low6, low4, top2) = (
        vdupq_n_u32(0x3f3f_3f3f),
        vdupq_n_u32(0x0f0f_0f0f),
        vdupq_n_u32(0x0303_0303),
    );
    // Per half (packings 0..4 for sub-blocks 0..4, 4..8 for 4..8): rows 0..4 and 4..8 of the
    // scales and of the mins, each as [row r's four sub-blocks] per lane after the transpose.
    let half = |at: usize| {
        // SAFETY: `at + 48 <= 96` bytes of `packings`; vld3 reads 48 bytes, one packing per lane.
        let w = unsafe { vld3q_u32(packings.as_ptr().add(at).cast()) };
        let (w0, w1, w2) = (w.0, w.1, w.2);
        let high = |w: uint32x4_t| vshlq_n_u32::<4>(vandq_u32(vshrq_n_u32::<6>(w), top2));
        [
            vandq_u32(w0, low6),
            vorrq_u32(vandq_u32(w2, low4), high(w0)),
            vandq_u32(w1, low6),
            vorrq_u32(vandq_u32(vshrq_n_u32::<4>(w2), low4), high(w1)),
        ]
        .map(transposed)
    };
    let ([s03, s47, m03, m47], [t03, t47, n03, n47]) = (half(0), half(48));
    // Rows r0..r0+4: sub-blocks 0..4 (`a`) keep six bits plus the top two of 4..8 (`b`); the
    // last word holds 4..8's low nibbles (scale | min << 4).
    let encode = |a: uint8x16_t, b: uint8x16_t, am: uint8x16_t, bm: uint8x16_t| {
        uint32x4x3_t(
            vreinterpretq_u32_u8(vorrq_u8(a, vshlq_n_u8::<6>(vshrq_n_u8::<4>(b)))),
            vreinterpretq_u32_u8(vorrq_u8(am, vshlq_n_u8::<6>(vshrq_n_u8::<4>(bm)))),
            vreinterpretq_u32_u8(vorrq_u8(vandq_u8(b, vdupq_n_u8(0x0f)), vshlq_n_u8::<4>(bm))),
        )
    };
    let base = out.as_mut_ptr();
    let store = |r0: usize, words: uint32x4x3_t| {
        // SAFETY: row `r0 + j < 8` has 12 bytes at `at(j)` (the caller's promise); each store
        // writes lane `j` of the three words, 12 bytes.
        unsafe {
            let at = |j: usize| base.add((r0 + j) * row_bytes).cast::<u32>();
            vst3q_lane_u32::<0>(at(0), words);
            vst3q_lane_u32::<1>(at(1), words);
            vst3q_lane_u32::<2>(at(2), words);
            vst3q_lane_u32::<3>(at(3), words);
        }
    };
    store(0, encode(s03, t03, m03, n03));
    store(4, encode(s47, t47, m47, n47));
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
