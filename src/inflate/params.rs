//! The per-row half of the method (see the module docs): the row scale `s_n` and the per-block
//! parameters, computed from the block scales alone by scalar code that every kernel path shares.

use crate::quant::{GgmlType, K_SCALE_SIZE, QK_K};

/// One row's parameters, reused from row to row (sized once per expert).
///
/// Where a block's parameter is one product with its fp16 scale (Q4_0, Q5_0, Q8_0: the
/// multiplier `m_j = clamp(rne(fl(d_j·unit_n)), ±32767)`), the kernels compute it on the fly from
/// `unit`, which costs less than a pass storing it; otherwise it is stored here.
pub(super) struct RowParams {
    ty: GgmlType,
    /// Q4_0, Q5_0: `unit_n = fl(inv_n·2¹⁵/code_scale)`; Q8_0: `unit_n = fl(32768/E_n)`; 0 for an
    /// all-zero row.
    pub unit: f32,
    /// Q4_1, Q4_K: `f_j = fl(a_j·inv_n)` of each (sub-)block of 32.
    pub f: Vec<f32>,
    /// Q4_1, Q4_K: `g_j = fl(b_j·inv_n)` of each (sub-)block of 32.
    pub g: Vec<f32>,
    /// Rescale types: Q15 multiplier `m_j` of each block (Q8_0) or sub-block of 16 (Q6_K).
    pub m: Vec<i16>,
}

/// Zero point of the table types' codes: `c(q) = q - zero_point`.
pub(super) fn zero_point(ty: GgmlType) -> i32 {
    match ty {
        GgmlType::Q4_0 => 8,
        GgmlType::Q5_0 => 16,
        _ => 0,
    }
}

/// Q4_0 and Q5_0 build their 16-entry tables by the fixed-point rescale: entry `q` is
/// `sat8((code_scale·c(q)·m_j + 2¹⁴) >> 15)`; `code_scale` stretches the codes (-8..8, -16..16)
/// to span -128..128, so `m_j ≈ f_j·2¹⁵/code_scale` uses the full 16 bits.
pub(super) fn code_scale(ty: GgmlType) -> i32 {
    match ty {
        GgmlType::Q4_0 => 16,
        GgmlType::Q5_0 => 8,
        _ => 1,
    }
}

/// `code_scale·c(q)` for the `N` codes of a Q4_0 (16) or Q5_0 (32) block.
pub(super) fn scaled_codes<const N: usize>(ty: GgmlType) -> [i16; N] {
    std::array::from_fn(|q| ((q as i32 - zero_point(ty)) * code_scale(ty)) as i16)
}

/// `fl(unit / E_n)` scales the rescale types' multipliers.
const Q8_0_UNIT: f32 = 32768.0;
const Q6_K_UNIT: f32 = 32512.0;

impl RowParams {
    pub fn new(ty: GgmlType, k: usize) -> RowParams {
        let blocks = k / ty.block_elems();
        let (tables, multipliers) = match ty {
            GgmlType::Q4_1 => (blocks, 0),
            GgmlType::Q4_K => (blocks * 8, 0),
            GgmlType::Q6_K => (0, blocks * 16),
            _ => (0, 0),
        };
        RowParams {
            ty,
            unit: 0.0,
            f: vec![0.0; tables],
            g: vec![0.0; tables],
            m: vec![0; multipliers],
        }
    }

