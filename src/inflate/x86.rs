//! x86-64 kernels: SSSE3 (16-byte `pshufb` tables), AVX2 (`avx2.rs`: a whole 32-byte run per
//! vector) and AVX-512 (`avx512.rs`: two tile rows per vector), and the scan's strided copies
//! (window gathers of the fp16 fields, 8×8 transposes). They reproduce
//! [`super::scalar`] bit for bit: the same binary32 products in the same order, `cvtps2dq`
//! rounding to nearest-even as `round_ties_even` does (the default MXCSR mode, which Rust code
//! never changes), saturating packs where the scalar code's `as i8`/`clamp` saturate, and
//! `pmulhrsw`, which is exactly `(x·m + 2¹⁴) >> 15`.

use super::params::{scaled_codes, transpose_plain, StridedCopy, TileParams};
use super::scalar::q4_k_pair_source;
use super::tile::{for_each_group, for_each_run, Tile};
use super::{ScanTile, TileKernel};
use crate::isa::Isa;
use crate::quant::GgmlType;
use std::arch::x86_64::*;

mod avx2;
mod avx512;

/// Calls a `#[target_feature]` kernel from the safe function pointer [`tile_kernel`] hands out.
macro_rules! unsafe_call {
    ($call:expr) => {
        // SAFETY: `tile_kernel` gives these out only for an `isa` the caller checked is
        // available, and each kernel enables exactly that path's features.
        unsafe { $call }
    };
}

/// The kernel for `ty` on `isa`, if `isa` is an x86 path. Callers must have checked
/// `isa.is_available()`: the returned safe functions rely on it.
pub(super) fn tile_kernel(isa: Isa, ty: GgmlType, b_n: usize) -> Option<TileKernel> {
    let pairs = b_n.is_multiple_of(avx512::ROWS);
    let k: TileKernel = match (isa, ty) {
        (Isa::Avx512, GgmlType::Q4_0) if pairs => {
            |r, p, t, n| unsafe_call!(avx512::q4_0(r, p, t, n))
        }
        (Isa::Avx512, GgmlType::Q4_1) if pairs => {
            |r, p, t, n| unsafe_call!(avx512::q4_1(r, p, t, n))
        }
        (Isa::Avx512, GgmlType::Q5_0) if pairs => {
            |r, p, t, n| unsafe_call!(avx512::q5_0(r, p, t, n))
        }
        (Isa::Avx512, GgmlType::Q8_0) if pairs => {
            |r, p, t, n| unsafe_call!(avx512::q8_0(r, p, t, n))
        }
        (Isa::Avx512, GgmlType::Q4_K) if pairs => {
            |r, p, t, n| unsafe_call!(avx512::q4_k(r, p, t, n))
        }
        (Isa::Avx512, GgmlType::Q6_K) if pairs => {
            |r, p, t, n| unsafe_call!(avx512::q6_k(r, p, t, n))
        }
        (Isa::Ssse3, GgmlType::Q4_0) => |r, p, t, n| unsafe_call!(ssse3::q4_0(r, p, t, n)),
        (Isa::Ssse3, GgmlType::Q4_1) => |r, p, t, n| unsafe_call!(ssse3::q4_1(r, p, t, n)),
        (Isa::Ssse3, GgmlType::Q5_0) => |r, p, t, n| unsafe_call!(ssse3::q5_0(r, p, t, n)),
        (Isa::Ssse3, GgmlType::Q8_0) => |r, p, t, n| unsafe_call!(ssse3::q8_0(r, p, t, n)),
        (Isa::Ssse3, GgmlType::Q4_K) => |r, p, t, n| unsafe_call!(ssse3::q4_k(r, p, t, n)),
        (Isa::Ssse3, GgmlType::Q6_K) => |r, p, t, n| unsafe_call!(ssse3::q6_k(r, p, t, n)),
        // AVX2, and AVX-512 tiles of an odd number of rows.
        (Isa::Avx2 | Isa::Avx512, GgmlType::Q4_0) => {
            |r, p, t, n| unsafe_call!(avx2::q4_0(r, p, t, n))
        }
        (Isa::Avx2 | Isa::Avx512, GgmlType::Q4_1) => {
            |r, p, t, n| unsafe_call!(avx2::q4_1(r, p, t, n))
        }
        (Isa::Avx2 | Isa::Avx512, GgmlType::Q5_0) => {
            |r, p, t, n| unsafe_call!(avx2::q5_0(r, p, t, n))
        }
        (Isa::Avx2 | Isa::Avx512, GgmlType::Q4_K) => {
            |r, p, t, n| unsafe_call!(avx2::q4_k(r, p, t, n))
        }
        (Isa::Avx2 | Isa::Avx512, GgmlType::Q8_0) => {
            |r, p, t, n| unsafe_call!(avx2::q8_0(r, p, t, n))
        }
        (Isa::Avx2 | Isa::Avx512, GgmlType::Q6_K) => {
            |r, p, t, n| unsafe_call!(avx2::q6_k(r, p, t, n))
        }
        _ => return None,
    };
    Some(k)
}

