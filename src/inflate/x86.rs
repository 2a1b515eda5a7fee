//! x86-64 kernels: SSSE3 (16-byte `pshufb` tables), AVX2 (a whole 32-byte run per shuffle) and
//! AVX-512 (the AVX2 kernels with a one-instruction-per-step table build). They reproduce
//! [`super::scalar`] bit for bit: the same binary32 products in the same order, `cvtps2dq`
//! rounding to nearest-even as `round_ties_even` does (the default MXCSR mode, which Rust code
//! never changes), saturating packs where the scalar code's `as i8`/`clamp` saturate, and
//! `pmulhrsw`, which is exactly `(x·m + 2¹⁴) >> 15`.

use super::params::{zero_point, RowParams};
use super::{RowKernel, Runs};
use crate::isa::Isa;
use crate::quant::GgmlType;
use std::arch::x86_64::*;

/// Calls a `#[target_feature]` kernel from the safe function pointer [`row_kernel`] hands out.
macro_rules! unsafe_call {
    ($call:expr) => {
        // SAFETY: `row_kernel` gives these out only for an `isa` the caller checked is available,
        // and each kernel enables exactly that path's features.
        unsafe { $call }
    };
}

/// The kernel for `ty` on `isa`, if `isa` is an x86 path. Callers must have checked
/// `isa.is_available()`: the returned safe functions rely on it.
pub(super) fn row_kernel(isa: Isa, ty: GgmlType) -> Option<RowKernel> {
    let k: RowKernel = match (isa, ty) {
        (Isa::Ssse3, GgmlType::Q4_0) => {
            |r, p, o| unsafe_call!(ssse3::nibbles_32::<18, 2>(r, p, o, GgmlType::Q4_0))
        }
        (Isa::Ssse3, GgmlType::Q4_1) => {
            |r, p, o| unsafe_call!(ssse3::nibbles_32::<20, 4>(r, p, o, GgmlType::Q4_1))
        }
        (Isa::Ssse3, GgmlType::Q5_0) => |r, p, o| unsafe_call!(ssse3::q5_0(r, p, o)),
        (Isa::Ssse3, GgmlType::Q8_0) => |r, p, o| unsafe_call!(ssse3::q8_0(r, p, o)),
        (Isa::Ssse3, GgmlType::Q4_K) => |r, p, o| unsafe_call!(ssse3::q4_k(r, p, o)),
        (Isa::Ssse3, GgmlType::Q6_K) => |r, p, o| unsafe_call!(ssse3::q6_k(r, p, o)),
        (Isa::Avx2, GgmlType::Q4_0) => {
            |r, p, o| unsafe_call!(avx2::nibbles_32::<18, 2>(r, p, o, GgmlType::Q4_0))
        }
        (Isa::Avx2, GgmlType::Q4_1) => {
            |r, p, o| unsafe_call!(avx2::nibbles_32::<20, 4>(r, p, o, GgmlType::Q4_1))
        }
        (Isa::Avx2, GgmlType::Q5_0) => |r, p, o| unsafe_call!(avx2::q5_0(r, p, o)),
        (Isa::Avx2, GgmlType::Q8_0) => |r, p, o| unsafe_call!(avx2_rescale::q8_0(r, p, o)),
        (Isa::Avx2, GgmlType::Q4_K) => |r, p, o| unsafe_call!(avx2::q4_k(r, p, o)),
        (Isa::Avx2, GgmlType::Q6_K) => |r, p, o| unsafe_call!(avx2_rescale::q6_k(r, p, o)),
        (Isa::Avx512, GgmlType::Q4_0) => {
            |r, p, o| unsafe_call!(avx512::nibbles_32::<18, 2>(r, p, o, GgmlType::Q4_0))
        }
        (Isa::Avx512, GgmlType::Q4_1) => {
            |r, p, o| unsafe_call!(avx512::nibbles_32::<20, 4>(r, p, o, GgmlType::Q4_1))
        }
        (Isa::Avx512, GgmlType::Q5_0) => |r, p, o| unsafe_call!(avx512::q5_0(r, p, o)),
        // No table to build: the AVX2 rescale kernels are as fast as wider ones would be here.
        (Isa::Avx512, GgmlType::Q8_0) => |r, p, o| unsafe_call!(avx2_rescale::q8_0(r, p, o)),
        (Isa::Avx512, GgmlType::Q4_K) => |r, p, o| unsafe_call!(avx512::q4_k(r, p, o)),
        (Isa::Avx512, GgmlType::Q6_K) => |r, p, o| unsafe_call!(avx2_rescale::q6_k(r, p, o)),
        _ => return None,
    };
    Some(k)
}

