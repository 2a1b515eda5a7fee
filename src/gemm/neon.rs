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

/// Where a group's B comes from: the packed group (`[K/16][4][16]`), or native B in place.
#[derive(Clone, Copy)]
struct BGroup {
    ptr: *const i8,
    native: bool,
}

/// Packs the operands and runs `group` on every group of [`GROUP`] channels. With a single row
/// block B is read once, so it is read in place; otherwise each group is packed first.
fn packed(
    shape: Shape,
    a: &[i8],
    b: &[i8],
    c: &mut [i32],
    group: impl Fn(Shape, &[i8], BGroup, usize, &mut [i32]),
) {
    let Shape { m, kp, np } = shape;
    A_PANELS.with_borrow_mut(|ap| {
        B_GROUP.with_borrow_mut(|bg| {
            let ap = aligned(ap, m * kp);
            let bg = aligned(bg, kp * GROUP);
            a_panels(m, kp, a, ROWS, 16, ap, |x| x);
            for n0 in (0..np).step_by(GROUP) {
                let source = if m <= ROWS {
                    let at = (n0 / 32) * 32 * kp + (n0 % 32) * 32;
                    BGroup {
                        ptr: b[at..].as_ptr(),
                        native: true,
                    }
                } else {
                    b_group(kp, b, n0, GROUP, 16, bg, |x| x);
                    BGroup {
                        ptr: bg.as_ptr(),
                        native: false,
                    }
                };
                group(shape, ap, source, n0, c);
            }
        })
    });
}

pub(super) fn gemm_dot(shape: Shape, a: &[i8], b: &[i8], c: &mut [i32]) {
    packed(shape, a, b, c, |shape, ap, bg, n0, c| {
        // SAFETY: the caller checked that this CPU has the dot-product extension
        // (`Isa::NeonDot`) and that `b` and `c` fit `shape`; `ap` and `bg` were set up for it.
        unsafe { dot_group(shape, ap, bg, n0, c) }
    });
}

pub(super) fn gemm_neon(shape: Shape, a: &[i8], b: &[i8], c: &mut [i32]) {
    packed(shape, a, b, c, |shape, ap, bg, n0, c| {
        // SAFETY: Advanced SIMD is part of every aarch64 CPU; the caller checked that `b` and
        // `c` fit `shape`; `ap` and `bg` were set up for it.
        unsafe { neon_group(shape, ap, bg, n0, c) }
    });
}

