//! The set types' scan steps ([`SetOps`]) in explicit AVX2/F16C code, each equal bit for bit
//! to its definition (tested below): the same binary32 products, `vcvtph2ps` (exact, like
//! `finite_half_to_f32` on finite halves), `maxps` with the operands in `larger`'s order. The
//! AVX-512 path takes them too, but Q5_1's and Q5_K's, which are Q4_1's and Q4_K's steps with
//! other block sizes.

use super::super::params::{PlainOps, SetOps};
use super::load16;
use super::scan::{
    block_max, lane_max, q4_1_values_avx2, q4_1_values_avx512, q4_k_values_avx2,
    q4_k_values_avx512, store_pairs, OpsAvx2, OpsAvx512,
};
use std::arch::x86_64::*;

/// The steps both paths take from the AVX2 code. SAFETY (for each call): a value of either
/// type exists only where AVX2 and F16C are available (their constructors need them).
macro_rules! avx2_steps {
    () => {
        #[inline(always)]
        fn mxfp4_multipliers(self, x: &[u16], x_max: u8, m: &mut [i16]) {
            // SAFETY: see `avx2_steps`.
            unsafe { mxfp4_multipliers_avx2(x, x_max, m) }
        }

        #[inline(always)]
        fn q2_k_values(self, row: &[u8], ab: &mut [[f32; 2]]) -> (u16, u32) {
            // SAFETY: see `avx2_steps`.
            unsafe { q2_k_values_avx2(row, ab) }
        }

        #[inline(always)]
        fn q3_k_values(self, row: &[u8], e: &mut [f32]) -> (u16, u32) {
            // SAFETY: see `avx2_steps`.
            unsafe { q3_k_values_avx2(row, e) }
        }

        #[inline(always)]
        fn iq4_xs_values(self, row: &[u8], e: &mut [f32]) -> (u16, u32) {
            // SAFETY: see `avx2_steps`.
            unsafe { iq4_xs_values_avx2(row, e) }
        }
    };
}

impl SetOps for OpsAvx2 {
    #[inline(always)]
    fn q5_1_values(self, row: &[u8], ab: &mut [[f32; 2]]) -> (u16, u32) {
        // SAFETY: see `avx2_steps`.
        unsafe { q4_1_values_avx2::<24, 31>(row, ab) }
    }

    #[inline(always)]
    fn q5_k_values(self, row: &[u8], ab: &mut [[f32; 2]]) -> (u16, u32) {
        // SAFETY: see `avx2_steps`.
        unsafe { q4_k_values_avx2::<176, 31>(row, ab) }
    }

    avx2_steps!();
}

impl SetOps for OpsAvx512 {
    #[inline(always)]
    fn q5_1_values(self, row: &[u8], ab: &mut [[f32; 2]]) -> (u16, u32) {
        // SAFETY: an `OpsAvx512` exists only where the AVX-512 path is available.
        unsafe { q4_1_values_avx512::<24, 31>(row, ab) }
    }

    #[inline(always)]
    fn q5_k_values(self, row: &[u8], ab: &mut [[f32; 2]]) -> (u16, u32) {
        // SAFETY: as for `q5_1_values`.
        unsafe { q4_k_values_avx512::<176, 31>(row, ab) }
    }

    avx2_steps!();
}

/// The little-endian u16 at byte `at` of `blk`.
#[inline(always)]
fn u16_at(blk: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([blk[at], blk[at + 1]])
}

/// `h` (fp16 bits) as binary32 in every lane.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn splat_half(h: u16) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16(h as i16))
}

