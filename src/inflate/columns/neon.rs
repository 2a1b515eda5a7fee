//! Advanced SIMD column decoders: `x86.rs`'s, eight rows as two 128-bit vectors (rows 0..4 and
//! 4..8, one f32 lane per row), the scalar reference's operations lane by lane. A row's byte of
//! a column comes from four-byte loads in plain blocks (rows `row_stride` apart), and in a
//! repacked multi-block from the rows' pieces side by side: two 16-byte loads (4-byte pieces) or
//! four (8-byte pieces: 64-bit shifts, then `uzp1` keeps the low words). fp16 scales convert
//! with integer operations, exactly as the scalar `half` (the intrinsics of `fcvtl` are newer
//! than the crate's Rust).

use super::super::params::q4k_scales_mins;
use super::scalar::{Decode, Q4K, Q4_0, Q4_1, Q5_0, Q6K, Q8_0};
use super::source::{Source, Window};
use super::{Column, Kernel, Loc, Plan, Run, LANES};
use crate::isa::Isa;
use crate::quant::{GgmlType, K_SCALE_SIZE};
use std::arch::aarch64::*;

/// Eight rows' u32 or f32 lanes: rows 0..4, 4..8.
type U8x = [uint32x4_t; 2];
type F8x = [float32x4_t; 2];

/// Calls a `#[target_feature]` kernel from the safe function pointer [`kernel`] hands out.
macro_rules! unsafe_call {
    ($call:expr) => {
        // SAFETY: Advanced SIMD is part of every aarch64 CPU.
        unsafe { $call }
    };
}

/// The Advanced SIMD decoder of `src`'s type and layout, if `isa` is an aarch64 SIMD path.
pub(super) fn kernel(isa: Isa, src: &Source) -> Option<Kernel> {
    if !matches!(isa, Isa::Neon | Isa::NeonDot) {
        return None;
    }
    kernel_table!(src)
}

/// Lane `j`: the four bytes at offset `at` of row `r + j`'s block `x`, plain blocks (`at + 4`
/// inside the block).
#[inline]
#[target_feature(enable = "neon")]
fn words(src: &Source, r: usize, x: usize, at: usize) -> U8x {
    let first = r * src.row_step + x * src.block_step + at;
    let window = &src.data[first..first + (LANES - 1) * src.row_step + 4];
    // SAFETY: lane `j` reads the 4 bytes at `j·row_step` of `window`, all inside it.
    unsafe { words_at(window.as_ptr(), src.row_step) }
}

/// Lane `j`: the 4 bytes at `at + j·step`.
///
/// # Safety
/// The 4 bytes at `at + j·step` for `j < 8` must be readable.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn words_at(at: *const u8, step: usize) -> U8x {
    // SAFETY: the caller's promise.
    let w: [u32; 8] =
        std::array::from_fn(|j| unsafe { at.add(j * step).cast::<u32>().read_unaligned() });
    // SAFETY: `w` is 8 readable u32.
    unsafe { [vld1q_u32(w.as_ptr()), vld1q_u32(w.as_ptr().add(4))] }
}

/// Lane `j`: the fp16 value at `loc` of row `r + j`'s block `x`, as f32.
#[inline]
#[target_feature(enable = "neon")]
fn halves<const R: usize>(src: &Source, r: usize, x: usize, loc: Loc) -> F8x {
    let h: uint16x8_t = match R {
        1 => {
            let at = loc.at.min(src.ty.block_bytes() - 4);
            let shift = vdupq_n_s32(-8 * (loc.at - at) as i32);
            let [lo, hi] = words(src, r, x, at).map(|w| vshlq_u32(w, shift));
            vuzp1q_u16(vreinterpretq_u16_u32(lo), vreinterpretq_u16_u32(hi))
        }
        // The rows' halves side by side.
        8 => vreinterpretq_u16_u8(load16(
            &src.data[r / 8 * src.row_step + x * src.block_step + loc.at..],
        )),
        4 => {
            let first = r / 4 * src.row_step + x * src.block_step + loc.at;
            let (a, b) = (
                load8(&src.data[first..]),
                load8(&src.data[first + src.row_step..]),
            );
            vreinterpretq_u16_u8(vcombine_u8(a, b))
        }
        _ => unreachable!("no layout has groups of {R} rows"),
    };
    [half4(vmovl_u16(vget_low_u16(h))), half4(vmovl_high_u16(h))]
}

