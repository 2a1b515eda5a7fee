//! The scan's steps on aarch64: the definitions (the trait defaults, which the compiler builds
//! with Advanced SIMD), but for the steps it leaves mostly scalar or gathers byte by byte: the
//! per-block values of Q4_1, Q5_1, Q4_K, Q5_K and Q6_K and the sets of Q2_K, Q3_K, IQ4_XS and
//! the codebook types. Those are explicit vector code here, equal to the definition bit for bit
//! (tested below): the same binary32 products in the same order, the fp16 fields converted by the
//! definition's integer steps, `fmax` of non-negative values where the definition keeps the
//! larger, no fused multiply-add.

use super::super::params::{
    finite_half_to_f32, q4k_scales_mins, PlainOps, ScanOps, SetOps, TileParams,
};
use crate::quant::{iq1m_scale, GgmlType};

/// The little-endian u16 at byte `at` of `blk`.
#[inline(always)]
fn half_at(blk: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([blk[at], blk[at + 1]])
}
use std::arch::aarch64::*;

/// [`ScanOps`] of the Advanced SIMD path (part of every aarch64 CPU).
#[derive(Clone, Copy)]
pub(in crate::inflate) struct OpsNeon;

impl ScanOps for OpsNeon {
    #[inline(always)]
    fn q4_k_values(self, row: &[u8], ab: &mut [[f32; 2]]) -> (u16, u32) {
        // SAFETY: Advanced SIMD is part of every aarch64 CPU (and of the target's baseline).
        unsafe { q4_k_values_neon::<144, 15>(row, ab) }
    }

    #[inline(always)]
    fn q6_k_values(self, row: &[u8], e: &mut [f32]) -> (u16, u32) {
        // SAFETY: as for `q4_k_values`.
        unsafe { q6_k_values_neon(row, e) }
    }

    #[inline(always)]
    fn q4_1_values(self, row: &[u8], ab: &mut [[f32; 2]]) -> (u16, u32) {
        // SAFETY: as for `q4_k_values`.
        unsafe { q4_1_values_neon::<20, 15>(row, ab) }
    }
}

impl SetOps for OpsNeon {
    #[inline(always)]
    fn q2_k_values(self, row: &[u8], ab: &mut [[f32; 2]]) -> (u16, u32) {
        // SAFETY: Advanced SIMD is part of every aarch64 CPU (and of the target's baseline).
        unsafe { q2_k_values_neon(row, ab) }
    }

    #[inline(always)]
    fn q3_k_values(self, row: &[u8], e: &mut [f32]) -> (u16, u32) {
        // SAFETY: as for `q2_k_values`.
        unsafe { q3_k_values_neon(row, e) }
    }

    #[inline(always)]
    fn iq4_xs_values(self, row: &[u8], e: &mut [f32]) -> (u16, u32) {
        // SAFETY: as for `q2_k_values`.
        unsafe { iq4_xs_values_neon(row, e) }
    }

    #[inline(always)]
    fn codebook_values(self, ty: GgmlType, row: &[u8], e: &mut [f32]) -> (u16, u32) {
        // SAFETY: Advanced SIMD is part of every aarch64 CPU (and of the target's baseline).
        unsafe { codebook_values_neon(ty, row, e) }
    }

    #[inline(always)]
    fn q5_1_values(self, row: &[u8], ab: &mut [[f32; 2]]) -> (u16, u32) {
        // SAFETY: as for `q2_k_values`.
        unsafe { q4_1_values_neon::<24, 31>(row, ab) }
    }

    #[inline(always)]
    fn q5_k_values(self, row: &[u8], ab: &mut [[f32; 2]]) -> (u16, u32) {
        // SAFETY: as for `q2_k_values`.
        unsafe { q4_k_values_neon::<176, 31>(row, ab) }
    }
}