/// The tile scan compiled for `isa`, if `isa` is an x86 path with a build of its own.
pub(super) fn scan_tile(isa: Isa) -> Option<ScanTile> {
    type Res = Result<(), (usize, usize)>;
    #[target_feature(enable = "avx2,f16c")]
    fn avx2(p: &mut TileParams, rows: &[&[u8]], scales: &mut [f32]) -> Res {
        p.prepare(CopyAvx2(()), rows, scales)
    }
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
    fn avx512(p: &mut TileParams, rows: &[&[u8]], scales: &mut [f32]) -> Res {
        p.prepare(CopyAvx512(()), rows, scales)
    }
    let s: ScanTile = match isa {
        Isa::Avx2 => |p, rows, s| unsafe_call!(avx2(p, rows, s)),
        Isa::Avx512 => |p, rows, s| unsafe_call!(avx512(p, rows, s)),
        _ => return None,
    };
    Some(s)
}

/// [`StridedCopy`] by AVX2 `vpgatherdd` (eight blocks at a time) and 8×8 transposes. Only the
/// AVX2 scan creates one.
#[derive(Clone, Copy)]
struct CopyAvx2(());

impl StridedCopy for CopyAvx2 {
    #[inline(always)]
    fn halves<const BB: usize, const AT: usize>(self, row: &[u8], out: &mut [u16]) {
        // SAFETY: a `CopyAvx2` exists only inside the AVX2 scan, which runs only where that
        // path is available.
        unsafe { gather_halves_avx2::<BB, AT>(row, out) }
    }

    #[inline(always)]
    fn transpose16(self, src: &[u16], per_row: usize, dst: &mut [u16], rows: usize) {
        // SAFETY: as above.
        unsafe { transpose16_avx2(src, per_row, dst, rows) }
    }

    #[inline(always)]
    fn transpose32(self, src: &[f32], per_row: usize, dst: &mut [f32], rows: usize) {
        // SAFETY: as above.
        unsafe { transpose32_avx2(src, per_row, dst, rows) }
    }
}

/// [`StridedCopy`] by AVX-512 word permutes of 128-byte windows of the row and AVX2 8×8
/// transposes. Only the AVX-512 scan creates one.
#[derive(Clone, Copy)]
struct CopyAvx512(());

impl StridedCopy for CopyAvx512 {
    #[inline(always)]
    fn halves<const BB: usize, const AT: usize>(self, row: &[u8], out: &mut [u16]) {
        // SAFETY: a `CopyAvx512` exists only inside the AVX-512 scan, which runs only where
        // that path is available.
        unsafe { gather_halves_avx512::<BB, AT>(row, out) }
    }

    #[inline(always)]
    fn transpose16(self, src: &[u16], per_row: usize, dst: &mut [u16], rows: usize) {
        // SAFETY: as above (AVX-512 implies AVX2).
        unsafe { transpose16_avx2(src, per_row, dst, rows) }
    }

    #[inline(always)]
    fn transpose32(self, src: &[f32], per_row: usize, dst: &mut [f32], rows: usize) {
        // SAFETY: as above (AVX-512 implies AVX2).
        unsafe { transpose32_avx2(src, per_row, dst, rows) }
    }
}

