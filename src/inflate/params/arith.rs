//! The scalar arithmetic the method is written in: exact fp16 conversion, ties-to-even
//! rounding, the table types' values and block maxima, the rescale multipliers. Every path's
//! scan and the scalar kernels use these; the SIMD kernels reproduce them lane by lane.

use crate::quant::K_SCALE_SIZE;

/// `(inv_n, s_n) = (fl(127/M_n), fl(M_n/127))`, or zeros for an all-zero row.
pub(in crate::inflate) fn table_range(w_max: f32) -> (f32, f32) {
    if w_max > 0.0 {
        (127.0 / w_max, w_max / 127.0)
    } else {
        (0.0, 0.0)
    }
}

/// `max` for values known not to be NaN: one instruction, unlike `f32::max`.
#[inline(always)]
fn larger(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// Q2_K's table value of code `c` in units of `s_n`, before rounding: `fl(fl(c·f) + g)`.
#[inline(always)]
pub(in crate::inflate) fn table_value(c: i32, f: f32, g: f32) -> f32 {
    c as f32 * f + g
}

/// The step between consecutive codes of a fixed-point table of `codes` entries (16: Q4_1,
/// Q4_K; 32: Q5_1, Q5_K): `2¹⁵/codes`, so that the largest code, `step·(codes - 1)`, fits 16
/// bits.
const fn code_step(codes: usize) -> i32 {
    32768 / codes as i32
}

/// The codes `code_step(CODES)·q` of a fixed-point table, in order: the first operand of
/// [`table_entry`]'s multiply, which every path loads in its own lane order.
pub(in crate::inflate) fn fixed_codes<const CODES: usize>() -> [i16; CODES] {
    std::array::from_fn(|q| (code_step(CODES) * q as i32) as i16)
}

/// The factors of `[f, g]` in [`table_fixed`]: `[2²¹/step, 2⁶]`, powers of two.
pub(in crate::inflate) const fn fixed_scales(codes: usize) -> [f32; 2] {
    [(1 << 21) as f32 / code_step(codes) as f32, 64.0]
}

/// A table type's run parameters in fixed point, `[F, G] = [sat16(rne(f·2²¹/step)),
/// sat16(rne(g·2⁶))]` with `step` = [`code_step`]`(CODES)` (so `F = f·2¹⁰` for 16 codes, `f·2¹¹`
/// for 32): both products are exact, and the scan's `M_n` bounds `|f| ≤ 2·127/(CODES -
/// 1)·(1 + 3u)` and `|g| ≤ 127·(1 + u)`, so neither saturates.
#[inline(always)]
pub(in crate::inflate) fn table_fixed<const CODES: usize>([f, g]: [f32; 2]) -> [i16; 2] {
    let sat16 = |x: f32| rne_i32(x.clamp(-32768.0, 32767.0)) as i16;
    let [f_scale, g_scale] = fixed_scales(CODES);
    [sat16(f * f_scale), sat16(g * g_scale)]
}

/// Entry `q` (`0..CODES`) of a table from [`table_fixed`]'s `[F, G]`:
/// `sat8((sat16(((step·q·F + 2¹⁴) >> 15) + G) + 2⁵) >> 6)`, `q·f + g` in units of 2⁻⁶ rounded
/// to the nearest integer, ties up. A table of 8 or 16 entries per 16-lane multiply (`pmulhrsw`,
/// `sqrdmulh`), saturating add and rounding shift, where binary32 takes a step per 4 or 8 entries
/// and a conversion.
#[inline(always)]
pub(in crate::inflate) fn table_entry<const CODES: usize>(q: i32, [f, g]: [i16; 2]) -> i8 {
    let product = (code_step(CODES) * q * f as i32 + (1 << 14)) >> 15;
    let sum = (product + g as i32).clamp(-32768, 32767);
    ((sum + 32) >> 6).clamp(-128, 127) as i8
}

/// Largest `|w|` over the codes 0..=15 of a Q4_1/Q4_K block, `w = fl(fl(q·a) + b)`.
#[inline(always)]
pub(in crate::inflate) fn table_block_max(a: f32, b: f32) -> f32 {
    table_set_max(a, b, 15.0)
}

/// Largest `|w|` over the codes `0..=top` of a set, `w = fl(fl(q·a) + b)`: `w` is monotonic in
/// `q`, so it is `|w|` at one end.
#[inline(always)]
pub(in crate::inflate) fn table_set_max(a: f32, b: f32, top: f32) -> f32 {
    larger(b.abs(), (top * a + b).abs())
}

/// All eight 6-bit scales and mins of a Q4_K super-block at once, with 32-bit word operations
/// (the same unpacking as [`crate::quant::q4k_scale_min`], which decodes one at a time; tested equal).
#[inline(always)]
pub(in crate::inflate) fn q4k_scales_mins(packed: &[u8; K_SCALE_SIZE]) -> ([u8; 8], [u8; 8]) {
    let word = |i: usize| u32::from_le_bytes(packed[4 * i..4 * i + 4].try_into().expect("4 bytes"));
    let (w0, w1, w2) = (word(0), word(1), word(2));
    let (low6, low4, top2) = (0x3f3f_3f3f, 0x0f0f_0f0f, 0x0303_0303);
    // Sub-blocks 0..4 keep their low six bits; 4..8 combine a nibble of w2 with the top two
    // bits of w0 (scales) or w1 (mins).
    let scales = [w0 & low6, (w2 & low4) | (((w0 >> 6) & top2) << 4)];
    let mins = [w1 & low6, ((w2 >> 4) & low4) | (((w1 >> 6) & top2) << 4)];
    let bytes = |w: [u32; 2]| {
        let (a, b) = (w[0].to_le_bytes(), w[1].to_le_bytes());
        [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
    };
    (bytes(scales), bytes(mins))
}

/// `clamp(rne(fl(e·unit)), ±32767)`.
#[inline(always)]
pub(in crate::inflate) fn multiplier(e: f32, unit: f32) -> i16 {
    rne_i32(e * unit).clamp(-32767, 32767) as i16
}

/// `x` rounded to an integer, ties to even, for `|x| < 2²²`: adding 1.5·2²³ leaves the rounded
/// integer in the low mantissa bits. Integer-only after one add, so loops of it vectorize
/// (`round_ties_even() as i32` is a libm call plus saturation checks on baseline x86-64).
#[inline(always)]
pub(in crate::inflate) fn rne_i32(x: f32) -> i32 {
    const SHIFTER: f32 = 12_582_912.0;
    (x + SHIFTER).to_bits() as i32 - SHIFTER.to_bits() as i32
}

/// Exact binary16 -> binary32 for finite values, without branches: the row scan's hot path.
/// Agrees with [`crate::quant::fp16::f16_to_f32`] on every finite half (tested exhaustively).
#[inline(always)]
pub(in crate::inflate) fn finite_half_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let mag = (h & 0x7fff) as u32;
    let normal = f32::from_bits((mag << 13) + ((127 - 15) << 23));
    // Subnormals (and zero): mantissa · 2⁻²⁴, exact in binary32.
    let small = mag as f32 * (1.0 / 16_777_216.0);
    f32::from_bits((if mag >= 0x0400 { normal } else { small }).to_bits() | sign)
}
