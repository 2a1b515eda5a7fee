//! The row scan of the types only the scalar path inflates ([`GgmlType::SCALAR_ONLY`]): each
//! row's scale sets (one per 16 or 32 weights) decoded block by block, then the row's `s_n` and
//! every set's parameters, as the module docs of `inflate` define them. Row by row and plain:
//! no SIMD path shares it.

use super::{code_scale, finite_half_to_f32, multiplier, q4k_scales_mins, table_range};
use super::{table_set_max, TileParams};
use crate::quant::fp16::f16_to_f32;
use crate::quant::{
    e8m0_to_f32_half, iq1m_scale, iq4xs_scale, q3k_scales, Block, BlockIq1M, BlockIq1S, BlockIq2S,
    BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs, BlockIq4Nl, BlockIq4Xs, BlockMxfp4, BlockQ2K,
    BlockQ3K, BlockQ5K, BlockQ5_1, GgmlType,
};

/// How a type's weights become int8 (module docs of `inflate`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Method {
    /// `w = fl(fl(q·a_j) + b_j)` for codes `q` in `0..=top`: one table per set (`fg`).
    Table { top: u8 },
    /// `w = e_j·c` for integer codes `|c| ≤ c_max`: one fixed-point multiplier per set (`m`),
    /// `q8 = sat8((k·c·m_j + 2¹⁴) >> 15)` with `k` = [`code_scale`].
    Rescale { c_max: i32 },
    /// MXFP4, `w = c·2^(x_j - 128)`: power-of-two multipliers (`m`), exact within 3 binades of
    /// the row's largest block.
    PowerOfTwo,
}

/// A type's method and its scale sets per run of 32 weights (1 or 2).
#[derive(Clone, Copy, Debug)]
pub(super) struct Sets {
    pub method: Method,
    pub per_run: usize,
}

impl Sets {
    /// `None` for the types the shared scan handles.
    pub fn of(ty: GgmlType) -> Option<Sets> {
        let (method, per_run) = match ty {
            GgmlType::Q5_1 | GgmlType::Q5_K => (Method::Table { top: 31 }, 1),
            GgmlType::Q2_K => (Method::Table { top: 3 }, 2),
            GgmlType::Q3_K => (Method::Rescale { c_max: 4 }, 2),
            GgmlType::IQ4_NL | GgmlType::IQ4_XS => (Method::Rescale { c_max: 127 }, 1),
            GgmlType::IQ2_XXS => (Method::Rescale { c_max: 43 }, 1),
            GgmlType::IQ2_XS | GgmlType::IQ2_S => (Method::Rescale { c_max: 43 }, 2),
            GgmlType::IQ3_XXS => (Method::Rescale { c_max: 62 }, 1),
            GgmlType::IQ3_S => (Method::Rescale { c_max: 15 }, 1),
            GgmlType::IQ1_S => (Method::Rescale { c_max: 9 }, 1),
            GgmlType::IQ1_M => (Method::Rescale { c_max: 9 }, 2),
            GgmlType::MXFP4 => (Method::PowerOfTwo, 1),
            _ => return None,
        };
        Some(Sets { method, per_run })
    }
}

/// `U = fl(127·2¹⁵ / (k·c_max))`: a set with `|e_j| = E_n` gets `m_j ≈ U`, so that its largest
/// code maps to `k·c_max·U/2¹⁵ = 127`.
pub(super) fn rescale_unit(ty: GgmlType, c_max: i32) -> f32 {
    (127 << 15) as f32 / (code_scale(ty) * c_max) as f32
}

/// [`TileParams::prepare`] for the types of [`Sets::of`].
pub(super) fn prepare(
    p: &mut TileParams,
    sets: Sets,
    rows: &[&[u8]],
    scales: &mut [f32],
) -> Result<(), (usize, usize)> {
    let (ty, per_row) = (p.ty, sets.per_run * p.stride);
    p.scaled = true;
    // Padding rows keep zero parameters.
    p.m.fill(0);
    p.fg.fill([0.0; 2]);
    for (j, (row, scale)) in rows.iter().zip(scales.iter_mut()).enumerate() {
        if let Some(block) = first_non_finite(ty, row) {
            return Err((j, block));
        }
        let at = j * per_row..(j + 1) * per_row;
        *scale = match sets.method {
            Method::Table { top } => table_row(ty, row, top, &mut p.fg[at]),
            Method::Rescale { c_max } => {
                let e = &mut p.scratch.e[..per_row];
                rescale_row(ty, row, c_max, e, &mut p.m[at])
            }
            Method::PowerOfTwo => power_of_two_row(row, &mut p.m[at]),
        };
    }
    Ok(())
}

