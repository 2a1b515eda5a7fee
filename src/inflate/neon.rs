//! aarch64 Advanced SIMD kernels (every aarch64 CPU has them; the dot-product extension is not
//! needed here). They reproduce [`super::scalar`] bit for bit: the same binary32 products in
//! the same order (no fused multiply-add), `fcvtns` rounding to nearest-even, saturating
//! narrows where the scalar code saturates, and `sqrdmulh`, which on these operands is exactly
//! `(x·m + 2¹⁴) >> 15`.

use super::params::{scaled_codes, TileParams};
use super::scalar::{q4_k_pair_source, q6_k_half_source};
use super::tile::{for_each_group, for_each_run, Tile};
use super::{ScanTile, TileKernel};
use crate::isa::Isa;
use crate::quant::GgmlType;
use std::arch::aarch64::*;

/// The kernel for `ty` on `isa`, if `isa` is an aarch64 path.
pub(super) fn tile_kernel(isa: Isa, ty: GgmlType) -> Option<TileKernel> {
    if !matches!(isa, Isa::Neon | Isa::NeonDot) {
        return None;
    }
    // SAFETY (each closure): Advanced SIMD is part of every aarch64 CPU (and of the target's
    // baseline); the `#[target_feature]` only lets the kernels use the intrinsics safely.
    Some(match ty {
        GgmlType::Q4_0 => |r, p, t, n| unsafe { q4_0(r, p, t, n) },
        GgmlType::Q4_1 => |r, p, t, n| unsafe { q4_1(r, p, t, n) },
        GgmlType::Q5_0 => |r, p, t, n| unsafe { q5_0(r, p, t, n) },
        GgmlType::Q8_0 => |r, p, t, n| unsafe { q8_0(r, p, t, n) },
        GgmlType::Q4_K => |r, p, t, n| unsafe { q4_k(r, p, t, n) },
        GgmlType::Q6_K => |r, p, t, n| unsafe { q6_k(r, p, t, n) },
        GgmlType::F32 | GgmlType::F16 => return None,
    })
}

/// The row scan compiled for the path (Advanced SIMD is the target's baseline, so the shared
/// scan needs no build of its own).
pub(super) fn scan_tile(_isa: Isa) -> Option<ScanTile> {
    None
}

/// Binary32 codes `base..base+16`.
fn codes(base: i32) -> [f32; 16] {
    std::array::from_fn(|i| (base + i as i32) as f32)
}

#[inline(always)]
fn load16(src: &[u8]) -> uint8x16_t {
    let src: &[u8; 16] = src[..16].try_into().expect("16 bytes");
    // SAFETY: `src` is 16 readable bytes; NEON loads need no alignment.
    unsafe { vld1q_u8(src.as_ptr()) }
}

#[inline(always)]
fn store16(dst: &mut [i8], v: int8x16_t) {
    let dst: &mut [i8; 16] = (&mut dst[..16]).try_into().expect("16 bytes");
    // SAFETY: `dst` is 16 writable bytes; NEON stores need no alignment.
    unsafe { vst1q_s8(dst.as_mut_ptr(), v) }
}

/// `lut[q] = sat8(rne(fl(fl(c·f) + g)))` for the 16 codes `c`.
#[inline]
#[target_feature(enable = "neon")]
fn table16(c: &[f32; 16], f: f32, g: f32) -> int8x16_t {
    let (vf, vg) = (vdupq_n_f32(f), vdupq_n_f32(g));
    let step = |i: usize| {
        let c: &[f32; 4] = c[i..i + 4].try_into().expect("4 codes");
        // SAFETY: `c` is 4 readable f32.
        let ci = unsafe { vld1q_f32(c.as_ptr()) };
        vqmovn_s32(vcvtnq_s32_f32(vaddq_f32(vmulq_f32(ci, vf), vg)))
    };
    let lo = vcombine_s16(step(0), step(4));
    let hi = vcombine_s16(step(8), step(12));
    vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi))
}

/// `lut[q] = sat8((c[q]·m + 2¹⁴) >> 15)` for 16 scaled codes: the Q4_0/Q5_0 tables.
#[inline]
#[target_feature(enable = "neon")]
fn rescale_table(c: &[i16; 16], m: i16) -> int8x16_t {
    // SAFETY: `c` is 16 readable i16 (two 8-lane loads).
    let (c0, c1) = unsafe { (vld1q_s16(c.as_ptr()), vld1q_s16(c[8..].as_ptr())) };
    let m = vdupq_n_s16(m);
    vcombine_s8(
        vqmovn_s16(vqrdmulhq_s16(c0, m)),
        vqmovn_s16(vqrdmulhq_s16(c1, m)),
    )
}

/// 16 quant bytes through a table, low nibbles first.
#[inline]
#[target_feature(enable = "neon")]
fn nibbles(qs: &[u8], lut: int8x16_t, out: &mut [i8; 32]) {
    let q = load16(qs);
    store16(&mut out[..16], vqtbl1q_s8(lut, vandq_u8(q, vdupq_n_u8(15))));
    store16(&mut out[16..], vqtbl1q_s8(lut, vshrq_n_u8(q, 4)));
}