/// [`StridedCopy::transpose16`] in blocks of 8 rows × 8 items, one 128-bit load and store per
/// row and item; the edges item by item.
#[inline]
#[target_feature(enable = "avx2")]
fn transpose16_avx2(src: &[u16], per_row: usize, dst: &mut [u16], rows: usize) {
    let (row_blocks, run_blocks) = (rows / 8, per_row / 8);
    assert!(src.len() >= rows * per_row && dst.len() >= rows * per_row);
    let (from, to) = (src.as_ptr(), dst.as_mut_ptr());
    for jb in 0..row_blocks {
        for rb in 0..run_blocks {
            // SAFETY: item 8·rb + 8 <= per_row of row 8·jb + i < rows: inside `src` (asserted);
            // unaligned loads.
            let v: [__m128i; 8] = std::array::from_fn(|i| unsafe {
                _mm_loadu_si128(from.add((8 * jb + i) * per_row + 8 * rb).cast())
            });
            // s: rows 2i, 2i + 1 interleaved; t: rows 4q..4q + 4 of two items; out: all 8 rows.
            let s: [__m128i; 8] = std::array::from_fn(|i| {
                let (a, b) = (v[2 * (i / 2)], v[2 * (i / 2) + 1]);
                if i % 2 == 0 {
                    _mm_unpacklo_epi16(a, b)
                } else {
                    _mm_unpackhi_epi16(a, b)
                }
            });
            let t: [__m128i; 8] = std::array::from_fn(|i| {
                // t[4q + p]: rows 4q..4q + 4, items 2p, 2p + 1.
                let (q, p) = (i / 4, i % 4);
                let (a, b) = (s[4 * q + p / 2], s[4 * q + 2 + p / 2]);
                if p % 2 == 0 {
                    _mm_unpacklo_epi32(a, b)
                } else {
                    _mm_unpackhi_epi32(a, b)
                }
            });
            for k in 0..8 {
                let (lo, hi) = (t[k / 2], t[4 + k / 2]);
                let out = if k % 2 == 0 {
                    _mm_unpacklo_epi64(lo, hi)
                } else {
                    _mm_unpackhi_epi64(lo, hi)
                };
                // SAFETY: rows 8·jb + 8 <= rows of item 8·rb + k < per_row: inside `dst`
                // (asserted); unaligned store.
                unsafe { _mm_storeu_si128(to.add((8 * rb + k) * rows + 8 * jb).cast(), out) };
            }
        }
    }
    transpose_plain(src, per_row, dst, rows, 0..8 * row_blocks, 8 * run_blocks);
    transpose_plain(src, per_row, dst, rows, 8 * row_blocks..rows, 0);
}

