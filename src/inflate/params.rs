//! The per-row half of the method (see the module docs): the row scale `s_n` and the per-block
//! parameters, computed from the block scales alone by scalar code that every kernel path shares.

use crate::quant::fp16::f16_to_f32;
use crate::quant::{q4k_scale_min, GgmlType, K_SCALE_SIZE, QK_K};

/// One row's parameters, reused from row to row (sized once per expert).
pub(super) struct RowParams {
    ty: GgmlType,
    /// Table types: scale `a_j` of each (sub-)block of 32.
    pub a: Vec<f32>,
    /// Table types: offset `b_j` of each (sub-)block of 32.
    pub b: Vec<f32>,
    /// Table types: `inv_n = 127 / M_n` (0 for an all-zero row).
    pub inv: f32,
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

/// `fl(scale / e_max)` for the rescale types' multipliers, and the multiplier itself.
const Q8_0_UNIT: f32 = 32768.0;
const Q6_K_UNIT: f32 = 32512.0;

impl RowParams {
    pub fn new(ty: GgmlType, k: usize) -> RowParams {
        let blocks = k / ty.block_elems();
        let (tables, multipliers) = match ty {
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 => (blocks, 0),
            GgmlType::Q4_K => (blocks * 8, 0),
            GgmlType::Q8_0 => (0, blocks),
            GgmlType::Q6_K => (0, blocks * 16),
            GgmlType::F32 | GgmlType::F16 => (0, 0),
        };
        RowParams {
            ty,
            a: vec![0.0; tables],
            b: vec![0.0; tables],
            inv: 0.0,
            m: vec![0; multipliers],
        }
    }

    /// Fills the parameters for one row of blocks and returns `s_n`, or the index of the first
    /// block with a NaN or infinite scale.
    pub fn prepare(&mut self, row: &[u8]) -> Result<f32, usize> {
        let ty = self.ty;
        let bb = ty.block_bytes();
        let blocks = row.chunks_exact(bb);
        match ty {
            GgmlType::Q4_0 | GgmlType::Q5_0 => {
                let mut d_max = 0f32;
                for (i, blk) in blocks.enumerate() {
                    let d = finite_half(blk, 0).ok_or(i)?;
                    d_max = d_max.max(d.abs());
                    (self.a[i], self.b[i]) = (d, 0.0);
                }
                // |w| <= |d|·zp for codes -zp..zp; the multiply by a power of two is exact.
                Ok(self.set_table_range(d_max * zero_point(ty) as f32))
            }
            GgmlType::Q4_1 => {
                let mut w_max = 0f32;
                for (i, blk) in blocks.enumerate() {
                    let d = finite_half(blk, 0).ok_or(i)?;
                    let m = finite_half(blk, 2).ok_or(i)?;
                    w_max = w_max.max(table_block_max(d, m, 15));
                    (self.a[i], self.b[i]) = (d, m);
                }
                Ok(self.set_table_range(w_max))
            }
            GgmlType::Q4_K => {
                let mut w_max = 0f32;
                for (i, blk) in blocks.enumerate() {
                    let d = finite_half(blk, 0).ok_or(i)?;
                    let dmin = finite_half(blk, 2).ok_or(i)?;
                    let scales: &[u8; K_SCALE_SIZE] = blk[4..16].try_into().expect("12 bytes");
                    for j in 0..8 {
                        let (sc, m) = q4k_scale_min(j, scales);
                        // ggml: w = fl(fl(d·sc)·q) - fl(dmin·m); negating the offset is exact.
                        let (a, b) = (d * sc as f32, -(dmin * m as f32));
                        w_max = w_max.max(table_block_max(a, b, 15));
                        (self.a[i * 8 + j], self.b[i * 8 + j]) = (a, b);
                    }
                }
                Ok(self.set_table_range(w_max))
            }
            GgmlType::Q8_0 => {
                let mut e_max = 0f32;
                for (i, blk) in blocks.clone().enumerate() {
                    e_max = e_max.max(finite_half(blk, 0).ok_or(i)?.abs());
                }
                let unit = if e_max > 0.0 { Q8_0_UNIT / e_max } else { 0.0 };
                for (m, blk) in self.m.iter_mut().zip(blocks) {
                    *m = multiplier(f16_to_f32(half_bits(blk, 0)), unit);
                }
                Ok(e_max)
            }
            GgmlType::Q6_K => {
                let mut e_max = 0f32;
                for (i, blk) in blocks.clone().enumerate() {
                    let d = finite_half(blk, 208).ok_or(i)?;
                    let sc_max = blk[192..208]
                        .iter()
                        .map(|&s| (s as i8).unsigned_abs())
                        .max()
                        .unwrap_or(0);
                    // fl(|d|·|sc|) is monotonic in |sc|, so this is the largest |fl(d·sc_j)|.
                    e_max = e_max.max(d.abs() * sc_max as f32);
                }
                let unit = if e_max > 0.0 { Q6_K_UNIT / e_max } else { 0.0 };
                for (m, blk) in self.m.chunks_exact_mut(QK_K / 16).zip(blocks) {
                    let d = f16_to_f32(half_bits(blk, 208));
                    for (m, &sc) in m.iter_mut().zip(&blk[192..208]) {
                        *m = multiplier(d * (sc as i8) as f32, unit);
                    }
                }
                Ok(32.0 * e_max / 127.0)
            }
            GgmlType::F32 | GgmlType::F16 => unreachable!("checked by the caller"),
        }
    }

    /// Sets `inv_n` from `M_n` and returns `s_n`.
    fn set_table_range(&mut self, w_max: f32) -> f32 {
        if w_max > 0.0 {
            self.inv = 127.0 / w_max;
            w_max / 127.0
        } else {
            self.inv = 0.0;
            0.0
        }
    }
}

/// The table types' value of a code: `fl(fl(c·a) + b)`.
#[inline(always)]
pub(super) fn table_value(c: i32, a: f32, b: f32) -> f32 {
    c as f32 * a + b
}

/// Largest `|w|` of a block with codes `0..=q_max`: `w` is monotonic in the code, so an end.
fn table_block_max(a: f32, b: f32, q_max: i32) -> f32 {
    table_value(0, a, b)
        .abs()
        .max(table_value(q_max, a, b).abs())
}

/// `clamp(rne(fl(e·unit)), ±32767)`.
fn multiplier(e: f32, unit: f32) -> i16 {
    (e * unit).round_ties_even().clamp(-32767.0, 32767.0) as i16
}

fn half_bits(blk: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([blk[at], blk[at + 1]])
}

/// The fp16 at `blk[at..at+2]` as f32, or `None` for NaN and infinities.
fn finite_half(blk: &[u8], at: usize) -> Option<f32> {
    let h = half_bits(blk, at);
    (h & 0x7c00 != 0x7c00).then(|| f16_to_f32(h))
}
