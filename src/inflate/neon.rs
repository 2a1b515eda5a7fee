//! aarch64 Advanced SIMD kernels (every aarch64 CPU has them; the dot-product extension is not
//! needed here). They reproduce [`super::scalar`] bit for bit: the same binary32 products in
//! the same order (no fused multiply-add), `fcvtns` rounding to nearest-even, saturating
//! narrows where the scalar code saturates, and `sqrdmulh`, which on these operands is exactly
//! `(x·m + 2¹⁴) >> 15`.
//!
//! Shaped for the Cortex-A76 (two 128-bit pipes): each row's blocks of a group of runs arrive as
//! one fixed-size array (no per-load bounds checks), a run's 16 quant bytes are one `ld1`, its
//! weights come from `tbl` on 16-byte tables, and the rescale types widen with one
//! `sshll`/`sxtl` per half. The row scan is the portable one (`super::scalar`'s), which the
//! compiler vectorizes with Advanced SIMD, but for the steps it leaves scalar (`scan.rs`).

use super::codebook::{groups, table_codes, Codebook};
use super::params::{fixed_codes, fixed_scales, scaled_codes, TileParams};
use super::tile::{for_each_block, for_each_block_group, RowMajor, Tile};
use super::{TileKernel, RUN};
use crate::isa::Isa;
use crate::quant::grids::IQ3S_GRID;
use crate::quant::GgmlType;
use std::arch::aarch64::*;

mod scan;

pub(super) use scan::scan_tile;

/// The kernel for `ty` on `isa`, if `isa` is an aarch64 path.
pub(super) fn tile_kernel(isa: Isa, ty: GgmlType) -> Option<TileKernel> {
    if !matches!(isa, Isa::Neon | Isa::NeonDot) {
        return None;
    }
    /// Calls a `#[target_feature]` kernel from the safe function pointer handed out.
    macro_rules! neon {
        ($kernel:ident) => {
            |r, p, t, n| {
                // SAFETY: Advanced SIMD is part of every aarch64 CPU (and of the target's
                // baseline); the `#[target_feature]` only lets the kernel use the intrinsics.
                unsafe { $kernel(r, p, t, n) }
            }
        };
    }
    Some(match ty {
        GgmlType::Q4_0 => neon!(q4_0),
        GgmlType::Q4_1 => neon!(q4_1),
        GgmlType::Q5_0 => neon!(q5_0),
        GgmlType::Q8_0 => neon!(q8_0),
        GgmlType::Q4_K => neon!(q4_k),
        GgmlType::Q6_K => neon!(q6_k),
        GgmlType::Q5_1 => neon!(q5_1),
        GgmlType::Q5_K => neon!(q5_k),
        GgmlType::Q2_K => neon!(q2_k),
        GgmlType::Q3_K => neon!(q3_k),
        GgmlType::IQ4_NL => neon!(iq4_nl),
        GgmlType::IQ2_XXS => neon!(iq2_xxs),
        GgmlType::IQ2_XS => neon!(iq2_xs),
        GgmlType::IQ2_S => neon!(iq2_s),
        GgmlType::IQ3_XXS => neon!(iq3_xxs),
        GgmlType::IQ3_S => neon!(iq3_s),
        GgmlType::IQ1_S => neon!(iq1_s),
        GgmlType::IQ1_M => neon!(iq1_m),
        GgmlType::IQ4_XS => neon!(iq4_xs),
        GgmlType::MXFP4 => neon!(mxfp4),
        _ => return None,
    })
}

/// The 16 bytes at the start of `src`.
#[inline(always)]
fn load16(src: &[u8]) -> uint8x16_t {
    let src: &[u8; 16] = src[..16].try_into().expect("16 bytes");
    // SAFETY: `src` is 16 readable bytes; NEON loads need no alignment.
    unsafe { vld1q_u8(src.as_ptr()) }
}