/// [`StridedCopy::transpose32`] in blocks of 8 rows × 8 items, one 256-bit load and store per
/// row and item; the edges item by item.
#[inline]
#[target_feature(enable = "avx2")]
fn transpose32_avx2(src: &[f32], per_row: usize, dst: &mut [f32], rows: usize) {
    let (row_blocks, run_blocks) = (rows / 8, per_row / 8);
    assert!(src.len() >= rows * per_row && dst.len() >= rows * per_row);
    let (from, to) = (src.as_ptr(), dst.as_mut_ptr());
    for jb in 0..row_blocks {
        for rb in 0..run_blocks {
            // SAFETY: item 8·rb + 8 <= per_row of row 8·jb + i < rows: inside `src` (asserted);
            // unaligned loads.
            let v: [__m256; 8] = std::array::from_fn(|i| unsafe {
                let at = from.add((8 * jb + i) * per_row + 8 * rb);
                _mm256_loadu_ps(at)
            });
            let t: [__m256; 8] = std::array::from_fn(|i| {
                let (a, b) = (v[2 * (i / 2)], v[2 * (i / 2) + 1]);
                if i % 2 == 0 {
                    _mm256_unpacklo_ps(a, b)
                } else {
                    _mm256_unpackhi_ps(a, b)
                }
            });
            // u[4q + k]: item [0, 2, 1, 3][k] (and that + 4, in the high lane) of rows
            // 4q..4q + 4.
            let u: [__m256; 8] = std::array::from_fn(|i| {
                let (q, k) = (i / 4, i % 4);
                let (a, b) = (t[4 * q + k % 2], t[4 * q + 2 + k % 2]);
                if k < 2 {
                    _mm256_shuffle_ps::<0x44>(a, b)
                } else {
                    _mm256_shuffle_ps::<0xee>(a, b)
                }
            });
            for k in 0..8 {
                // Item 8·rb + k of rows 8·jb..+8.
                let (lo, hi) = (u[[0, 2, 1, 3][k % 4]], u[4 + [0, 2, 1, 3][k % 4]]);
                let v = if k < 4 {
                    _mm256_permute2f128_ps::<0x20>(lo, hi)
                } else {
                    _mm256_permute2f128_ps::<0x31>(lo, hi)
                };
                // SAFETY: rows 8·jb + 8 <= rows of item 8·rb + k < per_row: inside `dst`
                // (asserted); unaligned store.
                unsafe {
                    let at = to.add((8 * rb + k) * rows + 8 * jb);
                    _mm256_storeu_ps(at, v);
                }
            }
        }
    }
    transpose_plain(src, per_row, dst, rows, 0..8 * row_blocks, 8 * run_blocks);
    transpose_plain(src, per_row, dst, rows, 8 * row_blocks..rows, 0);
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn gather_halves_avx512<const BB: usize, const AT: usize>(row: &[u8], out: &mut [u16]) {
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
    let index: [u16; 32] = std::array::from_fn(|i| ((i % per_window * BB + AT) / 2) as u16);
    // SAFETY: `index` is 64 readable bytes; unaligned load.
    let index = unsafe { _mm512_loadu_si512(index.as_ptr().cast()) };
    let blocks = (row.len() / BB).min(out.len());
    let windows = if row.len() >= 128 {
        ((row.len() - 128) / (per_window * BB) + 1).min(blocks / per_window)
    } else {
        0
    };
    let keep = ((1u16 << per_window) - 1) as u8;
    for w in 0..windows {
        let at = w * per_window * BB;
        let window: &[u8; 128] = row[at..at + 128].try_into().expect("128 bytes");
        // SAFETY: `window` is 128 readable bytes (two unaligned loads); the masked store writes
        // `per_window` u16 at `out[w·per_window..]`, inside `out` since `w < blocks / per_window`.
        unsafe {
            let (a, b) = (
                _mm512_loadu_si512(window.as_ptr().cast()),
                _mm512_loadu_si512(window[64..].as_ptr().cast()),
            );
            let v = _mm512_castsi512_si128(_mm512_permutex2var_epi16(a, index, b));
            _mm_mask_storeu_epi16(out[w * per_window..].as_mut_ptr().cast(), keep, v);
        }
    }
    let done = windows * per_window;
    for (h, blk) in out[done..blocks]
        .iter_mut()
        .zip(row[done * BB..].as_chunks::<BB>().0)
    {
        *h = u16::from_le_bytes([blk[AT], blk[AT + 1]]);
    }
}

#[inline]
#[target_feature(enable = "avx2")]
fn gather_halves_avx2<const BB: usize, const AT: usize>(row: &[u8], out: &mut [u16]) {
    const { assert!(AT + 4 <= BB) };
    let blocks = (row.len() / BB).min(out.len());
    let index = _mm256_mullo_epi32(
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        _mm256_set1_epi32(BB as i32),
    );
    let (groups, tail) = out[..blocks].as_chunks_mut::<8>();
    for (g, out) in groups.iter_mut().enumerate() {
        // SAFETY: reads the 4 bytes at `AT` of blocks `8g..8g + 8`, all inside `row` (`AT + 4 <=
        // BB`, and `8g + 8 <= blocks`).
        let v = unsafe {
            let base = row.as_ptr().add(8 * g * BB + AT);
            _mm256_i32gather_epi32::<1>(base.cast(), index)
        };
        // The low halves of the eight dwords, in order.
        let v = _mm256_shuffle_epi8(
            v,
            _mm256_setr_epi8(
                0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 4, 5, 8, 9, 12, 13,
                -1, -1, -1, -1, -1, -1, -1, -1,
            ),
        );
        let v = _mm256_castsi256_si128(_mm256_permute4x64_epi64(v, 0b00_00_10_00));
        // SAFETY: `out` is 8 writable u16; unaligned store.
        unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), v) };
    }
    let done = groups.len() * 8;
    for (h, blk) in tail.iter_mut().zip(row[done * BB..].as_chunks::<BB>().0) {
        *h = u16::from_le_bytes([blk[AT], blk[AT + 1]]);
    }
}

/// Where the four runs `r..r + 4` (`r` a multiple of 4: one 128-weight half) of a Q6_K row
/// live: the offsets of its 64 `ql` bytes and 32 `qh` bytes. Run `t` takes the low (t < 2) or
/// high nibbles of `ql[32·(t % 2)..][..32]` and bits `2t, 2t+1` of `qh`.
#[inline(always)]
fn q6_k_half_source(r: usize) -> (usize, usize) {
    let (block, half) = (r / 8, r % 8 / 4);
    (block * 210 + half * 64, block * 210 + 128 + half * 32)
}

