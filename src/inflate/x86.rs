//! x86-64 kernels: SSSE3 (16-byte `pshufb` tables), AVX2 (`avx2.rs`: a whole 32-byte run per
//! vector) and AVX-512 (`avx512.rs`: two tile rows per vector), and the scan's steps (window
//! gathers of the fp16 fields, Q4_K's scales unpacked by byte shuffles). They reproduce
//! [`super::scalar`] bit for bit: the same binary32 products in the same order, `cvtps2dq`
//! rounding to nearest-even as `round_ties_even` does (the default MXCSR mode, which Rust code
//! never changes), saturating packs where the scalar code's `as i8`/`clamp` saturate, and
//! `pmulhrsw`, which is exactly `(x·m + 2¹⁴) >> 15`.

use super::params::{scaled_codes, ScanOps, TileParams};
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
        p.prepare(OpsAvx2(()), rows, scales)
    }
    #[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
    fn avx512(p: &mut TileParams, rows: &[&[u8]], scales: &mut [f32]) -> Res {
        p.prepare(OpsAvx512(()), rows, scales)
    }
    let s: ScanTile = match isa {
        Isa::Avx2 => |p, rows, s| unsafe_call!(avx2(p, rows, s)),
        Isa::Avx512 => |p, rows, s| unsafe_call!(avx512(p, rows, s)),
        _ => return None,
    };
    Some(s)
}

/// [`ScanOps`] by AVX2 `vpgatherdd` (eight blocks at a time) and byte shuffles. Created only
/// where the AVX2 path is available: by its scan, and by a test after checking.
#[derive(Clone, Copy)]
struct OpsAvx2(());

impl ScanOps for OpsAvx2 {
    #[inline(always)]
    fn halves<const BB: usize, const AT: usize>(self, row: &[u8], out: &mut [u16]) {
        // SAFETY: an `OpsAvx2` exists only where the AVX2 path is available.
        unsafe { gather_halves_avx2::<BB, AT>(row, out) }
    }

    #[inline(always)]
    fn q4_k_values(self, row: &[u8], ab: &mut [[f32; 2]]) -> (u16, u32) {
        // SAFETY: as above.
        unsafe { q4_k_values_avx2(row, ab) }
    }
}

/// [`ScanOps`] by AVX-512 word permutes of 128-byte windows of the row and AVX2 byte shuffles.
/// Only the AVX-512 scan creates one.
#[derive(Clone, Copy)]
struct OpsAvx512(());

impl ScanOps for OpsAvx512 {
    #[inline(always)]
    fn halves<const BB: usize, const AT: usize>(self, row: &[u8], out: &mut [u16]) {
        // SAFETY: an `OpsAvx512` exists only inside the AVX-512 scan, which runs only where
        // that path is available.
        unsafe { gather_halves_avx512::<BB, AT>(row, out) }
    }

    #[inline(always)]
    fn q4_k_values(self, row: &[u8], ab: &mut [[f32; 2]]) -> (u16, u32) {
        // SAFETY: as above (AVX-512 implies AVX2 and F16C).
        unsafe { q4_k_values_avx2(row, ab) }
    }
}