/// [`SetOps::q2_k_values`] a super-block at a time: its 16 scale bytes' low and high nibbles
/// widened to binary32 (exact), times `d` and `dmin`; `M_n` as a running lane maximum.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn q2_k_values_avx2(row: &[u8], ab: &mut [[f32; 2]]) -> (u16, u32) {
    let (sign, low) = (_mm256_set1_ps(-0.0), _mm_set1_epi8(15));
    let (mut largest, mut w_max) = (0, _mm256_setzero_ps());
    let blocks = row.as_chunks::<84>().0;
    for (ab, blk) in ab.as_chunks_mut::<16>().0.iter_mut().zip(blocks) {
        let (d, dmin) = (u16_at(blk, 80), u16_at(blk, 82));
        largest = largest.max(d & 0x7fff).max(dmin & 0x7fff);
        let (d, dmin) = (splat_half(d), splat_half(dmin));
        let sc = load16(blk);
        let (sc, mn) = (
            _mm_and_si128(sc, low),
            _mm_and_si128(_mm_srli_epi16::<4>(sc), low),
        );
        let widen = |x: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(x));
        let (first, second) = ab.split_at_mut(8);
        for (ab, (sc, mn)) in [first, second]
            .into_iter()
            .zip([(sc, mn), (_mm_srli_si128::<8>(sc), _mm_srli_si128::<8>(mn))])
        {
            let a = _mm256_mul_ps(d, widen(sc));
            let b = _mm256_xor_ps(_mm256_mul_ps(dmin, widen(mn)), sign);
            w_max = _mm256_max_ps(w_max, block_max::<3>(a, b));
            store_pairs(ab.try_into().expect("8 pairs"), a, b);
        }
    }
    (largest, lane_max(w_max))
}

/// `e = fl(d·c)` of eight signed bytes `c` (the low eight of `c`) into `e`; returns the
/// running maximum of `|e|` updated.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn scaled_sets(d: __m256, c: __m128i, e: &mut [f32], e_max: __m256) -> __m256 {
    let e8: &mut [f32; 8] = (&mut e[..8]).try_into().expect("8 sets");
    let x = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c)));
    // SAFETY: `e8` is 32 writable bytes; unaligned store.
    unsafe { _mm256_storeu_ps(e8.as_mut_ptr(), x) };
    _mm256_max_ps(e_max, _mm256_andnot_ps(_mm256_set1_ps(-0.0), x))
}

/// [`SetOps::q3_k_values`] a super-block at a time: the 16 six-bit scales unpacked by 32-bit
/// lane shifts of their words (low nibbles: bytes 0..8, shifted by 0 or 4; top bits: bytes
/// 8..12, shifted by 0, 2, 4, 6), less 32, widened to binary32 (exact), times `d`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn q3_k_values_avx2(row: &[u8], e: &mut [f32]) -> (u16, u32) {
    let (nibble, two) = (_mm_set1_epi8(15), _mm_set1_epi8(3));
    let (low_shift, high_shift) = (_mm_setr_epi32(0, 0, 4, 4), _mm_setr_epi32(0, 2, 4, 6));
    let (mut largest, mut e_max) = (0, _mm256_setzero_ps());
    let blocks = row.as_chunks::<110>().0;
    for (e, blk) in e.as_chunks_mut::<16>().0.iter_mut().zip(blocks) {
        let h = u16_at(blk, 108);
        largest = largest.max(h & 0x7fff);
        let d = splat_half(h);
        let words = u64::from_le_bytes(blk[96..104].try_into().expect("8 bytes"));
        let top = u32::from_le_bytes(blk[104..108].try_into().expect("4 bytes"));
        // Scale j: the low nibble of byte j % 8 shifted by 4·(j / 8), and bits 2·(j / 4) of
        // byte 8 + j % 4 as bits 4, 5.
        let low = _mm_srlv_epi32(_mm_set1_epi64x(words as i64), low_shift);
        let high = _mm_srlv_epi32(_mm_set1_epi32(top as i32), high_shift);
        let sc = _mm_or_si128(
            _mm_and_si128(low, nibble),
            _mm_slli_epi32::<4>(_mm_and_si128(high, two)),
        );
        let sc = _mm_sub_epi8(sc, _mm_set1_epi8(32));
        let (first, second) = e.split_at_mut(8);
        e_max = scaled_sets(d, sc, first, e_max);
        e_max = scaled_sets(d, _mm_srli_si128::<8>(sc), second, e_max);
    }
    (largest, lane_max(e_max))
}