/// binary16 (the low 16 bits of each lane) → binary32, exactly as the scalar `half`: normal
/// values by moving the bits into place (infinities and NaNs rebiased once more), subnormals
/// (and zero) as `mantissa · 2⁻²⁴`.
#[inline]
#[target_feature(enable = "neon")]
fn half4(h: uint32x4_t) -> float32x4_t {
    let sign = vshlq_n_u32::<16>(vandq_u32(h, vdupq_n_u32(0x8000)));
    let mag = vandq_u32(h, vdupq_n_u32(0x7fff));
    let bias = vdupq_n_u32((127 - 15) << 23);
    let normal = vaddq_u32(vshlq_n_u32::<13>(mag), bias);
    let special = vcgeq_u32(mag, vdupq_n_u32(0x7c00));
    let normal = vaddq_u32(normal, vandq_u32(special, bias));
    let small = vmulq_f32(vcvtq_f32_u32(mag), vdupq_n_f32(1.0 / 16_777_216.0));
    let is_normal = vcgeq_u32(mag, vdupq_n_u32(0x0400));
    let bits = vbslq_u32(is_normal, normal, vreinterpretq_u32_f32(small));
    vreinterpretq_f32_u32(vorrq_u32(bits, sign))
}

/// A column's byte for the vectors of a strip ([`Window`]), and its shift as a count.
#[derive(Clone, Copy)]
struct Lanes<'a> {
    window: Window<'a>,
    /// Minus the shift: `ushl` shifts right by a negative count.
    count: int32x4_t,
}