/// Table types: every set's `[f_j, g_j]` into `fg`; returns `s_n`.
fn table_row(ty: GgmlType, row: &[u8], top: u8, fg: &mut [[f32; 2]]) -> f32 {
    let per_block = fg.len() / (row.len() / ty.block_bytes());
    for (blk, ab) in row
        .chunks_exact(ty.block_bytes())
        .zip(fg.chunks_exact_mut(per_block))
    {
        table_sets(ty, blk, ab);
    }
    let w_max = fg
        .iter()
        .map(|&[a, b]| table_set_max(a, b, top as f32))
        .fold(0.0, f32::max);
    let (inv, s_n) = table_range(w_max);
    for fg in fg {
        *fg = fg.map(|x| x * inv);
    }
    s_n
}

/// `[a_j, b_j]` of the sets of one block, in weight order: `w = fl(fl(q·a_j) + b_j)` exactly as
/// ggml computes it (ggml subtracts `fl(dmin·m)`; adding its negation is the same).
fn table_sets(ty: GgmlType, blk: &[u8], ab: &mut [[f32; 2]]) {
    match ty {
        GgmlType::Q5_1 => {
            let b = BlockQ5_1::read(blk);
            ab[0] = [half(b.d), half(b.m)];
        }
        GgmlType::Q5_K => {
            let b = BlockQ5K::read(blk);
            let (d, dmin) = (half(b.d), half(b.dmin));
            let (sc, mn) = q4k_scales_mins(&b.scales);
            for ((ab, sc), mn) in ab.iter_mut().zip(sc).zip(mn) {
                *ab = [d * sc as f32, -(dmin * mn as f32)];
            }
        }
        GgmlType::Q2_K => {
            let b = BlockQ2K::read(blk);
            let (d, dmin) = (half(b.d), half(b.dmin));
            for (ab, sc) in ab.iter_mut().zip(b.scales) {
                *ab = [d * (sc & 0x0f) as f32, -(dmin * (sc >> 4) as f32)];
            }
        }
        _ => unreachable!("a table type"),
    }
}

/// Rescale types: every set's `e_j` into `e`, then its multiplier into `m`; returns `s_n =
/// fl(fl(c_max·E_n)/127)`.
fn rescale_row(ty: GgmlType, row: &[u8], c_max: i32, e: &mut [f32], m: &mut [i16]) -> f32 {
    let per_block = e.len() / (row.len() / ty.block_bytes());
    for (blk, e) in row
        .chunks_exact(ty.block_bytes())
        .zip(e.chunks_exact_mut(per_block))
    {
        rescale_sets(ty, blk, e);
    }
    let e_max = e.iter().map(|e| e.abs()).fold(0.0, f32::max);
    let unit = if e_max > 0.0 {
        rescale_unit(ty, c_max) / e_max
    } else {
        0.0
    };
    for (m, &e) in m.iter_mut().zip(e.iter()) {
        *m = multiplier(e, unit);
    }
    c_max as f32 * e_max / 127.0
}

