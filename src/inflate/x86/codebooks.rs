//! The codebook types' kernels (IQ2, IQ3, IQ1) on AVX2 and AVX-512: per run, the four groups'
//! grid entries and sign bytes from the block ([`groups`]; the IQ3 entries, the KSIGNS-coded
//! signs and IQ1_M's built in vectors here), each weight's table index from its grid byte and
//! sign, and one `pshufb` of the run's table of stretched codes rescaled by its set's multiplier
//! (`pmulhrsw`, as Q4_0's tables: the scalar reference's `rescale` of the signed code).

use super::super::codebook::{groups, iq3_indices, sign_fields, table_codes, Codebook};
use super::super::params::TileParams;
use super::super::tile::{for_each_block_group, RowMajor, Tile};
use super::avx2::{pair_multipliers, store32};
use super::avx512::{lane_pairs, store, ROWS};
use crate::quant::grids::{IQ2XS_GRID, IQ3S_GRID, IQ3XXS_GRID};
use crate::quant::GgmlType;
use std::arch::x86_64::*;

/// A run's four groups' grid entries as one vector (group `l` in bytes `8l..8l + 8`).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn grid_bytes(grid: [u64; 4]) -> __m256i {
    _mm256_setr_epi64x(
        grid[0] as i64,
        grid[1] as i64,
        grid[2] as i64,
        grid[3] as i64,
    )
}

/// Byte `8l + j` of the result: bit `j` of sign byte `l` of each 128-bit lane's word (lane 0:
/// bytes 0, 1; lane 1: bytes 2, 3), as a spread for [`negatives`].
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn sign_spread() -> (__m256i, __m256i) {
    #[rustfmt::skip]
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
    );
    (spread, _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64))
}

/// Each byte of a run whose weight is negative: bit `j` of sign byte `l` (of `signs`) for
/// weight `8l + j`, spread by [`sign_spread`]; all ones where set.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn negatives(signs: u32, spread: (__m256i, __m256i)) -> __m256i {
    let (spread, bits) = spread;
    let s = _mm256_shuffle_epi8(_mm256_set1_epi32(signs as i32), spread);
    _mm256_cmpeq_epi8(_mm256_and_si256(s, bits), bits)
}

/// The negative weights of a run of a KSIGNS-coded type from its sign fields (`word`, `shift`:
/// [`sign_fields`]), as [`negatives`] gives them: bits 0..7 of group `l`'s field for its first
/// seven weights, and the eighth negative where those seven have an odd count of negatives.
/// The scalar table lookups and the sign word's assembly took some twenty instructions.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn ksign_negatives(word: u64, shift: [u32; 4]) -> __m256i {
    let shift = shift.map(|s| s as i64);
    let fields = _mm256_srlv_epi64(
        _mm256_set1_epi64x(word as i64),
        _mm256_setr_epi64x(shift[0], shift[1], shift[2], shift[3]),
    );
    // Group l's field (byte 0 of qword l) in its eight bytes; byte j's test bit is bit j, none
    // for the eighth weight, whose byte thus always reads positive.
    let low_byte = 0x0808_0808_0808_0808;
    let spread = _mm256_shuffle_epi8(fields, _mm256_setr_epi64x(0, low_byte, 0, low_byte));
    let zero = _mm256_setzero_si256();
    let bits = _mm256_set1_epi64x(0x0040_2010_0804_0201);
    let positive = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bits), zero);
    // Per group, 255 × its positive bytes: odd where the first seven hold an odd count of
    // negatives.
    let count = _mm256_sad_epu8(positive, zero);
    let eighth = _mm256_cmpgt_epi8(zero, _mm256_slli_epi64::<63>(count));
    _mm256_or_si256(_mm256_andnot_si256(positive, _mm256_set1_epi8(-1)), eighth)
}

/// An IQ3 run's grid entries, [`iq3_indices`] into `table` (4 bytes each), as one vector: each
/// entry loaded straight into its lane, where pairing them in general registers first took
/// twice the instructions.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn dword_grid<const N: usize>(table: &[u32; N], index: [usize; 8]) -> __m256i {
    let e = index.map(|i| table[i] as i32);
    _mm256_setr_epi32(e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7])
}