/// One run: two 16-byte halves, one `st1` of a register pair.
#[inline(always)]
fn store_run(out: &mut [i8; RUN], lo: int8x16_t, hi: int8x16_t) {
    // SAFETY: `out` is 32 writable bytes; NEON stores need no alignment.
    unsafe { vst1q_s8_x2(out.as_mut_ptr(), int8x16x2_t(lo, hi)) }
}

/// The codes `step·q` of a table of `N` entries (`table_entry`: 16 or 32), eight per register
/// (`R = N/8`).
#[inline]
#[target_feature(enable = "neon")]
fn code_registers<const N: usize, const R: usize>() -> [int16x8_t; R] {
    let c: [i16; N] = fixed_codes();
    // SAFETY: `c` is `8·R` readable i16.
    std::array::from_fn(|i| unsafe { vld1q_s16(c[8 * i..].as_ptr()) })
}

/// `table_fixed::<N>(fg)`'s `F` and `G`, each in every 16-bit lane of a register.
#[inline]
#[target_feature(enable = "neon")]
fn fixed_params<const N: usize>(fg: [f32; 2]) -> (int16x8_t, int16x8_t) {
    let scale = fixed_scales(N);
    // SAFETY: `fg` and `scale` are two readable f32 each.
    let scaled = unsafe { vmul_f32(vld1_f32(fg.as_ptr()), vld1_f32(scale.as_ptr())) };
    // [F, G, F, G]: rounded to nearest-even and saturated to 16 bits.
    let fixed = vcvtn_s32_f32(scaled);
    let fixed = vqmovn_s32(vcombine_s32(fixed, fixed));
    (vdupq_lane_s16::<0>(fixed), vdupq_lane_s16::<1>(fixed))
}

/// Entries `8i..8i + 8` of a table from [`fixed_params`] (`c`: [`code_registers`]), `table_entry`
/// of each: `sqrdmulh`, a saturating add and a rounding narrowing shift.
#[inline]
#[target_feature(enable = "neon")]
fn fixed_entries(c: int16x8_t, f: int16x8_t, g: int16x8_t) -> int8x8_t {
    vqrshrn_n_s16::<6>(vqaddq_s16(vqrdmulhq_s16(c, f), g))
}

/// The 16-entry table of a Q4_1 or Q4_K run, `table_entry` of `table_fixed(fg)`.
#[inline]
#[target_feature(enable = "neon")]
fn table16(c: &[int16x8_t; 2], fg: [f32; 2]) -> int8x16_t {
    let (f, g) = fixed_params::<16>(fg);
    vcombine_s8(fixed_entries(c[0], f, g), fixed_entries(c[1], f, g))
}

/// `lut[q] = sat8((c[q]·m + 2¹⁴) >> 15)` for 16 scaled codes (`c0`: codes 0..8, `c1`: 8..16):
/// the Q4_0/Q5_0 tables.
#[inline]
#[target_feature(enable = "neon")]
fn rescale_table(c0: int16x8_t, c1: int16x8_t, m: i16) -> int8x16_t {
    let m = vdupq_n_s16(m);
    vqmovn_high_s16(vqmovn_s16(vqrdmulhq_s16(c0, m)), vqrdmulhq_s16(c1, m))
}

/// `c` as two registers.
#[inline]
#[target_feature(enable = "neon")]
fn code_halves(c: &[i16; 16]) -> (int16x8_t, int16x8_t) {
    // SAFETY: `c` is 16 readable i16.
    unsafe { (vld1q_s16(c.as_ptr()), vld1q_s16(c[8..].as_ptr())) }
}

/// 16 quant bytes through a table, low nibbles first.
#[inline]
#[target_feature(enable = "neon")]
fn nibbles(q: uint8x16_t, lut: int8x16_t, out: &mut [i8; RUN]) {
    let lo = vqtbl1q_s8(lut, vandq_u8(q, vdupq_n_u8(15)));
    store_run(out, lo, vqtbl1q_s8(lut, vshrq_n_u8(q, 4)));
}

