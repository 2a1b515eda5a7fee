//! The scan's steps ([`ScanOps`]) in explicit AVX2/F16C and AVX-512 code, each equal bit for
//! bit to its definition (the trait's default methods; tested below): the same binary32
//! products in the same order, `vcvtph2ps` (exact, like `finite_half_to_f32` on finite
//! halves), `cvtps2dq` rounding to nearest-even like `rne_i32`, `maxps` with the operands in
//! `larger`'s order.

use super::super::params::{PlainOps, ScanOps, SetOps};
use super::load16;
use std::arch::x86_64::*;

/// [`ScanOps`] for the AVX2 path: the fp16 fields by eight scalar loads at a time.
#[derive(Clone, Copy)]
pub(super) struct OpsAvx2(());

impl OpsAvx2 {
    /// Only code built for AVX2 and F16C, so running where they are, can make one.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) fn new() -> OpsAvx2 {
        OpsAvx2(())
    }
}

/// [`ScanOps`] for the AVX-512 path: the fp16 fields by word permutes of 128-byte windows of
/// the row; the other steps as on AVX2.
#[derive(Clone, Copy)]
pub(super) struct OpsAvx512(());

impl OpsAvx512 {
    /// Only code built for the AVX-512 path's features can make one.
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
    pub(super) fn new() -> OpsAvx512 {
        OpsAvx512(())
    }
}

/// The steps both paths take from the AVX2 code. SAFETY (for each call): a value of either
/// type exists only where AVX2 and F16C are available (their constructors need them).
macro_rules! avx2_steps {
    () => {
        #[inline(always)]
        fn q6_k_values(self, row: &[u8], e: &mut [f32]) -> (u16, u32) {
            // SAFETY: see `avx2_steps`.
            unsafe { q6_k_values_avx2(row, e) }
        }

        #[inline(always)]
        fn half_multipliers(self, h: &[u16], unit: f32, m: &mut [i16]) {
            // SAFETY: see `avx2_steps`.
            unsafe { half_multipliers_avx2(h, unit, m) }
        }

        #[inline(always)]
        fn multipliers(self, e: &[f32], unit: f32, m: &mut [i16]) {
            // SAFETY: see `avx2_steps`.
            unsafe { multipliers_avx2(e, unit, m) }
        }

        #[inline(always)]
        fn scale(self, x: &mut [f32], factor: f32) {
            // SAFETY: see `avx2_steps`.
            unsafe { scale_avx2(x, factor) }
        }
    };
}

impl ScanOps for OpsAvx2 {
    #[inline(always)]
    fn halves<const BB: usize, const AT: usize>(self, row: &[u8], out: &mut [u16]) -> u16 {
        // SAFETY: see `avx2_steps`.
        unsafe { halves_avx2::<BB, AT>(row, out) }
    }

    #[inline(always)]
    fn q4_k_values(self, row: &[u8], ab: &mut [[f32; 2]]) -> (u16, u32) {
        // SAFETY: see `avx2_steps`.
        unsafe { q4_k_values_avx2::<144, 15>(row, ab) }
    }

    #[inline(always)]
    fn q4_1_values(self, row: &[u8], ab: &mut [[f32; 2]]) -> (u16, u32) {
        // SAFETY: see `avx2_steps`.
        unsafe { q4_1_values_avx2::<20, 15>(row, ab) }
    }

    avx2_steps!();
}

impl ScanOps for OpsAvx512 {
    #[inline(always)]
    fn halves<const BB: usize, const AT: usize>(self, row: &[u8], out: &mut [u16]) -> u16 {
        // SAFETY: an `OpsAvx512` exists only where the AVX-512 path is available.
        unsafe { halves_avx512::<BB, AT>(row, out) }
    }

    #[inline(always)]
    fn q4_k_values(self, row: &[u8], ab: &mut [[f32; 2]]) -> (u16, u32) {
        // SAFETY: as for `halves`.
        unsafe { q4_k_values_avx512::<144, 15>(row, ab) }
    }

    #[inline(always)]
    fn q4_1_values(self, row: &[u8], ab: &mut [[f32; 2]]) -> (u16, u32) {
        // SAFETY: as for `halves`.
        unsafe { q4_1_values_avx512::<20, 15>(row, ab) }
    }

    avx2_steps!();
}

/// `table_set_max` of eight sets of codes `0..=TOP`: `max(|b|, |TOP·a + b|)`, `maxps` taking the
/// second operand unless the first is larger, as `larger` does.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn block_max<const TOP: u32>(a: __m256, b: __m256) -> __m256 {
    let sign = _mm256_set1_ps(-0.0);
    let end = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(TOP as f32), a), b);
    _mm256_max_ps(_mm256_andnot_ps(sign, b), _mm256_andnot_ps(sign, end))
}

/// `ab[i] = [a[i], b[i]]` for eight runs.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn store_pairs(ab: &mut [[f32; 2]; 8], a: __m256, b: __m256) {
    let (lo, hi) = (_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
    // SAFETY: `ab` is 64 writable bytes; unaligned stores.
    unsafe {
        let at = ab.as_mut_ptr().cast::<f32>();
        _mm256_storeu_ps(at, _mm256_permute2f128_ps::<0x20>(lo, hi));
        _mm256_storeu_ps(at.add(8), _mm256_permute2f128_ps::<0x31>(lo, hi));
    }
}

