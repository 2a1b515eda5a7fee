//! AVX2 kernels: one tile row per step, a whole 32-byte run per 256-bit store (lane 0: the
//! run's weights 0..16, lane 1: 16..32), each row's blocks of a group of runs as one fixed-size
//! array. The table types build two runs' tables per set of 256-bit operations (lane 0 one
//! run's, lane 1 the next's; Q4_0, Q4_1 and Q5_0 also look both runs up at once and put each
//! run together with two lane permutes), so that a table costs half the operations.

use super::super::params::{fixed_codes, fixed_scales, scaled_codes, table_fixed, TileParams};
use super::super::tile::{
    for_each_block, for_each_block_group, for_each_row_block_group, Tile, GROUP,
};
use super::super::RUN;
use super::{load16, rescale_table};
use crate::quant::GgmlType;
use std::arch::x86_64::*;

#[inline]
#[target_feature(enable = "avx2,f16c")]
fn load32(src: &[u8]) -> __m256i {
    let src: &[u8; 32] = src[..32].try_into().expect("32 bytes");
    // SAFETY: `src` is 32 readable bytes; unaligned load.
    unsafe { _mm256_loadu_si256(src.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn store32(dst: &mut [i8; RUN], v: __m256i) {
    // SAFETY: `dst` is 32 writable bytes; unaligned store.
    unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), v) }
}

/// `(sat16(mulhrs(c, f) + g) + 2⁵) >> 6` of the 16-bit lanes of `c`: `table_entry`'s steps
/// after the code (`mulhrs(x, 512)` is the rounding shift).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn fixed_step(c: __m256i, f: __m256i, g: __m256i) -> __m256i {
    let product = _mm256_mulhrs_epi16(c, f);
    _mm256_mulhrs_epi16(_mm256_adds_epi16(product, g), _mm256_set1_epi16(512))
}

/// The codes `step·q` of a Q4_1/Q4_K table (`table_entry`): codes 0..8 in both lanes of the
/// first vector, 8..16 in those of the second, so that `packs` puts each lane's 16 in order.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn table16_codes() -> [__m256i; 2] {
    let c: [i16; 16] = fixed_codes();
    [0, 8].map(|first| {
        // SAFETY: `c[first..]` is at least 16 readable bytes; unaligned load.
        _mm256_broadcastsi128_si256(unsafe { _mm_loadu_si128(c[first..].as_ptr().cast()) })
    })
}

/// The 16-entry table of a Q4_1 or Q4_K run in both 128-bit lanes, `table_entry` of
/// [`table_fixed`]`([fl(a·inv), fl(b·inv)])` (`c`: [`table16_codes`]).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn table32(c: &[__m256i; 2], [a, b]: [f32; 2], inv: f32) -> __m256i {
    let [f, g] = table_fixed::<16>([a * inv, b * inv]);
    let (f, g) = (_mm256_set1_epi16(f), _mm256_set1_epi16(g));
    _mm256_packs_epi16(fixed_step(c[0], f, g), fixed_step(c[1], f, g))
}

/// The tables of two runs `[a, b]` (`ab`, adjacent in the row's parameters) of a row with
/// factor `inv` (in every lane): lane 0 run 0's 16 entries, lane 1 run 1's, [`table32`]'s.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn table_pair(c: &[__m256i; 2], ab: &[[f32; 2]; 2], inv: __m128) -> __m256i {
    // SAFETY: `ab` is 16 readable bytes; unaligned load.
    let v = _mm_mul_ps(unsafe { _mm_loadu_ps(ab.as_ptr().cast()) }, inv);
    // [F0, G0, F1, G1]: exact products, then rounded to nearest-even and saturated to 16 bits.
    let [f_scale, g_scale] = fixed_scales(16);
    let v = _mm_mul_ps(v, _mm_setr_ps(f_scale, g_scale, f_scale, g_scale));
    let words = _mm_packs_epi32(_mm_cvtps_epi32(v), _mm_setzero_si128());
    let words = _mm256_broadcastsi128_si256(words);
    #[rustfmt::skip]
    let (f_at, g_at) = (
        _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                         4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5),
        _mm256_setr_epi8(2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
                         6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7),
    );
    let (f, g) = (
        _mm256_shuffle_epi8(words, f_at),
        _mm256_shuffle_epi8(words, g_at),
    );
    _mm256_packs_epi16(fixed_step(c[0], f, g), fixed_step(c[1], f, g))
}

