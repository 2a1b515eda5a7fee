//! AVX-512 kernels: two adjacent tile rows per step, so that run `r` of both (64 contiguous
//! bytes of native B) is one 512-bit store, with one table build or rescale for both. Lanes:
//! the 128-bit lanes 0, 1 of a vector belong to the first row (its run's weights 0..16, 16..32),
//! lanes 2, 3 to the second; in-lane operations (`pshufb`, `packs`, `unpack`) then never mix rows.

use super::super::params::{fixed_codes, fixed_scales, scaled_codes, table_fixed, TileParams};
use super::super::tile::{for_each_block_group, for_each_row_block_group, Tile, GROUP};
use super::super::RUN;
use crate::quant::GgmlType;
use std::arch::x86_64::*;

/// Rows per step.
pub(super) const ROWS: usize = 2;

/// 16 bytes at the start of each of `a` and `b`, as the two halves of a 256-bit vector.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn load16x2(a: &[u8], b: &[u8]) -> __m256i {
    let (a, b): (&[u8; 16], &[u8; 16]) = (
        a[..16].try_into().expect("16"),
        b[..16].try_into().expect("16"),
    );
    // SAFETY: `a` and `b` are 16 readable bytes each; unaligned loads.
    unsafe {
        _mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(_mm_loadu_si128(a.as_ptr().cast())),
            _mm_loadu_si128(b.as_ptr().cast()),
        )
    }
}

/// 32 bytes at the start of each of `a` and `b`, as the two halves of a 512-bit vector.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn load32x2(a: &[u8], b: &[u8]) -> __m512i {
    let (a, b): (&[u8; 32], &[u8; 32]) = (
        a[..32].try_into().expect("32"),
        b[..32].try_into().expect("32"),
    );
    // SAFETY: `a` and `b` are 32 readable bytes each; unaligned loads.
    unsafe {
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_loadu_si256(a.as_ptr().cast())),
            _mm256_loadu_si256(b.as_ptr().cast()),
        )
    }
}

/// Run `r` of two adjacent rows: 64 contiguous bytes.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
pub(super) fn store(out: &mut [[i8; RUN]; ROWS], v: __m512i) {
    // SAFETY: `out` is 64 writable bytes; unaligned store.
    unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), v) }
}

/// `[m0, m0, m1, m1]`: each multiplier in all eight 16-bit lanes of two 128-bit lanes.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
pub(super) fn lane_pairs(m: &[i16; 2]) -> __m512i {
    let both = (m[0] as u16 as u32 | (m[1] as u16 as u32) << 16) as i32;
    #[rustfmt::skip]
    let spread = _mm512_set_epi32(
        0x0302_0302, 0x0302_0302, 0x0302_0302, 0x0302_0302,
        0x0302_0302, 0x0302_0302, 0x0302_0302, 0x0302_0302,
        0x0100_0100, 0x0100_0100, 0x0100_0100, 0x0100_0100,
        0x0100_0100, 0x0100_0100, 0x0100_0100, 0x0100_0100,
    );
    _mm512_shuffle_epi8(_mm512_set1_epi32(both), spread)
}

/// The multipliers of a group of runs of two rows, `a` (row `a`'s, `N` 16-bit items) then `b`,
/// in one vector: `N` = 4: `[a, b]` in every 128-bit lane; 8: `[a, a, b, b]`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn group_multipliers<const N: usize>(a: &[i16; N], b: &[i16; N]) -> __m512i {
    const { assert!(N == 4 || N == 8) };
    // SAFETY: `a` and `b` are `2·N` readable bytes each (8 or 16); unaligned loads.
    unsafe {
        if N == 4 {
            let v = _mm_loadl_epi64(a.as_ptr().cast());
            let v = _mm_castpd_si128(_mm_loadh_pd(_mm_castsi128_pd(v), b.as_ptr().cast()));
            _mm512_broadcast_i32x4(v)
        } else {
            let (a, b) = (
                _mm_loadu_si128(a.as_ptr().cast()),
                _mm_loadu_si128(b.as_ptr().cast()),
            );
            _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_broadcastsi128_si256(a)),
                _mm256_broadcastsi128_si256(b),
            )
        }
    }
}

/// The `pshufb` patterns that spread run `g`'s multipliers of [`group_multipliers`]`::<G>` (`G`
/// = 4 or 8) to `[m_a, m_a, m_b, m_b]`, each in all eight 16-bit lanes of its 128-bit lane.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn group_spread<const G: usize>() -> [__m512i; G] {
    const { assert!(G == 4 || G == 8) };
    std::array::from_fn(|g| {
        let pair = |at: i32| at | (at + 1) << 8;
        // G = 4: row a's at bytes 2g, 2g + 1 of every lane, b's at 8 + 2g; G = 8: each lane
        // holds one row's eight.
        let (a, b) = if G == 4 {
            (pair(2 * g as i32), pair(8 + 2 * g as i32))
        } else {
            (pair(2 * g as i32), pair(2 * g as i32))
        };
        let (a, b) = (a | a << 16, b | b << 16);
        #[rustfmt::skip]
        let v = _mm512_set_epi32(b, b, b, b, b, b, b, b, a, a, a, a, a, a, a, a);
        v
    })
}

/// Run `g`'s `RS` bytes of a group's `GB`: bytes `FIRST + g·RS..`.
#[inline(always)]
fn run_bytes<const GB: usize, const RS: usize, const FIRST: usize>(
    blk: &[u8; GB],
    g: usize,
) -> &[u8; RS] {
    blk[FIRST + g * RS..FIRST + (g + 1) * RS]
        .try_into()
        .expect("RS bytes")
}