/// The largest of eight non-negative binary32 lanes, as bits.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn lane_max(v: __m256) -> u32 {
    let w = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let w = _mm_max_ps(w, _mm_movehl_ps(w, w));
    let w = _mm_max_ps(w, _mm_shuffle_ps::<1>(w, w));
    _mm_cvtss_f32(w).to_bits()
}

/// The largest of eight u16 lanes (`phminposuw` of their complements).
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn lane_max_u16(v: __m128i) -> u16 {
    !(_mm_cvtsi128_si32(_mm_minpos_epu16(_mm_xor_si128(v, _mm_set1_epi8(-1)))) as u16)
}

/// The byte shuffles and masks that unpack a Q4_K header's packed scales (see
/// [`q4_k_values_avx2`]), for one 128-bit lane.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn q4_k_unpack_constants() -> [__m128i; 5] {
    // Packed byte i (header byte 4 + i): scales 0..4 are bytes 0..4 & 63, mins 0..4 bytes
    // 4..8 & 63; scale 4 + i is byte 8 + i & 15 with the top two bits of byte i as bits 4, 5,
    // min 4 + i is byte 8 + i >> 4 with the top two bits of byte 4 + i.
    #[rustfmt::skip]
    let c = [
        _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11),
        _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0),
        _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15),
        _mm_setr_epi8(0, 0, 0, 0, 0x30, 0x30, 0x30, 0x30, 0, 0, 0, 0, 0x30, 0x30, 0x30, 0x30),
    ];
    c
}

/// [`ScanOps::q4_k_values`] two super-blocks per step: their headers in the two 128-bit lanes
/// of one vector, unpacked as in [`q4_k_values_avx2`], the 16 runs' values in 512-bit vectors.
/// Also Q5_K's (`BB` 176, codes `0..=TOP` 31), whose header is Q4_K's.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
pub(super) fn q4_k_values_avx512<const BB: usize, const TOP: u32>(
    row: &[u8],
    ab: &mut [[f32; 2]],
) -> (u16, u32) {
    let [low_src, top_src, low_mask, high_nibble, top_mask] =
        q4_k_unpack_constants().map(|c| _mm256_broadcastsi128_si256(c));
    let (d_src, dmin_src) = (_mm256_set1_epi16(0x0100), _mm256_set1_epi16(0x0302));
    // `d`, `dmin`: the first two words of each header.
    let magnitude = _mm256_broadcastsi128_si256(_mm_setr_epi16(0x7fff, 0x7fff, 0, 0, 0, 0, 0, 0));
    let sign = _mm512_set1_epi32(i32::MIN);
    let top_code = _mm512_set1_ps(TOP as f32);
    let (lo_pairs, hi_pairs) = (
        _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23),
        _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31),
    );
    let blocks = row.as_chunks::<BB>().0;
    let n = blocks.len().min(ab.len() / 8);
    let (pairs, last) = blocks[..n].as_chunks::<2>();
    let (ab, ab_last) = ab[..8 * n].as_chunks_mut::<16>();
    let (mut largest, mut w_max) = (_mm256_setzero_si256(), _mm512_setzero_ps());
    // Super-blocks `b0`, `b1` into `ab`'s first 8 pairs and, if it holds 16, the next 8.
    let mut step = |b0: &[u8; BB], b1: &[u8; BB], ab: &mut [[f32; 2]]| {
        let h = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(load16(b0)), load16(b1));
        largest = _mm256_max_epu16(largest, _mm256_and_si256(h, magnitude));
        let x = _mm256_shuffle_epi8(h, low_src);
        let top = _mm256_shuffle_epi8(h, top_src);
        let top = _mm256_and_si256(_mm256_srli_epi16::<2>(top), top_mask);
        let high = _mm256_and_si256(_mm256_srli_epi16::<4>(x), high_nibble);
        // Quadwords: scales 0, mins 0, scales 1, mins 1; then scales 0, 1, mins 0, 1.
        let six = _mm256_or_si256(_mm256_or_si256(_mm256_and_si256(x, low_mask), high), top);
        let six = _mm256_permute4x64_epi64::<0b11_01_10_00>(six);
        let sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(six)));
        let mn = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256::<1>(six)));
        let d = _mm512_cvtph_ps(_mm256_shuffle_epi8(h, d_src));
        let dmin = _mm512_cvtph_ps(_mm256_shuffle_epi8(h, dmin_src));
        let a = _mm512_mul_ps(d, sc);
        let b = _mm512_castsi512_ps(_mm512_xor_si512(
            _mm512_castps_si512(_mm512_mul_ps(dmin, mn)),
            sign,
        ));
        // table_block_max, as in `block_max`.
        let end = _mm512_add_ps(_mm512_mul_ps(top_code, a), b);
        let larger = _mm512_max_ps(_mm512_abs_ps(b), _mm512_abs_ps(end));
        w_max = _mm512_max_ps(w_max, larger);
        let (first, second) = ab.split_at_mut(8);
        let first: &mut [[f32; 2]; 8] = first.try_into().expect("8 pairs");
        // SAFETY: `first` (and `second`, when stored) is 64 writable bytes; unaligned stores.
        unsafe {
            _mm512_storeu_ps(
                first.as_mut_ptr().cast(),
                _mm512_permutex2var_ps(a, lo_pairs, b),
            );
            if let Ok(second) = <&mut [[f32; 2]; 8]>::try_from(second) {
                let v = _mm512_permutex2var_ps(a, hi_pairs, b);
                _mm512_storeu_ps(second.as_mut_ptr().cast(), v);
            }
        }
    };
    for (ab, [b0, b1]) in ab.iter_mut().zip(pairs) {
        step(b0, b1, ab);
    }
    // An odd last super-block twice: its values are stored once, and the maxima are the same.
    if let [last] = last {
        step(last, last, ab_last);
    }
    let largest = _mm_max_epu16(
        _mm256_castsi256_si128(largest),
        _mm256_extracti128_si256::<1>(largest),
    );
    let w_max = _mm256_max_ps(
        _mm512_castps512_ps256(w_max),
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(w_max))),
    );
    (lane_max_u16(largest), lane_max(w_max))
}