/// `e_j` of the sets of one block, in weight order: the factor ggml multiplies the set's
/// integer codes by (IQ1: `dl/8`, for the codes `8·(grid ± 1/8)`), computed as ggml computes it.
fn rescale_sets(ty: GgmlType, blk: &[u8], e: &mut [f32]) {
    match ty {
        GgmlType::Q3_K => {
            let b = BlockQ3K::read(blk);
            let d = half(b.d);
            for (e, sc) in e.iter_mut().zip(q3k_scales(&b.scales)) {
                *e = d * sc as f32;
            }
        }
        GgmlType::IQ4_NL => e[0] = half(BlockIq4Nl::read(blk).d),
        GgmlType::IQ4_XS => {
            let b = BlockIq4Xs::read(blk);
            let d = half(b.d);
            for (ib, e) in e.iter_mut().enumerate() {
                *e = d * (iq4xs_scale(ib, b.scales_h, &b.scales_l) - 32) as f32;
            }
        }
        GgmlType::IQ2_XXS => {
            let b = BlockIq2Xxs::read(blk);
            let d = half(b.d);
            for (ib, e) in e.iter_mut().enumerate() {
                *e = d * (0.5 + b.scale(ib) as f32) * 0.25;
            }
        }
        GgmlType::IQ2_XS | GgmlType::IQ2_S => {
            let (d, scales) = match ty {
                GgmlType::IQ2_XS => {
                    let b = BlockIq2Xs::read(blk);
                    (b.d, b.scales)
                }
                _ => {
                    let b = BlockIq2S::read(blk);
                    (b.d, b.scales)
                }
            };
            let d = half(d);
            for (e, sc) in e.chunks_exact_mut(2).zip(scales) {
                e[0] = d * (0.5 + (sc & 0x0f) as f32) * 0.25;
                e[1] = d * (0.5 + (sc >> 4) as f32) * 0.25;
            }
        }
        GgmlType::IQ3_XXS => {
            let b = BlockIq3Xxs::read(blk);
            let d = half(b.d);
            for (ib, e) in e.iter_mut().enumerate() {
                *e = d * (0.5 + b.scale(ib) as f32) * 0.5;
            }
        }
        GgmlType::IQ3_S => {
            let b = BlockIq3S::read(blk);
            let d = half(b.d);
            for (ib, e) in e.iter_mut().enumerate() {
                *e = d * (1 + 2 * b.scale(ib)) as f32;
            }
        }
        GgmlType::IQ1_S => {
            let b = BlockIq1S::read(blk);
            let d = half(b.d);
            for (ib, e) in e.iter_mut().enumerate() {
                *e = d * (2 * b.scale(ib).0 + 1) as f32 * 0.125;
            }
        }
        GgmlType::IQ1_M => {
            let b = BlockIq1M::read(blk);
            let d = f16_to_f32(iq1m_scale(&b.scales));
            for (i, e) in e.iter_mut().enumerate() {
                *e = d * (2 * b.scale(i / 2, i % 2) + 1) as f32 * 0.125;
            }
        }
        _ => unreachable!("a rescale type"),
    }
}

/// MXFP4: `m_j = rne(2^(14 + x_j - x_max))` into `m`; returns `s_n = 2^(x_max - 128)/8`, exact.
fn power_of_two_row(row: &[u8], m: &mut [i16]) -> f32 {
    let blocks = row.chunks_exact(BlockMxfp4::BYTES);
    let x_max = blocks.clone().map(|b| b[0]).max().unwrap_or(0);
    for (m, b) in m.iter_mut().zip(blocks) {
        let below = x_max - b[0];
        // 2^-1 rounds to 0 (ties to even), and so does anything smaller.
        *m = if below <= 14 { 1 << (14 - below) } else { 0 };
    }
    e8m0_to_f32_half(x_max) * 0.125
}

/// The first block of `row` whose scale is NaN or infinite (fp16 fields: `d` before the second
/// field, as the shared scan; MXFP4: an E8M0 byte of 255, which ggml's validation rejects).
fn first_non_finite(ty: GgmlType, row: &[u8]) -> Option<usize> {
    let blocks = || row.chunks_exact(ty.block_bytes());
    let non_finite = |h: u16| h & 0x7c00 == 0x7c00;
    let at = |offset: usize| {
        blocks().position(|b| non_finite(u16::from_le_bytes([b[offset], b[offset + 1]])))
    };
    match ty {
        GgmlType::Q5_1 | GgmlType::Q5_K => at(0).or_else(|| at(2)),
        GgmlType::Q2_K => at(80).or_else(|| at(82)),
        GgmlType::Q3_K => at(108),
        GgmlType::IQ1_M => {
            blocks().position(|b| non_finite(iq1m_scale(&b[48..56].try_into().expect("8 bytes"))))
        }
        GgmlType::MXFP4 => blocks().position(|b| b[0] == 0xff),
        _ => at(0),
    }
}

/// An fp16 field known finite (checked first), as f32.
fn half(bits: [u8; 2]) -> f32 {
    finite_half_to_f32(u16::from_le_bytes(bits))
}