/// [`SetOps::iq4_xs_values`] a super-block at a time: the eight six-bit scales by 32-bit lane
/// shifts of `scales_l` (by 4·j) and `scales_h` (by 2·j), less 32, as binary32, times `d`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn iq4_xs_values_avx2(row: &[u8], e: &mut [f32]) -> (u16, u32) {
    let (low_shift, high_shift) = (
        _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28),
        _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14),
    );
    let sign = _mm256_set1_ps(-0.0);
    let (mut largest, mut e_max) = (0, _mm256_setzero_ps());
    let blocks = row.as_chunks::<136>().0;
    for (e, blk) in e.as_chunks_mut::<8>().0.iter_mut().zip(blocks) {
        let h = u16_at(blk, 0);
        largest = largest.max(h & 0x7fff);
        let d = splat_half(h);
        let high = _mm256_set1_epi32(u16_at(blk, 2) as i32);
        let low = _mm256_set1_epi32(i32::from_le_bytes(blk[4..8].try_into().expect("4")));
        let low = _mm256_and_si256(_mm256_srlv_epi32(low, low_shift), _mm256_set1_epi32(15));
        let high = _mm256_and_si256(_mm256_srlv_epi32(high, high_shift), _mm256_set1_epi32(3));
        let ls = _mm256_or_si256(low, _mm256_slli_epi32::<4>(high));
        let ls = _mm256_sub_epi32(ls, _mm256_set1_epi32(32));
        let x = _mm256_mul_ps(d, _mm256_cvtepi32_ps(ls));
        // SAFETY: `e` is 32 writable bytes; unaligned store.
        unsafe { _mm256_storeu_ps(e.as_mut_ptr(), x) };
        e_max = _mm256_max_ps(e_max, _mm256_andnot_ps(sign, x));
    }
    (largest, lane_max(e_max))
}