/// For the formats of one multiplier per run: `step([a, b], m, out)` for run `r` of every
/// pair of tile rows (`a`, `b`: their `RS` bytes of run `r`, at `FIRST + g·RS` of the group's
/// `GB`, `g = r % G`; `m`: `[m_a, m_a, m_b, m_b]`, each multiplier in all eight 16-bit lanes of
/// two 128-bit lanes). Runs go `G` (4 or 8) at a time, the group's multipliers loaded together
/// and spread by one `pshufb` per run; the last `runs % G` (formats of one block per run only)
/// one at a time.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn for_each_block_pair<const G: usize, const GB: usize, const RS: usize, const FIRST: usize>(
    rows: &[&[u8]],
    params: &TileParams,
    tile: &mut Tile,
    runs: usize,
    mut step: impl FnMut([&[u8; RS]; ROWS], __m512i, &mut [[i8; RUN]; ROWS]),
) {
    const { assert!(FIRST + G * RS <= GB) };
    let full = runs / G * G;
    let spread = group_spread::<G>();
    let m = params.m();
    for_each_block_group::<G, ROWS, GB, _>(rows, m, tile, 0..full, |_, [a, b], [ma, mb], out| {
        let v = if G == 4 {
            group_multipliers::<4>(
                ma[..4].try_into().expect("4"),
                mb[..4].try_into().expect("4"),
            )
        } else {
            group_multipliers::<8>(
                ma[..8].try_into().expect("8"),
                mb[..8].try_into().expect("8"),
            )
        };
        for (g, out) in out.into_iter().enumerate() {
            let (a, b) = (
                run_bytes::<GB, RS, FIRST>(a, g),
                run_bytes::<GB, RS, FIRST>(b, g),
            );
            step([a, b], _mm512_shuffle_epi8(v, spread[g]), out);
        }
    });
    if full < runs {
        for_each_block_group::<1, ROWS, RS, _>(
            rows,
            m,
            tile,
            full..runs,
            |_, [a, b], [ma, mb], [out]| step([a, b], lane_pairs(&[ma[0], mb[0]]), out),
        );
    }
}

/// The four nibble vectors of two 16-byte quant runs `[qa, qb]`: lanes `[qa & 15, qa >> 4, qb &
/// 15, qb >> 4]`, i.e. weights 0..32 of each row's run in order (Q4_0, Q4_1, Q5_0), each byte
/// or'ed with the byte of `offset` in its place.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn nibbles(q: __m256i, offset: __m512i) -> __m512i {
    let q = _mm512_permutexvar_epi64(
        _mm512_set_epi64(3, 2, 3, 2, 1, 0, 1, 0),
        _mm512_castsi256_si512(q),
    );
    #[rustfmt::skip]
    let shift = _mm512_set_epi64(4 * 0x0001_0001_0001_0001, 4 * 0x0001_0001_0001_0001, 0, 0,
                                 4 * 0x0001_0001_0001_0001, 4 * 0x0001_0001_0001_0001, 0, 0);
    // (q & 15) | offset in one `vpternlogd` (0xea: a & b | c).
    _mm512_ternarylogic_epi32::<0xea>(_mm512_srlv_epi16(q, shift), _mm512_set1_epi8(15), offset)
}

/// The table offsets of a run of two rows whose tables lie in one vector (`vpermb` lookups): row
/// b's weights (bytes 32..64 of a store) at 32 + `run`, row a's at `run`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn row_offsets(run: i8) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_set1_epi8(run), _mm256_set1_epi8(32 + run))
}

/// `sat8((y·m + 2¹⁴) >> 15)` for each of 64 signed bytes `x`, with `y = x·2^(8 - SHIFT)` and `m`
/// the multiplier of its 128-bit lane. In-lane throughout, so bytes keep their places.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn rescale<const SHIFT: u32>(x: __m512i, m: __m512i) -> __m512i {
    let z = _mm512_setzero_si512();
    // Each byte as the high byte of a 16-bit lane (x·256), shifted down arithmetically.
    let lo = _mm512_srai_epi16::<SHIFT>(_mm512_unpacklo_epi8(z, x));
    let hi = _mm512_srai_epi16::<SHIFT>(_mm512_unpackhi_epi8(z, x));
    _mm512_packs_epi16(_mm512_mulhrs_epi16(lo, m), _mm512_mulhrs_epi16(hi, m))
}

/// `c` (16 codes) as two vectors: codes 0..8 and 8..16, repeated in every 128-bit lane.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn code_halves(c: &[i16; 16]) -> (__m512i, __m512i) {
    // SAFETY: `c` is 32 readable bytes; unaligned 16-byte loads.
    unsafe {
        (
            _mm512_broadcast_i32x4(_mm_loadu_si128(c.as_ptr().cast())),
            _mm512_broadcast_i32x4(_mm_loadu_si128(c[8..].as_ptr().cast())),
        )
    }
}

/// The nibble-table types (Q4_0, IQ4_NL, MXFP4, IQ4_XS), as [`for_each_block_pair`] lays
/// their runs out: weight `i` of a run is the low (`i < 16`) or high nibble of byte `i % 16` of
/// its quant bytes (at `QS` of the run's bytes) through the run's table `sat8((c[q]·m + 2¹⁴) >>
/// 15)` of the scaled codes `c`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn nibble_rescale<
    const G: usize,
    const GB: usize,
    const RS: usize,
    const FIRST: usize,
    const QS: usize,