/// IQ1_M's negative weights of run `ib` of `blk`, as [`negatives`] gives them from
/// [`groups`]' sign bytes: a group's eight weights take its offset's sign, bit 3 of its nibble
/// of the run's 16 high bits. Straight from those bits, where the compiler's build of the sign
/// word took some fifteen instructions.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn iq1_m_negatives(blk: &[u8], ib: usize) -> __m256i {
    let high = u16::from_le_bytes([blk[32 + 2 * ib], blk[33 + 2 * ib]]) as i32;
    // Dword i holds four weights of group i / 2, whose sign is bit 4·(i / 2) + 3.
    let bits = _mm256_setr_epi32(8, 8, 128, 128, 2048, 2048, 32768, 32768);
    _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(high), bits), bits)
}

/// The table index of each weight of a run: its grid byte's magnitude index (`cb`), or'ed with
/// `cb.negative` where `negative` is set.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn indices(cb: Codebook, grid: __m256i, negative: __m256i) -> __m256i {
    let magnitude = if cb.shift == 0 {
        _mm256_add_epi8(grid, _mm256_set1_epi8(1))
    } else {
        let v = _mm256_srl_epi16(grid, _mm_cvtsi32_si128(cb.shift as i32));
        _mm256_and_si256(v, _mm256_set1_epi8(cb.mask as i8))
    };
    let negative = _mm256_and_si256(negative, _mm256_set1_epi8(cb.negative as i8));
    _mm256_or_si256(magnitude, negative)
}

/// The codebook kernel of `TY` (`BB`-byte blocks) on AVX2, its runs' multipliers `m` (one per
/// run, or one per 16 weights) spread over the lanes by `spread_m`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn avx2<const BB: usize, P: Copy>(
    ty: GgmlType,
    rows: &[&[u8]],
    m: RowMajor<P>,
    tile: &mut Tile,
    runs: usize,
    spread_m: impl Fn(P) -> __m256i,
) {
    let cb = Codebook::of(ty);
    let c = table_codes(ty);
    // SAFETY: each load reads 8 of `c`'s 16 i16 (16 bytes, in bounds); unaligned.
    let [c_lo, c_hi] = [0, 8]
        .map(|at| unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(c[at..].as_ptr().cast())) });
    let spread = sign_spread();
    for_each_block_group::<8, 1, BB, _>(rows, m, tile, 0..runs, |_, [blk], [m], out| {
        for (ib, [out]) in out.into_iter().enumerate() {
            let (grid, signs) = groups(ty, blk, ib);
            let grid = match ty {
                GgmlType::IQ3_XXS => dword_grid(&IQ3XXS_GRID, iq3_indices(ty, blk, ib)),
                GgmlType::IQ3_S => dword_grid(&IQ3S_GRID, iq3_indices(ty, blk, ib)),
                _ => grid_bytes(grid),
            };
            let negative = match ty {
                GgmlType::IQ1_M => iq1_m_negatives(blk, ib),
                GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ3_XXS => {
                    let (word, shift) = sign_fields(ty, blk, ib);
                    ksign_negatives(word, shift)
                }
                _ => negatives(signs, spread),
            };
            let index = indices(cb, grid, negative);
            let m = spread_m(m[ib]);
            let t = _mm256_packs_epi16(_mm256_mulhrs_epi16(c_lo, m), _mm256_mulhrs_epi16(c_hi, m));
            store32(out, _mm256_shuffle_epi8(t, index));
        }
    });
}