/// The tile scan of the Advanced SIMD path.
pub(in crate::inflate) fn scan_tile(
    p: &mut TileParams,
    rows: &[&[u8]],
    scales: &mut [f32],
) -> Result<(), (usize, usize)> {
    p.prepare(OpsNeon, rows, scales)
}

/// The 16 bytes at byte `at` of `blk` as four little-endian words.
#[inline]
#[target_feature(enable = "neon")]
fn words4(blk: &[u8], at: usize) -> uint32x4_t {
    let src: &[u8; 16] = blk[at..at + 16].try_into().expect("16 bytes");
    // SAFETY: `src` is 16 readable bytes; NEON loads need no alignment.
    vreinterpretq_u32_u8(unsafe { vld1q_u8(src.as_ptr()) })
}

/// `0.5 + s` of four small integers, as binary32 (exact).
#[inline]
#[target_feature(enable = "neon")]
fn plus_half(s: uint32x4_t) -> float32x4_t {
    vaddq_f32(vcvtq_f32_u32(s), vdupq_n_f32(0.5))
}

/// `2·s + 1` of four small integers, as binary32 (exact).
#[inline]
#[target_feature(enable = "neon")]
fn odd(s: uint32x4_t) -> float32x4_t {
    vcvtq_f32_u32(vorrq_u32(vshlq_n_u32::<1>(s), vdupq_n_u32(1)))
}

/// The first `4·N` nibbles of the little-endian bytes of `x`, each byte's low nibble first, four
/// to a vector.
#[inline]
#[target_feature(enable = "neon")]
fn nibbles<const N: usize>(x: u64) -> [uint32x4_t; N] {
    let x = vcreate_u8(x);
    let (lo, hi) = (vand_u8(x, vdup_n_u8(15)), vshr_n_u8::<4>(x));
    let h = [vmovl_u8(vzip1_u8(lo, hi)), vmovl_u8(vzip2_u8(lo, hi))];
    std::array::from_fn(|i| {
        let h = h[i / 2];
        if i % 2 == 0 {
            vmovl_u16(vget_low_u16(h))
        } else {
            vmovl_high_u16(h)
        }
    })
}

/// The 16 bytes at byte `at` of `blk`.
#[inline]
#[target_feature(enable = "neon")]
fn bytes16(blk: &[u8], at: usize) -> uint8x16_t {
    vreinterpretq_u8_u32(words4(blk, at))
}

/// Sixteen signed bytes as binary32 (exact), four to a vector.
#[inline]
#[target_feature(enable = "neon")]
fn widen_i8(x: int8x16_t) -> [float32x4_t; 4] {
    let h = [vmovl_s8(vget_low_s8(x)), vmovl_high_s8(x)];
    std::array::from_fn(|i| {
        let w = if i % 2 == 0 {
            vmovl_s16(vget_low_s16(h[i / 2]))
        } else {
            vmovl_high_s16(h[i / 2])
        };
        vcvtq_f32_s32(w)
    })
}

/// `e = fl(d·c)` of the sets `c` into `e`; returns the running maximum of the magnitude bits.
#[inline]
#[target_feature(enable = "neon")]
fn scaled_sets<const N: usize>(
    d: float32x4_t,
    c: [float32x4_t; N],
    e: &mut [f32],
    e_max: uint32x4_t,
) -> uint32x4_t {
    let magnitude = vdupq_n_u32(0x7fff_ffff);
    let mut e_max = e_max;
    for (e, c) in e.as_chunks_mut::<4>().0.iter_mut().zip(c) {
        let x = vmulq_f32(d, c);
        // SAFETY: `e` is 16 writable bytes; NEON stores need no alignment.
        unsafe { vst1q_f32(e.as_mut_ptr(), x) };
        e_max = vmaxq_u32(e_max, vandq_u32(vreinterpretq_u32_f32(x), magnitude));
    }
    e_max
}

