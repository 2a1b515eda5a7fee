//! x86-64 kernels: SSSE3 (16-byte `pshufb` tables), AVX2 (a whole 32-byte run per shuffle) and
//! AVX-512 (the AVX2 kernels with a one-instruction-per-step table build). They reproduce
//! [`super::scalar`] bit for bit: the same binary32 products in the same order, `cvtps2dq`
//! rounding to nearest-even as `round_ties_even` does (the default MXCSR mode, which Rust code
//! never changes), saturating packs where the scalar code's `as i8`/`clamp` saturate, and
//! `pmulhrsw`, which is exactly `(x·m + 2¹⁴) >> 15`.

use super::params::{half, multiplier, zero_point, RowParams};
use super::scalar::{q4_k_pair_source, q6_k_run_source};
use super::{for_each_run, for_each_run_pair, Tile, TileKernel};
use crate::isa::Isa;
use crate::quant::GgmlType;
use std::arch::x86_64::*;

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
pub(super) fn tile_kernel(isa: Isa, ty: GgmlType) -> Option<TileKernel> {
    let k: TileKernel = match (isa, ty) {
        (Isa::Ssse3, GgmlType::Q4_0) => |r, p, t, n| unsafe_call!(ssse3::q4_0(r, p, t, n)),
        (Isa::Ssse3, GgmlType::Q4_1) => |r, p, t, n| unsafe_call!(ssse3::q4_1(r, p, t, n)),
        (Isa::Ssse3, GgmlType::Q5_0) => |r, p, t, n| unsafe_call!(ssse3::q5_0(r, p, t, n)),
        (Isa::Ssse3, GgmlType::Q8_0) => |r, p, t, n| unsafe_call!(ssse3::q8_0(r, p, t, n)),
        (Isa::Ssse3, GgmlType::Q4_K) => |r, p, t, n| unsafe_call!(ssse3::q4_k(r, p, t, n)),
        (Isa::Ssse3, GgmlType::Q6_K) => |r, p, t, n| unsafe_call!(ssse3::q6_k(r, p, t, n)),
        (Isa::Avx2, GgmlType::Q4_0) => |r, p, t, n| unsafe_call!(avx2::q4_0(r, p, t, n)),
        (Isa::Avx2, GgmlType::Q4_1) => |r, p, t, n| unsafe_call!(avx2::q4_1(r, p, t, n)),
        (Isa::Avx2, GgmlType::Q5_0) => |r, p, t, n| unsafe_call!(avx2::q5_0(r, p, t, n)),
        (Isa::Avx2, GgmlType::Q4_K) => |r, p, t, n| unsafe_call!(avx2::q4_k(r, p, t, n)),
        (Isa::Avx512, GgmlType::Q4_0) => |r, p, t, n| unsafe_call!(avx512::q4_0(r, p, t, n)),
        (Isa::Avx512, GgmlType::Q4_1) => |r, p, t, n| unsafe_call!(avx512::q4_1(r, p, t, n)),
        (Isa::Avx512, GgmlType::Q5_0) => |r, p, t, n| unsafe_call!(avx512::q5_0(r, p, t, n)),
        (Isa::Avx512, GgmlType::Q4_K) => |r, p, t, n| unsafe_call!(avx512::q4_k(r, p, t, n)),
        // No table to build: AVX-512 has nothing to add to the AVX2 rescale kernels.
        (Isa::Avx2 | Isa::Avx512, GgmlType::Q8_0) => {
            |r, p, t, n| unsafe_call!(avx2_rescale::q8_0(r, p, t, n))
        }
        (Isa::Avx2 | Isa::Avx512, GgmlType::Q6_K) => {
            |r, p, t, n| unsafe_call!(avx2_rescale::q6_k(r, p, t, n))
        }
        _ => return None,
    };
    Some(k)
}