/// The 32 nibble indices of 16 quant bytes: low nibbles in lane 0, high nibbles in lane 1.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn nibbles(q: __m128i) -> __m256i {
    _mm256_and_si256(
        _mm256_set_m128i(_mm_srli_epi16::<4>(q), q),
        _mm256_set1_epi8(15),
    )
}

/// `sat8((y·m + 2¹⁴) >> 15)` for each of 32 signed bytes `x`, `y = x·2^(8 - SHIFT)`, `m` the
/// multipliers of its lane. In-lane throughout, so bytes keep their places.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn rescale<const SHIFT: i32>(x: __m256i, m: __m256i) -> __m256i {
    let z = _mm256_setzero_si256();
    let lo = _mm256_srai_epi16::<SHIFT>(_mm256_unpacklo_epi8(z, x));
    let hi = _mm256_srai_epi16::<SHIFT>(_mm256_unpackhi_epi8(z, x));
    _mm256_packs_epi16(_mm256_mulhrs_epi16(lo, m), _mm256_mulhrs_epi16(hi, m))
}

/// 16 signed bytes at the start of `src` as 16-bit lanes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn widen16(src: &[u8]) -> __m256i {
    _mm256_cvtepi8_epi16(load16(src))
}

/// `m[0]` in the 16-bit lanes of lane 0, `m[1]` in those of lane 1: the multipliers of two
/// runs, one per 128-bit lane.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) fn pair_multipliers(m: &[i16]) -> __m256i {
    let pair = (m[0] as u16 as u32 | (m[1] as u16 as u32) << 16) as i32;
    #[rustfmt::skip]
    let halves = _mm256_setr_epi8(
        0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
        2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
    );
    _mm256_shuffle_epi8(_mm256_set1_epi32(pair), halves)
}