/// [`ScanOps::q4_k_values`] a super-block at a time: its 16-byte header (`d`, `dmin`, the
/// packed scales) unpacked by two byte shuffles and masks into the eight scales and eight mins,
/// widened to binary32 (exact), times `d` and `dmin`; `M_n` as a running lane maximum. Also
/// Q5_K's (`BB` 176, codes `0..=TOP` 31), whose header is Q4_K's.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn q4_k_values_avx2<const BB: usize, const TOP: u32>(
    row: &[u8],
    ab: &mut [[f32; 2]],
) -> (u16, u32) {
    let ab = ab.as_chunks_mut::<8>().0;
    let [low_src, top_src, low_mask, high_nibble, top_mask] = q4_k_unpack_constants();
    let (d_src, dmin_src) = (_mm_set1_epi16(0x0100), _mm_set1_epi16(0x0302));
    let magnitude = _mm_setr_epi16(0x7fff, 0x7fff, 0, 0, 0, 0, 0, 0);
    let sign = _mm256_set1_ps(-0.0);
    let (mut largest, mut w_max) = (_mm_setzero_si128(), _mm256_setzero_ps());
    for (ab, blk) in ab.iter_mut().zip(row.as_chunks::<BB>().0) {
        let h = load16(blk);
        largest = _mm_max_epu16(largest, _mm_and_si128(h, magnitude));
        let x = _mm_shuffle_epi8(h, low_src);
        let top = _mm_and_si128(_mm_srli_epi16::<2>(_mm_shuffle_epi8(h, top_src)), top_mask);
        let high = _mm_and_si128(_mm_srli_epi16::<4>(x), high_nibble);
        // Bytes 0..8: the scales, 8..16: the mins.
        let six = _mm_or_si128(_mm_or_si128(_mm_and_si128(x, low_mask), high), top);
        let sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(six));
        let mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128::<8>(six)));
        let d = _mm256_cvtph_ps(_mm_shuffle_epi8(h, d_src));
        let dmin = _mm256_cvtph_ps(_mm_shuffle_epi8(h, dmin_src));
        let a = _mm256_mul_ps(d, sc);
        let b = _mm256_xor_ps(_mm256_mul_ps(dmin, mn), sign);
        w_max = _mm256_max_ps(w_max, block_max::<TOP>(a, b));
        store_pairs(ab, a, b);
    }
    (lane_max_u16(largest), lane_max(w_max))
}

/// [`ScanOps::q6_k_values`] a super-block at a time: its 16 signed scales widened to binary32
/// (exact), times `d`; `E_n` as a running lane maximum of `|e|`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn q6_k_values_avx2(row: &[u8], e: &mut [f32]) -> (u16, u32) {
    let sign = _mm256_set1_ps(-0.0);
    let (mut largest, mut e_max) = (0, _mm256_setzero_ps());
    for (e, blk) in e
        .as_chunks_mut::<16>()
        .0
        .iter_mut()
        .zip(row.as_chunks::<210>().0)
    {
        // `d` is the block's last two bytes.
        let h = u16::from_le_bytes([blk[208], blk[209]]);
        largest = largest.max(h & 0x7fff);
        let d = _mm256_cvtph_ps(_mm_set1_epi16(h as i16));
        let sc = load16(&blk[192..]);
        let e0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
        let high = _mm256_cvtepi8_epi32(_mm_srli_si128::<8>(sc));
        let e1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(high));
        let larger = _mm256_max_ps(_mm256_andnot_ps(sign, e0), _mm256_andnot_ps(sign, e1));
        e_max = _mm256_max_ps(e_max, larger);
        // SAFETY: `e` is 16 writable f32; unaligned stores.
        unsafe {
            _mm256_storeu_ps(e.as_mut_ptr(), e0);
            _mm256_storeu_ps(e[8..].as_mut_ptr(), e1);
        }
    }
    (largest, lane_max(e_max))
}