>(
    rows: &[&[u8]],
    params: &TileParams,
    tile: &mut Tile,
    runs: usize,
    c: &[i16; 16],
) {
    let (c_lo, c_hi) = code_halves(c);
    for_each_block_pair::<G, GB, RS, FIRST>(rows, params, tile, runs, |[a, b], m, out| {
        // Lane l: the 16-entry table of its row (codes 0..8 from c_lo, 8..16 from c_hi).
        let lut = _mm512_packs_epi16(_mm512_mulhrs_epi16(c_lo, m), _mm512_mulhrs_epi16(c_hi, m));
        store(
            out,
            _mm512_shuffle_epi8(
                lut,
                nibbles(load16x2(&a[QS..], &b[QS..]), _mm512_setzero_si512()),
            ),
        );
    });
}

#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
pub(super) fn q4_0(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let c = scaled_codes(GgmlType::Q4_0);
    nibble_rescale::<GROUP, 72, 18, 0, 2>(rows, params, tile, runs, &c);
}

#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
pub(super) fn iq4_nl(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let c = scaled_codes(GgmlType::IQ4_NL);
    nibble_rescale::<GROUP, 72, 18, 0, 2>(rows, params, tile, runs, &c);
}

#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
pub(super) fn mxfp4(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let c = scaled_codes(GgmlType::MXFP4);
    nibble_rescale::<GROUP, 68, 17, 0, 1>(rows, params, tile, runs, &c);
}

#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
pub(super) fn iq4_xs(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let c = scaled_codes(GgmlType::IQ4_XS);
    nibble_rescale::<8, 136, 16, 8, 0>(rows, params, tile, runs, &c);
}

/// Q5_0 through the 32-entry tables of a run of two rows, both in one vector (`[a 0..16, a
/// 16..32, b 0..16, b 16..32]`: two multiplies and a pack), each weight looked up across the
/// vector (`vpermb`) by its 5-bit code plus its row's offset.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vbmi")]
pub(super) fn q5_0(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let c: [i16; 32] = scaled_codes(GgmlType::Q5_0);
    // Lane l of the pack takes its first eight entries from `lo`, the next eight from `hi`:
    // codes 0..8 and 8..16 (lanes 0, 2), 16..24 and 24..32 (lanes 1, 3).
    let lane_codes = |first: usize| {
        let v: [i16; 32] = std::array::from_fn(|i| c[i / 8 % 2 * 16 + first + i % 8]);
        // SAFETY: `v` is 64 readable bytes; unaligned load.
        unsafe { _mm512_loadu_si512(v.as_ptr().cast()) }
    };
    let (lo, hi) = (lane_codes(0), lane_codes(8));
    let (sixteen, offsets) = (_mm512_set1_epi8(16), row_offsets(0));
    for_each_block_pair::<GROUP, 88, 22, 0>(rows, params, tile, runs, |[a, b], m, out| {
        let qh = |blk: &[u8; 22]| u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]) as u64;
        // Byte i of the vector is weight i % 32 of its row: bit i of the pair's qh.
        let fifth: __mmask64 = qh(a) | qh(b) << 32;
        let q = nibbles(load16x2(&a[6..], &b[6..]), offsets);
        let index = _mm512_mask_add_epi8(q, fifth, q, sixteen);
        let lut = _mm512_packs_epi16(_mm512_mulhrs_epi16(lo, m), _mm512_mulhrs_epi16(hi, m));
        store(out, _mm512_permutexvar_epi8(index, lut));
    });
}

#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
pub(super) fn q8_0(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    // Each row's run of quants sign-extended to 16 bits straight from memory and rescaled by
    // its multiplier; `packs` interleaves the two rows' quadwords (lane l: row a's, row b's),
    // one quadword permute puts each row's 32 bytes together.
    let order = _mm512_set_epi64(7, 5, 3, 1, 6, 4, 2, 0);
    let step = |a: &[u8; 34], b: &[u8; 34], ma: i16, mb: i16, out: &mut [[i8; RUN]; ROWS]| {
        let widen = |blk: &[u8; 34]| {
            let q: &[u8; 32] = blk[2..].try_into().expect("32 quants");
            // SAFETY: `q` is 32 readable bytes; unaligned load.
            _mm512_cvtepi8_epi16(unsafe { _mm256_loadu_si256(q.as_ptr().cast()) })
        };
        let ya = _mm512_mulhrs_epi16(widen(a), _mm512_set1_epi16(ma));
        let yb = _mm512_mulhrs_epi16(widen(b), _mm512_set1_epi16(mb));
        store(
            out,
            _mm512_permutexvar_epi64(order, _mm512_packs_epi16(ya, yb)),
        );
    };
    let m = params.m();
    let full = runs / GROUP * GROUP;
    for_each_block_group::<GROUP, ROWS, 136, _>(
        rows,
        m,
        tile,
        0..full,
        |_, [a, b], [ma, mb], out| {
            let (a, b) = (a.as_chunks::<34>().0, b.as_chunks::<34>().0);
            for (g, out) in out.into_iter().enumerate() {
                step(&a[g], &b[g], ma[g], mb[g], out);
            }
        },
    );
    for_each_block_group::<1, ROWS, 34, _>(
        rows,
        m,
        tile,
        full..runs,
        |_, [a, b], [ma, mb], [out]| step(a, b, ma[0], mb[0], out),
    );
}