/// Binary32 code vectors `c(q)` for `q` in `base..base+16`, in the order the table builders want.
#[inline]
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

    /// `lut[q]` for 16 codes (`c` in [`IN_ORDER`] order): `sat8(rne(fl(fl(fl(c·a)+b)·inv)))`.
    #[target_feature(enable = "ssse3")]
    fn table16(c: &[f32; 16], a: f32, b: f32, inv: f32) -> __m128i {
        let (va, vb, vi) = (_mm_set1_ps(a), _mm_set1_ps(b), _mm_set1_ps(inv));
        let step = |i: usize| {
            // SAFETY: `c[i..i + 4]` is in bounds (i <= 12); unaligned load.
            let ci = unsafe { _mm_loadu_ps(c[i..i + 4].as_ptr()) };
            _mm_cvtps_epi32(_mm_mul_ps(_mm_add_ps(_mm_mul_ps(ci, va), vb), vi))
        };
        _mm_packs_epi16(
            _mm_packs_epi32(step(0), step(4)),
            _mm_packs_epi32(step(8), step(12)),
        )
    }

    #[target_feature(enable = "ssse3")]
    pub(super) fn nibbles_32<const BB: usize, const QS: usize>(
        row: &[u8],
        p: &RowParams,
        runs: &mut Runs,
        ty: GgmlType,
    ) {
        let c = codes(-zero_point(ty), IN_ORDER);
        let low = _mm_set1_epi8(15);
        for (i, blk) in row.chunks_exact(BB).enumerate() {
            let lut = table16(&c, p.a[i], p.b[i], p.inv);
            let q = load16(&blk[QS..]);
            let out = runs.run(i);
            store16(&mut out[..16], _mm_shuffle_epi8(lut, _mm_and_si128(q, low)));
            store16(
                &mut out[16..],
                _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(q, 4), low)),
            );
        }
    }

    /// 0xff in byte `i` of the pair where bit `i` (first) / `i + 16` (second) of `qh` is set.
    #[target_feature(enable = "ssse3")]
    fn high_bits(qh: u32) -> (__m128i, __m128i) {
        let v = _mm_set1_epi32(qh as i32);
        let bits = _mm_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let spread = |byte0: i8| {
            let sel = _mm_setr_epi8(
                byte0,
                byte0,
                byte0,
                byte0,
                byte0,
                byte0,
                byte0,
                byte0,
                byte0 + 1,
                byte0 + 1,
                byte0 + 1,
                byte0 + 1,
                byte0 + 1,
                byte0 + 1,
                byte0 + 1,
                byte0 + 1,
            );
            _mm_cmpeq_epi8(_mm_and_si128(_mm_shuffle_epi8(v, sel), bits), bits)
        };
        (spread(0), spread(2))
    }

    #[target_feature(enable = "ssse3")]
    pub(super) fn q5_0(row: &[u8], p: &RowParams, runs: &mut Runs) {
        let (c_lo, c_hi) = (codes(-16, IN_ORDER), codes(0, IN_ORDER));
        let low = _mm_set1_epi8(15);
        for (i, blk) in row.chunks_exact(22).enumerate() {
            let (a, b) = (p.a[i], p.b[i]);
            let (t_lo, t_hi) = (table16(&c_lo, a, b, p.inv), table16(&c_hi, a, b, p.inv));
            let (h0, h1) = high_bits(u32::from_le_bytes(blk[2..6].try_into().expect("4 bytes")));
            let q = load16(&blk[6..]);
            let pick = |idx: __m128i, hi: __m128i| {
                let (x, y) = (_mm_shuffle_epi8(t_lo, idx), _mm_shuffle_epi8(t_hi, idx));
                _mm_or_si128(_mm_andnot_si128(hi, x), _mm_and_si128(hi, y))
            };
            let out = runs.run(i);
            store16(&mut out[..16], pick(_mm_and_si128(q, low), h0));
            store16(
                &mut out[16..],
                pick(_mm_and_si128(_mm_srli_epi16(q, 4), low), h1),
            );
        }
    }

    /// Sign-extends the low / high 8 bytes of `x` to 16 bits.
    #[target_feature(enable = "ssse3")]
    fn widen(x: __m128i) -> (__m128i, __m128i) {
        let z = _mm_setzero_si128();
        (
            _mm_srai_epi16(_mm_unpacklo_epi8(z, x), 8),
            _mm_srai_epi16(_mm_unpackhi_epi8(z, x), 8),
        )
    }

    #[target_feature(enable = "ssse3")]
    pub(super) fn q8_0(row: &[u8], p: &RowParams, runs: &mut Runs) {
        for (i, blk) in row.chunks_exact(34).enumerate() {
            let m = _mm_set1_epi16(p.m[i]);
            let out = runs.run(i);
            for half in 0..2 {
                let (x0, x1) = widen(load16(&blk[2 + 16 * half..]));
                let y = _mm_packs_epi16(_mm_mulhrs_epi16(x0, m), _mm_mulhrs_epi16(x1, m));
                store16(&mut out[16 * half..], y);
            }
        }
    }

    #[target_feature(enable = "ssse3")]
    pub(super) fn q4_k(row: &[u8], p: &RowParams, runs: &mut Runs) {
        let c = codes(0, IN_ORDER);
        let low = _mm_set1_epi8(15);
        for (i, blk) in row.chunks_exact(144).enumerate() {
            for chunk in 0..4 {
                let sub = i * 8 + chunk * 2;
                let lo = table16(&c, p.a[sub], p.b[sub], p.inv);
                let hi = table16(&c, p.a[sub + 1], p.b[sub + 1], p.inv);
                for h in 0..2 {
                    let q = load16(&blk[16 + chunk * 32 + 16 * h..]);
                    store16(
                        &mut runs.run(sub)[16 * h..],
                        _mm_shuffle_epi8(lo, _mm_and_si128(q, low)),
                    );
                    let qhi = _mm_and_si128(_mm_srli_epi16(q, 4), low);
                    store16(&mut runs.run(sub + 1)[16 * h..], _mm_shuffle_epi8(hi, qhi));
                }
            }
        }
    }

    #[target_feature(enable = "ssse3")]
    pub(super) fn q6_k(row: &[u8], p: &RowParams, runs: &mut Runs) {
        let (low, bits45, bias) = (_mm_set1_epi8(15), _mm_set1_epi8(0x30), _mm_set1_epi8(32));
        for (i, blk) in row.chunks_exact(210).enumerate() {
            for half in 0..2 {
                let first_run = i * 8 + half * 4;
                let m = &p.m[i * 16 + half * 8..i * 16 + half * 8 + 8];
                // l = 0..16 uses the even sub-block of each run, l = 16..32 the odd one.
                for h in 0..2 {
                    let ql0 = load16(&blk[half * 64 + 16 * h..]);
                    let ql1 = load16(&blk[half * 64 + 32 + 16 * h..]);
                    let qh = load16(&blk[128 + half * 32 + 16 * h..]);
                    let q = [
                        _mm_or_si128(
                            _mm_and_si128(ql0, low),
                            _mm_and_si128(_mm_slli_epi16(qh, 4), bits45),
                        ),
                        _mm_or_si128(
                            _mm_and_si128(ql1, low),
                            _mm_and_si128(_mm_slli_epi16(qh, 2), bits45),
                        ),
                        _mm_or_si128(
                            _mm_and_si128(_mm_srli_epi16(ql0, 4), low),
                            _mm_and_si128(qh, bits45),
                        ),
                        _mm_or_si128(
                            _mm_and_si128(_mm_srli_epi16(ql1, 4), low),
                            _mm_and_si128(_mm_srli_epi16(qh, 2), bits45),
                        ),
                    ];
                    for (t, q) in q.into_iter().enumerate() {
                        let mt = _mm_set1_epi16(m[2 * t + h]);
                        let (x0, x1) = widen(_mm_sub_epi8(q, bias));
                        let (x0, x1) = (_mm_slli_epi16(x0, 2), _mm_slli_epi16(x1, 2));
                        let y = _mm_packs_epi16(_mm_mulhrs_epi16(x0, mt), _mm_mulhrs_epi16(x1, mt));
                        store16(&mut runs.run(first_run + t)[16 * h..], y);
                    }
                }
            }
        }
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

/// The AVX2-width kernels, instantiated once per table builder (AVX2, AVX-512).
macro_rules! avx_kernels {
    ($name:ident, $features:literal, $order:expr, $table16:item) => {
        mod $name {
            use super::*;

            $table16

            /// Both 128-bit lanes hold the 16-entry table.
            #[target_feature(enable = $features)]
            fn table32(c: &[f32; 16], a: f32, b: f32, inv: f32) -> __m256i {
                _mm256_broadcastsi128_si256(table16(c, a, b, inv))
            }

            #[target_feature(enable = $features)]
            pub(super) fn nibbles_32<const BB: usize, const QS: usize>(
                row: &[u8],
                p: &RowParams,
                runs: &mut Runs,
                ty: GgmlType,
            ) {
                let c = codes(-zero_point(ty), $order);
                let low = _mm256_set1_epi8(15);
                for (i, blk) in row.chunks_exact(BB).enumerate() {
                    let lut = table32(&c, p.a[i], p.b[i], p.inv);
                    let q = load16(&blk[QS..]);
                    // Low lane: low nibbles (weights 0..16); high lane: high nibbles.
                    let idx = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), low);
                    store32(runs.run(i), _mm256_shuffle_epi8(lut, idx));
                }
            }

            #[target_feature(enable = $features)]
            pub(super) fn q5_0(row: &[u8], p: &RowParams, runs: &mut Runs) {
                let (c_lo, c_hi) = (codes(-16, $order), codes(0, $order));
                let low = _mm256_set1_epi8(15);
                let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
                #[rustfmt::skip]
                let spread = _mm256_setr_epi8(
                    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                    2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
                );
                for (i, blk) in row.chunks_exact(22).enumerate() {
                    let (a, b) = (p.a[i], p.b[i]);
                    let (t_lo, t_hi) = (table32(&c_lo, a, b, p.inv), table32(&c_hi, a, b, p.inv));
                    let qh = u32::from_le_bytes(blk[2..6].try_into().expect("4 bytes"));
                    let qh = _mm256_shuffle_epi8(_mm256_set1_epi32(qh as i32), spread);
                    let hi = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bits), bits);
                    let q = load16(&blk[6..]);
                    let idx = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), low);
                    let (x, y) = (_mm256_shuffle_epi8(t_lo, idx), _mm256_shuffle_epi8(t_hi, idx));
                    store32(runs.run(i), _mm256_blendv_epi8(x, y, hi));
                }
            }

            #[target_feature(enable = $features)]
            pub(super) fn q4_k(row: &[u8], p: &RowParams, runs: &mut Runs) {
                let c = codes(0, $order);
                let low = _mm256_set1_epi8(15);
                for (i, blk) in row.chunks_exact(144).enumerate() {
                    for chunk in 0..4 {
                        let sub = i * 8 + chunk * 2;
                        let lo = table32(&c, p.a[sub], p.b[sub], p.inv);
                        let hi = table32(&c, p.a[sub + 1], p.b[sub + 1], p.inv);
                        let q = load32(&blk[16 + chunk * 32..]);
                        store32(runs.run(sub), _mm256_shuffle_epi8(lo, _mm256_and_si256(q, low)));
                        let qhi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
                        store32(runs.run(sub + 1), _mm256_shuffle_epi8(hi, qhi));
                    }
                }
            }
        }
    };
}