/// [`finite_half_to_f32`] of the low 16 bits of four lanes, by the same integer steps.
#[inline]
#[target_feature(enable = "neon")]
fn finite_halves_to_f32(h: uint32x4_t) -> float32x4_t {
    let magnitude = vandq_u32(h, vdupq_n_u32(0x7fff));
    let sign = vshlq_n_u32::<16>(vandq_u32(h, vdupq_n_u32(0x8000)));
    let normal = vaddq_u32(vshlq_n_u32::<13>(magnitude), vdupq_n_u32((127 - 15) << 23));
    // Subnormals (and zero): mantissa · 2⁻²⁴, exact in binary32.
    let small = vmulq_n_f32(vcvtq_f32_u32(magnitude), 1.0 / 16_777_216.0);
    let is_normal = vcgeq_u32(magnitude, vdupq_n_u32(0x0400));
    let x = vbslq_u32(is_normal, normal, vreinterpretq_u32_f32(small));
    vreinterpretq_f32_u32(vorrq_u32(x, sign))
}

/// `table_set_max` of four sets of codes `0..=TOP`: `max(|b|, |fl(fl(TOP·a) + b)|)`.
#[inline]
#[target_feature(enable = "neon")]
fn set_max<const TOP: u32>(a: float32x4_t, b: float32x4_t) -> float32x4_t {
    let end = vaddq_f32(vmulq_n_f32(a, TOP as f32), b);
    vmaxq_f32(vabsq_f32(b), vabsq_f32(end))
}

/// Eight bytes as binary32 (exact), four to a vector.
#[inline]
#[target_feature(enable = "neon")]
fn widen_u8(x: [u8; 8]) -> [float32x4_t; 2] {
    let h = vmovl_u8(vcreate_u8(u64::from_le_bytes(x)));
    [
        vcvtq_f32_u32(vmovl_u16(vget_low_u16(h))),
        vcvtq_f32_u32(vmovl_high_u16(h)),
    ]
}

/// [`ScanOps::q4_1_values`] four blocks at a time: their `d` and `m` fields (one word per
/// block) in one vector's lanes, converted as [`finite_half_to_f32`] does, stored as pairs by
/// `st2`; `M_n` as a running lane maximum; the last `len % 4` blocks as defined. Also Q5_1's
/// (`BB` 24, codes `0..=TOP` 31).
#[inline]
#[target_feature(enable = "neon")]
fn q4_1_values_neon<const BB: usize, const TOP: u32>(
    row: &[u8],
    ab: &mut [[f32; 2]],
) -> (u16, u32) {
    let blocks = row.as_chunks::<BB>().0;
    let n = blocks.len().min(ab.len());
    let (quads, rest) = blocks[..n].as_chunks::<4>();
    let (ab, ab_rest) = ab[..n].as_chunks_mut::<4>();
    let (mut largest, mut w_max) = (vdupq_n_u16(0), vdupq_n_f32(0.0));
    for (ab, quad) in ab.iter_mut().zip(quads) {
        let fields: [u32; 4] =
            quad.map(|b| u32::from_le_bytes(b[..4].try_into().expect("4 bytes")));
        // SAFETY: `fields` is 16 readable bytes.
        let fields = unsafe { vld1q_u32(fields.as_ptr()) };
        largest = vmaxq_u16(
            largest,
            vandq_u16(vreinterpretq_u16_u32(fields), vdupq_n_u16(0x7fff)),
        );
        let a = finite_halves_to_f32(fields);
        let b = finite_halves_to_f32(vshrq_n_u32::<16>(fields));
        w_max = vmaxq_f32(w_max, set_max::<TOP>(a, b));
        // SAFETY: `ab` is 32 writable bytes; NEON stores need no alignment.
        unsafe { vst2q_f32(ab.as_mut_ptr().cast(), float32x4x2_t(a, b)) };
    }
    let (rest_largest, rest_max) = if TOP == 15 {
        PlainOps.q4_1_values(rest.as_flattened(), ab_rest)
    } else {
        PlainOps.q5_1_values(rest.as_flattened(), ab_rest)
    };
    (
        vmaxvq_u16(largest).max(rest_largest),
        vmaxvq_f32(w_max).to_bits().max(rest_max),
    )
}