/// The nibble-table types of one block per run (Q4_0, IQ4_NL, MXFP4): `BB`-byte blocks, the
/// 16 quant bytes at `QS`, weight `i` the low (`i < 16`) or high nibble of byte `i % 16`
/// through the run's table `sat8((c[q]·m + 2¹⁴) >> 15)` of the scaled codes `c`.
#[inline]
#[target_feature(enable = "neon")]
fn nibble_rescale<const BB: usize, const GB: usize, const QS: usize>(
    rows: &[&[u8]],
    params: &TileParams,
    tile: &mut Tile,
    runs: usize,
    c: &[i16; 16],
) {
    let (c0, c1) = code_halves(c);
    for_each_block::<1, BB, GB, _>(rows, params.m(), tile, runs, |[blk], [m], [out]| {
        nibbles(load16(&blk[QS..]), rescale_table(c0, c1, m), out);
    });
}

#[target_feature(enable = "neon")]
fn q4_0(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let c = scaled_codes(GgmlType::Q4_0);
    nibble_rescale::<18, 72, 2>(rows, params, tile, runs, &c);
}

#[target_feature(enable = "neon")]
fn iq4_nl(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let c = scaled_codes(GgmlType::IQ4_NL);
    nibble_rescale::<18, 72, 2>(rows, params, tile, runs, &c);
}

#[target_feature(enable = "neon")]
fn mxfp4(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let c = scaled_codes(GgmlType::MXFP4);
    nibble_rescale::<17, 68, 1>(rows, params, tile, runs, &c);
}

/// IQ4_XS: a super-block is 8 runs, run `g`'s quant bytes at `8 + 16·g`, as Q4_0's.
#[target_feature(enable = "neon")]
fn iq4_xs(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let (c0, c1) = code_halves(&scaled_codes(GgmlType::IQ4_XS));
    for_each_block_group::<8, 1, 136, _>(rows, params.m(), tile, 0..runs, |_, [blk], [m], out| {
        for (g, [out]) in out.into_iter().enumerate() {
            nibbles(load16(&blk[8 + 16 * g..]), rescale_table(c0, c1, m[g]), out);
        }
    });
}

#[target_feature(enable = "neon")]
fn q4_1(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let c = code_registers::<16, 2>();
    for_each_block::<1, 20, 80, _>(rows, params.fg(), tile, runs, |[blk], [fg], [out]| {
        nibbles(load16(&blk[4..]), table16(&c, fg), out);
    });
}

#[target_feature(enable = "neon")]
fn q5_0(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let c: [i16; 32] = scaled_codes(GgmlType::Q5_0);
    let (c_lo, c_hi) = c.split_at(16);
    let (lo0, lo1) = code_halves(c_lo.try_into().expect("16"));
    let (hi0, hi1) = code_halves(c_hi.try_into().expect("16"));
    let bit_masks: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    // Output byte i of the run's first 16 takes qh byte i / 8, of its second 16 byte 2 + i / 8.
    let spread: [[u8; 16]; 2] =
        std::array::from_fn(|h| std::array::from_fn(|i| (2 * h + i / 8) as u8));
    // SAFETY: `bit_masks` and `spread` are 16 readable bytes each.
    let (bits, spread) = unsafe {
        (
            vld1q_u8(bit_masks.as_ptr()),
            [vld1q_u8(spread[0].as_ptr()), vld1q_u8(spread[1].as_ptr())],
        )
    };
    let (low, sixteen) = (vdupq_n_u8(15), vdupq_n_u8(16));
    for_each_block::<1, 22, 88, _>(rows, params.m(), tile, runs, |[blk], [m], [out]| {
        let t = int8x16x2_t(rescale_table(lo0, lo1, m), rescale_table(hi0, hi1, m));
        let qh = vreinterpretq_u8_u32(vdupq_n_u32(u32::from_le_bytes([
            blk[2], blk[3], blk[4], blk[5],
        ])));
        let q = load16(&blk[6..]);
        // The fifth bit of each code: bit i of qh, as 16.
        let fifth = |h: usize, nibbles: uint8x16_t| {
            let set = vandq_u8(vtstq_u8(vqtbl1q_u8(qh, spread[h]), bits), sixteen);
            vqtbl2q_s8(t, vorrq_u8(nibbles, set))
        };
        store_run(out, fifth(0, vandq_u8(q, low)), fifth(1, vshrq_n_u8(q, 4)));
    });
}