/// Binary32 codes `c(q) = base + q` for q in 0..16, in the order a table builder wants.
fn codes(base: i32, order: [i32; 16]) -> [f32; 16] {
    order.map(|i| (base + i) as f32)
}
const IN_ORDER: [i32; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

/// A 16-byte load from the start of `src`.
#[inline(always)]
fn load16(src: &[u8]) -> __m128i {
    let src: &[u8; 16] = src[..16].try_into().expect("16 bytes");
    // SAFETY: `src` is 16 readable bytes; the load is unaligned.
    unsafe { _mm_loadu_si128(src.as_ptr().cast()) }
}

#[inline(always)]
fn store16(dst: &mut [i8], v: __m128i) {
    let dst: &mut [i8; 16] = (&mut dst[..16]).try_into().expect("16 bytes");
    // SAFETY: `dst` is 16 writable bytes; the store is unaligned.
    unsafe { _mm_storeu_si128(dst.as_mut_ptr().cast(), v) }
}

/// `lut[q] = sat8((c[q]·m + 2¹⁴) >> 15)` for 16 scaled codes: the Q4_0/Q5_0 tables.
#[inline]
#[target_feature(enable = "ssse3")]
fn rescale_table(c: &[i16; 16], m: i16) -> __m128i {
    // SAFETY: `c` is 16 readable i16 (two unaligned 16-byte loads).
    let (c0, c1) = unsafe {
        (
            _mm_loadu_si128(c.as_ptr().cast()),
            _mm_loadu_si128(c[8..].as_ptr().cast()),
        )
    };
    let m = _mm_set1_epi16(m);
    _mm_packs_epi16(_mm_mulhrs_epi16(c0, m), _mm_mulhrs_epi16(c1, m))
}

mod ssse3 {
    use super::*;

    /// `lut[q] = sat8(rne(fl(fl(c·f) + g)))` for the 16 codes `c` ([`IN_ORDER`]).
    #[target_feature(enable = "ssse3")]
    fn table16(c: &[f32; 16], f: f32, g: f32) -> __m128i {
        let (vf, vg) = (_mm_set1_ps(f), _mm_set1_ps(g));
        let step = |i: usize| {
            // SAFETY: `c[i..i + 4]` is in bounds (i <= 12); unaligned load.
            let ci = unsafe { _mm_loadu_ps(c[i..i + 4].as_ptr()) };
            _mm_cvtps_epi32(_mm_add_ps(_mm_mul_ps(ci, vf), vg))
        };
        _mm_packs_epi16(
            _mm_packs_epi32(step(0), step(4)),
            _mm_packs_epi32(step(8), step(12)),
        )
    }

    /// 16 quant bytes through a table, low nibbles first.
    #[target_feature(enable = "ssse3")]
    fn nibbles(qs: &[u8], lut: __m128i, out: &mut [i8; 32]) {
        let low = _mm_set1_epi8(15);
        let q = load16(qs);
        store16(&mut out[..16], _mm_shuffle_epi8(lut, _mm_and_si128(q, low)));
        store16(
            &mut out[16..],
            _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(q, 4), low)),
        );
    }

    #[target_feature(enable = "ssse3")]
    pub(super) fn q4_0(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
        let c: [i16; 16] = scaled_codes(GgmlType::Q4_0);
        for_each_run(rows, &params.m, tile, runs, |row, &m, r, out| {
            nibbles(&row[r * 18 + 2..], rescale_table(&c, m), out);
        });
    }

    #[target_feature(enable = "ssse3")]
    pub(super) fn q4_1(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
        let c = codes(0, IN_ORDER);
        for_each_run(rows, &params.fg, tile, runs, |row, &[f, g], r, out| {
            nibbles(&row[r * 20 + 4..], table16(&c, f, g), out);
        });
    }

    #[target_feature(enable = "ssse3")]
    pub(super) fn q5_0(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
        let c: [i16; 32] = scaled_codes(GgmlType::Q5_0);
        let (c_lo, c_hi) = c.split_at(16);
        let (c_lo, c_hi): (&[i16; 16], &[i16; 16]) =
            (c_lo.try_into().expect("16"), c_hi.try_into().expect("16"));
        let low = _mm_set1_epi8(15);
        let bits = _mm_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        // Byte i of the result takes byte i / 8 of qh (first half) or 2 + i / 8 (second).
        let spread0 = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        let spread1 = _mm_setr_epi8(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
        for_each_run(rows, &params.m, tile, runs, |row, &m, r, out| {
            let blk = &row[r * 22..r * 22 + 22];
            let (t_lo, t_hi) = (rescale_table(c_lo, m), rescale_table(c_hi, m));
            let qh = _mm_set1_epi32(i32::from_le_bytes(blk[2..6].try_into().expect("4 bytes")));
            let q = load16(&blk[6..]);
            let pick = |idx: __m128i, spread: __m128i| {
                let hi = _mm_cmpeq_epi8(_mm_and_si128(_mm_shuffle_epi8(qh, spread), bits), bits);
                let (x, y) = (_mm_shuffle_epi8(t_lo, idx), _mm_shuffle_epi8(t_hi, idx));
                _mm_or_si128(_mm_andnot_si128(hi, x), _mm_and_si128(hi, y))
            };
            store16(&mut out[..16], pick(_mm_and_si128(q, low), spread0));
            store16(
                &mut out[16..],
                pick(_mm_and_si128(_mm_srli_epi16(q, 4), low), spread1),
            );
        });
    }

    /// `sat8((x·m + 2¹⁴) >> 15)` of 16 signed bytes times `2^(8 - SHIFT)`.
    #[target_feature(enable = "ssse3")]
    fn rescale16<const SHIFT: i32>(x: __m128i, m: i16) -> __m128i {
        let z = _mm_setzero_si128();
        // Widen to 16 bits as the high byte (x·256), then shift down arithmetically.
        let x0 = _mm_srai_epi16(_mm_unpacklo_epi8(z, x), SHIFT);
        let x1 = _mm_srai_epi16(_mm_unpackhi_epi8(z, x), SHIFT);
        let m = _mm_set1_epi16(m);
        _mm_packs_epi16(_mm_mulhrs_epi16(x0, m), _mm_mulhrs_epi16(x1, m))
    }

    #[target_feature(enable = "ssse3")]
    pub(super) fn q8_0(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
        for_each_run(rows, &params.m, tile, runs, |row, &m, r, out| {
            let blk = &row[r * 34..r * 34 + 34];
            for h in 0..2 {
                store16(
                    &mut out[16 * h..],
                    rescale16::<8>(load16(&blk[2 + 16 * h..]), m),
                );
            }
        });
    }

    #[target_feature(enable = "ssse3")]
    pub(super) fn q4_k(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
        let c = codes(0, IN_ORDER);
        let low = _mm_set1_epi8(15);
        let fg = &params.fg;
        for_each_group::<2, 1, _>(
            rows,
            fg,
            tile,
            runs,
            |r, [row], [[p0], [p1]], [[even], [odd]]| {
                let at = q4_k_pair_source(r);
                let (lo, hi) = (table16(&c, p0[0], p0[1]), table16(&c, p1[0], p1[1]));
                for h in 0..2 {
                    let q = load16(&row[at + 16 * h..]);
                    store16(
                        &mut even[16 * h..],
                        _mm_shuffle_epi8(lo, _mm_and_si128(q, low)),
                    );
                    store16(
                        &mut odd[16 * h..],
                        _mm_shuffle_epi8(hi, _mm_and_si128(_mm_srli_epi16(q, 4), low)),
                    );
                }
            },
        );
    }

    #[target_feature(enable = "ssse3")]
    pub(super) fn q6_k(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
        let (low, bits45, bias) = (_mm_set1_epi8(15), _mm_set1_epi8(0x30), _mm_set1_epi8(32));
        let m = params.m.as_chunks::<2>().0;
        for_each_group::<4, 1, _>(rows, m, tile, runs, |r, [row], m, out| {
            let (ql, qh) = q6_k_half_source(r);
            let m = m.map(|[m]| m);
            let out = out.map(|[o]| o);
            for h in 0..2 {
                let ql0 = load16(&row[ql + 16 * h..]);
                let ql1 = load16(&row[ql + 32 + 16 * h..]);
                let qh = load16(&row[qh + 16 * h..]);
                let and = |a, b| _mm_and_si128(a, b);
                let codes = [
                    _mm_or_si128(and(ql0, low), and(_mm_slli_epi16(qh, 4), bits45)),
                    _mm_or_si128(and(ql1, low), and(_mm_slli_epi16(qh, 2), bits45)),
                    _mm_or_si128(and(_mm_srli_epi16(ql0, 4), low), and(qh, bits45)),
                    _mm_or_si128(
                        and(_mm_srli_epi16(ql1, 4), low),
                        and(_mm_srli_epi16(qh, 2), bits45),
                    ),
                ];
                for (t, code) in codes.into_iter().enumerate() {
                    let y = rescale16::<6>(_mm_sub_epi8(code, bias), m[t][h]);
                    store16(&mut out[t][16 * h..], y);
                }
            }
        });
    }
}