/// [`ScanOps::q4_k_values`] a super-block at a time: the eight scales and eight mins (decoded
/// by [`q4k_scales_mins`]) as binary32 (exact), times `d` and `-dmin`, stored as pairs by
/// `st2`; `M_n` as a running lane maximum. Also Q5_K's (`BB` 176, codes `0..=TOP` 31), whose
/// header is Q4_K's.
#[inline]
#[target_feature(enable = "neon")]
fn q4_k_values_neon<const BB: usize, const TOP: u32>(
    row: &[u8],
    ab: &mut [[f32; 2]],
) -> (u16, u32) {
    let (mut largest, mut w_max) = (0, vdupq_n_f32(0.0));
    for (ab, blk) in ab
        .as_chunks_mut::<8>()
        .0
        .iter_mut()
        .zip(row.as_chunks::<BB>().0)
    {
        let (hd, hm) = (half_at(blk, 0), half_at(blk, 2));
        largest = largest.max(hd & 0x7fff).max(hm & 0x7fff);
        // `-fl(dmin·m) = fl(-dmin·m)`: the negation moves onto the scale, once per block.
        let (d, negative_dmin) = (
            vdupq_n_f32(finite_half_to_f32(hd)),
            vdupq_n_f32(-finite_half_to_f32(hm)),
        );
        let (sc, mn) = q4k_scales_mins(blk[4..16].try_into().expect("12 bytes"));
        let (sc, mn) = (widen_u8(sc), widen_u8(mn));
        for ((ab, sc), mn) in ab.as_chunks_mut::<4>().0.iter_mut().zip(sc).zip(mn) {
            let (a, b) = (vmulq_f32(d, sc), vmulq_f32(negative_dmin, mn));
            w_max = vmaxq_f32(w_max, set_max::<TOP>(a, b));
            // SAFETY: `ab` is 32 writable bytes; NEON stores need no alignment.
            unsafe { vst2q_f32(ab.as_mut_ptr().cast(), float32x4x2_t(a, b)) };
        }
    }
    (largest, vmaxvq_f32(w_max).to_bits())
}

/// [`ScanOps::q6_k_values`] a super-block at a time: its 16 signed scales as binary32 (exact),
/// times `d`.
#[inline]
#[target_feature(enable = "neon")]
fn q6_k_values_neon(row: &[u8], e: &mut [f32]) -> (u16, u32) {
    let (mut largest, mut e_max) = (0, vdupq_n_u32(0));
    for (e, blk) in e
        .as_chunks_mut::<16>()
        .0
        .iter_mut()
        .zip(row.as_chunks::<210>().0)
    {
        // `d` is the block's last two bytes.
        let h = half_at(blk, 208);
        largest = largest.max(h & 0x7fff);
        let d = vdupq_n_f32(finite_half_to_f32(h));
        let sc = vreinterpretq_s8_u8(bytes16(blk, 192));
        e_max = scaled_sets(d, widen_i8(sc), e, e_max);
    }
    (largest, vmaxvq_u32(e_max))
}