avx_kernels!(
    avx2,
    "avx2",
    AVX2_ORDER,
    /// `lut[q]` for 16 codes (`c` in [`AVX2_ORDER`]): `sat8(rne(fl(fl(fl(c·a)+b)·inv)))`.
    #[target_feature(enable = "avx2")]
    fn table16(c: &[f32; 16], a: f32, b: f32, inv: f32) -> __m128i {
        let (va, vb, vi) = (_mm256_set1_ps(a), _mm256_set1_ps(b), _mm256_set1_ps(inv));
        let step = |i: usize| {
            // SAFETY: `c[i..i + 8]` is in bounds (i <= 8); unaligned load.
            let ci = unsafe { _mm256_loadu_ps(c[i..i + 8].as_ptr()) };
            _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_add_ps(_mm256_mul_ps(ci, va), vb), vi))
        };
        let p = _mm256_packs_epi32(step(0), step(8));
        _mm_packs_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1))
    }
);

avx_kernels!(
    avx512,
    "avx2,avx512f",
    IN_ORDER,
    /// `lut[q]` for 16 codes (`c` in [`IN_ORDER`]): `sat8(rne(fl(fl(fl(c·a)+b)·inv)))`.
    #[target_feature(enable = "avx2,avx512f")]
    fn table16(c: &[f32; 16], a: f32, b: f32, inv: f32) -> __m128i {
        // SAFETY: `c` is 16 f32; unaligned load.
        let ci = unsafe { _mm512_loadu_ps(c.as_ptr()) };
        let (va, vb, vi) = (_mm512_set1_ps(a), _mm512_set1_ps(b), _mm512_set1_ps(inv));
        _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(
            _mm512_add_ps(_mm512_mul_ps(ci, va), vb),
            vi,
        )))
    }
);

