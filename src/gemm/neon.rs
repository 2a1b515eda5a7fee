//! aarch64 int8 GEMM kernels on the RK3588 tiling (A `[K/16][M][16]`, B `[N/32][K/32][32n][32k]`,
//! C `[N/4][M][4]`).
//!
//! Both kernels keep per (row, channel) pair a vector of 4 int32 partial sums across k (B stores
//! every channel's k contiguously), summed with pairwise adds once per output. A register block is
//! 4 rows × 4 channels (16 accumulators, 4 A and 4 B registers of 32), over A panels and a packed
//! B group ([`super::pack`]) so the streams fill the cache evenly.
//!
//! Exactness: `sdot` adds four int8 products into an int32 lane, without saturation. Without the
//! dot-product extension each `smull` product (|p| ≤ 2^14) is kept alone in its int16 lane and
//! `sadalp` adds pairs of them into int32; `smlal`, which would add two products in int16, is not
//! used because (-128)·(-128) + (-128)·(-128) = 32768 overflows int16.

use super::pack::{a_panels, aligned, b_group};
use super::Shape;
use std::arch::aarch64::*;
use std::arch::asm;
use std::cell::RefCell;

/// Rows per register block.
const ROWS: usize = 4;
/// Channels per register block and packed B group.
const GROUP: usize = 4;

thread_local! {
    /// Per-thread scratch for repacked operands, kept between calls to avoid allocations per GEMM.
    static A_PANELS: RefCell<Vec<i8>> = const { RefCell::new(Vec::new()) };
    static B_GROUP: RefCell<Vec<i8>> = const { RefCell::new(Vec::new()) };
}

/// Packs the operands and runs `group` on every group of [`GROUP`] channels.
fn packed(
    shape: Shape,
    a: &[i8],
    b: &[i8],
    c: &mut [i32],
    group: impl Fn(Shape, &[i8], &[i8], usize, &mut [i32]),
) {
    let Shape { m, kp, np } = shape;
    A_PANELS.with_borrow_mut(|ap| {
        B_GROUP.with_borrow_mut(|bg| {
            let ap = aligned(ap, m * kp);
            let bg = aligned(bg, kp * GROUP);
            a_panels(m, kp, a, ROWS, 16, ap, |x| x);
            for n0 in (0..np).step_by(GROUP) {
                b_group(kp, b, n0, GROUP, 16, bg, |x| x);
                group(shape, ap, bg, n0, c);
            }
        })
    });
}

pub(super) fn gemm_dot(shape: Shape, a: &[i8], b: &[i8], c: &mut [i32]) {
    packed(shape, a, b, c, |shape, ap, bg, n0, c| {
        // SAFETY: the caller checked that this CPU has the dot-product extension
        // (`Isa::NeonDot`) and that `c` fits `shape`; `ap` and `bg` were packed for it.
        unsafe { dot_group(shape, ap, bg, n0, c) }
    });
}

pub(super) fn gemm_neon(shape: Shape, a: &[i8], b: &[i8], c: &mut [i32]) {
    packed(shape, a, b, c, |shape, ap, bg, n0, c| {
        // SAFETY: Advanced SIMD is part of every aarch64 CPU; the caller checked that `c` fits
        // `shape`; `ap` and `bg` were packed for it.
        unsafe { neon_group(shape, ap, bg, n0, c) }
    });
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
unsafe fn dot_group(shape: Shape, ap: &[i8], bg: &[i8], n0: usize, c: &mut [i32]) {
    group::<Sdot>(shape, ap, bg, n0, c)
}

unsafe fn neon_group(shape: Shape, ap: &[i8], bg: &[i8], n0: usize, c: &mut [i32]) {
    group::<Widening>(shape, ap, bg, n0, c)
}

/// Channels `n0..n0+4` of C from the A panels and the packed B group.
#[inline(always)]
unsafe fn group<S: Step>(shape: Shape, ap: &[i8], bg: &[i8], n0: usize, c: &mut [i32]) {
    let Shape { m, kp, .. } = shape;
    let mut r0 = 0;
    while r0 < m {
        let rows = (m - r0).min(ROWS);
        let panel = ap.as_ptr().add(r0 * kp);
        let out = c.as_mut_ptr().add((n0 / 4 * m + r0) * 4);
        match rows {
            1 => block::<S, 1>(panel, bg.as_ptr(), kp / 16, out),
            2 => block::<S, 2>(panel, bg.as_ptr(), kp / 16, out),
            3 => block::<S, 3>(panel, bg.as_ptr(), kp / 16, out),
            _ => block::<S, ROWS>(panel, bg.as_ptr(), kp / 16, out),
        }
        r0 += rows;
    }
}

/// `R` rows of A (a panel) × 4 channels of the packed B group over `k16s` chunks of 16 k; stores
/// the `R` × 4 results.
#[inline(always)]
unsafe fn block<S: Step, const R: usize>(
    panel: *const i8,
    bg: *const i8,
    k16s: usize,
    out: *mut i32,
) {
    let mut acc = [[vdupq_n_s32(0); GROUP]; R];
    for kk in 0..k16s {
        let bk = bg.add(kk * GROUP * 16);
        let bv: [int8x16_t; GROUP] = [
            vld1q_s8(bk),
            vld1q_s8(bk.add(16)),
            vld1q_s8(bk.add(32)),
            vld1q_s8(bk.add(48)),
        ];
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let av = vld1q_s8(panel.add((kk * R + r) * 16));
            for j in 0..GROUP {
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