/// [`SetOps::q2_k_values`] a super-block at a time: its 16 scale bytes' low and high nibbles as
/// binary32 (exact), times `d` and `dmin`, stored as pairs by `st2`; `M_n` as a running lane
/// maximum of `max(|b|, |fl(fl(3·a) + b)|)` (non-negative, so its bits order as its values).
#[inline]
#[target_feature(enable = "neon")]
fn q2_k_values_neon(row: &[u8], ab: &mut [[f32; 2]]) -> (u16, u32) {
    let (mut largest, mut w_max) = (0, vdupq_n_f32(0.0));
    for (ab, blk) in ab
        .as_chunks_mut::<16>()
        .0
        .iter_mut()
        .zip(row.as_chunks::<84>().0)
    {
        let (hd, hm) = (half_at(blk, 80), half_at(blk, 82));
        largest = largest.max(hd & 0x7fff).max(hm & 0x7fff);
        // `-fl(dmin·m) = fl(-dmin·m)`: the negation moves onto the scale, once per block.
        let (d, negative_dmin) = (
            vdupq_n_f32(finite_half_to_f32(hd)),
            vdupq_n_f32(-finite_half_to_f32(hm)),
        );
        let sc = bytes16(blk, 0);
        let (sc, mn) = (
            // Nibbles: as signed bytes, the same values.
            widen_i8(vreinterpretq_s8_u8(vandq_u8(sc, vdupq_n_u8(15)))),
            widen_i8(vreinterpretq_s8_u8(vshrq_n_u8::<4>(sc))),
        );
        for ((ab, sc), mn) in ab.as_chunks_mut::<4>().0.iter_mut().zip(sc).zip(mn) {
            let (a, b) = (vmulq_f32(d, sc), vmulq_f32(negative_dmin, mn));
            let end = vaddq_f32(vmulq_n_f32(a, 3.0), b);
            w_max = vmaxq_f32(w_max, vmaxq_f32(vabsq_f32(b), vabsq_f32(end)));
            // SAFETY: `ab` is 32 writable bytes; NEON stores need no alignment.
            unsafe { vst2q_f32(ab.as_mut_ptr().cast(), float32x4x2_t(a, b)) };
        }
    }
    (largest, vmaxvq_f32(w_max).to_bits())
}

/// [`SetOps::q3_k_values`] a super-block at a time: the 16 six-bit scales by byte shifts (low
/// nibbles: bytes 0..8, by 0 or 4; top bits: bytes 8..12, by 0, 2, 4, 6), less 32, as binary32,
/// times `d`.
#[inline]
#[target_feature(enable = "neon")]
fn q3_k_values_neon(row: &[u8], e: &mut [f32]) -> (u16, u32) {
    let top_shift: [i8; 16] = std::array::from_fn(|j| -2 * (j / 4) as i8);
    // SAFETY: `top_shift` is 16 readable bytes.
    let top_shift = unsafe { vld1q_s8(top_shift.as_ptr()) };
    let (mut largest, mut e_max) = (0, vdupq_n_u32(0));
    for (e, blk) in e
        .as_chunks_mut::<16>()
        .0
        .iter_mut()
        .zip(row.as_chunks::<110>().0)
    {
        let h = half_at(blk, 108);
        largest = largest.max(h & 0x7fff);
        let low = vcreate_u8(u64::from_le_bytes(
            blk[96..104].try_into().expect("8 bytes"),
        ));
        let low = vcombine_u8(vand_u8(low, vdup_n_u8(15)), vshr_n_u8::<4>(low));
        let top = u32::from_le_bytes(blk[104..108].try_into().expect("4 bytes"));
        let top = vshlq_u8(vreinterpretq_u8_u32(vdupq_n_u32(top)), top_shift);
        let top = vshlq_n_u8::<4>(vandq_u8(top, vdupq_n_u8(3)));
        let sc = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(low, top)), vdupq_n_s8(32));
        let d = vdupq_n_f32(finite_half_to_f32(h));
        e_max = scaled_sets(d, widen_i8(sc), e, e_max);
    }
    (largest, vmaxvq_u32(e_max))
}