impl<'a> Lanes<'a> {
    #[inline]
    #[target_feature(enable = "neon")]
    fn new(window: Window<'a>) -> Lanes<'a> {
        Lanes {
            window,
            count: vdupq_n_s32(-(window.bits as i32)),
        }
    }

    /// Lane `j`: the byte of row `j` of vector `u`, in bits `0..8` after the shift (the bits
    /// above: the next bytes', or garbage).
    #[inline]
    #[target_feature(enable = "neon")]
    fn get<const R: usize, const C: usize>(&self, u: usize) -> U8x {
        let w = &self.window;
        let at = w.vector(u);
        let shr = |v: uint32x4_t| vshlq_u32(v, self.count);
        // SAFETY: the vector's `span` bytes from `Window::vector` lie in the window:
        // the plain rows' words at `j·row_step` (`j < 8`, 4 bytes each; `span = 7·row_step +
        // 4`), 32 bytes (8 rows of 4-byte pieces, `span = 32`) or the loads at 0 and `second`
        // (16 bytes each for 4-byte pieces in groups of four, 32 for 8-byte pieces: `span =
        // second + 16` or `second + 32`).
        unsafe {
            let q = |at: *const u8| vreinterpretq_u32_u8(vld1q_u8(at));
            match (R, C) {
                (1, _) => words_at(at, w.row_step).map(shr),
                (8, 4) => [shr(q(at)), shr(q(at.add(16)))],
                (4, 4) => [shr(q(at)), shr(q(at.add(w.second)))],
                _ => {
                    // Rows `2i, 2i + 1`'s pieces are the two u64 of load `i`: shift each, then
                    // keep the low words.
                    let count = vdupq_n_s64(i64::from(vgetq_lane_s32::<0>(self.count)));
                    let shr64 = |at: *const u8| {
                        vreinterpretq_u32_u64(vshlq_u64(vreinterpretq_u64_u8(vld1q_u8(at)), count))
                    };
                    let (a, b) = (shr64(at), shr64(at.add(16)));
                    let (c, d) = (shr64(at.add(w.second)), shr64(at.add(w.second + 16)));
                    [vuzp1q_u32(a, b), vuzp1q_u32(c, d)]
                }
            }
        }
    }
}

#[inline]
#[target_feature(enable = "neon")]
fn load8(src: &[u8]) -> uint8x8_t {
    let src: &[u8; 8] = src[..8].try_into().expect("8 bytes");
    // SAFETY: `src` is 8 readable bytes.
    unsafe { vld1_u8(src.as_ptr()) }
}

#[inline]
#[target_feature(enable = "neon")]
fn load16(src: &[u8]) -> uint8x16_t {
    let src: &[u8; 16] = src[..16].try_into().expect("16 bytes");
    // SAFETY: `src` is 16 readable bytes.
    unsafe { vld1q_u8(src.as_ptr()) }
}

#[inline]
#[target_feature(enable = "neon")]
fn store8(dst: &mut [f32], v: F8x) {
    let dst: &mut [f32; 8] = (&mut dst[..8]).try_into().expect("8 floats");
    // SAFETY: `dst` is 8 writable floats.
    unsafe {
        vst1q_f32(dst.as_mut_ptr(), v[0]);
        vst1q_f32(dst.as_mut_ptr().add(4), v[1]);
    }
}

/// The low byte of each lane, sign-extended.
#[inline]
#[target_feature(enable = "neon")]
fn signed8(v: uint32x4_t) -> int32x4_t {
    vshrq_n_s32::<24>(vshlq_n_s32::<24>(vreinterpretq_s32_u32(v)))
}

/// `v & mask`.
#[inline]
#[target_feature(enable = "neon")]
fn low(v: U8x, mask: u32) -> U8x {
    v.map(|v| vandq_u32(v, vdupq_n_u32(mask)))
}

/// `(lo | hi << 4) - offset` as i32 lanes: Q5_0's and Q6_K's codes.
#[inline]
#[target_feature(enable = "neon")]
fn combine(lo: U8x, hi: U8x, offset: i32) -> [int32x4_t; 2] {
    [0, 1].map(|i| {
        let q = vorrq_u32(lo[i], vshlq_n_u32::<4>(hi[i]));
        vsubq_s32(vreinterpretq_s32_u32(q), vdupq_n_s32(offset))
    })
}

/// `c·a` lane by lane, `c` integer codes.
#[inline]
#[target_feature(enable = "neon")]
fn times(c: [int32x4_t; 2], a: F8x) -> F8x {
    [0, 1].map(|i| vmulq_f32(vcvtq_f32_s32(c[i]), a[i]))
}

/// Widens eight bytes (rows 0..8) to u32 lanes.
#[inline]
#[target_feature(enable = "neon")]
fn widen(v: uint8x8_t) -> U8x {
    let w = vmovl_u8(v);
    [vmovl_u16(vget_low_u16(w)), vmovl_high_u16(w)]
}

#[inline]
#[target_feature(enable = "neon")]
fn zero_f() -> F8x {
    [vdupq_n_f32(0.0); 2]
}

#[inline]
#[target_feature(enable = "neon")]
fn zero_u() -> U8x {
    [vdupq_n_u32(0); 2]
}

simd_drive!("neon", F8x, zero_f(), store8);

#[target_feature(enable = "neon")]
fn q4_0<const R: usize, const C: usize>(src: &Source, plan: &Plan, out: &mut [f32]) {
    drive::<Q4_0, R, C, _, _>(
        src,
        plan,
        out,
        (),
        |_, _| (),
        |_, r, run, _| (halves::<R>(src, r, run.x, src.d), zero_f()),
        |col, r0, x, units| {
            let flip = vdupq_n_u32(u32::from(col.flip >> col.shift[0]));
            let window = src.window::<R, C>(r0, units, x, col.q[0], col.shift[0]);
            (Lanes::new(window), flip)
        },
        |(q, flip), u, a, _| {
            let q = low(q.get::<R, C>(u).map(|q| veorq_u32(q, *flip)), 15);
            times(
                q.map(|q| vsubq_s32(vreinterpretq_s32_u32(q), vdupq_n_s32(8))),
                a,
            )
        },
    );
}

#[target_feature(enable = "neon")]
fn q4_1(src: &Source, plan: &Plan, out: &mut [f32]) {
    drive::<Q4_1, 1, 0, _, _>(
        src,
        plan,
        out,
        (),
        |_, _| (),
        |_, r, run, _| {
            (
                halves::<1>(src, r, run.x, src.d),
                halves::<1>(src, r, run.x, src.m),
            )
        },
        |col, r0, x, units| Lanes::new(src.window::<1, 0>(r0, units, x, col.q[0], col.shift[0])),
        |q, u, a, b| {
            let c = low(q.get::<1, 0>(u), 15).map(|v| vreinterpretq_s32_u32(v));
            let ca = times(c, a);
            [0, 1].map(|i| vaddq_f32(ca[i], b[i]))
        },
    );
}

/// Q5_0 in plain blocks: the rows' fifth bits, `qh`, are read once per block and ride in the
/// place of the `b` parameter Q5_0 has not.
#[target_feature(enable = "neon")]
fn q5_0(src: &Source, plan: &Plan, out: &mut [f32]) {
    drive::<Q5_0, 1, 0, _, _>(
        src,
        plan,
        out,
        (),
        |_, _| (),
        |_, r, run, _| {
            let qh = words(src, r, run.x, 2).map(|v| vreinterpretq_f32_u32(v));
            (halves::<1>(src, r, run.x, src.d), qh)
        },
        |col, r0, x, units| {
            // Bit `e` of `qh`: byte `q[1].at - 2`, bit `shift[1]`.
            let bit = 8 * (col.q[1].at - 2) as i32 + col.shift[1] as i32;
            let lo = Lanes::new(src.window::<1, 0>(r0, units, x, col.q[0], col.shift[0]));
            (lo, vdupq_n_s32(-bit))
        },
        |(lo, bit), u, a, qh| {
            let hi = low(qh.map(|h| vshlq_u32(vreinterpretq_u32_f32(h), *bit)), 1);
            times(combine(low(lo.get::<1, 0>(u), 15), hi, 16), a)
        },
    );
}

#[target_feature(enable = "neon")]
fn q8_0<const R: usize, const C: usize>(src: &Source, plan: &Plan, out: &mut [f32]) {
    drive::<Q8_0, R, C, _, _>(
        src,
        plan,
        out,
        (),
        |_, _| (),
        |_, r, run, _| (halves::<R>(src, r, run.x, src.d), zero_f()),
        |col, r0, x, units| Lanes::new(src.window::<R, C>(r0, units, x, col.q[0], 0)),
        |q, u, a, _| times(q.get::<R, C>(u).map(|v| signed8(v)), a),
    );
}

/// Q4_K's block: `d`, `dmin` and (plain blocks) the scale packing's three words, per row.
#[derive(Clone, Copy)]
struct Q4KBlock {
    d: F8x,
    dmin: F8x,
    words: [U8x; 3],
}

#[target_feature(enable = "neon")]
fn q4_k<const R: usize, const C: usize>(src: &Source, plan: &Plan, out: &mut [f32]) {
    let zero = Q4KBlock {
        d: zero_f(),
        dmin: zero_f(),
        words: [zero_u(); 3],
    };
    drive::<Q4K, R, C, _, _>(
        src,
        plan,
        out,
        zero,
        |r, x| Q4KBlock {
            d: halves::<R>(src, r, x, src.d),
            dmin: halves::<R>(src, r, x, src.m),
            words: if R == 1 {
                [4, 8, 12].map(|at| words(src, r, x, at))
            } else {
                zero.words
            },
        },
        |blk, r, run, set| {
            let (sc, m) = if R == 1 {
                plain_q4k_scales(&blk.words, run.s)
            } else {
                let at = r / R * src.row_step + run.x * src.block_step + set.at;
                let packing = src.data[at..at + K_SCALE_SIZE]
                    .try_into()
                    .expect("12 bytes");
                let (sc, m) = q4k_scales_mins(packing);
                // SAFETY: the arrays are 8 readable bytes each.
                unsafe { (widen(vld1_u8(sc.as_ptr())), widen(vld1_u8(m.as_ptr()))) }
            };
            let mul = |d: F8x, v: U8x| [0, 1].map(|i| vmulq_f32(d[i], vcvtq_f32_u32(v[i])));
            (mul(blk.d, sc), mul(blk.dmin, m))
        },
        |col, r0, x, units| Lanes::new(src.window::<R, C>(r0, units, x, col.q[0], col.shift[0])),
        |q, u, a, b| {
            let ca = times(
                low(q.get::<R, C>(u), 15).map(|v| vreinterpretq_s32_u32(v)),
                a,
            );
            [0, 1].map(|i| vsubq_f32(ca[i], b[i]))
        },
    );
}

/// Sub-block `s`'s 6-bit scales and mins of eight rows from the words of their scale packings
/// (lane `j`: row `j`'s bytes `4i..4i + 4` in `words[i]`), as [`crate::quant::q4k_scale_min`]
/// unpacks them.
#[inline]
#[target_feature(enable = "neon")]
fn plain_q4k_scales(words: &[U8x; 3], s: usize) -> (U8x, U8x) {
    let n = vdupq_n_s32(-8 * (s % 4) as i32);
    let [w0, w1, w2] = words.map(|w| w.map(|w| vshlq_u32(w, n)));
    if s < 4 {
        (low(w0, 63), low(w1, 63))
    } else {
        let top = |w: U8x| low(w.map(|v| vshrq_n_u32::<6>(v)), 3).map(|v| vshlq_n_u32::<4>(v));
        let or = |a: U8x, b: U8x| [0, 1].map(|i| vorrq_u32(a[i], b[i]));
        (
            or(low(w2, 15), top(w0)),
            or(low(w2.map(|v| vshrq_n_u32::<4>(v)), 15), top(w1)),
        )
    }
}

/// Q6_K's block: `d` and (plain blocks) the 16 scale bytes as four words, per row.
#[derive(Clone, Copy)]
struct Q6KBlock {
    d: F8x,
    words: [U8x; 4],
}

#[target_feature(enable = "neon")]
fn q6_k<const R: usize, const C: usize>(src: &Source, plan: &Plan, out: &mut [f32]) {
    let zero = Q6KBlock {
        d: zero_f(),
        words: [zero_u(); 4],
    };
    drive::<Q6K, R, C, _, _>(
        src,
        plan,
        out,
        zero,
        |r, x| Q6KBlock {
            d: halves::<R>(src, r, x, src.d),
            words: if R == 1 {
                [192, 196, 200, 204].map(|at| words(src, r, x, at))
            } else {
                zero.words
            },
        },
        |blk, r, run, set| {
            let sc = if R == 1 {
                let n = vdupq_n_s32(-8 * (run.s % 4) as i32);
                blk.words[run.s / 4].map(|w| signed8(vshlq_u32(w, n)))
            } else {
                let at = r / R * src.row_step + run.x * src.block_step + set.at;
                let w = vmovl_s8(vreinterpret_s8_u8(load8(&src.data[at..])));
                [vmovl_s16(vget_low_s16(w)), vmovl_high_s16(w)]
            };
            let a = [0, 1].map(|i| vmulq_f32(blk.d[i], vcvtq_f32_s32(sc[i])));
            (a, zero_f())
        },
        |col, r0, x, units| {
            let at =
                |i: usize| Lanes::new(src.window::<R, C>(r0, units, x, col.q[i], col.shift[i]));
            (at(0), at(1))
        },
        |(lo, hi), u, a, _| {
            let (lo, hi) = (low(lo.get::<R, C>(u), 15), low(hi.get::<R, C>(u), 3));
            times(combine(lo, hi, 32), a)
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_conversion_is_the_scalar_one_for_every_half() {
        for h in (0..=u16::MAX).step_by(4) {
            let lanes: [u32; 4] = std::array::from_fn(|i| u32::from(h) + i as u32);
            // SAFETY: Advanced SIMD is part of every aarch64 CPU; `lanes` and `got` are four
            // readable and writable values.
            let got = unsafe {
                let mut got = [0f32; 4];
                vst1q_f32(got.as_mut_ptr(), half4(vld1q_u32(lanes.as_ptr())));
                got
            };
            for (&l, g) in lanes.iter().zip(got) {
                let want = super::super::scalar::half(l as u16);
                assert_eq!(g.to_bits(), want.to_bits(), "{l:#06x}");
            }
        }
    }
}