/// `sat8((x·m + 2¹⁴) >> 15)` of 16 signed bytes, each times `2^SHIFT` first (`sshll`).
#[inline]
#[target_feature(enable = "neon")]
fn rescale16<const SHIFT: i32>(x: int8x16_t, m: i16) -> int8x16_t {
    let (x0, x1) = (
        vshll_n_s8::<SHIFT>(vget_low_s8(x)),
        vshll_high_n_s8::<SHIFT>(x),
    );
    let m = vdupq_n_s16(m);
    vqmovn_high_s16(vqmovn_s16(vqrdmulhq_s16(x0, m)), vqrdmulhq_s16(x1, m))
}

#[target_feature(enable = "neon")]
fn q8_0(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    for_each_block::<1, 34, 136, _>(rows, params.m(), tile, runs, |[blk], [m], [out]| {
        let (q0, q1) = (load16(&blk[2..]), load16(&blk[18..]));
        let y0 = rescale16::<0>(vreinterpretq_s8_u8(q0), m);
        store_run(out, y0, rescale16::<0>(vreinterpretq_s8_u8(q1), m));
    });
}

#[target_feature(enable = "neon")]
fn q4_k(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let c = code_registers::<16, 2>();
    // Runs 2p, 2p + 1 of a super-block: the low and high nibbles of its quant bytes 32p..32p+32.
    let pair = |blk: &[u8; 144],
                p: usize,
                fg: [[f32; 2]; 2],
                even: &mut [i8; RUN],
                odd: &mut [i8; RUN]| {
        let (lo, hi) = (table16(&c, fg[0]), table16(&c, fg[1]));
        let (q0, q1) = (load16(&blk[16 + 32 * p..]), load16(&blk[32 + 32 * p..]));
        let low = vdupq_n_u8(15);
        store_run(
            even,
            vqtbl1q_s8(lo, vandq_u8(q0, low)),
            vqtbl1q_s8(lo, vandq_u8(q1, low)),
        );
        store_run(
            odd,
            vqtbl1q_s8(hi, vshrq_n_u8(q0, 4)),
            vqtbl1q_s8(hi, vshrq_n_u8(q1, 4)),
        );
    };
    for_each_block_group::<8, 1, 144, _>(rows, params.fg(), tile, 0..runs, |_, [blk], [p], out| {
        let [[e0], [o0], [e1], [o1], [e2], [o2], [e3], [o3]] = out;
        pair(blk, 0, [p[0], p[1]], e0, o0);
        pair(blk, 1, [p[2], p[3]], e1, o1);
        pair(blk, 2, [p[4], p[5]], e2, o2);
        pair(blk, 3, [p[6], p[7]], e3, o3);
    });
}