/// `(sat16(mulhrs(c, f) + g) + 2⁵) >> 6` of the 16-bit lanes of `c`: `table_entry`'s steps
/// after the code (`mulhrs(x, 512)` is the rounding shift).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn fixed_step(c: __m512i, f: __m512i, g: __m512i) -> __m512i {
    let product = _mm512_mulhrs_epi16(c, f);
    _mm512_mulhrs_epi16(_mm512_adds_epi16(product, g), _mm512_set1_epi16(512))
}

/// Lane `l` of the result: the 16-entry Q4_1/Q4_K table (`table_entry`) of lane `l`'s `F`,
/// `G` (in each of its 16-bit lanes). `codes`: [`lane_codes`].
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn lane_tables(codes: &[__m512i; 2], f: __m512i, g: __m512i) -> __m512i {
    _mm512_packs_epi16(fixed_step(codes[0], f, g), fixed_step(codes[1], f, g))
}

/// The codes `step·q` of [`lane_tables`]: 0..8 in every lane of the first vector, 8..16 in the
/// second's, so that `packs` puts each lane's 16 entries in order.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn lane_codes() -> [__m512i; 2] {
    let c: [i16; 16] = fixed_codes();
    [0, 8].map(|first| {
        // SAFETY: `c[first..]` is at least 16 readable bytes; unaligned load.
        _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(c[first..].as_ptr().cast()) })
    })
}

/// `vpermw` indices that put 16-bit lane `items[l]` in every 16-bit lane of 128-bit lane `l`.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn lane_spread(items: [i16; 4]) -> __m512i {
    let v: [i16; 32] = std::array::from_fn(|i| items[i / 8]);
    // SAFETY: `v` is 64 readable bytes; unaligned load.
    unsafe { _mm512_loadu_si512(v.as_ptr().cast()) }
}

/// The `F` and `G` indices ([`lane_spread`]) for runs `r`, `r + 1` (`r = 2p`) of two rows over
/// the four 128-bit lanes `[a run r, a run r + 1, b run r, b run r + 1]`, from [`fixed_words`]
/// of a group of runs: row a's at pair `0..`, row b's `b_pairs` pairs and `b_lanes` 16-bit lanes
/// on (4 and 0 in one vector; 0 and 32 in a second one, for `vpermt2w`).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn pair_spread(p: usize, b_pairs: usize, b_lanes: i16) -> [__m512i; 2] {
    let item = |lane: usize| {
        let run = 2 * p + lane % 2;
        if lane < 2 {
            fixed_word(run)
        } else {
            b_lanes + fixed_word(b_pairs + run)
        }
    };
    let f = [item(0), item(1), item(2), item(3)];
    [lane_spread(f), lane_spread(f.map(|i| i + 1))]
}

/// `N` runs' `[f, g]` (`N·8` bytes) at the start of `p` as a vector.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn load_fg<const N: usize>(p: &[[f32; 2]; N]) -> __m512 {
    const { assert!(N == 4 || N == 8) };
    // SAFETY: `p` is `8·N` readable bytes (32 or 64); unaligned loads.
    unsafe {
        if N == 8 {
            _mm512_loadu_ps(p.as_ptr().cast())
        } else {
            _mm512_castps256_ps512(_mm256_loadu_ps(p.as_ptr().cast()))
        }
    }
}

/// Q4_1 with the four tables of a run pair of two rows in one vector, `[a run r, a run r + 1,
/// b run r, b run r + 1]`, each weight looked up across the whole vector (`vpermb`); the last
/// `runs % GROUP` runs one at a time, their tables in each 128-bit lane of their row.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vbmi")]
pub(super) fn q4_1(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let codes = lane_codes();
    let full = runs / GROUP * GROUP;
    let (ab, inv) = (params.ab(), params.factors());
    // The group's [f, g] of both rows in one vector: row a at items 0..8, row b at 8..16, each
    // [a, b] times its row's inv_n; then their fixed words, row b's at pairs 4..8.
    let spread = [pair_spread(0, 4, 0), pair_spread(1, 4, 0)];
    let (even_at, odd_at) = (row_offsets(0), row_offsets(16));
    for_each_row_block_group::<GROUP, ROWS, 80, _>(
        rows,
        ab,
        tile,
        0..full,
        |_, j, [a, b], p, out| {
            let (a, b) = (a.as_chunks::<20>().0, b.as_chunks::<20>().0);
            let va = _mm512_mul_ps(load_fg(p[0]), _mm512_set1_ps(inv[j]));
            let vb = _mm512_castps512_ps256(load_fg(p[1]));
            let vb = _mm256_mul_ps(vb, _mm256_set1_ps(inv[j + 1]));
            let v = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                _mm512_castps_pd(va),
                _mm256_castps_pd(vb),
            ));
            let words = fixed_words::<16>(v);
            let [o0, o1, o2, o3] = out;
            for (i, (even, odd)) in [(o0, o1), (o2, o3)].into_iter().enumerate() {
                let [f, g] = spread[i].map(|s| _mm512_permutexvar_epi16(s, words));
                // Lanes [a run r, a run r + 1, b run r, b run r + 1].
                let luts = lane_tables(&codes, f, g);
                for (r, (out, offsets)) in [(even, even_at), (odd, odd_at)].into_iter().enumerate()
                {
                    let q = load16x2(&a[2 * i + r][4..], &b[2 * i + r][4..]);
                    store(out, _mm512_permutexvar_epi8(nibbles(q, offsets), luts));
                }
            }
        },
    );
    // The last runs one at a time: lanes [a, a, b, b].
    let last = full..runs;
    for_each_row_block_group::<1, ROWS, 20, _>(rows, ab, tile, last, |_, j, [a, b], p, [out]| {
        let ([[fa, ga]], [[fb, gb]]) = (*p[0], *p[1]);
        let (inv_a, inv_b) = (inv[j], inv[j + 1]);
        let [fa, ga] = table_fixed::<16>([fa * inv_a, ga * inv_a]);
        let [fb, gb] = table_fixed::<16>([fb * inv_b, gb * inv_b]);
        let (f, g) = (split16(fa, fb), split16(ga, gb));
        let lut = lane_tables(&codes, f, g);
        store(
            out,
            _mm512_shuffle_epi8(
                lut,
                nibbles(load16x2(&a[4..], &b[4..]), _mm512_setzero_si512()),
            ),
        );
    });
}

