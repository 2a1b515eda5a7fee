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
use crate::quant::{iq1m_scale, GgmlType};
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

        #[inline(always)]
        fn codebook_values(self, ty: GgmlType, row: &[u8], e: &mut [f32]) -> (u16, u32) {
            // SAFETY: see `avx2_steps`.
            unsafe { codebook_values_avx2(ty, row, e) }
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

/// The codebook types' `e_j = fl(fl(d·v)·c)` of one block's 8 or 16 sets, `v` as binary32 (a
/// small integer or one plus a half: exact) in `v[0]` (sets 0..8) and `v[1]` (8..16), `c` a
/// power of two (so the second product is exact, as the definition's).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn codebook_block<const SETS: usize>(
    h: u16,
    v: [__m256; 2],
    c: f32,
    e: &mut [f32],
    e_max: __m256i,
) -> __m256i {
    let (d, c, magnitude) = (
        splat_half(h),
        _mm256_set1_ps(c),
        _mm256_set1_epi32(0x7fff_ffff),
    );
    let mut e_max = e_max;
    for (e, v) in e[..SETS].as_chunks_mut::<8>().0.iter_mut().zip(v) {
        let x = _mm256_mul_ps(_mm256_mul_ps(d, v), c);
        // SAFETY: `e` is 32 writable bytes; unaligned store.
        unsafe { _mm256_storeu_ps(e.as_mut_ptr(), x) };
        e_max = _mm256_max_epu32(e_max, _mm256_and_si256(_mm256_castps_si256(x), magnitude));
    }
    e_max
}

/// `0.5 + s` and `2·s + 1` of eight small integers `s` as binary32 (exact).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn plus_half(s: __m256i) -> __m256 {
    _mm256_add_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(0.5))
}

#[inline]
#[target_feature(enable = "avx2,f16c")]
fn odd(s: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_or_si256(
        _mm256_slli_epi32::<1>(s),
        _mm256_set1_epi32(1),
    ))
}