#[target_feature(enable = "neon")]
fn q6_k(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let (low, two, bias) = (vdupq_n_u8(15), vdupq_n_u8(3), vdupq_n_s8(32));
    // 4·(q - 32) with the multiplier of each 16-weight half.
    let put = |out: &mut [i8; RUN], c0: uint8x16_t, c1: uint8x16_t, m: [i16; 2]| {
        let x = |c| vsubq_s8(vreinterpretq_s8_u8(c), bias);
        store_run(
            out,
            rescale16::<2>(x(c0), m[0]),
            rescale16::<2>(x(c1), m[1]),
        );
    };
    // The four runs of 128-weight half `h` of a super-block: low (runs 0, 1) and high (2, 3)
    // nibbles of ql[64h..][..32], ql[64h + 32..][..32], and bits 2t, 2t + 1 of qh[32h..][..32].
    let half = |blk: &[u8; 210], h: usize, m: [[i16; 2]; 4], out: [&mut [i8; RUN]; 4]| {
        let (ql, qh) = (64 * h, 128 + 32 * h);
        let [o0, o1, o2, o3] = out;
        let (ql0, ql1) = (
            [load16(&blk[ql..]), load16(&blk[ql + 16..])],
            [load16(&blk[ql + 32..]), load16(&blk[ql + 48..])],
        );
        let qh = [load16(&blk[qh..]), load16(&blk[qh + 16..])];
        let high2 = |bits: uint8x16_t| vshlq_n_u8(vandq_u8(bits, two), 4);
        let c = |i: usize| {
            [
                vorrq_u8(vandq_u8(ql0[i], low), high2(qh[i])),
                vorrq_u8(vandq_u8(ql1[i], low), high2(vshrq_n_u8(qh[i], 2))),
                vorrq_u8(vshrq_n_u8(ql0[i], 4), high2(vshrq_n_u8(qh[i], 4))),
                vorrq_u8(vshrq_n_u8(ql1[i], 4), high2(vshrq_n_u8(qh[i], 6))),
            ]
        };
        let (first, second) = (c(0), c(1));
        put(o0, first[0], second[0], m[0]);
        put(o1, first[1], second[1], m[1]);
        put(o2, first[2], second[2], m[2]);
        put(o3, first[3], second[3], m[3]);
    };
    let m = params.m_pairs();
    for_each_block_group::<8, 1, 210, _>(rows, m, tile, 0..runs, |_, [blk], [m], out| {
        let [[o0], [o1], [o2], [o3], [o4], [o5], [o6], [o7]] = out;
        half(blk, 0, [m[0], m[1], m[2], m[3]], [o0, o1, o2, o3]);
        half(blk, 1, [m[4], m[5], m[6], m[7]], [o4, o5, o6, o7]);
    });
}

#[target_feature(enable = "neon")]
fn q3_k(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    // Table entry i = q2 + 4·hbit (code i - 4), scaled by 32: a run's two sets' 8 entries in
    // one 16-byte table, the second set's at 8..16.
    let c: [i16; 8] = [-128, -96, -64, -32, 0, 32, 64, 96];
    // SAFETY: `c` is 16 readable bytes.
    let codes = unsafe { vld1q_s16(c.as_ptr()) };
    let (three, four, eight) = (vdupq_n_u8(3), vdupq_n_u8(4), vdupq_n_u8(8));
    let m = params.m_pairs();
    // Run s of a super-block: 2-bit field s % 4 of qs[32·(s / 4)..][..32], bit s of hmask.
    for_each_block_group::<8, 1, 110, _>(rows, m, tile, 0..runs, |_, [blk], [m], out| {
        let hmask = [load16(blk), load16(&blk[16..])];
        let qs = [
            load16(&blk[32..]),
            load16(&blk[48..]),
            load16(&blk[64..]),
            load16(&blk[80..]),
        ];
        for (s, [out]) in out.into_iter().enumerate() {
            let set = |m: i16| vqrdmulhq_s16(codes, vdupq_n_s16(m));
            let t = vqmovn_high_s16(vqmovn_s16(set(m[s][0])), set(m[s][1]));
            let (shift, bit) = (vdupq_n_s8(-2 * (s as i8 % 4)), vdupq_n_u8(1 << s));
            let index = |h: usize| {
                let q2 = vandq_u8(vshlq_u8(qs[2 * (s / 4) + h], shift), three);
                vorrq_u8(q2, vandq_u8(vtstq_u8(hmask[h], bit), four))
            };
            store_run(
                out,
                vqtbl1q_s8(t, index(0)),
                vqtbl1q_s8(t, vorrq_u8(index(1), eight)),
            );
        }
    });
}