    /// Fills the parameters for one row of blocks and returns `s_n`, or the index of the first
    /// block with a NaN or infinite scale.
    pub fn prepare(&mut self, row: &[u8]) -> Result<f32, usize> {
        let ty = self.ty;
        let blocks = row.chunks_exact(ty.block_bytes());
        match ty {
            GgmlType::Q4_0 | GgmlType::Q5_0 => {
                let largest = check_halves(row, ty.block_bytes(), 0)?;
                // |w| <= |d|·zp for codes -zp..zp-1; the product with a power of two is exact.
                let w_max = largest * zero_point(ty) as f32;
                let (inv, s) = table_range(w_max);
                // A power-of-two factor: exact, so m_j = rne(fl(d_j·inv_n)·2¹⁵/code_scale).
                self.unit = inv * (32768 / code_scale(ty)) as f32;
                Ok(s)
            }
            GgmlType::Q4_1 => {
                check_halves(row, ty.block_bytes(), 0)?;
                check_halves(row, ty.block_bytes(), 2)?;
                for ((a, b), blk) in self.f.iter_mut().zip(&mut self.g).zip(blocks) {
                    (*a, *b) = (half(blk, 0), half(blk, 2));
                }
                Ok(self.scale_tables(tables_max(&self.f, &self.g)))
            }
            GgmlType::Q4_K => {
                check_halves(row, ty.block_bytes(), 0)?;
                check_halves(row, ty.block_bytes(), 2)?;
                let subs = self.f.chunks_exact_mut(8).zip(self.g.chunks_exact_mut(8));
                for ((a, b), blk) in subs.zip(blocks) {
                    let (d, dmin) = (half(blk, 0), half(blk, 2));
                    let (sc, mn) = q4k_scales_mins(blk[4..16].try_into().expect("12 bytes"));
                    for j in 0..8 {
                        // ggml: w = fl(fl(d·sc)·q) - fl(dmin·m); negating the offset is exact.
                        (a[j], b[j]) = (d * sc[j] as f32, -(dmin * mn[j] as f32));
                    }
                }
                Ok(self.scale_tables(tables_max(&self.f, &self.g)))
            }
            GgmlType::Q8_0 => {
                let e_max = check_halves(row, ty.block_bytes(), 0)?;
                self.unit = if e_max > 0.0 { Q8_0_UNIT / e_max } else { 0.0 };
                Ok(e_max)
            }
            GgmlType::Q6_K => {
                let d_max = check_halves(row, ty.block_bytes(), 208)?;
                let mut e_max = 0f32;
                if d_max > 0.0 {
                    for blk in blocks.clone() {
                        let sc_max = blk[192..208]
                            .iter()
                            .map(|&s| (s as i8).unsigned_abs())
                            .max()
                            .unwrap_or(0);
                        // fl(|d|·|sc|) is monotonic in |sc|, so this is the largest |fl(d·sc_j)|.
                        e_max = larger(e_max, half(blk, 208).abs() * sc_max as f32);
                    }
                }
                let unit = if e_max > 0.0 { Q6_K_UNIT / e_max } else { 0.0 };
                for (m, blk) in self.m.chunks_exact_mut(QK_K / 16).zip(blocks) {
                    let d = half(blk, 208);
                    for (m, &sc) in m.iter_mut().zip(&blk[192..208]) {
                        *m = multiplier(d * (sc as i8) as f32, unit);
                    }
                }
                Ok(32.0 * e_max / 127.0)
            }
            GgmlType::F32 | GgmlType::F16 => unreachable!("checked by the caller"),
        }
    }

    /// From the row's largest value `M_n`, turns every `(a_j, b_j)` into `(f_j, g_j)`; returns
    /// `s_n`.
    fn scale_tables(&mut self, w_max: f32) -> f32 {
        let (inv, s) = table_range(w_max);
        // Two plain loops (not one chained iterator) so they vectorize.
        for x in &mut self.f {
            *x *= inv;
        }
        for x in &mut self.g {
            *x *= inv;
        }
        s
    }
}

/// `(inv_n, s_n) = (fl(127/M_n), fl(M_n/127))`, or zeros for an all-zero row.
fn table_range(w_max: f32) -> (f32, f32) {
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

/// The table types' value of code `c` in units of `s_n`, before rounding: `fl(fl(c·f) + g)`.
#[inline(always)]
pub(super) fn table_value(c: i32, f: f32, g: f32) -> f32 {
    c as f32 * f + g
}

/// `M_n` of a Q4_1/Q4_K row: the largest [`table_block_max`] of its blocks. Eight independent
/// running maxima (instead of one serial chain) so the loop vectorizes.
fn tables_max(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    for (a, b) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for j in 0..8 {
            lanes[j] = larger(lanes[j], table_block_max(a[j], b[j]));
        }
    }
    let tail = a
        .chunks_exact(8)
        .remainder()
        .iter()
        .zip(b.chunks_exact(8).remainder());
    tail.fold(lanes.into_iter().fold(0.0, larger), |m, (&a, &b)| {
        larger(m, table_block_max(a, b))
    })
}

/// Largest `|w|` over the codes 0..=15 of a Q4_1/Q4_K block, `w = fl(fl(q·a) + b)`: `w` is
/// monotonic in `q`, so it is `|w|` at one end.
fn table_block_max(a: f32, b: f32) -> f32 {
    larger(b.abs(), (15.0 * a + b).abs())
}