/// The nibble-table types (Q4_0, IQ4_NL, MXFP4, IQ4_XS): a group of `G` runs is `GB` bytes of
/// the row, run `g`'s 16 quant bytes at `QS + g·RS` of them (single-run blocks: `RS` the block's
/// bytes; IQ4_XS: a super-block of 8 runs), weight `i` the low (`i < 16`) or high nibble of
/// byte `i % 16` through the run's table `sat8((c[q]·m + 2¹⁴) >> 15)` of the scaled codes `c`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn nibble_rescale<const G: usize, const GB: usize, const QS: usize, const RS: usize>(
    rows: &[&[u8]],
    params: &TileParams,
    tile: &mut Tile,
    runs: usize,
    c: &[i16; 16],
) {
    const { assert!(G.is_multiple_of(2) && QS + (G - 1) * RS + 16 <= GB) };
    // SAFETY: each load reads 8 of `c`'s 16 i16 (16 bytes, in bounds); unaligned.
    let [c_lo, c_hi] = [0, 8]
        .map(|at| unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(c[at..].as_ptr().cast())) });
    let low = _mm256_set1_epi8(15);
    // Runs r, r + 1 (quant bytes `q0`, `q1`, multipliers `m`): one table pair (lane 0 run r's
    // table, lane 1 run r + 1's) from one pair of multiplies and one pack; it looks up both
    // runs' quant bytes at once, their low nibbles (weights 0..16) in one vector, high nibbles
    // (16..32) in another, and two lane permutes put each run together.
    let pair = |q0: &[u8], q1: &[u8], m: &[i16], even: &mut [i8; RUN], odd: &mut [i8; RUN]| {
        let m = pair_multipliers(m);
        let t = _mm256_packs_epi16(_mm256_mulhrs_epi16(c_lo, m), _mm256_mulhrs_epi16(c_hi, m));
        let q = _mm256_set_m128i(load16(q1), load16(q0));
        let first = _mm256_shuffle_epi8(t, _mm256_and_si256(q, low));
        let second = _mm256_shuffle_epi8(t, _mm256_and_si256(_mm256_srli_epi16::<4>(q), low));
        store32(even, _mm256_permute2x128_si256::<0x20>(first, second));
        store32(odd, _mm256_permute2x128_si256::<0x31>(first, second));
    };
    let m = params.m();
    let full = runs / G * G;
    for_each_block_group::<G, 1, GB, _>(rows, m, tile, 0..full, |_, [blk], [m], out| {
        let mut out = out.into_iter();
        for p in (0..G).step_by(2) {
            let (Some([even]), Some([odd])) = (out.next(), out.next()) else {
                unreachable!("G runs")
            };
            let at = QS + p * RS;
            pair(&blk[at..], &blk[at + RS..], &m[p..p + 2], even, odd);
        }
    });
    // The last `runs % G`, one at a time (only formats of one block per run have them).
    if full < runs {
        for_each_block_group::<1, 1, RS, _>(
            rows,
            m,
            tile,
            full..runs,
            |_, [blk], [[m]], [[out]]| {
                let lut = _mm256_broadcastsi128_si256(rescale_table(c, *m));
                store32(out, _mm256_shuffle_epi8(lut, nibbles(load16(&blk[QS..]))));
            },
        );
    }
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn q4_0(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let c = scaled_codes(GgmlType::Q4_0);
    nibble_rescale::<GROUP, 72, 2, 18>(rows, params, tile, runs, &c);
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn iq4_nl(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let c = scaled_codes(GgmlType::IQ4_NL);
    nibble_rescale::<GROUP, 72, 2, 18>(rows, params, tile, runs, &c);
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn mxfp4(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let c = scaled_codes(GgmlType::MXFP4);
    nibble_rescale::<GROUP, 68, 1, 17>(rows, params, tile, runs, &c);
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn iq4_xs(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let c = scaled_codes(GgmlType::IQ4_XS);
    nibble_rescale::<8, 136, 8, 16>(rows, params, tile, runs, &c);
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn q4_1(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let c = table16_codes();
    let low = _mm256_set1_epi8(15);
    // Runs r, r + 1 (blocks `b0`, `b1`): one table pair (lane 0 run r's table, lane 1 run r +
    // 1's) looks up both runs' quant bytes at once, their low nibbles (weights 0..16) in one
    // vector, high nibbles (16..32) in another; two lane permutes put each run together.
    let pair = |b0: &[u8; 20],
                b1: &[u8; 20],
                ab: &[[f32; 2]; 2],
                inv: __m128,
                even: &mut [i8; RUN],
                odd: &mut [i8; RUN]| {
        let t = table_pair(&c, ab, inv);
        let q = _mm256_set_m128i(load16(&b1[4..]), load16(&b0[4..]));
        let first = _mm256_shuffle_epi8(t, _mm256_and_si256(q, low));
        let second = _mm256_shuffle_epi8(t, _mm256_and_si256(_mm256_srli_epi16::<4>(q), low));
        store32(even, _mm256_permute2x128_si256::<0x20>(first, second));
        store32(odd, _mm256_permute2x128_si256::<0x31>(first, second));
    };
    let (ab, inv) = (params.ab(), params.factors());
    // Eight runs per step (one bounds check per row and step), then four, then one at a time.
    let (eights, fours) = (runs / 8 * 8, runs / GROUP * GROUP);
    for_each_row_block_group::<8, 1, 160, _>(rows, ab, tile, 0..eights, |_, j, [blk], [p], out| {
        let (blk, p, inv) = (
            blk.as_chunks::<20>().0,
            p.as_chunks::<2>().0,
            _mm_set1_ps(inv[j]),
        );
        let [[o0], [o1], [o2], [o3], [o4], [o5], [o6], [o7]] = out;
        pair(&blk[0], &blk[1], &p[0], inv, o0, o1);
        pair(&blk[2], &blk[3], &p[1], inv, o2, o3);
        pair(&blk[4], &blk[5], &p[2], inv, o4, o5);
        pair(&blk[6], &blk[7], &p[3], inv, o6, o7);
    });
    let fours_range = eights..fours;
    for_each_row_block_group::<GROUP, 1, 80, _>(
        rows,
        ab,
        tile,
        fours_range,
        |_, j, [blk], [p], out| {
            let (blk, p, inv) = (
                blk.as_chunks::<20>().0,
                p.as_chunks::<2>().0,
                _mm_set1_ps(inv[j]),
            );
            let [[o0], [o1], [o2], [o3]] = out;
            pair(&blk[0], &blk[1], &p[0], inv, o0, o1);
            pair(&blk[2], &blk[3], &p[1], inv, o2, o3);
        },
    );
    let last = fours..runs;
    for_each_row_block_group::<1, 1, 20, _>(
        rows,
        ab,
        tile,
        last,
        |_, j, [blk], [[ab]], [[out]]| {
            let lut = table32(&c, *ab, inv[j]);
            store32(out, _mm256_shuffle_epi8(lut, nibbles(load16(&blk[4..]))));
        },
    );
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn q5_0(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let c: [i16; 32] = scaled_codes(GgmlType::Q5_0);
    // `codes[k]`: the codes 8k..8k + 8 in both lanes.
    // SAFETY: each load reads 8 of `c`'s 32 i16 (16 bytes, in bounds); unaligned.
    let codes = [0, 8, 16, 24]
        .map(|at| unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(c[at..].as_ptr().cast())) });
    let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let low = _mm256_set1_epi8(15);
    // Byte i of a lane (weight i, or 16 + i, of its run) takes byte i / 8 (or 2 + i / 8) of its
    // run's qh.
    #[rustfmt::skip]
    let (spread_first, spread_second) = (
        _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
        ),
        _mm256_setr_epi8(
            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
        ),
    );
    let fifth = |qh: __m256i, spread: __m256i| {
        _mm256_cmpeq_epi8(
            _mm256_and_si256(_mm256_shuffle_epi8(qh, spread), bits),
            bits,
        )
    };
    let qh = |blk: &[u8; 22]| i32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
    // Runs r, r + 1 (blocks `b0`, `b1`): two table pairs (lane 0 run r's table of the codes
    // 0..16, or 16..32, lane 1 run r + 1's) from two pairs of multiplies and two packs; each
    // weight's nibble goes through both and its fifth bit picks one. Both runs' low nibbles
    // (weights 0..16) in one vector, high nibbles in another; two lane permutes put each run
    // together.
    let pair =
        |b0: &[u8; 22], b1: &[u8; 22], m: &[i16], even: &mut [i8; RUN], odd: &mut [i8; RUN]| {
            let m = pair_multipliers(m);
            let table =
                |c0, c1| _mm256_packs_epi16(_mm256_mulhrs_epi16(c0, m), _mm256_mulhrs_epi16(c1, m));
            let (t_lo, t_hi) = (table(codes[0], codes[1]), table(codes[2], codes[3]));
            let qh = _mm256_set_m128i(_mm_set1_epi32(qh(b1)), _mm_set1_epi32(qh(b0)));
            let q = _mm256_set_m128i(load16(&b1[6..]), load16(&b0[6..]));
            let pick = |n: __m256i, fifth: __m256i| {
                let (x, y) = (_mm256_shuffle_epi8(t_lo, n), _mm256_shuffle_epi8(t_hi, n));
                _mm256_blendv_epi8(x, y, fifth)
            };
            let first = pick(_mm256_and_si256(q, low), fifth(qh, spread_first));
            let high = _mm256_and_si256(_mm256_srli_epi16::<4>(q), low);
            let second = pick(high, fifth(qh, spread_second));
            store32(even, _mm256_permute2x128_si256::<0x20>(first, second));
            store32(odd, _mm256_permute2x128_si256::<0x31>(first, second));
        };
    // One run: the tables of the codes 0..16 and 16..32 in the two lanes of one vector.
    let (c_lo, c_hi) = (
        _mm256_permute2x128_si256::<0x20>(codes[0], codes[2]),
        _mm256_permute2x128_si256::<0x20>(codes[1], codes[3]),
    );
    // Byte i of the vector (weight i of the run) takes byte i / 8 of qh.
    let spread = _mm256_permute2x128_si256::<0x30>(spread_first, spread_second);
    let single = |blk: &[u8; 22], m: i16, out: &mut [i8; RUN]| {
        let m = _mm256_set1_epi16(m);
        let t = _mm256_packs_epi16(_mm256_mulhrs_epi16(c_lo, m), _mm256_mulhrs_epi16(c_hi, m));
        let fifth = fifth(_mm256_set1_epi32(qh(blk)), spread);
        let q = nibbles(load16(&blk[6..]));
        let low = _mm256_shuffle_epi8(_mm256_permute2x128_si256::<0x00>(t, t), q);
        let high = _mm256_shuffle_epi8(_mm256_permute2x128_si256::<0x11>(t, t), q);
        store32(out, _mm256_blendv_epi8(low, high, fifth));
    };
    let m = params.m();
    let full = runs / GROUP * GROUP;
    for_each_block_group::<GROUP, 1, 88, _>(rows, m, tile, 0..full, |_, [blk], [m], out| {
        let blk = blk.as_chunks::<22>().0;
        let [[o0], [o1], [o2], [o3]] = out;
        pair(&blk[0], &blk[1], &m[..2], o0, o1);
        pair(&blk[2], &blk[3], &m[2..], o2, o3);
    });
    for_each_block_group::<1, 1, 22, _>(rows, m, tile, full..runs, |_, [blk], [[m]], [[out]]| {
        single(blk, *m, out)
    });
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn q8_0(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    for_each_block::<1, 34, 136, _>(rows, params.m(), tile, runs, |[blk], [m], [out]| {
        // The quants sign-extended to 16 bits straight from memory (weights 0..16, 16..32);
        // `packs` interleaves their lanes, one quadword permute restores the order.
        let (lo, hi) = (widen16(&blk[2..]), widen16(&blk[18..]));
        let m = _mm256_set1_epi16(m);
        let y = _mm256_packs_epi16(_mm256_mulhrs_epi16(lo, m), _mm256_mulhrs_epi16(hi, m));
        store32(out, _mm256_permute4x64_epi64::<0b11_01_10_00>(y));
    });
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn q4_k(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let c = table16_codes();
    let low = _mm256_set1_epi8(15);
    // Runs 2p, 2p + 1 of a super-block: the low and high nibbles of its quant bytes 32p..32p+32,
    // their tables from one table pair.
    let pair = |blk: &[u8; 144],
                p: usize,
                ab: &[[f32; 2]; 2],
                inv: __m128,
                even: &mut [i8; RUN],
                odd: &mut [i8; RUN]| {
        let t = table_pair(&c, ab, inv);
        let q = load32(&blk[16 + 32 * p..]);
        let lut0 = _mm256_permute2x128_si256::<0x00>(t, t);
        store32(even, _mm256_shuffle_epi8(lut0, _mm256_and_si256(q, low)));
        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), low);
        let lut1 = _mm256_permute2x128_si256::<0x11>(t, t);
        store32(odd, _mm256_shuffle_epi8(lut1, hi));
    };
    let (ab, inv) = (params.ab(), params.factors());
    for_each_row_block_group::<8, 1, 144, _>(rows, ab, tile, 0..runs, |_, j, [blk], [p], out| {
        let [[e0], [o0], [e1], [o1], [e2], [o2], [e3], [o3]] = out;
        let (p, inv) = (p.as_chunks::<2>().0, _mm_set1_ps(inv[j]));
        pair(blk, 0, &p[0], inv, e0, o0);
        pair(blk, 1, &p[1], inv, e1, o1);
        pair(blk, 2, &p[2], inv, e2, o2);
        pair(blk, 3, &p[3], inv, e3, o3);
    });
}

/// For the formats of two sets of 16 per run (Q6_K, Q3_K): the multipliers `clamp(rne(fl(e·
/// unit)), ±32767)` of a group of 8 runs of one row from their `e`, run `t`'s first set's in the
/// 16-bit lanes of 128-bit lane 0, its second's in those of lane 1. The pack saturates to 16 bits
/// first, which the clamp then narrows.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn set_multipliers(e: &[[f32; 2]; 8], unit: f32) -> [__m256i; 8] {
    let e = e.as_flattened();
    // SAFETY: `e` is 16 readable f32; unaligned loads.
    let (e0, e1) = unsafe {
        (
            _mm256_loadu_ps(e.as_ptr()),
            _mm256_loadu_ps(e[8..].as_ptr()),
        )
    };
    let unit = _mm256_set1_ps(unit);
    let m = |e: __m256| _mm256_cvtps_epi32(_mm256_mul_ps(e, unit));
    let v = _mm256_packs_epi32(m(e0), m(e1));
    let v = _mm256_max_epi16(
        _mm256_min_epi16(v, _mm256_set1_epi16(32767)),
        _mm256_set1_epi16(-32767),
    );
    // The pack leaves words m0..4, m8..12 | m4..8, m12..16: words 2t, 2t + 1 are dword `at[t]`,
    // broadcast, then word 0 of it spread over lane 0 and word 1 over lane 1.
    let at = [0, 1, 4, 5, 2, 3, 6, 7];
    #[rustfmt::skip]
    let halves = _mm256_setr_epi8(
        0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
        2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
    );
    std::array::from_fn(|t| {
        let pair = _mm256_permutevar8x32_epi32(v, _mm256_set1_epi32(at[t]));
        _mm256_shuffle_epi8(pair, halves)
    })
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn q6_k(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let (low, bits45, bias) = (
        _mm256_set1_epi8(15),
        _mm256_set1_epi8(0x30),
        _mm256_set1_epi8(32),
    );
    // 4·(q - 32) with each 16-weight half's multiplier.
    let put = |out: &mut [i8; RUN], code: __m256i, m: __m256i| {
        store32(out, rescale::<6>(_mm256_sub_epi8(code, bias), m))
    };
    // The four runs of 128-weight half `h` of a super-block: low (runs 0, 1) and high (2, 3)
    // nibbles of ql[64h..][..32], ql[64h + 32..][..32], and bits 2t, 2t + 1 of qh[32h..][..32].
    let half = |blk: &[u8; 210], h: usize, m: [__m256i; 4], out: [&mut [i8; RUN]; 4]| {
        let (ql, qh) = (64 * h, 128 + 32 * h);
        let (ql0, ql1, qh) = (
            load32(&blk[ql..]),
            load32(&blk[ql + 32..]),
            load32(&blk[qh..]),
        );
        let and = _mm256_and_si256;
        let [o0, o1, o2, o3] = out;
        put(
            o0,
            _mm256_or_si256(and(ql0, low), and(_mm256_slli_epi16::<4>(qh), bits45)),
            m[0],
        );
        put(
            o1,
            _mm256_or_si256(and(ql1, low), and(_mm256_slli_epi16::<2>(qh), bits45)),
            m[1],
        );
        put(
            o2,
            _mm256_or_si256(and(_mm256_srli_epi16::<4>(ql0), low), and(qh, bits45)),
            m[2],
        );
        let c3 = and(_mm256_srli_epi16::<2>(qh), bits45);
        put(
            o3,
            _mm256_or_si256(and(_mm256_srli_epi16::<4>(ql1), low), c3),
            m[3],
        );
    };
    let (e, unit) = (params.e_pairs(), params.factors());
    for_each_row_block_group::<8, 1, 210, _>(rows, e, tile, 0..runs, |_, j, [blk], [e], out| {
        let [[o0], [o1], [o2], [o3], [o4], [o5], [o6], [o7]] = out;
        let m = set_multipliers(e, unit[j]);
        half(blk, 0, [m[0], m[1], m[2], m[3]], [o0, o1, o2, o3]);
        half(blk, 1, [m[4], m[5], m[6], m[7]], [o4, o5, o6, o7]);
    });
}

/// `v` with bit `from` of each byte moved to bit `to` (other bits: garbage to mask off; a
/// 16-bit shift, so bits cross into the neighbouring byte's far end only).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn move_bit(v: __m256i, from: u32, to: u32) -> __m256i {
    if from >= to {
        _mm256_srl_epi16(v, _mm_cvtsi32_si128((from - to) as i32))
    } else {
        _mm256_sll_epi16(v, _mm_cvtsi32_si128((to - from) as i32))
    }
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn q3_k(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    // Table entry i = q2 + 4·hbit (code i - 4), scaled by 32: each set's 8 entries, twice per
    // 128-bit lane after the pack (lane 0: the run's first set, lane 1: its second).
    let codes = _mm256_broadcastsi128_si256(_mm_setr_epi16(-128, -96, -64, -32, 0, 32, 64, 96));
    let (three, four) = (_mm256_set1_epi8(3), _mm256_set1_epi8(4));
    let (e, unit) = (params.e_pairs(), params.factors());
    // Run s of a super-block: 2-bit field s % 4 of qs[32·(s / 4)..][..32], bit s of hmask.
    for_each_row_block_group::<8, 1, 110, _>(rows, e, tile, 0..runs, |_, j, [blk], [e], out| {
        let hmask = load32(blk);
        let qs = [load32(&blk[32..]), load32(&blk[64..])];
        let m = set_multipliers(e, unit[j]);
        for (s, [out]) in out.into_iter().enumerate() {
            let t = _mm256_mulhrs_epi16(codes, m[s]);
            let t = _mm256_packs_epi16(t, t);
            let low = _mm256_and_si256(move_bit(qs[s / 4], 2 * (s as u32 % 4), 0), three);
            let high = _mm256_and_si256(move_bit(hmask, s as u32, 2), four);
            store32(out, _mm256_shuffle_epi8(t, _mm256_or_si256(low, high)));
        }
    });
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn q2_k(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let order = _mm256_setr_epi32(0, 4, 2, 6, 1, 5, 3, 7);
    let (three, twelve) = (_mm256_set1_ps(3.0), _mm256_set1_epi8(12));
    // The tables of four runs (their eight sets' `[f, g]`): lane 0 the runs' first sets, lane
    // 1 their second ones; byte 4q + t of a lane is code q of run t's set, `sat8(rne(fl(fl(q·f)
    // + g)))` (fl(0·f) + g = g and fl(2·f) = f + f: the same values), from their `[a, b]`
    // times the row's `inv_n`: `[f, g]`.
    let tables = |fg: &[[f32; 2]], inv: f32| {
        let fg: &[[f32; 2]; 8] = fg.try_into().expect("8 sets");
        // SAFETY: `fg` is 64 readable bytes; unaligned loads.
        let (p0, p1) = unsafe {
            let at = fg.as_ptr().cast::<f32>();
            (_mm256_loadu_ps(at), _mm256_loadu_ps(at.add(8)))
        };
        let inv = _mm256_set1_ps(inv);
        let (p0, p1) = (_mm256_mul_ps(p0, inv), _mm256_mul_ps(p1, inv));
        // Sets [0, 2, 4, 6 | 1, 3, 5, 7] (each run's first sets, then its second).
        let f = _mm256_permutevar8x32_ps(_mm256_shuffle_ps::<0b10_00_10_00>(p0, p1), order);
        let g = _mm256_permutevar8x32_ps(_mm256_shuffle_ps::<0b11_01_11_01>(p0, p1), order);
        let e0 = _mm256_cvtps_epi32(g);
        let e1 = _mm256_cvtps_epi32(_mm256_add_ps(f, g));
        let e2 = _mm256_cvtps_epi32(_mm256_add_ps(_mm256_add_ps(f, f), g));
        let e3 = _mm256_cvtps_epi32(_mm256_add_ps(_mm256_mul_ps(f, three), g));
        _mm256_packs_epi16(_mm256_packs_epi32(e0, e1), _mm256_packs_epi32(e2, e3))
    };
    // Runs 4h..4h + 4 of a super-block: 2-bit field t of qs[32h..][..32] for run 4h + t.
    let (ab, inv) = (params.ab_pairs(), params.factors());
    for_each_row_block_group::<8, 1, 84, _>(rows, ab, tile, 0..runs, |_, j, [blk], [p], out| {
        let mut out = out.into_iter();
        for (h, fg) in p.as_flattened().chunks_exact(8).enumerate() {
            let t = tables(fg, inv[j]);
            let q = load32(&blk[16 + 32 * h..]);
            for (run, [out]) in (0..4).zip(&mut out) {
                let code = _mm256_and_si256(move_bit(q, 2 * run, 2), twelve);
                let index = _mm256_or_si256(code, _mm256_set1_epi8(run as i8));
                store32(out, _mm256_shuffle_epi8(t, index));
            }
        }
    });
}

/// The codes `2¹⁰·q` of [`five_bit_table`], in the order that `packsswb` of the two vectors
/// turns into codes 0..16 in lane 0 and 16..32 in lane 1: `[0..8 | 16..24]`, `[8..16 | 24..32]`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn five_bit_codes() -> [__m256i; 2] {
    let c: [i16; 32] = fixed_codes();
    let codes: [[i16; 16]; 2] =
        std::array::from_fn(|v| std::array::from_fn(|i| c[8 * v + i % 8 + 16 * (i / 8)]));
    // SAFETY: each of `codes` is 32 readable bytes; unaligned loads.
    codes.map(|c| unsafe { _mm256_loadu_si256(c.as_ptr().cast()) })
}

/// `[F, G]` ([`table_fixed`]) of four runs from their `[f, g]`, each in both halves of a
/// 32-bit word.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn five_bit_fixed4(fg: &[[f32; 2]]) -> [[i32; 2]; 4] {
    let fg: &[[f32; 2]; 4] = fg[..4].try_into().expect("four runs");
    // SAFETY: `fg` is 32 readable bytes; unaligned load.
    let v = unsafe { _mm256_loadu_ps(fg.as_ptr().cast()) };
    let [f, g] = fixed_scales(32);
    let scaled = _mm256_mul_ps(v, _mm256_setr_ps(f, g, f, g, f, g, f, g));
    // Saturated to 16 bits: lane 0 holds runs 0 and 1, lane 1 runs 2 and 3.
    let words = _mm256_packs_epi32(_mm256_cvtps_epi32(scaled), _mm256_setzero_si256());
    let doubled = _mm256_unpacklo_epi16(words, words);
    let mut out = [[0i32; 2]; 4];
    // SAFETY: `out` is 32 writable bytes; unaligned store.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), doubled) };
    out
}

/// [`five_bit_fixed4`] of one run.
#[inline(always)]
fn five_bit_fixed1(fg: [f32; 2]) -> [i32; 2] {
    table_fixed::<32>(fg).map(|x| (x as u16 as u32 * 0x0001_0001) as i32)
}

/// The 32-entry table of a run of Q5_1 or Q5_K (`table_entry`) from its
/// [`five_bit_fixed4`] words: lane 0 holds the codes 0..16, lane 1 the codes 16..32 (`codes`:
/// [`five_bit_codes`]).
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn five_bit_table(codes: &[__m256i; 2], fixed: &[i32; 2]) -> __m256i {
    let (f, g) = (_mm256_set1_epi32(fixed[0]), _mm256_set1_epi32(fixed[1]));
    _mm256_packs_epi16(fixed_step(codes[0], f, g), fixed_step(codes[1], f, g))
}

/// 32 five-bit codes through a [`five_bit_table`]: `nibbles` their low four bits, `fifth` all ones
/// where the fifth is set.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn five_bit_lookup(t: __m256i, nibbles: __m256i, fifth: __m256i) -> __m256i {
    let low = _mm256_shuffle_epi8(_mm256_permute2x128_si256::<0x00>(t, t), nibbles);
    let high = _mm256_shuffle_epi8(_mm256_permute2x128_si256::<0x11>(t, t), nibbles);
    _mm256_blendv_epi8(low, high, fifth)
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn q5_1(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let codes = five_bit_codes();
    let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    // Byte i of the run takes byte i / 8 of qh (its weight's fifth bit is bit i % 8 there).
    #[rustfmt::skip]
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
    );
    let run = |blk: &[u8; 24], fixed: &[i32; 2], out: &mut [i8; RUN]| {
        let qh = _mm256_set1_epi32(i32::from_le_bytes([blk[4], blk[5], blk[6], blk[7]]));
        let fifth = _mm256_and_si256(_mm256_shuffle_epi8(qh, spread), bits);
        let fifth = _mm256_cmpeq_epi8(fifth, bits);
        let t = five_bit_table(&codes, fixed);
        store32(out, five_bit_lookup(t, nibbles(load16(&blk[8..])), fifth));
    };
    let (fg, full) = (params.fg(), runs / GROUP * GROUP);
    for_each_block_group::<GROUP, 1, 96, _>(rows, fg, tile, 0..full, |_, [blk], [p], out| {
        let fixed = five_bit_fixed4(p);
        for ((blk, fixed), [out]) in blk.as_chunks::<24>().0.iter().zip(&fixed).zip(out) {
            run(blk, fixed, out);
        }
    });
    for_each_block_group::<1, 1, 24, _>(rows, fg, tile, full..runs, |_, [blk], [[p]], [[out]]| {
        run(blk, &five_bit_fixed1(*p), out)
    });
}