/// [`SetOps::mxfp4_multipliers`] 16 at a time: `x_max - x_j`, saturated at 15 (whose
/// multiplier is 0, as every larger distance's), looks the low and high bytes of `2^(14 -
/// distance)` up in two tables. The last `len % 16` with the items before them, again (an
/// elementwise map); fewer than 16 as defined.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn mxfp4_multipliers_avx2(x: &[u16], x_max: u8, m: &mut [i16]) {
    let n = m.len().min(x.len());
    if n < 16 {
        return PlainOps.mxfp4_multipliers(x, x_max, m);
    }
    let power = |b: usize| if b <= 14 { 1u16 << (14 - b) } else { 0 };
    let (lo, hi): ([u8; 16], [u8; 16]) = (
        std::array::from_fn(|b| power(b) as u8),
        std::array::from_fn(|b| (power(b) >> 8) as u8),
    );
    let (lo, hi) = (load16(&lo), load16(&hi));
    let (top, fifteen) = (_mm_set1_epi8(x_max as i8), _mm_set1_epi8(15));
    let mut step = |at: usize| {
        let x: &[u16; 16] = x[at..at + 16].try_into().expect("16");
        let m: &mut [i16; 16] = (&mut m[at..at + 16]).try_into().expect("16");
        // SAFETY: `x` is 32 readable bytes; `m` 32 writable ones; unaligned.
        unsafe {
            let v = _mm256_loadu_si256(x.as_ptr().cast());
            // The exponents are bytes: the pack does not saturate.
            let v = _mm_packus_epi16(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
            let below = _mm_min_epu8(_mm_sub_epi8(top, v), fifteen);
            let (l, h) = (_mm_shuffle_epi8(lo, below), _mm_shuffle_epi8(hi, below));
            _mm_storeu_si128(m.as_mut_ptr().cast(), _mm_unpacklo_epi8(l, h));
            _mm_storeu_si128(m[8..].as_mut_ptr().cast(), _mm_unpackhi_epi8(l, h));
        }
    };
    for g in 0..n / 16 {
        step(16 * g);
    }
    if !n.is_multiple_of(16) {
        step(n - 16);
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::params::{PlainOps, SetOps};
    use super::*;
    use crate::isa::Isa;
    use crate::quant::GgmlType;
    use crate::testutil::{half_offsets, Rng};

    /// fp16 values that stress the steps: both zeros, subnormals, the extremes, NaN, infinity.
    const SPECIAL: [u16; 10] = [
        0x0000, 0x8000, 0x0001, 0x83ff, 0x0400, 0x7bff, 0xfbff, 0x3c00, 0x7c00, 0xfe00,
    ];

    /// Every step of `ops` against its definition on random rows of 1..=12 super-blocks
    /// (1..=40 blocks of Q5_1, MXFP4), with special fp16 scales.
    fn agree(ops: impl SetOps, what: &str) {
        let mut rng = Rng::new(23);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for round in 0..800 {
            for ty in [
                GgmlType::Q5_1,
                GgmlType::Q5_K,
                GgmlType::Q2_K,
                GgmlType::Q3_K,
                GgmlType::IQ4_XS,
                GgmlType::MXFP4,
            ] {
                let blocks = if ty.block_elems() == 32 {
                    1 + round % 40
                } else {
                    1 + round % 12
                };
                let ctx = format!("{what} {ty:?} round {round}, {blocks} blocks");
                let mut row = vec![0u8; blocks * ty.block_bytes()];
                rng.fill_bytes(&mut row);
                for blk in row.chunks_exact_mut(ty.block_bytes()) {
                    for &at in half_offsets(ty) {
                        let h = if rng.below(3) == 0 {
                            SPECIAL[rng.below(SPECIAL.len())]
                        } else {
                            rng.next_u32() as u16 & 0xfbff
                        };
                        blk[at..at + 2].copy_from_slice(&h.to_le_bytes());
                    }
                }
                let sets = blocks * ty.block_elems() / 16;
                if ty == GgmlType::MXFP4 {
                    let (mut want, mut got) = (vec![7u16; blocks], vec![7u16; blocks]);
                    let w = PlainOps.mxfp4_exponents(&row, &mut want);
                    let g = ops.mxfp4_exponents(&row, &mut got);
                    assert_eq!((g, &got), (w, &want), "{ctx}: exponents");
                    // Rows whose exponents span less and more than the 15 binades kept.
                    let narrow = want.iter().map(|&x| x.max(w.saturating_sub(20) as u16));
                    for x in [want.clone(), narrow.collect()] {
                        let (mut want, mut got) = (vec![7i16; blocks], vec![7i16; blocks]);
                        PlainOps.mxfp4_multipliers(&x, w, &mut want);
                        ops.mxfp4_multipliers(&x, w, &mut got);
                        assert_eq!(got, want, "{ctx}: multipliers");
                    }
                    continue;
                }
                let (w, g, want, got) = match ty {
                    GgmlType::Q3_K | GgmlType::IQ4_XS => {
                        let n = if ty == GgmlType::Q3_K { sets } else { sets / 2 };
                        let (mut want, mut got) = (vec![0f32; n], vec![0f32; n]);
                        let (w, g) = if ty == GgmlType::Q3_K {
                            (
                                PlainOps.q3_k_values(&row, &mut want),
                                ops.q3_k_values(&row, &mut got),
                            )
                        } else {
                            (
                                PlainOps.iq4_xs_values(&row, &mut want),
                                ops.iq4_xs_values(&row, &mut got),
                            )
                        };
                        (w, g, bits(&want), bits(&got))
                    }
                    _ => {
                        let n = if ty == GgmlType::Q2_K { sets } else { sets / 2 };
                        let (mut want, mut got) = (vec![[0f32; 2]; n], vec![[0f32; 2]; n]);
                        let (w, g) = match ty {
                            GgmlType::Q2_K => (
                                PlainOps.q2_k_values(&row, &mut want),
                                ops.q2_k_values(&row, &mut got),
                            ),
                            GgmlType::Q5_K => (
                                PlainOps.q5_k_values(&row, &mut want),
                                ops.q5_k_values(&row, &mut got),
                            ),
                            _ => (
                                PlainOps.q5_1_values(&row, &mut want),
                                ops.q5_1_values(&row, &mut got),
                            ),
                        };
                        (w, g, bits(want.as_flattened()), bits(got.as_flattened()))
                    }
                };
                assert_eq!(g.0, w.0, "{ctx}: largest half");
                if w.0 < 0x7c00 {
                    assert_eq!(g.1, w.1, "{ctx}: largest value");
                    assert_eq!(got, want, "{ctx}: sets");
                }
            }
        }
    }

    #[test]
    fn avx2_set_steps_agree_with_their_definitions() {
        if Isa::Avx2.is_available() {
            // SAFETY: AVX2 and F16C are available (checked).
            agree(unsafe { OpsAvx2::new() }, "AVX2");
        }
    }

    #[test]
    fn avx512_set_steps_agree_with_their_definitions() {
        if Isa::Avx512.is_available() {
            // SAFETY: the AVX-512 path's features are available (checked).
            agree(unsafe { OpsAvx512::new() }, "AVX-512");
        }
    }
}