/// The codebook kernel of `TY` (`BB`-byte blocks) on AVX-512, two tile rows per step (lanes 0,
/// 1: row a's run, lanes 2, 3: row b's), the multipliers `[a's first set, a's second, b's
/// first, b's second]` from `spread_m`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn avx512<const BB: usize, P: Copy>(
    ty: GgmlType,
    rows: &[&[u8]],
    m: RowMajor<P>,
    tile: &mut Tile,
    runs: usize,
    spread_m: impl Fn(P, P) -> __m512i,
) {
    let cb = Codebook::of(ty);
    let c = table_codes(ty);
    // SAFETY: each load reads 8 of `c`'s 16 i16 (16 bytes, in bounds); unaligned.
    let [c_lo, c_hi] = [0, 8]
        .map(|at| unsafe { _mm512_broadcast_i32x4(_mm_loadu_si128(c[at..].as_ptr().cast())) });
    // Byte 8l + j of lanes 0, 1 (row a's groups) takes byte l of the signs (row a's word), of
    // lanes 2, 3 byte 4 + l (row b's).
    #[rustfmt::skip]
    let spread = _mm512_set_epi64(
        0x0707_0707_0707_0707, 0x0606_0606_0606_0606, 0x0505_0505_0505_0505, 0x0404_0404_0404_0404,
        0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0,
    );
    let bits = _mm512_set1_epi64(0x8040_2010_0804_0201u64 as i64);
    let (one, mask, negative) = (
        _mm512_set1_epi8(1),
        _mm512_set1_epi8(cb.mask as i8),
        _mm512_set1_epi8(cb.negative as i8),
    );
    for_each_block_group::<8, ROWS, BB, _>(rows, m, tile, 0..runs, |_, [a, b], [ma, mb], out| {
        for (ib, out) in out.into_iter().enumerate() {
            let ((ga, sa), (gb, sb)) = (groups(ty, a, ib), groups(ty, b, ib));
            let grid = if matches!(ty, GgmlType::IQ3_XXS | GgmlType::IQ3_S) {
                iq3_grid(ty, a, b, ib)
            } else if ty == GgmlType::IQ2_XS {
                iq2_xs_grid(a, b, ib)
            } else {
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(grid_bytes(ga)), grid_bytes(gb))
            };
            let magnitude = if cb.shift == 0 {
                _mm512_add_epi8(grid, one)
            } else {
                let v = _mm512_srl_epi16(grid, _mm_cvtsi32_si128(cb.shift as i32));
                _mm512_and_si512(v, mask)
            };
            let negatives = match ty {
                GgmlType::IQ1_M => iq1_m_negatives_pair(a, b, ib),
                GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ3_XXS => {
                    ksign_negatives_pair(sign_fields(ty, a, ib), sign_fields(ty, b, ib).0)
                }
                _ => {
                    let signs = _mm512_set1_epi64((sa as u64 | (sb as u64) << 32) as i64);
                    _mm512_test_epi8_mask(_mm512_shuffle_epi8(signs, spread), bits)
                }
            };
            let index = _mm512_mask_add_epi8(magnitude, negatives, magnitude, negative);
            let m = spread_m(ma[ib], mb[ib]);
            let t = _mm512_packs_epi16(_mm512_mulhrs_epi16(c_lo, m), _mm512_mulhrs_epi16(c_hi, m));
            store(out, _mm512_shuffle_epi8(t, index));
        }
    });
}

/// IQ3_XXS's or IQ3_S's grid entries of run `ib` of blocks `a` (dwords 0..8) and `b` (8..16),
/// as [`groups`] reads them, in one 16-lane gather: the compiler's own vectorisation of the
/// scalar lookups takes four narrow gathers and their shuffles, slower than the AVX2 kernel's
/// scalar lookups.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn iq3_grid(ty: GgmlType, a: &[u8], b: &[u8], ib: usize) -> __m512i {
    let q = |blk: &[u8]| {
        let q: [u8; 8] = blk[2 + 8 * ib..10 + 8 * ib].try_into().expect("8 bytes");
        i64::from_le_bytes(q)
    };
    // Lane i's index: byte i of the two runs' codes (IQ3_S: bit i of their high bits as bit 8).
    let low = _mm512_cvtepu8_epi32(_mm_set_epi64x(q(b), q(a)));
    if ty == GgmlType::IQ3_XXS {
        // SAFETY: every index is below 256, the table's length; 4-byte entries.
        return unsafe { _mm512_i32gather_epi32::<4>(low, IQ3XXS_GRID.as_ptr().cast()) };
    }
    let qh = _mm512_set1_epi32(a[66 + ib] as i32 | (b[66 + ib] as i32) << 8);
    #[rustfmt::skip]
    let bit = _mm512_setr_epi32(
        1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768,
    );
    let high = _mm512_test_epi32_mask(qh, bit);
    let index = _mm512_mask_or_epi32(low, high, low, _mm512_set1_epi32(256));
    // SAFETY: every index is below 512, the table's length; 4-byte entries.
    unsafe { _mm512_i32gather_epi32::<4>(index, IQ3S_GRID.as_ptr().cast()) }
}