#[target_feature(enable = "avx2,f16c")]
pub(super) fn q5_k(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let codes = five_bit_codes();
    let low = _mm256_set1_epi8(15);
    // Runs 2p, 2p + 1 of a super-block: the low and high nibbles of qs[32p..][..32], bits 2p
    // and 2p + 1 of qh.
    let pair = |blk: &[u8; 176],
                qh: __m256i,
                p: usize,
                fixed: &[[i32; 2]],
                even: &mut [i8; RUN],
                odd: &mut [i8; RUN]| {
        let q = load32(&blk[48 + 32 * p..]);
        let nibbles = [
            _mm256_and_si256(q, low),
            _mm256_and_si256(_mm256_srli_epi16::<4>(q), low),
        ];
        for (h, out) in [even, odd].into_iter().enumerate() {
            let bit = _mm256_set1_epi8(1 << (2 * p + h));
            let fifth = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
            let t = five_bit_table(&codes, &fixed[h]);
            store32(out, five_bit_lookup(t, nibbles[h], fifth));
        }
    };
    for_each_block_group::<8, 1, 176, _>(rows, params.fg(), tile, 0..runs, |_, [blk], [p], out| {
        let qh = load32(&blk[16..]);
        let fixed = [five_bit_fixed4(&p[..4]), five_bit_fixed4(&p[4..])];
        let [[e0], [o0], [e1], [o1], [e2], [o2], [e3], [o3]] = out;
        pair(blk, qh, 0, &fixed[0][..2], e0, o0);
        pair(blk, qh, 1, &fixed[0][2..], e1, o1);
        pair(blk, qh, 2, &fixed[1][..2], e2, o2);
        pair(blk, qh, 3, &fixed[1][2..], e3, o3);
    });
}