/// Eight halves at the start of `h` as binary32.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn halves8(h: &[u16; 8]) -> __m256 {
    // SAFETY: `h` is 16 readable bytes; unaligned load.
    _mm256_cvtph_ps(unsafe { _mm_loadu_si128(h.as_ptr().cast()) })
}

/// The four bytes at `AT` of each of eight `BB`-byte blocks, each in the low dword of a vector:
/// eight `vmovd` loads. A gather (`vpgatherdd`) would be one instruction, but it is microcoded
/// and takes longer than these on AMD's cores and on Intel's since the Downfall mitigation.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn dwords8<const BB: usize, const AT: usize>(blocks: &[[u8; BB]; 8]) -> [__m128i; 8] {
    const { assert!(AT + 4 <= BB) };
    blocks.each_ref().map(|blk| {
        let d = i32::from_le_bytes(blk[AT..AT + 4].try_into().expect("4 bytes"));
        _mm_cvtsi32_si128(d)
    })
}

/// Blocks `first..first + 8` of `row`.
#[inline]
fn eight_blocks<const BB: usize>(row: &[u8], first: usize) -> &[[u8; BB]; 8] {
    row[first * BB..(first + 8) * BB]
        .as_chunks::<BB>()
        .0
        .try_into()
        .expect("8 blocks")
}

/// [`ScanOps::q4_1_values`] eight blocks at a time: their first four bytes (`d`, `m`) as
/// halves, already the pairs `[d, m]` that `vcvtph2ps` turns into `[a_j, b_j]`. A last
/// `len % 8` with the seven before them, again; fewer than eight blocks as defined. Also
/// Q5_1's (`BB` 24, codes `0..=TOP` 31), whose blocks start as Q4_1's.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn q4_1_values_avx2<const BB: usize, const TOP: u32>(
    row: &[u8],
    ab: &mut [[f32; 2]],
) -> (u16, u32) {
    let blocks = (row.len() / BB).min(ab.len());
    if blocks < 8 {
        return table_values_defined::<BB>(row, ab);
    }
    let magnitude = _mm256_set1_epi16(0x7fff);
    let (mut largest, mut w_max) = (_mm256_setzero_si256(), _mm256_setzero_ps());
    let mut group = |first: usize| {
        let ab: &mut [[f32; 2]; 8] = (&mut ab[first..first + 8]).try_into().expect("8");
        let [d0, d1, d2, d3, d4, d5, d6, d7] = dwords8::<BB, 0>(eight_blocks::<BB>(row, first));
        let pairs =
            |a, b, c, d| _mm_unpacklo_epi64(_mm_unpacklo_epi32(a, b), _mm_unpacklo_epi32(c, d));
        let h = _mm256_set_m128i(pairs(d4, d5, d6, d7), pairs(d0, d1, d2, d3));
        largest = _mm256_max_epu16(largest, _mm256_and_si256(h, magnitude));
        let x0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
        let x1 = _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h));
        // The eight a's and b's (in the same permuted order, which the maximum ignores).
        let a = _mm256_shuffle_ps::<0b10_00_10_00>(x0, x1);
        let b = _mm256_shuffle_ps::<0b11_01_11_01>(x0, x1);
        w_max = _mm256_max_ps(w_max, block_max::<TOP>(a, b));
        // SAFETY: `ab` is 64 writable bytes; unaligned stores.
        unsafe {
            let at = ab.as_mut_ptr().cast::<f32>();
            _mm256_storeu_ps(at, x0);
            _mm256_storeu_ps(at.add(8), x1);
        }
    };
    for g in 0..blocks / 8 {
        group(8 * g);
    }
    if !blocks.is_multiple_of(8) {
        group(blocks - 8);
    }
    let largest = _mm_max_epu16(
        _mm256_castsi256_si128(largest),
        _mm256_extracti128_si256::<1>(largest),
    );
    (lane_max_u16(largest), lane_max(w_max))
}