/// All eight 6-bit scales and mins of a Q4_K super-block at once, with 32-bit word operations
/// (the same unpacking as [`crate::quant::q4k_scale_min`], which decodes one at a time; tested equal).
#[inline(always)]
pub(super) fn q4k_scales_mins(packed: &[u8; K_SCALE_SIZE]) -> ([u8; 8], [u8; 8]) {
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
pub(super) fn multiplier(e: f32, unit: f32) -> i16 {
    rne_i32(e * unit).clamp(-32767, 32767) as i16
}

/// `x` rounded to an integer, ties to even, for `|x| < 2²²`: adding 1.5·2²³ leaves the rounded
/// integer in the low mantissa bits. Integer-only after one add, so loops of it vectorize
/// (`round_ties_even() as i32` is a libm call plus saturation checks on baseline x86-64).
#[inline(always)]
pub(super) fn rne_i32(x: f32) -> i32 {
    const SHIFTER: f32 = 12_582_912.0;
    (x + SHIFTER).to_bits() as i32 - SHIFTER.to_bits() as i32
}

/// The fp16 at `blk[at..at + 2]`, which must be finite, as f32 (exact).
#[inline(always)]
pub(super) fn half(blk: &[u8], at: usize) -> f32 {
    finite_half_to_f32(u16::from_le_bytes([blk[at], blk[at + 1]]))
}

/// Exact binary16 -> binary32 for finite values, without branches: the row scan's hot path.
/// Agrees with [`crate::quant::fp16::f16_to_f32`] on every finite half (tested exhaustively).
#[inline(always)]
pub(super) fn finite_half_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let mag = (h & 0x7fff) as u32;
    let normal = f32::from_bits((mag << 13) + ((127 - 15) << 23));
    // Subnormals (and zero): mantissa · 2⁻²⁴, exact in binary32.
    let small = mag as f32 * (1.0 / 16_777_216.0);
    f32::from_bits((if mag >= 0x0400 { normal } else { small }).to_bits() | sign)
}

/// Scans the fp16 field at byte `at` of every block of the row: the largest magnitude as f32,
/// or the index of the first block where it is NaN or infinite.
fn check_halves(row: &[u8], block_bytes: usize, at: usize) -> Result<f32, usize> {
    // Finite halves order like their magnitude bits, and NaN/Inf have all exponent bits set,
    // so one integer max finds both the largest value and any non-finite one.
    let largest = row
        .chunks_exact(block_bytes)
        .map(|blk| u16::from_le_bytes([blk[at], blk[at + 1]]) & 0x7fff)
        .max()
        .unwrap_or(0);
    if largest >= 0x7c00 {
        let bad = row
            .chunks_exact(block_bytes)
            .position(|blk| blk[at + 1] & 0x7c == 0x7c);
        return Err(bad.expect("a non-finite half exists"));
    }
    Ok(finite_half_to_f32(largest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::fp16::f16_to_f32;
    use crate::quant::q4k_scale_min;

    #[test]
    fn finite_half_conversion_is_exact() {
        for h in (0..=u16::MAX).filter(|h| h & 0x7c00 != 0x7c00) {
            assert_eq!(
                finite_half_to_f32(h).to_bits(),
                f16_to_f32(h).to_bits(),
                "{h:#06x}"
            );
        }
    }

    #[test]
    fn q4k_scales_mins_agrees_with_the_reference_decoder() {
        let mut rng = crate::testutil::Rng::new(9);
        for _ in 0..1000 {
            let mut packed = [0u8; K_SCALE_SIZE];
            rng.fill_bytes(&mut packed);
            let (sc, mn) = q4k_scales_mins(&packed);
            for j in 0..8 {
                assert_eq!(
                    (sc[j], mn[j]),
                    q4k_scale_min(j, &packed),
                    "{packed:?} sub-block {j}"
                );
            }
        }
    }

    #[test]
    fn rne_i32_rounds_half_to_even() {
        let mut rng = crate::testutil::Rng::new(3);
        let fixed = [
            0.5f32, 1.5, 2.5, -0.5, -1.5, 3.49, -3.51, 32767.5, 32768.4, -0.0, 127.5,
        ];
        let random = (0..10_000).map(|_| rng.uniform(-40_000.0, 40_000.0));
        for x in fixed.into_iter().chain(random) {
            assert_eq!(rne_i32(x), x.round_ties_even() as i32, "{x}");
        }
    }
}