/// [`SetOps::iq4_xs_values`] a super-block at a time: the eight six-bit scales by 32-bit lane
/// shifts of `scales_l` (by 4·j) and `scales_h` (by 2·j), less 32, as binary32, times `d`.
#[inline]
#[target_feature(enable = "neon")]
fn iq4_xs_values_neon(row: &[u8], e: &mut [f32]) -> (u16, u32) {
    let shifts = |step: i32, first: i32| {
        let s: [i32; 4] = std::array::from_fn(|j| -step * (first + j as i32));
        // SAFETY: `s` is 16 readable bytes.
        unsafe { vld1q_s32(s.as_ptr()) }
    };
    let (low_shift, high_shift) = ([shifts(4, 0), shifts(4, 4)], [shifts(2, 0), shifts(2, 4)]);
    let (mut largest, mut e_max) = (0, vdupq_n_u32(0));
    for (e, blk) in e
        .as_chunks_mut::<8>()
        .0
        .iter_mut()
        .zip(row.as_chunks::<136>().0)
    {
        let h = half_at(blk, 0);
        largest = largest.max(h & 0x7fff);
        let high = vdupq_n_u32(half_at(blk, 2) as u32);
        let low = vdupq_n_u32(u32::from_le_bytes(blk[4..8].try_into().expect("4 bytes")));
        let ls: [float32x4_t; 2] = std::array::from_fn(|i| {
            let l = vandq_u32(vshlq_u32(low, low_shift[i]), vdupq_n_u32(15));
            let h = vandq_u32(vshlq_u32(high, high_shift[i]), vdupq_n_u32(3));
            let ls = vreinterpretq_s32_u32(vorrq_u32(l, vshlq_n_u32::<4>(h)));
            vcvtq_f32_s32(vsubq_s32(ls, vdupq_n_s32(32)))
        });
        let d = vdupq_n_f32(finite_half_to_f32(h));
        e_max = scaled_sets(d, ls, e, e_max);
    }
    (largest, vmaxvq_u32(e_max))
}