/// One multiply-accumulate step: `acc` += the 16 products of `a` and `b`, spread over its lanes.
trait Step {
    /// # Safety
    /// The CPU has the step's instructions: the dot-product extension for [`Sdot`] (Advanced
    /// SIMD, which [`Widening`] uses, is part of every aarch64 CPU).
    unsafe fn step(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t;
}

struct Sdot;

impl Step for Sdot {
    #[inline]
    #[target_feature(enable = "dotprod")]
    unsafe fn step(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        // SAFETY: register-only instruction; the dot-product extension is enabled for this
        // function.
        unsafe {
            asm!(
                "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
                acc = inout(vreg) acc,
                a = in(vreg) a,
                b = in(vreg) b,
                options(pure, nomem, nostack),
            );
        }
        acc
    }
}

struct Widening;

impl Step for Widening {
    #[inline(always)]
    unsafe fn step(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        // SAFETY: Advanced SIMD register operations, part of every aarch64 CPU.
        unsafe {
            let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
            let hi = vmull_high_s8(a, b);
            vpadalq_s16(vpadalq_s16(acc, lo), hi)
        }
    }
}

/// [`group`] with `sdot`.
///
/// # Safety
/// The CPU has the dot-product extension; the operands are as [`group`] requires, `bg.ptr` its
/// `bp`, native B when `bg.native`.
#[target_feature(enable = "dotprod")]
unsafe fn dot_group(shape: Shape, ap: &[i8], bg: BGroup, n0: usize, c: &mut [i32]) {
    // SAFETY: this function's feature is `Sdot`'s; the operands are the caller's promise.
    unsafe {
        match bg.native {
            true => group::<Sdot, true>(shape, ap, bg.ptr, n0, c),
            false => group::<Sdot, false>(shape, ap, bg.ptr, n0, c),
        }
    }
}

/// [`group`] with the widening multiplies of Advanced SIMD.
///
/// # Safety
/// The operands are as [`group`] requires, `bg.ptr` its `bp`, native B when `bg.native`.
unsafe fn neon_group(shape: Shape, ap: &[i8], bg: BGroup, n0: usize, c: &mut [i32]) {
    // SAFETY: `Widening` needs Advanced SIMD alone; the operands are the caller's promise.
    unsafe {
        match bg.native {
            true => group::<Widening, true>(shape, ap, bg.ptr, n0, c),
            false => group::<Widening, false>(shape, ap, bg.ptr, n0, c),
        }
    }
}

/// Channels `n0..n0+4` of C from the A panels and B at `bp`: native B when `NATIVE`, else the
/// packed group.
///
/// # Safety
/// The CPU has `S`'s instructions ([`Step::step`]). `ap` holds the A panels of `m` rows
/// (`m·kp` bytes) and `c` native C of `m` rows for channels `n0..n0 + 4` at least. `bp` points
/// to the group's `kp / 32` k-blocks: 1 KiB apart in native B (`NATIVE`; 4 channels × 32 bytes
/// read from each), else `kp / 16` packed chunks of 4 × 16 bytes back to back.
#[inline(always)]
unsafe fn group<S: Step, const NATIVE: bool>(
    shape: Shape,
    ap: &[i8],
    bp: *const i8,
    n0: usize,
    c: &mut [i32],
) {
    let Shape { m, kp, .. } = shape;
    let mut r0 = 0;
    while r0 < m {
        let rows = (m - r0).min(ROWS);
        // SAFETY: `S`'s instructions and `bp` are the caller's promise; the panel of rows
        // `r0..r0 + rows` is `rows·kp` bytes from `r0·kp` of `ap`, and rows `r0..r0 + rows` of
        // channels `n0..n0 + 4` are `4·rows` values of `c` from `(n0/4·m + r0)·4`.
        unsafe {
            let panel = ap.as_ptr().add(r0 * kp);
            let out = c.as_mut_ptr().add((n0 / 4 * m + r0) * 4);
            match rows {
                1 => block::<S, NATIVE, 1>(panel, bp, kp / 16, out),
                2 => block::<S, NATIVE, 2>(panel, bp, kp / 16, out),
                3 => block::<S, NATIVE, 3>(panel, bp, kp / 16, out),
                _ => block::<S, NATIVE, ROWS>(panel, bp, kp / 16, out),
            }
        }
        r0 += rows;
    }
}

/// `R` rows of A (a panel) × 4 channels of B (see [`group`]) over `k16s` chunks of 16 k; stores
/// the `R` × 4 results.
///
/// # Safety
/// The CPU has `S`'s instructions ([`Step::step`]). `panel` points to `k16s·R·16` readable
/// bytes, `out` to `4·R` writable values, and `bp` to the group's B as [`group`] describes it,
/// `k16s` chunks of 16 k.
#[inline(always)]
unsafe fn block<S: Step, const NATIVE: bool, const R: usize>(
    panel: *const i8,
    bp: *const i8,
    k16s: usize,
    out: *mut i32,
) {
    // SAFETY: Advanced SIMD is part of every aarch64 CPU.
    let mut acc = [[unsafe { vdupq_n_s32(0) }; GROUP]; R];
    for kk in 0..k16s {
        // Chunk kk of channel j: native B keeps 32 k per channel in 1 KiB k-blocks.
        // SAFETY: chunk `kk < k16s`: k-block `kk / 2`, half `kk % 2`, or packed chunk `kk`.
        let (bk, channel_stride) = unsafe {
            if NATIVE {
                (bp.add((kk / 2) * 32 * 32 + (kk % 2) * 16), 32)
            } else {
                (bp.add(kk * GROUP * 16), 16)
            }
        };
        // SAFETY: channel `j < 4`'s 16 bytes of the chunk.
        let bv: [int8x16_t; GROUP] =
            std::array::from_fn(|j| unsafe { vld1q_s8(bk.add(j * channel_stride)) });
        for (r, acc_r) in acc.iter_mut().enumerate() {
            // SAFETY: row `r < R`'s 16 bytes of chunk `kk` of the panel.
            let av = unsafe { vld1q_s8(panel.add((kk * R + r) * 16)) };
            for j in 0..GROUP {
                // SAFETY: `S`'s instructions (the caller's promise).
                acc_r[j] = unsafe { S::step(acc_r[j], av, bv[j]) };
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        // SAFETY: Advanced SIMD; row `r < R`'s 4 values of `out`.
        unsafe {
            let sum = vpaddq_s32(
                vpaddq_s32(acc_r[0], acc_r[1]),
                vpaddq_s32(acc_r[2], acc_r[3]),
            );
            vst1q_s32(out.add(r * 4), sum);
        }
    }
}