/// [`SetOps::codebook_values`] a block at a time: each type's small integers by 32-bit lane
/// shifts of its scale fields, then [`codebook_block`]; `E_n` as a running lane maximum of the
/// magnitude bits.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn codebook_values_avx2(ty: GgmlType, row: &[u8], e: &mut [f32]) -> (u16, u32) {
    let zero = _mm256_setzero_ps();
    let (mut largest, mut e_max) = (0, _mm256_setzero_si256());
    // One loop per type: `sets` maps a block to its fp16 scale, its `v` and `c`.
    macro_rules! blocks {
        ($bb:literal, $sets:literal, |$blk:ident| $sets_of:expr) => {{
            let blocks = row.as_chunks::<$bb>().0;
            for (e, $blk) in e.as_chunks_mut::<$sets>().0.iter_mut().zip(blocks) {
                let (h, v, c): (u16, [__m256; 2], f32) = $sets_of;
                largest = largest.max(h & 0x7fff);
                e_max = codebook_block::<$sets>(h, v, c, e, e_max);
            }
        }};
    }
    let nibbles = |bytes: u64| {
        // Set 2k: the low nibble of byte k, set 2k + 1: its high nibble.
        let x = _mm256_cvtepu8_epi32(_mm_set1_epi64x(bytes as i64));
        let (lo, hi) = (
            _mm256_and_si256(x, _mm256_set1_epi32(15)),
            _mm256_srli_epi32::<4>(x),
        );
        let (a, b) = (_mm256_unpacklo_epi32(lo, hi), _mm256_unpackhi_epi32(lo, hi));
        [
            plus_half(_mm256_permute2x128_si256::<0x20>(a, b)),
            plus_half(_mm256_permute2x128_si256::<0x31>(a, b)),
        ]
    };
    let u64_at =
        |blk: &[u8], at: usize| u64::from_le_bytes(blk[at..at + 8].try_into().expect("8 bytes"));
    match ty {
        GgmlType::IQ2_XXS => blocks!(66, 8, |blk| {
            // Each group of 8 bytes from byte 2 ends in its sub-block's word: the odd dwords.
            // SAFETY: bytes 2..66 of the block; unaligned loads.
            let (a, b) = unsafe {
                (
                    _mm256_loadu_ps(blk[2..34].as_ptr().cast()),
                    _mm256_loadu_ps(blk[34..66].as_ptr().cast()),
                )
            };
            let aux = _mm256_castps_si256(_mm256_shuffle_ps::<0b11_01_11_01>(a, b));
            let aux = _mm256_permute4x64_epi64::<0b11_01_10_00>(aux);
            (
                u16_at(blk, 0),
                [plus_half(_mm256_srli_epi32::<28>(aux)), zero],
                0.25,
            )
        }),
        GgmlType::IQ2_XS => blocks!(74, 16, |blk| (
            u16_at(blk, 0),
            nibbles(u64_at(blk, 66)),
            0.25
        )),
        GgmlType::IQ2_S => blocks!(82, 16, |blk| (
            u16_at(blk, 0),
            nibbles(u64_at(blk, 74)),
            0.25
        )),
        GgmlType::IQ3_XXS => blocks!(98, 8, |blk| {
            // SAFETY: bytes 66..98 of the block; unaligned load.
            let aux = unsafe { _mm256_loadu_si256(blk[66..98].as_ptr().cast()) };
            (
                u16_at(blk, 0),
                [plus_half(_mm256_srli_epi32::<28>(aux)), zero],
                0.5,
            )
        }),
        GgmlType::IQ3_S => blocks!(110, 8, |blk| {
            let word = u32::from_le_bytes(blk[106..110].try_into().expect("4 bytes"));
            let s = _mm256_srlv_epi32(
                _mm256_set1_epi32(word as i32),
                _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28),
            );
            let s = _mm256_and_si256(s, _mm256_set1_epi32(15));
            (u16_at(blk, 0), [odd(s), zero], 1.0)
        }),
        GgmlType::IQ1_S => blocks!(50, 8, |blk| {
            let words = _mm256_cvtepu16_epi32(load16(&blk[34..]));
            let s = _mm256_and_si256(_mm256_srli_epi32::<12>(words), _mm256_set1_epi32(7));
            (u16_at(blk, 0), [odd(s), zero], 0.125)
        }),
        GgmlType::IQ1_M => blocks!(56, 16, |blk| {
            // Set i: bits 3·(i % 4).. of scale word i / 4.
            let scales: &[u8; 8] = blk[48..56].try_into().expect("8 bytes");
            let words = _mm256_cvtepu16_epi32(_mm_set1_epi64x(u64::from_le_bytes(*scales) as i64));
            let shift = _mm256_setr_epi32(0, 3, 6, 9, 0, 3, 6, 9);
            let s = |first: i32| {
                let second = first + 1;
                let w = _mm256_permutevar8x32_epi32(
                    words,
                    _mm256_setr_epi32(first, first, first, first, second, second, second, second),
                );
                odd(_mm256_and_si256(
                    _mm256_srlv_epi32(w, shift),
                    _mm256_set1_epi32(7),
                ))
            };
            (iq1m_scale(scales), [s(0), s(2)], 0.125)
        }),
        _ => unreachable!("{ty:?} is no codebook type"),
    }
    let e_max = _mm_max_epu32(
        _mm256_castsi256_si128(e_max),
        _mm256_extracti128_si256::<1>(e_max),
    );
    let e_max = _mm_max_epu32(e_max, _mm_shuffle_epi32::<0b01_00_11_10>(e_max));
    let e_max = _mm_max_epu32(e_max, _mm_shuffle_epi32::<0b10_11_00_01>(e_max));
    (largest, _mm_cvtsi128_si32(e_max) as u32)
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
    use super::super::super::codebook::CODEBOOK_TYPES;
    use super::super::super::params::{PlainOps, SetOps};
    use super::*;
    use crate::isa::Isa;
    use crate::quant::GgmlType;
    use crate::testutil::{half_offsets, set_iq1m_scale, Rng};

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
            let others = [
                GgmlType::Q5_1,
                GgmlType::Q5_K,
                GgmlType::Q2_K,
                GgmlType::Q3_K,
                GgmlType::IQ4_XS,
                GgmlType::MXFP4,
            ];
            for ty in others.into_iter().chain(CODEBOOK_TYPES) {
                let blocks = if ty.block_elems() == 32 {
                    1 + round % 40
                } else {
                    1 + round % 12
                };
                let ctx = format!("{what} {ty:?} round {round}, {blocks} blocks");
                let mut row = vec![0u8; blocks * ty.block_bytes()];
                rng.fill_bytes(&mut row);
                for blk in row.chunks_exact_mut(ty.block_bytes()) {
                    let mut half = || {
                        if rng.below(3) == 0 {
                            SPECIAL[rng.below(SPECIAL.len())]
                        } else {
                            rng.next_u32() as u16 & 0xfbff
                        }
                    };
                    if ty == GgmlType::IQ1_M {
                        set_iq1m_scale(blk, half());
                    }
                    for &at in half_offsets(ty) {
                        blk[at..at + 2].copy_from_slice(&half().to_le_bytes());
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
                    GgmlType::Q2_K | GgmlType::Q5_K | GgmlType::Q5_1 => {
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
                    _ => {
                        // Sets of 16 (IQ2_XS, IQ2_S, IQ1_M) or 32 weights.
                        let n = match ty {
                            GgmlType::IQ2_XS | GgmlType::IQ2_S | GgmlType::IQ1_M => sets,
                            _ => sets / 2,
                        };
                        let (mut want, mut got) = (vec![0f32; n], vec![0f32; n]);
                        let w = PlainOps.codebook_values(ty, &row, &mut want);
                        let g = ops.codebook_values(ty, &row, &mut got);
                        (w, g, bits(&want), bits(&got))
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