/// Q4_K with the four tables of a run pair of two rows in one vector, `[a run r, a run r + 1,
/// b run r, b run r + 1]`, each weight looked up across the whole vector (`vpermb`): its nibble
/// plus the byte offset of its row's and run's table.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vbmi")]
pub(super) fn q4_k(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let codes = lane_codes();
    let low = _mm512_set1_epi8(15);
    let (off_even, off_odd) = (row_offsets(0), row_offsets(16));
    // A super-block's [f, g] of row a in one vector (items 0..16), row b's in another (16..32).
    let spread: [[__m512i; 2]; 4] = std::array::from_fn(|p| pair_spread(p, 0, 32));
    let (ab, inv) = (params.ab(), params.factors());
    for_each_row_block_group::<8, ROWS, 144, _>(
        rows,
        ab,
        tile,
        0..runs,
        |_, j, [a, b], [pa, pb], out| {
            // Each row's [a, b] times its inv_n: [f, g].
            let va = _mm512_mul_ps(load_fg(pa), _mm512_set1_ps(inv[j]));
            let vb = _mm512_mul_ps(load_fg(pb), _mm512_set1_ps(inv[j + 1]));
            let (wa, wb) = (fixed_words::<16>(va), fixed_words::<16>(vb));
            let [e0, o0, e1, o1, e2, o2, e3, o3] = out;
            // Runs 2p, 2p + 1: the low and high nibbles of the quant bytes 32p..32p + 32.
            for (p, (even, odd)) in [(e0, o0), (e1, o1), (e2, o2), (e3, o3)]
                .into_iter()
                .enumerate()
            {
                let [f, g] = spread[p].map(|s| _mm512_permutex2var_epi16(wa, s, wb));
                let luts = lane_tables(&codes, f, g);
                let at = 16 + 32 * p;
                let q = load32x2(&a[at..], &b[at..]);
                // (nibble & 15) | offset in one `vpternlogd` (0xea: a & b | c).
                let even_at = _mm512_ternarylogic_epi32::<0xea>(q, low, off_even);
                let odd_at =
                    _mm512_ternarylogic_epi32::<0xea>(_mm512_srli_epi16::<4>(q), low, off_odd);
                store(even, _mm512_permutexvar_epi8(even_at, luts));
                store(odd, _mm512_permutexvar_epi8(odd_at, luts));
            }
        },
    );
}

/// Q6_K with each run's codes put together by GF(2) affine byte maps (`vgf2p8affineqb`): the
/// nibble from `ql` into bits 2..6, the two bits from `qh` into bits 6, 7 with bit 7 flipped, so
/// that each byte is `4·(q - 32)` (`4q ^ 0x80`): three instructions per run.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,gfni")]
pub(super) fn q6_k(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    // Row `7 - d` of a matrix selects the input bit that becomes output bit `d`.
    let matrix = |from: &[(u32, u32)]| {
        let m = from
            .iter()
            .fold(0u64, |m, &(bit, to)| m | 1u64 << (8 * (7 - to) + bit));
        _mm512_set1_epi64(m as i64)
    };
    let nibble = |at: u32| matrix(&[(at, 2), (at + 1, 3), (at + 2, 4), (at + 3, 5)]);
    let (low, high) = (nibble(0), nibble(4));
    let field = |at: u32| matrix(&[(at, 6), (at + 1, 7)]);
    let fields = [field(0), field(2), field(4), field(6)];
    // The four runs of 128-weight half `h` of a super-block: runs 0, 1: the low nibbles of
    // ql[64h..][..32], ql[64h + 32..][..32]; runs 2, 3: their high nibbles; run t: bits 2t,
    // 2t + 1 of qh[32h..][..32].
    let half = |a: &[u8; 210],
                b: &[u8; 210],
                h: usize,
                m: [__m512i; 4],
                out: [&mut [[i8; RUN]; ROWS]; 4]| {
        let (ql, qh) = (64 * h, 128 + 32 * h);
        let (ql0, ql1) = (
            load32x2(&a[ql..], &b[ql..]),
            load32x2(&a[ql + 32..], &b[ql + 32..]),
        );
        let qh = load32x2(&a[qh..], &b[qh..]);
        let ql = [(ql0, low), (ql1, low), (ql0, high), (ql1, high)];
        for (t, (out, m)) in out.into_iter().zip(m).enumerate() {
            let (src, nibble) = ql[t];
            let code = _mm512_or_si512(
                _mm512_gf2p8affine_epi64_epi8::<0>(src, nibble),
                _mm512_gf2p8affine_epi64_epi8::<0x80>(qh, fields[t]),
            );
            // Each 16-weight half with its multiplier.
            store(out, rescale::<8>(code, m));
        }
    };
    let spread = set_pair_spread();
    let (e, unit) = (params.e_pairs(), params.factors());
    for_each_row_block_group::<8, ROWS, 210, _>(rows, e, tile, 0..runs, |_, j, [a, b], e, out| {
        let m = set_pair_multipliers(&spread, e, [unit[j], unit[j + 1]]);
        let [o0, o1, o2, o3, o4, o5, o6, o7] = out;
        half(a, b, 0, [m[0], m[1], m[2], m[3]], [o0, o1, o2, o3]);
        half(a, b, 1, [m[4], m[5], m[6], m[7]], [o4, o5, o6, o7]);
    });
}

