//! aarch64 int8 GEMM kernels on the RK3588 tiling (A `[K/16][M][16]`, B `[N/32][K/32][32n][32k]`,
//! C `[N/4][M][4]`).
//!
//! Native A already holds 16 consecutive k of a row, and B 32 consecutive k of a channel, so both
//! kernels read them in place: per (row, channel) pair a vector of 4 int32 partial sums across k,
//! summed with pairwise adds once per output. A register block is 4 rows × 4 channels (16
//! accumulators, 4 A and 4 B registers of 32).
//!
//! Exactness: `sdot` adds four int8 products into an int32 lane, without saturation. Without the
//! dot-product extension each `smull` product (|p| ≤ 2^14) is kept alone in its int16 lane and
//! `sadalp` adds pairs of them into int32; `smlal`, which would add two products in int16, is not
//! used because (-128)·(-128) + (-128)·(-128) = 32768 overflows int16.

use super::Shape;
use std::arch::aarch64::*;
use std::arch::asm;

/// Bytes of one B k-block of one N-tile (32 channels × 32 k).
const B_BLOCK: usize = 32 * 32;
/// Rows per register block.
const ROWS: usize = 4;

pub(super) fn gemm_dot(shape: Shape, a: &[i8], b: &[i8], c: &mut [i32]) {
    // SAFETY: the caller checked that this CPU has the dot-product extension (`Isa::NeonDot`) and
    // that `a`, `b` and `c` fit `shape`.
    unsafe { dot_all(shape, a, b, c) }
}

pub(super) fn gemm_neon(shape: Shape, a: &[i8], b: &[i8], c: &mut [i32]) {
    // SAFETY: Advanced SIMD is part of every aarch64 CPU; the caller checked that `a`, `b` and `c`
    // fit `shape`.
    unsafe { neon_all(shape, a, b, c) }
}

/// One multiply-accumulate step: `acc` += the 16 products of `a` and `b`, spread over its lanes.
trait Step {
    unsafe fn step(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t;
}

struct Sdot;

impl Step for Sdot {
    #[inline]
    #[target_feature(enable = "dotprod")]
    unsafe fn step(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        // SAFETY: register-only instruction; the dot-product extension is enabled for this function.
        asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack),
        );
        acc
    }
}

struct Widening;

impl Step for Widening {
    #[inline(always)]
    unsafe fn step(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
        let hi = vmull_high_s8(a, b);
        vpadalq_s16(vpadalq_s16(acc, lo), hi)
    }
}

#[target_feature(enable = "dotprod")]
unsafe fn dot_all(shape: Shape, a: &[i8], b: &[i8], c: &mut [i32]) {
    all::<Sdot>(shape, a, b, c)
}

unsafe fn neon_all(shape: Shape, a: &[i8], b: &[i8], c: &mut [i32]) {
    all::<Widening>(shape, a, b, c)
}

#[inline(always)]
unsafe fn all<S: Step>(shape: Shape, a: &[i8], b: &[i8], c: &mut [i32]) {
    let Shape { m, kp, np } = shape;
    for quad in 0..np / 4 {
        let n0 = quad * 4;
        let bp = b.as_ptr().add((n0 / 32) * 32 * kp + (n0 % 32) * 32);
        let mut r0 = 0;
        while r0 < m {
            let rows = (m - r0).min(ROWS);
            let ar = a.as_ptr().add(r0 * 16);
            let out = c.as_mut_ptr().add((quad * m + r0) * 4);
            match rows {
                1 => block::<S, 1>(ar, m * 16, bp, kp / 16, out),
                2 => block::<S, 2>(ar, m * 16, bp, kp / 16, out),
                3 => block::<S, 3>(ar, m * 16, bp, kp / 16, out),
                _ => block::<S, ROWS>(ar, m * 16, bp, kp / 16, out),
            }
            r0 += rows;
        }
    }
}

/// `R` rows of A × 4 channels of B over `k16s` chunks of 16 k; stores the `R` × 4 results.
#[inline(always)]
unsafe fn block<S: Step, const R: usize>(
    a: *const i8,
    a_stride: usize,
    bp: *const i8,
    k16s: usize,
    out: *mut i32,
) {
    let mut acc = [[vdupq_n_s32(0); 4]; R];
    for kk in 0..k16s {
        // Channel j's 16 k of chunk kk: k-block kk/2, half kk%2.
        let bk = bp.add((kk / 2) * B_BLOCK + (kk % 2) * 16);
        let bv: [int8x16_t; 4] = [
            vld1q_s8(bk),
            vld1q_s8(bk.add(32)),
            vld1q_s8(bk.add(64)),
            vld1q_s8(bk.add(96)),
        ];
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let av = vld1q_s8(a.add(kk * a_stride + r * 16));
            for j in 0..4 {
                acc_r[j] = S::step(acc_r[j], av, bv[j]);
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        let sum = vpaddq_s32(
            vpaddq_s32(acc_r[0], acc_r[1]),
            vpaddq_s32(acc_r[2], acc_r[3]),
        );
        vst1q_s32(out.add(r * 4), sum);
    }
}