/// [`ScanOps::q4_1_values`] by word permutes: the `[d, m]` of the seven blocks whose first four
/// bytes lie in one 128-byte window of the row in one `vpermt2w`, as binary32 by one
/// `vcvtph2ps`; the last ones from the window that ends where the blocks do; rows under 128
/// bytes as defined. Also Q5_1's (`BB` 24, codes `0..=TOP` 31).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
pub(super) fn q4_1_values_avx512<const BB: usize, const TOP: u32>(
    row: &[u8],
    ab: &mut [[f32; 2]],
) -> (u16, u32) {
    // Blocks whose first four bytes lie in one 128-byte window: 7 of Q4_1's, 6 of Q5_1's.
    const { assert!(BB == 20 || BB == 24) };
    let per_window: usize = (124 / BB) + 1;
    let blocks = (row.len() / BB).min(ab.len());
    let span = BB * blocks;
    if span < 128 {
        return table_values_defined::<BB>(row, ab);
    }
    // Word 2i, 2i + 1: d, m of the window's block i (lanes past the window's repeat block 0).
    let index: [u16; 32] =
        std::array::from_fn(|i| (i % (2 * per_window) / 2 * (BB / 2) + i % 2) as u16);
    // SAFETY: `index` is 64 readable bytes; unaligned load.
    let index = unsafe { _mm512_loadu_si512(index.as_ptr().cast()) };
    let magnitude = _mm256_set1_epi16(0x7fff);
    let (mut largest, mut w_max) = (_mm256_setzero_si256(), _mm512_setzero_ps());
    // Blocks `first..first + count` (`count <= per_window`) from the window at byte `at <= BB·first`.
    let mut window = |at: usize, first: usize, count: usize| {
        let window: &[u8; 128] = row[at..at + 128].try_into().expect("128 bytes");
        let ab = &mut ab[first..first + count];
        let shift = _mm512_set1_epi16(((BB * first - at) / 2) as i16);
        let keep = (1u32 << (2 * count)) - 1;
        // SAFETY: `window` is 128 readable bytes (two unaligned loads); the masked store
        // writes `2·count` f32 into `ab`, which is that long.
        unsafe {
            let (a, b) = (
                _mm512_loadu_si512(window.as_ptr().cast()),
                _mm512_loadu_si512(window[64..].as_ptr().cast()),
            );
            let h = _mm512_permutex2var_epi16(a, _mm512_add_epi16(index, shift), b);
            let h = _mm256_maskz_mov_epi16(keep as u16, _mm512_castsi512_si256(h));
            largest = _mm256_max_epu16(largest, _mm256_and_si256(h, magnitude));
            let x = _mm512_cvtph_ps(h);
            _mm512_mask_storeu_ps(ab.as_mut_ptr().cast(), keep as u16, x);
            // table_block_max, as in `block_max` (the masked-off lanes are zeros).
            let (a, b) = (_mm512_moveldup_ps(x), _mm512_movehdup_ps(x));
            let end = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(TOP as f32), a), b);
            w_max = _mm512_max_ps(w_max, _mm512_max_ps(_mm512_abs_ps(b), _mm512_abs_ps(end)));
        }
    };
    let windows = ((span - 128) / (per_window * BB) + 1).min(blocks / per_window);
    for w in 0..windows {
        window(w * per_window * BB, w * per_window, per_window);
    }
    let done = windows * per_window;
    if done < blocks {
        window(span - 128, done, blocks - done);
    }
    let largest = _mm_max_epu16(
        _mm256_castsi256_si128(largest),
        _mm256_extracti128_si256::<1>(largest),
    );
    let w_max = _mm256_max_ps(
        _mm512_castps512_ps256(w_max),
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(w_max))),
    );
    (lane_max_u16(largest), lane_max(w_max))
}

/// The Q4_1 (`BB` 20) or Q5_1 (24) values step as defined.
#[inline(always)]
fn table_values_defined<const BB: usize>(row: &[u8], ab: &mut [[f32; 2]]) -> (u16, u32) {
    if BB == 20 {
        PlainOps.q4_1_values(row, ab)
    } else {
        PlainOps.q5_1_values(row, ab)
    }
}

/// Eight `clamp(rne(x), ±32767)` as i32 lanes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn clamped(x: __m256) -> __m256i {
    let x = _mm256_cvtps_epi32(x);
    _mm256_min_epi32(
        _mm256_max_epi32(x, _mm256_set1_epi32(-32767)),
        _mm256_set1_epi32(32767),
    )
}

/// 16 multipliers from two vectors of `fl(e·unit)` into `m`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn store_multipliers(m: &mut [i16; 16], x0: __m256, x1: __m256) {
    // `packs` interleaves its operands' 128-bit lanes; the permute puts them back in order.
    let v = _mm256_packs_epi32(clamped(x0), clamped(x1));
    let v = _mm256_permute4x64_epi64::<0b11_01_10_00>(v);
    // SAFETY: `m` is 32 writable bytes; unaligned store.
    unsafe { _mm256_storeu_si256(m.as_mut_ptr().cast(), v) }
}

/// 8 multipliers from a vector of `fl(e·unit)` into `m`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn store_multipliers8(m: &mut [i16; 8], x: __m256) {
    let x = clamped(x);
    let v = _mm_packs_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256::<1>(x));
    // SAFETY: `m` is 16 writable bytes; unaligned store.
    unsafe { _mm_storeu_si128(m.as_mut_ptr().cast(), v) }
}

/// [`ScanOps::half_multipliers`] 16 at a time, then 8; the last `len % 8` with the items
/// before them, again (an elementwise map, so recomputing items is harmless); fewer than 8 as
/// defined.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn half_multipliers_avx2(h: &[u16], unit: f32, m: &mut [i16]) {
    let n = m.len().min(h.len());
    let (m, h) = (&mut m[..n], &h[..n]);
    let unit_v = _mm256_set1_ps(unit);
    let (groups, tail) = m.as_chunks_mut::<16>();
    let (h16, h_tail) = h.as_chunks::<16>();
    for (m, h) in groups.iter_mut().zip(h16) {
        let (lo, hi) = h.split_at(8);
        let x0 = _mm256_mul_ps(halves8(lo.try_into().expect("8")), unit_v);
        let x1 = _mm256_mul_ps(halves8(hi.try_into().expect("8")), unit_v);
        store_multipliers(m, x0, x1);
    }
    if let (Some(m), Some(h)) = (tail.first_chunk_mut::<8>(), h_tail.first_chunk::<8>()) {
        store_multipliers8(m, _mm256_mul_ps(halves8(h), unit_v));
    }
    if n.is_multiple_of(8) {
        return;
    }
    match (m.last_chunk_mut::<8>(), h.last_chunk::<8>()) {
        (Some(m), Some(h)) => store_multipliers8(m, _mm256_mul_ps(halves8(h), unit_v)),
        _ => PlainOps.half_multipliers(h, unit, m),
    }
}