/// The `vpermw` indices of [`set_pair_multipliers`]: run `t`'s lanes `[a's first set, a's
/// second, b's first, b's second]` take items `2t, 2t + 1` of row a's 16 multipliers and of row
/// b's, each in all eight words of a lane. `vpackssdw` of the two rows' 16 leaves row a's items
/// 4l..4l + 4 in words 8l..8l + 4 and row b's in 8l + 4..8l + 8.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn set_pair_spread() -> [__m512i; 8] {
    let word = |row: usize, item: usize| (8 * (item / 4) + 4 * row + item % 4) as i16;
    std::array::from_fn(|t| {
        let (w0, w1) = (word(0, 2 * t), word(0, 2 * t + 1));
        let (w2, w3) = (word(1, 2 * t), word(1, 2 * t + 1));
        #[rustfmt::skip]
        let v = _mm512_set_epi16(
            w3, w3, w3, w3, w3, w3, w3, w3, w2, w2, w2, w2, w2, w2, w2, w2,
            w1, w1, w1, w1, w1, w1, w1, w1, w0, w0, w0, w0, w0, w0, w0, w0,
        );
        v
    })
}

/// For the formats of two sets of 16 per run (Q6_K, Q3_K): the multipliers `clamp(rne(fl(e·
/// unit)), ±32767)` of a group of 8 runs of two rows from their `e` (`ea`, `eb`) and units, run
/// `t`'s as `[a's first set, a's second, b's first, b's second]`, each in all eight 16-bit lanes
/// of a 128-bit lane (`spread`: [`set_pair_spread`]). The pack saturates to 16 bits first,
/// which the clamp then narrows.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn set_pair_multipliers(
    spread: &[__m512i; 8],
    [ea, eb]: [&[[f32; 2]; 8]; 2],
    [unit_a, unit_b]: [f32; 2],
) -> [__m512i; 8] {
    let m = |e: &[[f32; 2]; 8], unit: f32| {
        // SAFETY: `e` is 64 readable bytes; unaligned load.
        let e = unsafe { _mm512_loadu_ps(e.as_ptr().cast()) };
        _mm512_cvtps_epi32(_mm512_mul_ps(e, _mm512_set1_ps(unit)))
    };
    let v = _mm512_packs_epi32(m(ea, unit_a), m(eb, unit_b));
    let v = _mm512_max_epi16(
        _mm512_min_epi16(v, _mm512_set1_epi16(32767)),
        _mm512_set1_epi16(-32767),
    );
    std::array::from_fn(|t| _mm512_permutexvar_epi16(spread[t], v))
}

/// `v` with bit `from` of each byte moved to bit `to` (other bits: garbage to mask off; a
/// 16-bit shift, so bits cross into the neighbouring byte's far end only).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn move_bit(v: __m512i, from: u32, to: u32) -> __m512i {
    if from >= to {
        _mm512_srl_epi16(v, _mm_cvtsi32_si128((from - to) as i32))
    } else {
        _mm512_sll_epi16(v, _mm_cvtsi32_si128((to - from) as i32))
    }
}

#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
pub(super) fn q3_k(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    // Table entry i = q2 + 4·hbit (code i - 4), scaled by 32: each set's 8 entries, twice per
    // 128-bit lane after the pack.
    let codes = _mm512_broadcast_i32x4(_mm_setr_epi16(-128, -96, -64, -32, 0, 32, 64, 96));
    let (three, four) = (_mm512_set1_epi8(3), _mm512_set1_epi8(4));
    let spread = set_pair_spread();
    let (e, unit) = (params.e_pairs(), params.factors());
    // Run s of a super-block: 2-bit field s % 4 of qs[32·(s / 4)..][..32], bit s of hmask.
    for_each_row_block_group::<8, ROWS, 110, _>(rows, e, tile, 0..runs, |_, j, [a, b], e, out| {
        let m = set_pair_multipliers(&spread, e, [unit[j], unit[j + 1]]);
        let hmask = load32x2(a, b);
        let qs = [load32x2(&a[32..], &b[32..]), load32x2(&a[64..], &b[64..])];
        for (s, out) in out.into_iter().enumerate() {
            let t = _mm512_mulhrs_epi16(codes, m[s]);
            let t = _mm512_packs_epi16(t, t);
            let high = _mm512_and_si512(move_bit(hmask, s as u32, 2), four);
            // (q2 & 3) | high in one `vpternlogd` (0xec: a & c | b).
            let q2 = move_bit(qs[s / 4], 2 * (s as u32 % 4), 0);
            let index = _mm512_ternarylogic_epi32::<0xec>(q2, high, three);
            store(out, _mm512_shuffle_epi8(t, index));
        }
    });
}