#[target_feature(enable = "neon")]
fn q4_0(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let c: [i16; 16] = scaled_codes(GgmlType::Q4_0);
    for_each_run(rows, &params.m, tile, runs, |row, &m, r, out| {
        nibbles(&row[r * 18 + 2..], rescale_table(&c, m), out);
    });
}

#[target_feature(enable = "neon")]
fn q4_1(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let c = codes(0);
    for_each_run(rows, &params.fg, tile, runs, |row, &[f, g], r, out| {
        nibbles(&row[r * 20 + 4..], table16(&c, f, g), out);
    });
}

#[target_feature(enable = "neon")]
fn q5_0(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let c: [i16; 32] = scaled_codes(GgmlType::Q5_0);
    let (c_lo, c_hi) = c.split_at(16);
    let (c_lo, c_hi): (&[i16; 16], &[i16; 16]) =
        (c_lo.try_into().expect("16"), c_hi.try_into().expect("16"));
    let bit_masks: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    // SAFETY: `bit_masks` is 16 readable bytes.
    let bits = unsafe { vld1q_u8(bit_masks.as_ptr()) };
    for_each_run(rows, &params.m, tile, runs, |row, &m, r, out| {
        let blk = &row[r * 22..r * 22 + 22];
        let t = int8x16x2_t(rescale_table(c_lo, m), rescale_table(c_hi, m));
        let qh = u32::from_le_bytes(blk[2..6].try_into().expect("4 bytes"));
        let q = load16(&blk[6..]);
        // Output byte i takes bit i of qh: bytes 0..16 from qh's bytes 0, 1; 16..32 from 2, 3.
        let fifth = |half_bits: u16, nibbles: uint8x16_t| {
            let spread = vcombine_u8(
                vdup_n_u8(half_bits as u8),
                vdup_n_u8((half_bits >> 8) as u8),
            );
            let set = vandq_u8(vtstq_u8(spread, bits), vdupq_n_u8(16));
            vqtbl2q_s8(t, vorrq_u8(nibbles, set))
        };
        store16(
            &mut out[..16],
            fifth(qh as u16, vandq_u8(q, vdupq_n_u8(15))),
        );
        store16(&mut out[16..], fifth((qh >> 16) as u16, vshrq_n_u8(q, 4)));
    });
}

/// `sat8((x·m + 2¹⁴) >> 15)` of 16 signed bytes, each times 4 first when `TIMES4`.
#[inline]
#[target_feature(enable = "neon")]
fn rescale16<const TIMES4: bool>(x: int8x16_t, m: i16) -> int8x16_t {
    let (mut x0, mut x1) = (vmovl_s8(vget_low_s8(x)), vmovl_high_s8(x));
    if TIMES4 {
        (x0, x1) = (vshlq_n_s16(x0, 2), vshlq_n_s16(x1, 2));
    }
    let m = vdupq_n_s16(m);
    vcombine_s8(
        vqmovn_s16(vqrdmulhq_s16(x0, m)),
        vqmovn_s16(vqrdmulhq_s16(x1, m)),
    )
}

#[target_feature(enable = "neon")]
fn q8_0(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    for_each_run(rows, &params.m, tile, runs, |row, &m, r, out| {
        let blk = &row[r * 34..r * 34 + 34];
        for h in 0..2 {
            let q = vreinterpretq_s8_u8(load16(&blk[2 + 16 * h..]));
            store16(&mut out[16 * h..], rescale16::<false>(q, m));
        }
    });
}

#[target_feature(enable = "neon")]
fn q4_k(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let c = codes(0);
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
                    vqtbl1q_s8(lo, vandq_u8(q, vdupq_n_u8(15))),
                );
                store16(&mut odd[16 * h..], vqtbl1q_s8(hi, vshrq_n_u8(q, 4)));
            }
        },
    );
}

#[target_feature(enable = "neon")]
fn q6_k(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let m = params.m.as_chunks::<2>().0;
    for_each_group::<4, 1, _>(rows, m, tile, runs, |r, [row], m, out| {
        let (ql, qh) = q6_k_half_source(r);
        let (m, out) = (m.map(|[m]| m), out.map(|[o]| o));
        let (low, two) = (vdupq_n_u8(15), vdupq_n_u8(3));
        for h in 0..2 {
            let ql0 = load16(&row[ql + 16 * h..]);
            let ql1 = load16(&row[ql + 32 + 16 * h..]);
            let qh = load16(&row[qh + 16 * h..]);
            let high2 = |shift: uint8x16_t| vshlq_n_u8(vandq_u8(shift, two), 4);
            let codes = [
                vorrq_u8(vandq_u8(ql0, low), high2(qh)),
                vorrq_u8(vandq_u8(ql1, low), high2(vshrq_n_u8(qh, 2))),
                vorrq_u8(vshrq_n_u8(ql0, 4), high2(vshrq_n_u8(qh, 4))),
                vorrq_u8(vshrq_n_u8(ql1, 4), high2(vshrq_n_u8(qh, 6))),
            ];
            for (t, code) in codes.into_iter().enumerate() {
                let x = vsubq_s8(vreinterpretq_s8_u8(code), vdupq_n_s8(32));
                store16(&mut out[t][16 * h..], rescale16::<true>(x, m[t][h]));
            }
        }
    });
}