mod avx2_rescale {
    use super::*;

    /// `sat8((x·m + 2¹⁴) >> 15)` of 32 sign-extended bytes: low 16 with `m0`, high 16 with `m1`.
    #[target_feature(enable = "avx2")]
    fn rescale32(x: __m256i, m0: i16, m1: i16, shift2: bool) -> __m256i {
        let mut x0 = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(x));
        let mut x1 = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(x, 1));
        if shift2 {
            (x0, x1) = (_mm256_slli_epi16(x0, 2), _mm256_slli_epi16(x1, 2));
        }
        let y0 = _mm256_mulhrs_epi16(x0, _mm256_set1_epi16(m0));
        let y1 = _mm256_mulhrs_epi16(x1, _mm256_set1_epi16(m1));
        // packs interleaves lanes: [y0 0..8, y1 0..8, y0 8..16, y1 8..16] -> restore order.
        _mm256_permute4x64_epi64(_mm256_packs_epi16(y0, y1), 0b11_01_10_00)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn q8_0(row: &[u8], p: &RowParams, runs: &mut Runs) {
        for (i, blk) in row.chunks_exact(34).enumerate() {
            store32(
                runs.run(i),
                rescale32(load32(&blk[2..]), p.m[i], p.m[i], false),
            );
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn q6_k(row: &[u8], p: &RowParams, runs: &mut Runs) {
        let (low, bits45, bias) = (
            _mm256_set1_epi8(15),
            _mm256_set1_epi8(0x30),
            _mm256_set1_epi8(32),
        );
        for (i, blk) in row.chunks_exact(210).enumerate() {
            for half in 0..2 {
                let first_run = i * 8 + half * 4;
                let m = &p.m[i * 16 + half * 8..i * 16 + half * 8 + 8];
                let ql0 = load32(&blk[half * 64..]);
                let ql1 = load32(&blk[half * 64 + 32..]);
                let qh = load32(&blk[128 + half * 32..]);
                let and = _mm256_and_si256;
                let q = [
                    _mm256_or_si256(and(ql0, low), and(_mm256_slli_epi16(qh, 4), bits45)),
                    _mm256_or_si256(and(ql1, low), and(_mm256_slli_epi16(qh, 2), bits45)),
                    _mm256_or_si256(and(_mm256_srli_epi16(ql0, 4), low), and(qh, bits45)),
                    _mm256_or_si256(
                        and(_mm256_srli_epi16(ql1, 4), low),
                        and(_mm256_srli_epi16(qh, 2), bits45),
                    ),
                ];
                for (t, q) in q.into_iter().enumerate() {
                    let y = rescale32(_mm256_sub_epi8(q, bias), m[2 * t], m[2 * t + 1], true);
                    store32(runs.run(first_run + t), y);
                }
            }
        }
    }
}