#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
pub(super) fn q2_k(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    // Lanes [a's first sets, a's second sets, b's first, b's second] of four runs: row a's
    // eight `[f, g]` at items 0..16, row b's at 16..32.
    let f_at = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 16, 20, 24, 28, 18, 22, 26, 30);
    let g_at = _mm512_add_epi32(f_at, _mm512_set1_epi32(1));
    let (three, twelve) = (_mm512_set1_ps(3.0), _mm512_set1_epi8(12));
    // The tables of four runs of two rows: byte 4q + t of a lane is code q of run t's set,
    // `sat8(rne(fl(fl(q·f) + g)))` (fl(0·f) + g = g and fl(2·f) = f + f: the same values), from
    // their `[a, b]` times each row's `inv_n`: `[f, g]`.
    let tables = |fa: &[[f32; 2]], fb: &[[f32; 2]], inv_a: f32, inv_b: f32| {
        let (fa, fb): (&[[f32; 2]; 8], &[[f32; 2]; 8]) = (
            fa.try_into().expect("8 sets"),
            fb.try_into().expect("8 sets"),
        );
        // SAFETY: `fa` and `fb` are 64 readable bytes each; unaligned loads.
        let (va, vb) = unsafe {
            (
                _mm512_loadu_ps(fa.as_ptr().cast()),
                _mm512_loadu_ps(fb.as_ptr().cast()),
            )
        };
        let va = _mm512_mul_ps(va, _mm512_set1_ps(inv_a));
        let vb = _mm512_mul_ps(vb, _mm512_set1_ps(inv_b));
        let f = _mm512_permutex2var_ps(va, f_at, vb);
        let g = _mm512_permutex2var_ps(va, g_at, vb);
        let e0 = _mm512_cvtps_epi32(g);
        let e1 = _mm512_cvtps_epi32(_mm512_add_ps(f, g));
        let e2 = _mm512_cvtps_epi32(_mm512_add_ps(_mm512_add_ps(f, f), g));
        let e3 = _mm512_cvtps_epi32(_mm512_add_ps(_mm512_mul_ps(f, three), g));
        _mm512_packs_epi16(_mm512_packs_epi32(e0, e1), _mm512_packs_epi32(e2, e3))
    };
    // Runs 4h..4h + 4 of a super-block: 2-bit field t of qs[32h..][..32] for run 4h + t.
    let (ab, inv) = (params.ab_pairs(), params.factors());
    for_each_row_block_group::<8, ROWS, 84, _>(
        rows,
        ab,
        tile,
        0..runs,
        |_, j, [a, b], [pa, pb], out| {
            let mut out = out.into_iter();
            let sets = pa
                .as_flattened()
                .chunks_exact(8)
                .zip(pb.as_flattened().chunks_exact(8));
            for (h, (fa, fb)) in sets.enumerate() {
                let t = tables(fa, fb, inv[j], inv[j + 1]);
                let q = load32x2(&a[16 + 32 * h..], &b[16 + 32 * h..]);
                for (run, out) in (0..4).zip(&mut out) {
                    // (code << 2 & 12) | run in one `vpternlogd` (0xec: a & c | b).
                    let code = move_bit(q, 2 * run, 2);
                    let index = _mm512_ternarylogic_epi32::<0xec>(
                        code,
                        _mm512_set1_epi8(run as i8),
                        twelve,
                    );
                    store(out, _mm512_shuffle_epi8(t, index));
                }
            }
        },
    );
}

/// The codes `2¹⁰·q` of [`table32x2`], in the order that `packsswb` of the two vectors turns
/// into codes 0..32 in each 256-bit half: `[0..8 | 16..24]`, `[8..16 | 24..32]` per half.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn codes32() -> [__m512i; 2] {
    let c: [i16; 32] = fixed_codes();
    let codes: [[i16; 32]; 2] =
        std::array::from_fn(|v| std::array::from_fn(|i| c[8 * v + i % 8 + 16 * (i / 8 % 2)]));
    // SAFETY: each of `codes` is 64 readable bytes; unaligned loads.
    codes.map(|c| unsafe { _mm512_loadu_si512(c.as_ptr().cast()) })
}

/// [`table_fixed`]`::<CODES>`'s `[F, G]` of the eight `[f, g]` pairs in `fg`: pair `i`'s at
/// 16-bit lanes [`fixed_word`]`(i)` and the one after it.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn fixed_words<const CODES: usize>(fg: __m512) -> __m512i {
    let [f_scale, g_scale] = fixed_scales(CODES);
    let scale = _mm512_castpd_ps(_mm512_set1_pd(f64::from_bits(
        (g_scale.to_bits() as u64) << 32 | f_scale.to_bits() as u64,
    )));
    let fixed = _mm512_cvtps_epi32(_mm512_mul_ps(fg, scale));
    _mm512_packs_epi32(fixed, _mm512_setzero_si512())
}

/// Where [`fixed_words`] puts pair `i`'s `F` (its `G` is the next lane).
const fn fixed_word(i: usize) -> i16 {
    (8 * (i / 2) + 2 * (i % 2)) as i16
}