/// [`ScanOps::multipliers`] 16 at a time, then 8; the last `len % 8` as defined.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn multipliers_avx2(e: &[f32], unit: f32, m: &mut [i16]) {
    let n = m.len().min(e.len());
    let (groups, tail) = m[..n].as_chunks_mut::<16>();
    let (e, e_tail) = e[..n].as_chunks::<16>();
    let unit_v = _mm256_set1_ps(unit);
    for (m, e) in groups.iter_mut().zip(e) {
        // SAFETY: `e` is 16 readable f32; unaligned loads.
        let (e0, e1) = unsafe {
            (
                _mm256_loadu_ps(e.as_ptr()),
                _mm256_loadu_ps(e[8..].as_ptr()),
            )
        };
        store_multipliers(m, _mm256_mul_ps(e0, unit_v), _mm256_mul_ps(e1, unit_v));
    }
    if let (Some(m), Some(e)) = (tail.first_chunk_mut::<8>(), e_tail.first_chunk::<8>()) {
        // SAFETY: `e` is 8 readable f32; unaligned load.
        let e = unsafe { _mm256_loadu_ps(e.as_ptr()) };
        store_multipliers8(m, _mm256_mul_ps(e, unit_v));
    }
    let done = tail.len() / 8 * 8;
    PlainOps.multipliers(&e_tail[done..], unit, &mut tail[done..]);
}

/// [`ScanOps::scale`] eight at a time; the last `len % 8` as defined.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn scale_avx2(x: &mut [f32], factor: f32) {
    let (groups, tail) = x.as_chunks_mut::<8>();
    let factor_v = _mm256_set1_ps(factor);
    for x in groups {
        // SAFETY: `x` is 8 readable and writable f32; unaligned load and store.
        unsafe {
            let v = _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr()), factor_v);
            _mm256_storeu_ps(x.as_mut_ptr(), v);
        }
    }
    PlainOps.scale(tail, factor);
}

/// [`ScanOps::halves`] by word permutes: the fields inside one 128-byte window of the row (up
/// to eight blocks) in one `vpermt2w`, their maximum kept in a register.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn halves_avx512<const BB: usize, const AT: usize>(row: &[u8], out: &mut [u16]) -> u16 {
    // Blocks whose field lies inside one 128-byte window (at most 8: one 16-byte store).
    let per_window: usize = const {
        let n = (126 - AT) / BB + 1;
        if n < 8 {
            n
        } else {
            8
        }
    };
    const { assert!(BB.is_multiple_of(2) && AT.is_multiple_of(2)) };
    // Lanes past `per_window` repeat the window's first fields: harmless for the maximum.
    let index: [u16; 32] = std::array::from_fn(|i| ((i % per_window * BB + AT) / 2) as u16);
    // SAFETY: `index` is 64 readable bytes; unaligned load.
    let index = unsafe { _mm512_loadu_si512(index.as_ptr().cast()) };
    let blocks = (row.len() / BB).min(out.len());
    // The bytes of those blocks.
    let span = blocks * BB;
    let windows = if span >= 128 {
        ((span - 128) / (per_window * BB) + 1).min(blocks / per_window)
    } else {
        0
    };
    let magnitude = _mm_set1_epi16(0x7fff);
    let mut largest = _mm_setzero_si128();
    // The fields of the blocks `first..first + count` (`count <= per_window`) of the 128-byte
    // window at byte `at <= first·BB` of the row.
    let mut window = |at: usize, first: usize, count: usize| {
        let window: &[u8; 128] = row[at..at + 128].try_into().expect("128 bytes");
        let shift = _mm512_set1_epi16(((first * BB - at) / 2) as i16);
        let out = &mut out[first..first + count];
        // SAFETY: `window` is 128 readable bytes (two unaligned loads); the masked store
        // writes `count` u16 into `out`, which is that long.
        unsafe {
            let (a, b) = (
                _mm512_loadu_si512(window.as_ptr().cast()),
                _mm512_loadu_si512(window[64..].as_ptr().cast()),
            );
            let v = _mm512_permutex2var_epi16(a, _mm512_add_epi16(index, shift), b);
            let v = _mm512_castsi512_si128(v);
            let keep = ((1u16 << count) - 1) as u8;
            _mm_mask_storeu_epi16(out.as_mut_ptr().cast(), keep, v);
            let v = _mm_maskz_mov_epi16(keep, v);
            largest = _mm_max_epu16(largest, _mm_and_si128(v, magnitude));
        }
    };
    for w in 0..windows {
        window(w * per_window * BB, w * per_window, per_window);
    }
    let done = windows * per_window;
    if windows > 0 && done < blocks {
        // The rest (fewer than a window holds, all within the last 128 bytes of the blocks)
        // from the window that ends where the blocks do.
        window(span - 128, done, blocks - done);
        return lane_max_u16(largest);
    }
    let mut tail = 0;
    for (h, blk) in out[done..blocks]
        .iter_mut()
        .zip(row[done * BB..].as_chunks::<BB>().0)
    {
        *h = u16::from_le_bytes([blk[AT], blk[AT + 1]]);
        tail = tail.max(*h & 0x7fff);
    }
    lane_max_u16(largest).max(tail)
}