/// [`SetOps::codebook_values`] a block at a time: each type's small integers `s` from its scale
/// fields by lane shifts, `v` (`0.5 + s` or `2·s + 1`, exact), `e_j = fl(fl(d·v)·c)` with `c`
/// a power of two (the definition's last product, or none: `c = 1` changes no finite value);
/// `E_n` as a running lane maximum of the magnitude bits.
#[inline]
#[target_feature(enable = "neon")]
fn codebook_values_neon(ty: GgmlType, row: &[u8], e: &mut [f32]) -> (u16, u32) {
    let magnitude = vdupq_n_u32(0x7fff_ffff);
    let (mut largest, mut e_max) = (0, vdupq_n_u32(0));
    // One loop per type: `$sets_of` maps a block to its fp16 scale, its `v` and `c`.
    macro_rules! blocks {
        ($bb:literal, $sets:literal, |$blk:ident| $sets_of:expr) => {{
            let blocks = row.as_chunks::<$bb>().0;
            for (e, $blk) in e.as_chunks_mut::<$sets>().0.iter_mut().zip(blocks) {
                let (h, v, c): (u16, [float32x4_t; $sets / 4], f32) = $sets_of;
                largest = largest.max(h & 0x7fff);
                let d = vdupq_n_f32(finite_half_to_f32(h));
                for (e, v) in e.as_chunks_mut::<4>().0.iter_mut().zip(v) {
                    let x = vmulq_n_f32(vmulq_f32(d, v), c);
                    // SAFETY: `e` is 16 writable bytes; NEON stores need no alignment.
                    unsafe { vst1q_f32(e.as_mut_ptr(), x) };
                    e_max = vmaxq_u32(e_max, vandq_u32(vreinterpretq_u32_f32(x), magnitude));
                }
            }
        }};
    }
    let u64_at =
        |blk: &[u8], at: usize| u64::from_le_bytes(blk[at..at + 8].try_into().expect("8 bytes"));
    match ty {
        GgmlType::IQ2_XXS => blocks!(66, 8, |blk| {
            // Each group of 8 bytes from byte 2 ends in its sub-block's word: the odd words.
            let aux = |at| vuzp2q_u32(words4(blk, at), words4(blk, at + 16));
            let s = |at| plus_half(vshrq_n_u32::<28>(aux(at)));
            (half_at(blk, 0), [s(2), s(34)], 0.25)
        }),
        GgmlType::IQ2_XS => blocks!(74, 16, |blk| {
            (
                half_at(blk, 0),
                nibbles::<4>(u64_at(blk, 66)).map(|s| plus_half(s)),
                0.25,
            )
        }),
        GgmlType::IQ2_S => blocks!(82, 16, |blk| {
            (
                half_at(blk, 0),
                nibbles::<4>(u64_at(blk, 74)).map(|s| plus_half(s)),
                0.25,
            )
        }),
        GgmlType::IQ3_XXS => blocks!(98, 8, |blk| {
            let s = |at| plus_half(vshrq_n_u32::<28>(words4(blk, at)));
            (half_at(blk, 0), [s(66), s(82)], 0.5)
        }),
        GgmlType::IQ3_S => blocks!(110, 8, |blk| {
            let word = u32::from_le_bytes(blk[106..110].try_into().expect("4 bytes"));
            (
                half_at(blk, 0),
                nibbles::<2>(word as u64).map(|s| odd(s)),
                1.0,
            )
        }),
        GgmlType::IQ1_S => blocks!(50, 8, |blk| {
            // The top four bits of each of the eight words from byte 34.
            let w = vreinterpretq_u16_u32(words4(blk, 34));
            let s = vandq_u16(vshrq_n_u16::<12>(w), vdupq_n_u16(7));
            let s = [vmovl_u16(vget_low_u16(s)), vmovl_high_u16(s)];
            (half_at(blk, 0), s.map(|s| odd(s)), 0.125)
        }),
        GgmlType::IQ1_M => blocks!(56, 16, |blk| {
            // Set i: bits 3·(i % 4).. of scale word i / 4.
            let scales: &[u8; 8] = blk[48..56].try_into().expect("8 bytes");
            let shifts: [i32; 4] = [0, -3, -6, -9];
            // SAFETY: `shifts` is 16 readable bytes.
            let shifts = unsafe { vld1q_s32(shifts.as_ptr()) };
            let v = std::array::from_fn(|k| {
                let w = vdupq_n_u32(half_at(scales, 2 * k) as u32);
                odd(vandq_u32(vshlq_u32(w, shifts), vdupq_n_u32(7)))
            });
            (iq1m_scale(scales), v, 0.125)
        }),
        _ => unreachable!("{ty:?} is no codebook type"),
    }
    (largest, vmaxvq_u32(e_max))
}

#[cfg(test)]
mod tests {
    use super::super::super::codebook::CODEBOOK_TYPES;
    use super::super::super::params::PlainOps;
    use super::*;
    use crate::testutil::{half_offsets, set_iq1m_scale, Rng};

    /// fp16 scales that stress the step: both zeros, subnormals, the extremes (NaN and infinity
    /// leave the result unspecified; the largest half still has to agree).
    const SPECIAL: [u16; 8] = [
        0x0000, 0x8000, 0x0001, 0x83ff, 0x0400, 0x7bff, 0xfbff, 0x7c00,
    ];