/// The 32-entry tables of a run of two rows (Q5_1, Q5_K), `table_entry` with row a's
/// `F`, `G` in 16-bit lanes 0..16 of `f`, `g` and row b's in 16..32, in one vector: row a's
/// at bytes 0..32, row b's at 32..64 (`codes`: [`codes32`]).
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn table32x2(codes: &[__m512i; 2], f: __m512i, g: __m512i) -> __m512i {
    _mm512_packs_epi16(fixed_step(codes[0], f, g), fixed_step(codes[1], f, g))
}

/// The 32-entry tables of [`table32x2`] looked up (`vpermb`) by each weight's 5-bit code: its
/// nibble or'ed with its row's offset (`nibbles`: [`row_offsets`]`(0)`), plus 16 where
/// `fifth` has its bit.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vbmi")]
fn lookup32x2(luts: __m512i, nibbles: __m512i, fifth: __mmask64) -> __m512i {
    let index = _mm512_mask_add_epi8(nibbles, fifth, nibbles, _mm512_set1_epi8(16));
    _mm512_permutexvar_epi8(index, luts)
}

/// `a` in 16-bit lanes 0..16, `b` in 16..32.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
fn split16(a: i16, b: i16) -> __m512i {
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_set1_epi16(a)),
        _mm256_set1_epi16(b),
    )
}

#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vbmi")]
pub(super) fn q5_1(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let codes = codes32();
    // Run r's F, G: pair r (row a) and 4 + r (row b) of the group's fixed words.
    let spread: [[__m512i; 2]; GROUP] = std::array::from_fn(|r| {
        let (a, b) = (fixed_word(r), fixed_word(4 + r));
        [split16(a, b), split16(a + 1, b + 1)]
    });
    let qh = |blk: &[u8; 24]| u32::from_le_bytes([blk[4], blk[5], blk[6], blk[7]]) as u64;
    let offsets = row_offsets(0);
    let run = |a: &[u8; 24], b: &[u8; 24], [f, g]: [__m512i; 2], out: &mut [[i8; RUN]; ROWS]| {
        let q = nibbles(load16x2(&a[8..], &b[8..]), offsets);
        // Byte i of the vector is weight i % 32 of its row: bit i of the pair's qh.
        let fifth: __mmask64 = qh(a) | qh(b) << 32;
        store(out, lookup32x2(table32x2(&codes, f, g), q, fifth));
    };
    let fg = params.fg();
    let full = runs / GROUP * GROUP;
    for_each_block_group::<GROUP, ROWS, 96, _>(rows, fg, tile, 0..full, |_, [a, b], p, out| {
        // SAFETY: each of `p` is 32 readable bytes (four runs' [f, g]); unaligned loads.
        let both = unsafe {
            _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                _mm512_castpd256_pd512(_mm256_loadu_pd(p[0].as_ptr().cast())),
                _mm256_loadu_pd(p[1].as_ptr().cast()),
            ))
        };
        let words = fixed_words::<32>(both);
        let (a, b) = (a.as_chunks::<24>().0, b.as_chunks::<24>().0);
        for (r, out) in out.into_iter().enumerate() {
            let fg = spread[r].map(|at| _mm512_permutexvar_epi16(at, words));
            run(&a[r], &b[r], fg, out);
        }
    });
    for_each_block_group::<1, ROWS, 24, _>(rows, fg, tile, full..runs, |_, [a, b], p, [out]| {
        let ([fa, ga], [fb, gb]) = (table_fixed::<32>(p[0][0]), table_fixed::<32>(p[1][0]));
        run(a, b, [split16(fa, fb), split16(ga, gb)], out);
    });
}

#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vbmi")]
pub(super) fn q5_k(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let codes = codes32();
    let (low, offsets) = (_mm512_set1_epi8(15), row_offsets(0));
    // Run s's F, G: pair s of row a's fixed words and of row b's (the second source, from 32).
    let spread: [[__m512i; 2]; 8] = std::array::from_fn(|s| {
        let w = fixed_word(s);
        [split16(w, 32 + w), split16(w + 1, 33 + w)]
    });
    // Run s of a super-block: nibble s % 2 of qs[32·(s / 2)..][..32], bit s of qh.
    let fg = params.fg();
    for_each_block_group::<8, ROWS, 176, _>(rows, fg, tile, 0..runs, |_, [a, b], p, out| {
        // SAFETY: each of `p` is 64 readable bytes (eight runs' [f, g]); unaligned loads.
        let (wa, wb) = unsafe {
            (
                fixed_words::<32>(_mm512_loadu_ps(p[0].as_ptr().cast())),
                fixed_words::<32>(_mm512_loadu_ps(p[1].as_ptr().cast())),
            )
        };
        let qh = load32x2(&a[16..], &b[16..]);
        for (s, out) in out.into_iter().enumerate() {
            let f = _mm512_permutex2var_epi16(wa, spread[s][0], wb);
            let g = _mm512_permutex2var_epi16(wa, spread[s][1], wb);
            let q = load32x2(&a[48 + 32 * (s / 2)..], &b[48 + 32 * (s / 2)..]);
            let q = if s % 2 == 0 {
                q
            } else {
                _mm512_srli_epi16::<4>(q)
            };
            // (q & 15) | offset in one `vpternlogd` (0xea: a & b | c).
            let nibbles = _mm512_ternarylogic_epi32::<0xea>(q, low, offsets);
            let fifth = _mm512_test_epi8_mask(qh, _mm512_set1_epi8(1 << s));
            store(out, lookup32x2(table32x2(&codes, f, g), nibbles, fifth));
        }
    });
}