#[target_feature(enable = "neon")]
fn q2_k(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let (three, twelve) = (vdupq_n_f32(3.0), vdupq_n_u8(12));
    // The table of four sets (their `[f, g]`): byte 4q + t is code q of set t, `sat8(rne(fl(fl(q·f)
    // + g)))` (fl(0·f) + g = g and fl(2·f) = f + f: the same values).
    let table = |fg: &[[f32; 2]]| {
        let fg: &[[f32; 2]; 4] = fg.try_into().expect("4 sets");
        // SAFETY: `fg` is 32 readable bytes; `ld2` deinterleaves them into the f's and g's.
        let float32x4x2_t(f, g) = unsafe { vld2q_f32(fg.as_ptr().cast()) };
        let e0 = vcvtnq_s32_f32(g);
        let e1 = vcvtnq_s32_f32(vaddq_f32(f, g));
        let e2 = vcvtnq_s32_f32(vaddq_f32(vaddq_f32(f, f), g));
        let e3 = vcvtnq_s32_f32(vaddq_f32(vmulq_f32(f, three), g));
        let low = vqmovn_high_s32(vqmovn_s32(e0), e1);
        vqmovn_high_s16(vqmovn_s16(low), vqmovn_high_s32(vqmovn_s32(e2), e3))
    };
    // Run s of a super-block: sets 2s, 2s + 1 (table s / 2), 2-bit field s % 4 of
    // qs[32·(s / 4)..][..32].
    let m = params.fg_pairs();
    for_each_block_group::<8, 1, 84, _>(rows, m, tile, 0..runs, |_, [blk], [p], out| {
        let sets = p.as_flattened();
        let tables = [
            table(&sets[..4]),
            table(&sets[4..8]),
            table(&sets[8..12]),
            table(&sets[12..]),
        ];
        let qs = [
            load16(&blk[16..]),
            load16(&blk[32..]),
            load16(&blk[48..]),
            load16(&blk[64..]),
        ];
        for (s, [out]) in out.into_iter().enumerate() {
            // The code to bits 2, 3; the set's place in its table to bits 0, 1.
            let shift = vdupq_n_s8(2 - 2 * (s % 4) as i8);
            let index = |h: usize| {
                let code = vandq_u8(vshlq_u8(qs[2 * (s / 4) + h], shift), twelve);
                vorrq_u8(code, vdupq_n_u8((2 * (s % 2) + h) as u8))
            };
            let t = tables[s / 2];
            store_run(out, vqtbl1q_s8(t, index(0)), vqtbl1q_s8(t, index(1)));
        }
    });
}

/// The 32-entry table of a run of Q5_1 or Q5_K, `table_entry` of `table_fixed(fg)`, as the two
/// registers of a `tbl` (`c`: [`code_registers`]).
#[inline]
#[target_feature(enable = "neon")]
fn five_bit_table(c: &[int16x8_t; 4], fg: [f32; 2]) -> int8x16x2_t {
    let (f, g) = fixed_params::<32>(fg);
    let half = |i: usize| {
        vcombine_s8(
            fixed_entries(c[2 * i], f, g),
            fixed_entries(c[2 * i + 1], f, g),
        )
    };
    int8x16x2_t(half(0), half(1))
}

#[target_feature(enable = "neon")]
fn q5_1(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let c = code_registers::<32, 4>();
    let bit_masks: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    // Output byte i of the run's first 16 takes qh byte i / 8, of its second 16 byte 2 + i / 8.
    let spread: [[u8; 16]; 2] =
        std::array::from_fn(|h| std::array::from_fn(|i| (2 * h + i / 8) as u8));
    // SAFETY: `bit_masks` and `spread` are 16 readable bytes each.
    let (bits, spread) = unsafe {
        (
            vld1q_u8(bit_masks.as_ptr()),
            [vld1q_u8(spread[0].as_ptr()), vld1q_u8(spread[1].as_ptr())],
        )
    };
    let (low, sixteen) = (vdupq_n_u8(15), vdupq_n_u8(16));
    for_each_block::<1, 24, 96, _>(rows, params.fg(), tile, runs, |[blk], [fg], [out]| {
        let t = five_bit_table(&c, fg);
        let qh = vreinterpretq_u8_u32(vdupq_n_u32(u32::from_le_bytes([
            blk[4], blk[5], blk[6], blk[7],
        ])));
        let q = load16(&blk[8..]);
        // The fifth bit of each code: bit i of qh, as 16.
        let fifth = |h: usize, nibbles: uint8x16_t| {
            let set = vandq_u8(vtstq_u8(vqtbl1q_u8(qh, spread[h]), bits), sixteen);
            vqtbl2q_s8(t, vorrq_u8(nibbles, set))
        };
        store_run(out, fifth(0, vandq_u8(q, low)), fifth(1, vshrq_n_u8(q, 4)));
    });
}