/// IQ2_XS's grid entries of run `ib` of blocks `a` (qwords 0..4) and `b` (4..8), as [`groups`]
/// reads them, in one 8-lane gather. (The other types of 8-byte entries measured no faster so.)
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn iq2_xs_grid(a: &[u8], b: &[u8], ib: usize) -> __m512i {
    let q = |blk: &[u8]| {
        let q: [u8; 8] = blk[2 + 8 * ib..10 + 8 * ib].try_into().expect("8 bytes");
        i64::from_le_bytes(q)
    };
    // Lane l's index: the low 9 bits of the run's 16-bit code l.
    let q = _mm256_cvtepu16_epi32(_mm_set_epi64x(q(b), q(a)));
    let index = _mm256_and_si256(q, _mm256_set1_epi32(511));
    // SAFETY: every index is below 512, the table's length; 8-byte entries.
    unsafe { _mm512_i32gather_epi64::<8>(index, IQ2XS_GRID.as_ptr().cast()) }
}

/// The negative weights of run `ib` of a KSIGNS-coded type's blocks `a` (bytes 0..32) and `b`
/// (32..64) from their sign fields (`word_a`, `shift`, `word_b`: [`sign_fields`]), as
/// [`ksign_negatives`] gives one run's.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn ksign_negatives_pair((word_a, shift): (u64, [u32; 4]), word_b: u64) -> __mmask64 {
    let [s0, s1, s2, s3] = shift.map(|s| s as i64);
    let words = _mm512_inserti64x4::<1>(
        _mm512_set1_epi64(word_a as i64),
        _mm256_set1_epi64x(word_b as i64),
    );
    let fields = _mm512_srlv_epi64(words, _mm512_setr_epi64(s0, s1, s2, s3, s0, s1, s2, s3));
    // Group l's field (byte 0 of qword l) in its eight bytes, tested as in `ksign_negatives`.
    let low_byte = 0x0808_0808_0808_0808;
    let spread = _mm512_shuffle_epi8(
        fields,
        _mm512_setr_epi64(0, low_byte, 0, low_byte, 0, low_byte, 0, low_byte),
    );
    let first_seven = _mm512_test_epi8_mask(spread, _mm512_set1_epi64(0x0040_2010_0804_0201));
    // Per group, the count of its first seven negatives, odd where the eighth is negative.
    let count = _mm512_sad_epu8(
        _mm512_maskz_set1_epi8(first_seven, 1),
        _mm512_setzero_si512(),
    );
    first_seven | _mm512_movepi8_mask(_mm512_slli_epi64::<63>(count))
}

/// IQ1_M's negative weights of run `ib` of blocks `a` (bytes 0..32) and `b` (32..64), as
/// [`groups`]' sign bytes give them: a group's eight weights take its offset's sign, bit 3 of
/// its nibble of the run's 16 high bits. Straight from those bits, where the compiler's build
/// of the sign words took some thirty instructions.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn iq1_m_negatives_pair(a: &[u8], b: &[u8], ib: usize) -> __mmask64 {
    let high = |blk: &[u8]| u16::from_le_bytes([blk[32 + 2 * ib], blk[33 + 2 * ib]]) as u32;
    let both = _mm512_set1_epi32((high(a) | high(b) << 16) as i32);
    // Dword i holds four weights of group i / 2 (b's from i = 8 on), whose sign is bit
    // 4·(i / 2) + 3 of `both`.
    let bit = |i: u32| (1u32 << (4 * (i / 2) + 3)) as i32;
    #[rustfmt::skip]
    let bits = _mm512_setr_epi32(
        bit(0), bit(1), bit(2), bit(3), bit(4), bit(5), bit(6), bit(7),
        bit(8), bit(9), bit(10), bit(11), bit(12), bit(13), bit(14), bit(15),
    );
    let dwords = _mm512_maskz_set1_epi32(_mm512_test_epi32_mask(both, bits), -1);
    _mm512_test_epi8_mask(dwords, dwords)
}