/// [`ScanOps::halves`] eight blocks at a time ([`dwords8`]), their maximum kept in a register.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn halves_avx2<const BB: usize, const AT: usize>(row: &[u8], out: &mut [u16]) -> u16 {
    const { assert!(AT + 4 <= BB) };
    let blocks = (row.len() / BB).min(out.len());
    let magnitude = _mm_set1_epi16(0x7fff);
    let mut largest = _mm_setzero_si128();
    // The fields of blocks `first..first + 8`.
    let mut group = |first: usize| {
        let out: &mut [u16; 8] = (&mut out[first..first + 8]).try_into().expect("8");
        let [d0, d1, d2, d3, d4, d5, d6, d7] = dwords8::<BB, AT>(eight_blocks::<BB>(row, first));
        // The low words of the eight dwords, in order.
        let (w01, w23) = (_mm_unpacklo_epi16(d0, d1), _mm_unpacklo_epi16(d2, d3));
        let (w45, w67) = (_mm_unpacklo_epi16(d4, d5), _mm_unpacklo_epi16(d6, d7));
        let v = _mm_unpacklo_epi64(_mm_unpacklo_epi32(w01, w23), _mm_unpacklo_epi32(w45, w67));
        largest = _mm_max_epu16(largest, _mm_and_si128(v, magnitude));
        // SAFETY: `out` is 8 writable u16; unaligned store.
        unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), v) };
    };
    for g in 0..blocks / 8 {
        group(8 * g);
    }
    if blocks >= 8 {
        // The last `blocks % 8` with the seven before them, again.
        if !blocks.is_multiple_of(8) {
            group(blocks - 8);
        }
        return lane_max_u16(largest);
    }
    let mut rest = 0;
    for (h, blk) in out[..blocks].iter_mut().zip(row.as_chunks::<BB>().0) {
        *h = u16::from_le_bytes([blk[AT], blk[AT + 1]]);
        rest = rest.max(*h & 0x7fff);
    }
    rest
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::Isa;
    use crate::testutil::Rng;

    /// fp16 values that stress the steps: both zeros, subnormals, the extremes, NaN, infinity.
    const SPECIAL: [u16; 10] = [
        0x0000, 0x8000, 0x0001, 0x83ff, 0x0400, 0x7bff, 0xfbff, 0x3c00, 0x7c00, 0xfe00,
    ];

    fn half(rng: &mut Rng, finite: bool) -> u16 {
        let h = if rng.below(3) == 0 {
            SPECIAL[rng.below(SPECIAL.len())]
        } else {
            rng.next_u32() as u16
        };
        if finite && h & 0x7c00 == 0x7c00 {
            h & 0xbfff
        } else {
            h
        }
    }

    /// Every step of `ops` against its definition on random rows of 1..=40 blocks (or items).
    fn agree(ops: impl ScanOps, what: &str) {
        let mut rng = Rng::new(21);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for round in 0..1500 {
            let len = 1 + round % 40;
            let ctx = format!("{what} round {round}, {len} items");
            // The fp16 fields of the plain block types (windows, eight-block groups and their edges; an
            // output shorter than the row).
            let mut row = vec![0u8; 34 * len];
            rng.fill_bytes(&mut row);
            for out_len in [len, len + 5, len.div_ceil(2)] {
                let (mut want, mut got) = (vec![7u16; out_len], vec![7u16; out_len]);
                macro_rules! same {
                    ($bb:literal, $at:literal) => {
                        let w = PlainOps.halves::<$bb, $at>(&row[..$bb * len], &mut want);
                        let g = ops.halves::<$bb, $at>(&row[..$bb * len], &mut got);
                        assert_eq!((g, &got), (w, &want), "{ctx}: halves {} at {}", $bb, $at);
                    };
                }
                same!(18, 0);
                same!(20, 0);
                same!(20, 2);
                same!(22, 0);
                same!(34, 0);
            }
            // Q4_K and Q6_K super-blocks with special d, dmin.
            let blocks = 1 + round % 9;
            let mut row = vec![0u8; 210 * blocks];
            rng.fill_bytes(&mut row);
            for blk in row.chunks_exact_mut(144) {
                for at in [0, 2] {
                    blk[at..at + 2].copy_from_slice(&half(&mut rng, round % 2 == 0).to_le_bytes());
                }
            }
            let (mut want, mut got) = (vec![[0f32; 2]; 8 * blocks], vec![[0f32; 2]; 8 * blocks]);
            let w = PlainOps.q4_k_values(&row[..144 * blocks], &mut want);
            let g = ops.q4_k_values(&row[..144 * blocks], &mut got);
            assert_eq!(g.0, w.0, "{ctx}: Q4_K largest half");
            if w.0 < 0x7c00 {
                assert_eq!(g.1, w.1, "{ctx}: Q4_K M_n");
                assert_eq!(
                    bits(got.as_flattened()),
                    bits(want.as_flattened()),
                    "{ctx}: Q4_K"
                );
            }
            for blk in row.chunks_exact_mut(210) {
                blk[208..].copy_from_slice(&half(&mut rng, round % 2 == 0).to_le_bytes());
            }
            let (mut want, mut got) = (vec![0f32; 16 * blocks], vec![0f32; 16 * blocks]);
            let w = PlainOps.q6_k_values(&row, &mut want);
            let g = ops.q6_k_values(&row, &mut got);
            assert_eq!(g.0, w.0, "{ctx}: Q6_K largest half");
            if w.0 < 0x7c00 {
                assert_eq!((g.1, bits(&got)), (w.1, bits(&want)), "{ctx}: Q6_K");
            }
            // Q4_1 blocks (`d`, `m` of both kinds), whole and with an output shorter than the row.
            let mut row = vec![0u8; 20 * len];
            rng.fill_bytes(&mut row);
            for blk in row.chunks_exact_mut(20) {
                for at in [0, 2] {
                    blk[at..at + 2].copy_from_slice(&half(&mut rng, round % 2 == 0).to_le_bytes());
                }
            }
            for out_len in [len, len.div_ceil(2)] {
                let (mut want, mut got) = (vec![[0f32; 2]; out_len], vec![[0f32; 2]; out_len]);
                let w = PlainOps.q4_1_values(&row, &mut want);
                let g = ops.q4_1_values(&row, &mut got);
                assert_eq!(g.0, w.0, "{ctx}: Q4_1 largest half");
                if w.0 < 0x7c00 {
                    assert_eq!(g.1, w.1, "{ctx}: Q4_1 M_n");
                    assert_eq!(
                        bits(got.as_flattened()),
                        bits(want.as_flattened()),
                        "{ctx}: Q4_1"
                    );
                }
            }
            // The multipliers, from finite halves.
            let h0: Vec<u16> = (0..len).map(|_| half(&mut rng, true)).collect();
            let h1: Vec<u16> = (0..len).map(|_| half(&mut rng, true)).collect();
            let mut want = vec![[0f32; 2]; len];
            for ((ab, &d), &m) in want.iter_mut().zip(&h0).zip(&h1) {
                *ab = [d, m].map(crate::quant::fp16::f16_to_f32);
            }
            let largest = h0.iter().map(|&h| h & 0x7fff).max().unwrap_or(0);
            let e_max = crate::quant::fp16::f16_to_f32(largest);
            let units = [0.0, 32768.0 / e_max, 2048.0 * 127.0 / (8.0 * e_max), 1e-3];
            let e: Vec<f32> = want.as_flattened().to_vec();
            // The method's multipliers stay within ±32768 (`|e| <= E_n`).
            let e_largest = e.iter().fold(0f32, |m, e| m.max(e.abs()));
            for unit in units.into_iter().filter(|u| u.is_finite()) {
                let (mut want, mut got) = (vec![0i16; len], vec![0i16; len]);
                PlainOps.half_multipliers(&h0, unit, &mut want);
                ops.half_multipliers(&h0, unit, &mut got);
                assert_eq!(got, want, "{ctx}: multipliers of halves, unit {unit}");
            }
            for factor in [0.0, 127.0 / e_largest, 1.5] {
                let (mut want, mut got) = (e.clone(), e.clone());
                PlainOps.scale(&mut want, factor);
                ops.scale(&mut got, factor);
                assert_eq!(bits(&got), bits(&want), "{ctx}: scale by {factor}");
            }
            let e_units = [0.0, 32512.0 / e_largest, 32768.0 / e_largest, 0.3];
            for unit in e_units.into_iter().filter(|u| u.is_finite()) {
                let (mut want, mut got) = (vec![0i16; 2 * len], vec![0i16; 2 * len]);
                PlainOps.multipliers(&e, unit, &mut want);
                ops.multipliers(&e, unit, &mut got);
                assert_eq!(got, want, "{ctx}: multipliers, unit {unit}");
            }
        }
    }

    #[test]
    fn avx2_steps_agree_with_their_definitions() {
        if Isa::Avx2.is_available() {
            // SAFETY: AVX2 and F16C are available (checked).
            agree(unsafe { OpsAvx2::new() }, "AVX2");
        }
    }

    #[test]
    fn avx512_steps_agree_with_their_definitions() {
        if Isa::Avx512.is_available() {
            // SAFETY: the AVX-512 path's features are available (checked).
            agree(unsafe { OpsAvx512::new() }, "AVX-512");
        }
    }
}