#[target_feature(enable = "neon")]
fn q5_k(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
    let c = code_registers::<32, 4>();
    let (low, sixteen) = (vdupq_n_u8(15), vdupq_n_u8(16));
    // Run s of a super-block: nibble s % 2 of qs[32·(s / 2)..][..32], bit s of qh.
    for_each_block_group::<8, 1, 176, _>(rows, params.fg(), tile, 0..runs, |_, [blk], [p], out| {
        let qh = [load16(&blk[16..]), load16(&blk[32..])];
        for (s, [out]) in out.into_iter().enumerate() {
            let t = five_bit_table(&c, p[s]);
            let at = 48 + 32 * (s / 2);
            let bit = vdupq_n_u8(1 << s);
            let code = |h: usize| {
                let q = load16(&blk[at + 16 * h..]);
                let nibbles = if s % 2 == 0 {
                    vandq_u8(q, low)
                } else {
                    vshrq_n_u8(q, 4)
                };
                let fifth = vandq_u8(vtstq_u8(qh[h], bit), sixteen);
                vqtbl2q_s8(t, vorrq_u8(nibbles, fifth))
            };
            store_run(out, code(0), code(1));
        }
    });
}

/// The codebook types (IQ2, IQ3, IQ1; `BB`-byte blocks): per run, the four groups' grid entries
/// and sign bytes from the block ([`groups`]), each weight's table index from its grid byte and
/// sign, and one `tbl` per half of the table of stretched codes rescaled by the multiplier of
/// its set (`multipliers`: the run's first and second 16 weights', equal for sets of 32).
#[inline]
#[target_feature(enable = "neon")]
fn codebook<const BB: usize, P: Copy>(
    ty: GgmlType,
    rows: &[&[u8]],
    m: RowMajor<P>,
    tile: &mut Tile,
    runs: usize,
    multipliers: impl Fn(P) -> [i16; 2],
) {
    let cb = Codebook::of(ty);
    let (c0, c1) = code_halves(&table_codes(ty));
    let bit_masks: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    // SAFETY: `bit_masks` is 16 readable bytes.
    let bits = unsafe { vld1q_u8(bit_masks.as_ptr()) };
    // IQ1_M: a group's weights take its offset's sign, bit 3 of its nibble of the run's high
    // bits (groups 2h and 2h + 1: the low and high nibble of byte h), tested straight from those
    // bits rather than through the sign bytes the compiler builds with scalar code.
    let iq1_m_bits = vcombine_u8(vdup_n_u8(8), vdup_n_u8(128));
    // Half h's weights 8l + j (l = 0, 1) take sign byte 2h + l.
    let spread = [(0, 1), (2, 3)].map(|(a, b)| vcombine_u8(vdup_n_u8(a), vdup_n_u8(b)));
    let (mask, negative) = (vdupq_n_u8(cb.mask), vdupq_n_u8(cb.negative));
    let shift = vdupq_n_s8(-(cb.shift as i8));
    for_each_block_group::<8, 1, BB, _>(rows, m, tile, 0..runs, |_, [blk], [m], out| {
        for (ib, [out]) in out.into_iter().enumerate() {
            let (grid, signs) = groups(ty, blk, ib);
            let grid = if ty == GgmlType::IQ3_S {
                iq3_s_grid(blk, ib)
            } else {
                grid
            };
            let signs = vcombine_u8(vcreate_u8(signs as u64), vcreate_u8(signs as u64));
            let [m0, m1] = multipliers(m[ib]);
            // Groups 2h, 2h + 1: weights 16h..16h + 16.
            let half = |h: usize, m: i16| {
                let g = vcombine_u8(vcreate_u8(grid[2 * h]), vcreate_u8(grid[2 * h + 1]));
                let magnitude = if cb.shift == 0 {
                    vaddq_u8(g, vdupq_n_u8(1))
                } else {
                    vandq_u8(vshlq_u8(g, shift), mask)
                };
                let negatives = match ty {
                    GgmlType::IQ1_M => vtstq_u8(vdupq_n_u8(blk[32 + 2 * ib + h]), iq1_m_bits),
                    // IQ1_S: one offset sign for the run, bit 15 of its high bits.
                    GgmlType::IQ1_S => vtstq_u8(vdupq_n_u8(blk[35 + 2 * ib]), vdupq_n_u8(128)),
                    _ => vtstq_u8(vqtbl1q_u8(signs, spread[h]), bits),
                };
                let index = vorrq_u8(magnitude, vandq_u8(negatives, negative));
                vqtbl1q_s8(rescale_table(c0, c1, m), index)
            };
            store_run(out, half(0, m0), half(1, m1));
        }
    });
}