/// `[m_a0, m_a1, m_b0, m_b1]`: each of the four in all eight 16-bit lanes of its 128-bit lane.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn set_pairs([a0, a1]: [i16; 2], [b0, b1]: [i16; 2]) -> __m512i {
    let word = |m: i16, at: u32| (m as u16 as u64) << at;
    let all = word(a0, 0) | word(a1, 16) | word(b0, 32) | word(b1, 48);
    #[rustfmt::skip]
    let spread = _mm512_set_epi64(
        0x0706_0706_0706_0706, 0x0706_0706_0706_0706, 0x0504_0504_0504_0504, 0x0504_0504_0504_0504,
        0x0302_0302_0302_0302, 0x0302_0302_0302_0302, 0x0100_0100_0100_0100, 0x0100_0100_0100_0100,
    );
    _mm512_shuffle_epi8(_mm512_set1_epi64(all as i64), spread)
}

/// The per-type entry points: one multiplier per run (`m`) or two (`m_pairs`).
macro_rules! codebook_kernels {
    ($($name:ident: $ty:ident, $bb:literal, $sets:ident;)*) => {
        pub(super) mod avx2_kernels {
            use super::*;
            $(
                #[target_feature(enable = "avx2,f16c")]
                pub(in super::super) fn $name(
                    rows: &[&[u8]],
                    params: &TileParams,
                    tile: &mut Tile,
                    runs: usize,
                ) {
                    codebook_kernels!(@avx2 $sets, GgmlType::$ty, $bb, rows, params, tile, runs);
                }
            )*
        }
        pub(super) mod avx512_kernels {
            use super::*;
            $(
                #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
                pub(in super::super) fn $name(
                    rows: &[&[u8]],
                    params: &TileParams,
                    tile: &mut Tile,
                    runs: usize,
                ) {
                    codebook_kernels!(@avx512 $sets, GgmlType::$ty, $bb, rows, params, tile, runs);
                }
            )*
        }
    };
    (@avx2 one, $ty:expr, $bb:literal, $rows:ident, $p:ident, $tile:ident, $runs:ident) => {
        avx2::<$bb, i16>($ty, $rows, $p.m(), $tile, $runs, |m| _mm256_set1_epi16(m))
    };
    (@avx2 two, $ty:expr, $bb:literal, $rows:ident, $p:ident, $tile:ident, $runs:ident) => {
        avx2::<$bb, [i16; 2]>($ty, $rows, $p.m_pairs(), $tile, $runs, |m| pair_multipliers(&m))
    };
    (@avx512 one, $ty:expr, $bb:literal, $rows:ident, $p:ident, $tile:ident, $runs:ident) => {
        avx512::<$bb, i16>($ty, $rows, $p.m(), $tile, $runs, |a, b| lane_pairs(&[a, b]))
    };
    (@avx512 two, $ty:expr, $bb:literal, $rows:ident, $p:ident, $tile:ident, $runs:ident) => {
        avx512::<$bb, [i16; 2]>($ty, $rows, $p.m_pairs(), $tile, $runs, |a, b| set_pairs(a, b))
    };
}

codebook_kernels! {
    iq2_xxs: IQ2_XXS, 66, one;
    iq2_xs: IQ2_XS, 74, two;
    iq2_s: IQ2_S, 82, two;
    iq3_xxs: IQ3_XXS, 98, one;
    iq3_s: IQ3_S, 110, one;
    iq1_s: IQ1_S, 50, one;
    iq1_m: IQ1_M, 56, two;
}