/// [`ScanOps::q4_k_values`] a super-block at a time: its 16-byte header (`d`, `dmin`, the
/// packed scales) unpacked by two byte shuffles and masks into the eight scales and eight mins,
/// widened to binary32 (exact), times `d` and `dmin` (`vcvtph2ps`: exact, like
/// [`super::params::finite_half_to_f32`] on finite halves); `M_n` as a running lane maximum.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn q4_k_values_avx2(row: &[u8], ab: &mut [[f32; 2]]) -> (u16, u32) {
    let ab = ab.as_chunks_mut::<8>().0;
    // Packed byte i (header byte 4 + i): scales 0..4 are bytes 0..4 & 63, mins 0..4 bytes
    // 4..8 & 63; scale 4 + i is byte 8 + i & 15 with the top two bits of byte i as bits 4, 5,
    // min 4 + i is byte 8 + i >> 4 with the top two bits of byte 4 + i.
    #[rustfmt::skip]
    let (low_src, top_src) = (
        _mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11),
    );
    #[rustfmt::skip]
    let (low_mask, high_nibble, top_mask) = (
        _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0),
        _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15),
        _mm_setr_epi8(0, 0, 0, 0, 0x30, 0x30, 0x30, 0x30, 0, 0, 0, 0, 0x30, 0x30, 0x30, 0x30),
    );
    let (d_src, dmin_src) = (_mm_set1_epi16(0x0100), _mm_set1_epi16(0x0302));
    let magnitude = _mm_setr_epi16(0x7fff, 0x7fff, 0, 0, 0, 0, 0, 0);
    let (sign, fifteen) = (_mm256_set1_ps(-0.0), _mm256_set1_ps(15.0));
    let (mut largest, mut w_max) = (_mm_setzero_si128(), _mm256_setzero_ps());
    for (ab, blk) in ab.iter_mut().zip(row.as_chunks::<144>().0) {
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
        // table_block_max: max(|b|, |15a + b|), the operands in its order (`maxps` returns
        // the second unless the first is larger, as `larger` does).
        let end = _mm256_andnot_ps(sign, _mm256_add_ps(_mm256_mul_ps(fifteen, a), b));
        w_max = _mm256_max_ps(w_max, _mm256_max_ps(_mm256_andnot_ps(sign, b), end));
        // [a, b] pairs in run order.
        let (lo, hi) = (_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
        // SAFETY: `ab` is 64 writable bytes; unaligned stores.
        unsafe {
            let at = ab.as_mut_ptr().cast::<f32>();
            _mm256_storeu_ps(at, _mm256_permute2f128_ps::<0x20>(lo, hi));
            _mm256_storeu_ps(at.add(8), _mm256_permute2f128_ps::<0x31>(lo, hi));
        }
    }
    let largest = _mm_max_epu16(largest, _mm_srli_epi32::<16>(largest));
    // The lane maximum of non-negative values.
    let w = _mm_max_ps(
        _mm256_castps256_ps128(w_max),
        _mm256_extractf128_ps::<1>(w_max),
    );
    let w = _mm_max_ps(w, _mm_movehl_ps(w, w));
    let w = _mm_max_ps(w, _mm_shuffle_ps::<1>(w, w));
    (
        _mm_cvtsi128_si32(largest) as u16,
        _mm_cvtss_f32(w).to_bits(),
    )
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
        for_each_run(rows, params.m(), tile, runs, |row, &m, r, out| {
            nibbles(&row[r * 18 + 2..], rescale_table(&c, m), out);
        });
    }

    #[target_feature(enable = "ssse3")]
    pub(super) fn q4_1(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
        let c = codes(0, IN_ORDER);
        for_each_run(rows, params.fg(), tile, runs, |row, &[f, g], r, out| {
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
        for_each_run(rows, params.m(), tile, runs, |row, &m, r, out| {
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
        for_each_run(rows, params.m(), tile, runs, |row, &m, r, out| {
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
        for_each_group::<2, 1, _>(
            rows,
            params.fg(),
            tile,
            runs,
            |r, [row], [[p0, p1]], [[even], [odd]]| {
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
        for_each_group::<4, 1, _>(rows, params.m_pairs(), tile, runs, |r, [row], [m], out| {
            let (ql, qh) = q6_k_half_source(r);
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

#[cfg(test)]
mod tests {
    use super::super::params::PlainOps;
    use super::*;

    /// Q4_K super-blocks with random packed scales and every kind of fp16 `d`, `dmin`
    /// (subnormals, both zeros, the largest finite, NaN and infinities).
    fn q4_k_row(rng: &mut crate::testutil::Rng, blocks: usize) -> Vec<u8> {
        let special = [
            0x0000u16, 0x8000, 0x0001, 0x83ff, 0x0400, 0x7bff, 0xfbff, 0x7c00, 0xfe00,
        ];
        let mut row = vec![0u8; 144 * blocks];
        rng.fill_bytes(&mut row);
        for blk in row.chunks_exact_mut(144) {
            for at in [0, 2] {
                if rng.below(3) == 0 {
                    let h = special[rng.below(special.len())];
                    blk[at..at + 2].copy_from_slice(&h.to_le_bytes());
                }
            }
        }
        row
    }

    #[test]
    fn q4_k_values_avx2_agrees_with_the_plain_scan() {
        if !Isa::Avx2.is_available() {
            return;
        }
        let mut rng = crate::testutil::Rng::new(21);
        for round in 0..2000 {
            let blocks = 1 + round % 9;
            let row = q4_k_row(&mut rng, blocks);
            let (mut plain, mut simd) = (vec![[0f32; 2]; 8 * blocks], vec![[0f32; 2]; 8 * blocks]);
            let expect = PlainOps.q4_k_values(&row, &mut plain);
            let got = OpsAvx2(()).q4_k_values(&row, &mut simd);
            assert_eq!(got.0, expect.0, "round {round}: largest fp16 magnitude");
            if expect.0 >= 0x7c00 {
                continue; // Values unspecified.
            }
            let bits = |v: &[[f32; 2]]| v.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&simd), bits(&plain), "round {round}: [a, b]");
            assert_eq!(got.1, expect.1, "round {round}: M_n");
        }
    }
}