/// IQ3_S's grid entries of run `ib` of `blk`, as [`groups`] reads them: the eight 9-bit indices
/// (code byte `e` and, as bit 8, bit `e` of the run's high bits) in one vector, then eight
/// lookups, where the compiler's scalar build of each index took four instructions. (The
/// types of 8-byte entries, four per run, gain nothing so.)
#[inline]
#[target_feature(enable = "neon")]
fn iq3_s_grid(blk: &[u8], ib: usize) -> [u64; 4] {
    let q: [u8; 8] = blk[2 + 8 * ib..10 + 8 * ib].try_into().expect("8 bytes");
    let bit_masks: [u8; 8] = [1, 2, 4, 8, 16, 32, 64, 128];
    // SAFETY: `q` and `bit_masks` are 8 readable bytes each.
    let (q, bits) = unsafe { (vld1_u8(q.as_ptr()), vld1_u8(bit_masks.as_ptr())) };
    let high = vand_u8(vtst_u8(vdup_n_u8(blk[66 + ib]), bits), vdup_n_u8(1));
    let index = vorrq_u16(vmovl_u8(q), vshll_n_u8::<8>(high));
    let mut at = [0u16; 8];
    // SAFETY: `at` is 8 writable u16.
    unsafe { vst1q_u16(at.as_mut_ptr(), index) };
    let g = at.map(|i| IQ3S_GRID[i as usize & 511] as u64);
    std::array::from_fn(|l| g[2 * l] | g[2 * l + 1] << 32)
}

/// The codebook types' entry points: one multiplier per run (`one`) or per 16 weights (`two`).
macro_rules! codebook_kernels {
    ($($name:ident: $ty:ident, $bb:literal, $sets:ident;)*) => {
        $(
            #[target_feature(enable = "neon")]
            fn $name(rows: &[&[u8]], params: &TileParams, tile: &mut Tile, runs: usize) {
                codebook_kernels!(@$sets GgmlType::$ty, $bb, rows, params, tile, runs);
            }
        )*
    };
    (@one $ty:expr, $bb:literal, $rows:ident, $p:ident, $tile:ident, $runs:ident) => {
        codebook::<$bb, i16>($ty, $rows, $p.m(), $tile, $runs, |m| [m, m])
    };
    (@two $ty:expr, $bb:literal, $rows:ident, $p:ident, $tile:ident, $runs:ident) => {
        codebook::<$bb, [i16; 2]>($ty, $rows, $p.m_pairs(), $tile, $runs, |m| m)
    };
}

codebook_kernels! {
    iq2_xxs: IQ2_XXS, 66, one;
    iq2_xs: IQ2_XS, 74, two;
    iq2_s: IQ2_S, 82, two;
    iq3_xxs: IQ3_XXS, 98, one;
    iq3_s: IQ3_S, 110, one;
    iq1_s: IQ1_S, 50, one;
    iq1_m: IQ1_M, 56, two;
}