    /// A row of `blocks` random blocks of `ty` with random and special fp16 scales.
    fn random_row(rng: &mut Rng, ty: GgmlType, blocks: usize) -> Vec<u8> {
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
        row
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn k_and_iq4_xs_sets_agree_with_their_definitions() {
        let mut rng = Rng::new(31);
        for ty in [GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::IQ4_XS] {
            for round in 0..300 {
                let blocks = 1 + round % 12;
                let row = random_row(&mut rng, ty, blocks);
                let ctx = format!("{ty:?} round {round}, {blocks} blocks");
                let (w, g, want, got) = if ty == GgmlType::Q2_K {
                    let (mut want, mut got) =
                        (vec![[0f32; 2]; 16 * blocks], vec![[0f32; 2]; 16 * blocks]);
                    let w = PlainOps.q2_k_values(&row, &mut want);
                    let g = OpsNeon.q2_k_values(&row, &mut got);
                    (w, g, bits(want.as_flattened()), bits(got.as_flattened()))
                } else {
                    let n = if ty == GgmlType::Q3_K { 16 } else { 8 } * blocks;
                    let (mut want, mut got) = (vec![0f32; n], vec![0f32; n]);
                    let (w, g) = if ty == GgmlType::Q3_K {
                        (
                            PlainOps.q3_k_values(&row, &mut want),
                            OpsNeon.q3_k_values(&row, &mut got),
                        )
                    } else {
                        (
                            PlainOps.iq4_xs_values(&row, &mut want),
                            OpsNeon.iq4_xs_values(&row, &mut got),
                        )
                    };
                    (w, g, bits(&want), bits(&got))
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
    fn block_values_agree_with_their_definitions() {
        let mut rng = Rng::new(37);
        let types = [
            GgmlType::Q4_1,
            GgmlType::Q5_1,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ];
        for ty in types {
            for round in 0..300 {
                let blocks = 1 + round % 13;
                let row = random_row(&mut rng, ty, blocks);
                let ctx = format!("{ty:?} round {round}, {blocks} blocks");
                let (w, g, want, got) = if ty == GgmlType::Q6_K {
                    let (mut want, mut got) = (vec![0f32; 16 * blocks], vec![0f32; 16 * blocks]);
                    let w = PlainOps.q6_k_values(&row, &mut want);
                    let g = OpsNeon.q6_k_values(&row, &mut got);
                    (w, g, bits(&want), bits(&got))
                } else {
                    let pairs = blocks * ty.block_elems() / 32;
                    let (mut want, mut got) = (vec![[0f32; 2]; pairs], vec![[0f32; 2]; pairs]);
                    let (w, g) = match ty {
                        GgmlType::Q4_1 => (
                            PlainOps.q4_1_values(&row, &mut want),
                            OpsNeon.q4_1_values(&row, &mut got),
                        ),
                        GgmlType::Q5_1 => (
                            PlainOps.q5_1_values(&row, &mut want),
                            OpsNeon.q5_1_values(&row, &mut got),
                        ),
                        GgmlType::Q4_K => (
                            PlainOps.q4_k_values(&row, &mut want),
                            OpsNeon.q4_k_values(&row, &mut got),
                        ),
                        _ => (
                            PlainOps.q5_k_values(&row, &mut want),
                            OpsNeon.q5_k_values(&row, &mut got),
                        ),
                    };
                    (w, g, bits(want.as_flattened()), bits(got.as_flattened()))
                };
                assert_eq!(g.0, w.0, "{ctx}: largest half");
                if w.0 < 0x7c00 {
                    assert_eq!(g.1, w.1, "{ctx}: largest value");
                    assert_eq!(got, want, "{ctx}: values");
                }
            }
        }
    }

    #[test]
    fn codebook_sets_agree_with_their_definition() {
        let mut rng = Rng::new(29);
        for ty in CODEBOOK_TYPES {
            for round in 0..300 {
                let blocks = 1 + round % 12;
                let row = random_row(&mut rng, ty, blocks);
                let sets = blocks * ty.block_elems()
                    / match ty {
                        GgmlType::IQ2_XS | GgmlType::IQ2_S | GgmlType::IQ1_M => 16,
                        _ => 32,
                    };
                let (mut want, mut got) = (vec![0f32; sets], vec![0f32; sets]);
                let w = PlainOps.codebook_values(ty, &row, &mut want);
                let g = OpsNeon.codebook_values(ty, &row, &mut got);
                let ctx = format!("{ty:?} round {round}, {blocks} blocks");
                assert_eq!(g.0, w.0, "{ctx}: largest half");
                if w.0 < 0x7c00 {
                    assert_eq!(g.1, w.1, "{ctx}: largest value");
                    assert_eq!(bits(&got), bits(&want), "{ctx}: sets");
                }
            }
        }
    }
}