/// Binary32 codes `c(q) = base + q` for q in 0..16, in the order a table builder wants.
fn codes(base: i32, order: [i32; 16]) -> [f32; 16] {
    order.map(|i| (base + i) as f32)
}
const IN_ORDER: [i32; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];
/// AVX2's `packs` interleaves 128-bit lanes; feeding codes in this order undoes it.
const AVX2_ORDER: [i32; 16] = [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15];

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
    pub(super) fn q4_0(rows: &[&[u8]], params: &[RowParams], tile: &mut Tile, runs: usize) {
        let c = codes(-zero_point(GgmlType::Q4_0), IN_ORDER);
        for_each_run(rows, params, tile, runs, |row, p, r, out| {
            let blk = &row[r * 18..r * 18 + 18];
            nibbles(&blk[2..], table16(&c, half(blk, 0) * p.inv, 0.0), out);
        });
    }

    #[target_feature(enable = "ssse3")]
    pub(super) fn q4_1(rows: &[&[u8]], params: &[RowParams], tile: &mut Tile, runs: usize) {
        let c = codes(0, IN_ORDER);
        for_each_run(rows, params, tile, runs, |row, p, r, out| {
            nibbles(&row[r * 20 + 4..], table16(&c, p.f[r], p.g[r]), out);
        });
    }

    #[target_feature(enable = "ssse3")]
    pub(super) fn q5_0(rows: &[&[u8]], params: &[RowParams], tile: &mut Tile, runs: usize) {
        let zp = zero_point(GgmlType::Q5_0);
        let (c_lo, c_hi) = (codes(-zp, IN_ORDER), codes(16 - zp, IN_ORDER));
        let low = _mm_set1_epi8(15);
        let bits = _mm_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        // Byte i of the result takes byte i / 8 of qh (first half) or 2 + i / 8 (second).
        let spread0 = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        let spread1 = _mm_setr_epi8(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
        for_each_run(rows, params, tile, runs, |row, p, r, out| {
            let blk = &row[r * 22..r * 22 + 22];
            let f = half(blk, 0) * p.inv;
            let (t_lo, t_hi) = (table16(&c_lo, f, 0.0), table16(&c_hi, f, 0.0));
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
    pub(super) fn q8_0(rows: &[&[u8]], params: &[RowParams], tile: &mut Tile, runs: usize) {
        for_each_run(rows, params, tile, runs, |row, p, r, out| {
            let blk = &row[r * 34..r * 34 + 34];
            let m = multiplier(half(blk, 0), p.inv);
            for h in 0..2 {
                store16(
                    &mut out[16 * h..],
                    rescale16::<8>(load16(&blk[2 + 16 * h..]), m),
                );
            }
        });
    }

    #[target_feature(enable = "ssse3")]
    pub(super) fn q4_k(rows: &[&[u8]], params: &[RowParams], tile: &mut Tile, runs: usize) {
        let c = codes(0, IN_ORDER);
        let low = _mm_set1_epi8(15);
        for_each_run_pair(rows, params, tile, runs, |row, p, r, even, odd| {
            let at = q4_k_pair_source(r);
            let (lo, hi) = (
                table16(&c, p.f[r], p.g[r]),
                table16(&c, p.f[r + 1], p.g[r + 1]),
            );
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
        });
    }

    #[target_feature(enable = "ssse3")]
    pub(super) fn q6_k(rows: &[&[u8]], params: &[RowParams], tile: &mut Tile, runs: usize) {
        let (low, two, bias) = (_mm_set1_epi8(15), _mm_set1_epi8(3), _mm_set1_epi8(32));
        for_each_run(rows, params, tile, runs, |row, p, r, out| {
            let (ql, qh, ql_shift, qh_shift, m) = q6_k_run_source(r);
            let (ql_shift, qh_shift) = (
                _mm_cvtsi32_si128(ql_shift as i32),
                _mm_cvtsi32_si128(qh_shift as i32),
            );
            for h in 0..2 {
                let lo4 = _mm_and_si128(_mm_srl_epi16(load16(&row[ql + 16 * h..]), ql_shift), low);
                let hi2 = _mm_and_si128(_mm_srl_epi16(load16(&row[qh + 16 * h..]), qh_shift), two);
                let code = _mm_or_si128(lo4, _mm_slli_epi16(hi2, 4));
                store16(
                    &mut out[16 * h..],
                    rescale16::<6>(_mm_sub_epi8(code, bias), p.m[m + h]),
                );
            }
        });
    }
}

/// A 32-byte load from the start of `src`.
#[inline]
#[target_feature(enable = "avx")]
fn load32(src: &[u8]) -> __m256i {
    let src: &[u8; 32] = src[..32].try_into().expect("32 bytes");
    // SAFETY: `src` is 32 readable bytes; unaligned load.
    unsafe { _mm256_loadu_si256(src.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx")]
fn store32(dst: &mut [i8; 32], v: __m256i) {
    // SAFETY: `dst` is 32 writable bytes; unaligned store.
    unsafe { _mm256_storeu_si256(dst.as_mut_ptr().cast(), v) }
}

/// The fp16 scale at the start of a block, converted by F16C (exact, like
/// [`super::params::half`]; every finite half is representable in binary32).
#[inline]
#[target_feature(enable = "f16c")]
fn half_f16c(blk: &[u8]) -> f32 {
    let h = u16::from_le_bytes([blk[0], blk[1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

/// The AVX2-width table kernels, instantiated once per table builder (AVX2, AVX-512).
macro_rules! avx_table_kernels {
    ($name:ident, $features:literal, $order:expr, $table16:item) => {
        mod $name {
            use super::*;

            $table16

            /// Both 128-bit lanes hold the 16-entry table.
            #[target_feature(enable = $features)]
            fn table32(c: &[f32; 16], f: f32, g: f32) -> __m256i {
                _mm256_broadcastsi128_si256(table16(c, f, g))
            }

            /// 16 quant bytes through a table, low nibbles first.
            #[target_feature(enable = $features)]
            fn nibbles(qs: &[u8], lut: __m256i, out: &mut [i8; 32]) {
                let q = load16(qs);
                // Low lane: low nibbles (weights 0..16); high lane: high nibbles.
                let idx = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(15));
                store32(out, _mm256_shuffle_epi8(lut, idx));
            }

            #[target_feature(enable = $features)]
            pub(super) fn q4_0(rows: &[&[u8]], params: &[RowParams], tile: &mut Tile, runs: usize) {
                let c = codes(-zero_point(GgmlType::Q4_0), $order);
                for_each_run(rows, params, tile, runs, |row, p, r, out| {
                    let blk = &row[r * 18..r * 18 + 18];
                    nibbles(&blk[2..], table32(&c, half_f16c(blk) * p.inv, 0.0), out);
                });
            }

            #[target_feature(enable = $features)]
            pub(super) fn q4_1(rows: &[&[u8]], params: &[RowParams], tile: &mut Tile, runs: usize) {
                let c = codes(0, $order);
                for_each_run(rows, params, tile, runs, |row, p, r, out| {
                    nibbles(&row[r * 20 + 4..], table32(&c, p.f[r], p.g[r]), out);
                });
            }

            #[target_feature(enable = $features)]
            pub(super) fn q5_0(rows: &[&[u8]], params: &[RowParams], tile: &mut Tile, runs: usize) {
                let zp = zero_point(GgmlType::Q5_0);
                let (c_lo, c_hi) = (codes(-zp, $order), codes(16 - zp, $order));
                let low = _mm256_set1_epi8(15);
                let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
                // Byte i of the result takes byte i / 8 of qh.
                #[rustfmt::skip]
                let spread = _mm256_setr_epi8(
                    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                    2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
                );
                for_each_run(rows, params, tile, runs, |row, p, r, out| {
                    let blk = &row[r * 22..r * 22 + 22];
                    let f = half_f16c(blk) * p.inv;
                    let (t_lo, t_hi) = (table32(&c_lo, f, 0.0), table32(&c_hi, f, 0.0));
                    let qh = i32::from_le_bytes(blk[2..6].try_into().expect("4 bytes"));
                    let qh = _mm256_shuffle_epi8(_mm256_set1_epi32(qh), spread);
                    let hi = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bits), bits);
                    let q = load16(&blk[6..]);
                    let idx = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), low);
                    let (x, y) = (_mm256_shuffle_epi8(t_lo, idx), _mm256_shuffle_epi8(t_hi, idx));
                    store32(out, _mm256_blendv_epi8(x, y, hi));
                });
            }

            #[target_feature(enable = $features)]
            pub(super) fn q4_k(rows: &[&[u8]], params: &[RowParams], tile: &mut Tile, runs: usize) {
                let c = codes(0, $order);
                let low = _mm256_set1_epi8(15);
                for_each_run_pair(rows, params, tile, runs, |row, p, r, even, odd| {
                    let q = load32(&row[q4_k_pair_source(r)..]);
                    let (lo, hi) = (table32(&c, p.f[r], p.g[r]), table32(&c, p.f[r + 1], p.g[r + 1]));
                    store32(even, _mm256_shuffle_epi8(lo, _mm256_and_si256(q, low)));
                    store32(odd, _mm256_shuffle_epi8(hi, _mm256_and_si256(_mm256_srli_epi16(q, 4), low)));
                });
            }
        }
    };
}

avx_table_kernels!(
    avx2,
    "avx2,f16c",
    AVX2_ORDER,
    /// `lut[q] = sat8(rne(fl(fl(c·f) + g)))` for the 16 codes `c` ([`AVX2_ORDER`]).
    #[target_feature(enable = "avx2,f16c")]
    fn table16(c: &[f32; 16], f: f32, g: f32) -> __m128i {
        let (vf, vg) = (_mm256_set1_ps(f), _mm256_set1_ps(g));
        let step = |i: usize| {
            // SAFETY: `c[i..i + 8]` is in bounds (i <= 8); unaligned load.
            let ci = unsafe { _mm256_loadu_ps(c[i..i + 8].as_ptr()) };
            _mm256_cvtps_epi32(_mm256_add_ps(_mm256_mul_ps(ci, vf), vg))
        };
        let p = _mm256_packs_epi32(step(0), step(8));
        _mm_packs_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1))
    }
);

avx_table_kernels!(
    avx512,
    "avx2,f16c,avx512f",
    IN_ORDER,
    /// `lut[q] = sat8(rne(fl(fl(c·f) + g)))` for the 16 codes `c` ([`IN_ORDER`]).
    #[target_feature(enable = "avx2,f16c,avx512f")]
    fn table16(c: &[f32; 16], f: f32, g: f32) -> __m128i {
        // SAFETY: `c` is 16 f32; unaligned load.
        let ci = unsafe { _mm512_loadu_ps(c.as_ptr()) };
        let x = _mm512_add_ps(_mm512_mul_ps(ci, _mm512_set1_ps(f)), _mm512_set1_ps(g));
        _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(x))
    }
);

mod avx2_rescale {
    use super::*;

    /// `sat8((x·m + 2¹⁴) >> 15)` of 32 signed bytes: the low 16 with `m0`, the high 16 with
    /// `m1` (times 4 first when `times4`).
    #[target_feature(enable = "avx2,f16c")]
    fn rescale32(x: __m256i, m0: i16, m1: i16, times4: bool) -> __m256i {
        let mut x0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(x));
        let mut x1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(x, 1));
        if times4 {
            (x0, x1) = (_mm256_slli_epi16(x0, 2), _mm256_slli_epi16(x1, 2));
        }
        let y0 = _mm256_mulhrs_epi16(x0, _mm256_set1_epi16(m0));
        let y1 = _mm256_mulhrs_epi16(x1, _mm256_set1_epi16(m1));
        // packs interleaves lanes: [y0 0..8, y1 0..8, y0 8..16, y1 8..16] -> restore order.
        _mm256_permute4x64_epi64(_mm256_packs_epi16(y0, y1), 0b11_01_10_00)
    }

    #[target_feature(enable = "avx2,f16c")]
    pub(super) fn q8_0(rows: &[&[u8]], params: &[RowParams], tile: &mut Tile, runs: usize) {
        for_each_run(rows, params, tile, runs, |row, p, r, out| {
            let blk = &row[r * 34..r * 34 + 34];
            let m = multiplier(half_f16c(blk), p.inv);
            store32(out, rescale32(load32(&blk[2..]), m, m, false));
        });
    }

    #[target_feature(enable = "avx2,f16c")]
    pub(super) fn q6_k(rows: &[&[u8]], params: &[RowParams], tile: &mut Tile, runs: usize) {
        let (low, two, bias) = (
            _mm256_set1_epi8(15),
            _mm256_set1_epi8(3),
            _mm256_set1_epi8(32),
        );
        for_each_run(rows, params, tile, runs, |row, p, r, out| {
            let (ql, qh, ql_shift, qh_shift, m) = q6_k_run_source(r);
            let lo4 = _mm256_and_si256(
                _mm256_srl_epi16(load32(&row[ql..]), _mm_cvtsi32_si128(ql_shift as i32)),
                low,
            );
            let hi2 = _mm256_and_si256(
                _mm256_srl_epi16(load32(&row[qh..]), _mm_cvtsi32_si128(qh_shift as i32)),
                two,
            );
            let code = _mm256_or_si256(lo4, _mm256_slli_epi16(hi2, 4));
            store32(
                out,
                rescale32(_mm256_sub_epi8(code, bias), p.m[m], p.m[m + 1], true),
            );
        });
    }
}
