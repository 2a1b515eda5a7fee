//! The row scan of the types with one scale set per 16 or 32 weights beside the shared scan's
//! (Q5_1, Q5_K, Q2_K, Q3_K, the IQ types, MXFP4): as the shared scan, passes over all the
//! tile's rows — each row's sets and its largest value, then every row's factor and `s_n`, then
//! every set's parameters — as the module docs of `inflate` define them. The per-row steps that
//! decode a type's scales are [`SetOps`] methods (their definitions here; the x86 paths
//! override the hot ones in explicit vector code, tested equal).

use super::{code_scale, finite_half_to_f32, q4k_scales_mins, table_range};
use super::{table_set_max, ScanOps, Scratch, TileParams, NON_FINITE};
use crate::quant::{e8m0_to_f32_half, iq1m_scale, iq4xs_scale, q3k_scales, MXFP4_E8M0_FINITE_MAX};
use crate::quant::{Block, BlockMxfp4, GgmlType};

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

    /// Per set of a tile row: multipliers (`m`), `[a_j, b_j]` pairs (`fg`) and the scan's
    /// binary32 `e_j`; per block of 32 weights: fp16 fields (`h0`: IQ4_NL's `d`, whose
    /// multipliers come from the halves as Q8_0's do; MXFP4's exponents).
    pub fn items(self, ty: GgmlType) -> (usize, usize, usize, usize) {
        match self.method {
            Method::Table { .. } => (0, self.per_run, 0, 0),
            Method::Rescale { .. } if ty == GgmlType::IQ4_NL => (1, 0, 0, 1),
            Method::Rescale { .. } => (self.per_run, 0, self.per_run, 0),
            Method::PowerOfTwo => (1, 0, 0, 1),
        }
    }
}

/// `U = fl(127·2¹⁵ / (k·c_max))`: a set with `|e_j| = E_n` gets `m_j ≈ U`, so that its largest
/// code maps to `k·c_max·U/2¹⁵ = 127`.
pub(super) fn rescale_unit(ty: GgmlType, c_max: i32) -> f32 {
    (127 << 15) as f32 / (code_scale(ty) * c_max) as f32
}

/// [`TileParams::prepare`] for the types of [`Sets::of`]; without `scale_fg`, Q2_K keeps its
/// `[a_j, b_j]` and Q3_K its `e_j` ([`TileParams::prepare_unscaled`]).
#[inline(always)]
pub(super) fn prepare(
    p: &mut TileParams,
    sets: Sets,
    ops: impl ScanOps,
    rows: &[&[u8]],
    scales: &mut [f32],
    scale_fg: bool,
) -> Result<(), (usize, usize)> {
    let (ty, n) = (p.ty, rows.len());
    let per_row = sets.per_run * p.stride;
    p.scaled = scale_fg || !matches!(ty, GgmlType::Q2_K | GgmlType::Q3_K);
    let sc = &mut p.scratch;
    if let Method::PowerOfTwo = sets.method {
        return power_of_two_rows(ops, rows, &mut p.m, &mut sc.h0, p.stride, scales);
    }
    fields(ops, ty, rows, p.stride, &mut p.fg, sc);
    // Padding channels: zero parameters (and zero `e`, which the kernels of a tile prepared
    // unscaled turn into multipliers).
    let (m_len, fg_len, e_len) = (p.m.len(), p.fg.len(), sc.e.len());
    p.m[(n * per_row).min(m_len)..].fill(0);
    p.fg[(n * per_row).min(fg_len)..].fill([0.0; 2]);
    sc.e[(n * per_row).min(e_len)..].fill(0.0);
    if let Some(j) = sc.largest_half[..n].iter().position(|&t| t >= NON_FINITE) {
        let block = first_non_finite(ty, rows[j]).expect("a non-finite scale exists");
        return Err((j, block));
    }
    let per_row_factor = sc.top[..n]
        .iter()
        .zip(&mut sc.factor[..n])
        .zip(&mut sc.scale[..n]);
    match sets.method {
        Method::Table { .. } => {
            for ((&w_max, inv), s) in per_row_factor {
                (*inv, *s) = table_range(f32::from_bits(w_max));
            }
            if p.scaled {
                let fg = p.fg.chunks_exact_mut(per_row);
                for (fg, &inv) in fg.zip(&sc.factor[..n]) {
                    // [a_j, b_j] becomes [fl(a_j·inv_n), fl(b_j·inv_n)].
                    ops.scale(fg.as_flattened_mut(), inv);
                }
            }
        }
        Method::Rescale { c_max } => {
            let unit = rescale_unit(ty, c_max);
            for ((&top, u), s) in per_row_factor {
                let e_max = if ty == GgmlType::IQ4_NL {
                    finite_half_to_f32(top as u16)
                } else {
                    f32::from_bits(top)
                };
                *u = if e_max > 0.0 { unit / e_max } else { 0.0 };
                *s = c_max as f32 * e_max / 127.0;
            }
            let (m, factor) = (p.m.chunks_exact_mut(per_row), &sc.factor[..n]);
            if !p.scaled {
                // The kernels turn `e_j` into multipliers themselves.
            } else if ty == GgmlType::IQ4_NL {
                for ((m, h), &unit) in m.zip(sc.h0.chunks_exact(per_row)).zip(factor) {
                    ops.half_multipliers(h, unit, m);
                }
            } else {
                for ((m, e), &unit) in m.zip(sc.e.chunks_exact(per_row)).zip(factor) {
                    ops.multipliers(e, unit, m);
                }
            }
        }
        Method::PowerOfTwo => unreachable!("handled above"),
    }
    scales[..n].copy_from_slice(&sc.scale[..n]);
    Ok(())
}

/// Each row's sets (table types: `[a_j, b_j]` into `fg`; rescale types: `e_j` into the scratch's
/// `e`, IQ4_NL: its `d` fields into `h0`), the largest magnitude of its fp16 scale fields into
/// `largest_half` and the largest value its sets can take (`M_n`, `E_n`; binary32 bits, IQ4_NL:
/// fp16 bits) into `top`. One loop per type, as the shared scan's.
#[inline(always)]
fn fields(
    ops: impl ScanOps,
    ty: GgmlType,
    rows: &[&[u8]],
    stride: usize,
    fg: &mut [[f32; 2]],
    sc: &mut Scratch,
) {
    let found = sc.largest_half.iter_mut().zip(sc.top.iter_mut());
    macro_rules! each_row {
        ($items:expr, |$row:ident, $chunk:ident| $step:expr) => {
            for ((&$row, $chunk), (largest, top)) in rows.iter().zip($items).zip(found) {
                let (l, t): (u16, u32) = $step;
                (*largest, *top) = (l as u32, t);
            }
        };
    }
    match ty {
        GgmlType::Q5_1 => each_row!(fg.chunks_exact_mut(stride), |r, ab| ops.q5_1_values(r, ab)),
        GgmlType::Q5_K => each_row!(fg.chunks_exact_mut(stride), |r, ab| ops.q5_k_values(r, ab)),
        GgmlType::Q2_K => {
            each_row!(fg.chunks_exact_mut(2 * stride), |r, ab| ops
                .q2_k_values(r, ab))
        }
        GgmlType::Q3_K => {
            each_row!(sc.e.chunks_exact_mut(2 * stride), |r, e| ops
                .q3_k_values(r, e))
        }
        GgmlType::IQ4_NL => each_row!(sc.h0.chunks_exact_mut(stride), |r, h| {
            let largest = ops.halves::<18, 0>(r, h);
            (largest, largest as u32)
        }),
        GgmlType::IQ4_XS => {
            each_row!(sc.e.chunks_exact_mut(stride), |r, e| ops
                .iq4_xs_values(r, e))
        }
        _ => {
            let per_row = sc.e.len() / sc.rows;
            // One loop per type, so that each compiles with its block size and set layout
            // known.
            macro_rules! codebook {
                ($($t:ident),*) => {
                    match ty {
                        $(GgmlType::$t => each_row!(sc.e.chunks_exact_mut(per_row), |r, e| {
                            ops.codebook_values(GgmlType::$t, r, e)
                        }),)*
                        _ => unreachable!("{ty:?} is no codebook type"),
                    }
                };
            }
            codebook!(IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M)
        }
    }
}

/// MXFP4, row by row: `m_j = rne(2^(14 + x_j - x_max))` into `m`, `s_n = 2^(x_max - 128)/8`
/// (exact) into `scales`; padding rows get zero multipliers. `fields`: scratch for a row's
/// exponents.
#[inline(always)]
fn power_of_two_rows(
    ops: impl ScanOps,
    rows: &[&[u8]],
    m: &mut [i16],
    fields: &mut [u16],
    stride: usize,
    scales: &mut [f32],
) -> Result<(), (usize, usize)> {
    let mut params = m.chunks_exact_mut(stride);
    let x = &mut fields[..stride];
    for (j, ((row, m), scale)) in rows.iter().zip(&mut params).zip(scales).enumerate() {
        let x_max = ops.mxfp4_exponents(row, x);
        if x_max > MXFP4_E8M0_FINITE_MAX {
            let above = x.iter().position(|&x| x > MXFP4_E8M0_FINITE_MAX as u16);
            return Err((j, above.expect("found")));
        }
        ops.mxfp4_multipliers(x, x_max, m);
        *scale = e8m0_to_f32_half(x_max) * 0.125;
    }
    for m in params {
        m.fill(0);
    }
    Ok(())
}

/// The per-row steps of the set types' scan. Each default method is the definition (plain
/// loads, stores and arithmetic); the x86 paths, and for some the aarch64 one, override them in
/// explicit vector code. Each returns the largest magnitude bits (`h & 0x7fff`) of the row's
/// fp16 scale fields and the binary32 bits of the largest value its sets can take (`M_n`,
/// `E_n`); where a field is NaN or infinite, what it writes and that value are unspecified.
pub(in crate::inflate) trait SetOps: Copy {
    /// MXFP4: each block's E8M0 scale `x_j` into `x`; returns the largest, `x_max`.
    #[inline(always)]
    fn mxfp4_exponents(self, row: &[u8], x: &mut [u16]) -> u8 {
        let mut x_max = 0;
        for (x, blk) in x.iter_mut().zip(row.as_chunks::<{ BlockMxfp4::BYTES }>().0) {
            *x = blk[0] as u16;
            x_max = x_max.max(blk[0]);
        }
        x_max
    }

    /// MXFP4: `m_j = rne(2^(14 + x_j - x_max))` of the exponents `x` (none above `x_max`).
    #[inline(always)]
    fn mxfp4_multipliers(self, x: &[u16], x_max: u8, m: &mut [i16]) {
        for (m, &x) in m.iter_mut().zip(x) {
            let below = x_max as u32 - x as u32;
            // 2^-1 rounds to 0 (ties to even), and so does anything smaller.
            *m = if below <= 14 { 1 << (14 - below) } else { 0 };
        }
    }

    /// Q5_1: `ab[j] = [d, m]` of every block.
    #[inline(always)]
    fn q5_1_values(self, row: &[u8], ab: &mut [[f32; 2]]) -> (u16, u32) {
        let (mut largest, mut w_max) = (0, 0);
        for (ab, blk) in ab.iter_mut().zip(row.as_chunks::<24>().0) {
            let (d, m) = (half_at(blk, 0), half_at(blk, 2));
            largest = largest.max(d & 0x7fff).max(m & 0x7fff);
            let (a, b) = (finite_half_to_f32(d), finite_half_to_f32(m));
            *ab = [a, b];
            w_max = w_max.max(table_set_max(a, b, 31.0).to_bits());
        }
        (largest, w_max)
    }

    /// Q5_K: `[a_j, b_j] = [fl(d·sc_j), -fl(dmin·m_j)]` of every sub-block (Q4_K's header).
    #[inline(always)]
    fn q5_k_values(self, row: &[u8], ab: &mut [[f32; 2]]) -> (u16, u32) {
        let (mut largest, mut w_max) = (0, 0);
        for (ab, blk) in ab
            .as_chunks_mut::<8>()
            .0
            .iter_mut()
            .zip(row.as_chunks::<176>().0)
        {
            let (d, dmin) = (half_at(blk, 0), half_at(blk, 2));
            largest = largest.max(d & 0x7fff).max(dmin & 0x7fff);
            let (d, dmin) = (finite_half_to_f32(d), finite_half_to_f32(dmin));
            let (sc, mn) = q4k_scales_mins(blk[4..16].try_into().expect("12 bytes"));
            for ((ab, sc), mn) in ab.iter_mut().zip(sc).zip(mn) {
                let (a, b) = (d * sc as f32, -(dmin * mn as f32));
                *ab = [a, b];
                w_max = w_max.max(table_set_max(a, b, 31.0).to_bits());
            }
        }
        (largest, w_max)
    }

    /// Q2_K: `[a_j, b_j] = [fl(d·(sc_j & 15)), -fl(dmin·(sc_j >> 4))]` of every set of 16.
    #[inline(always)]
    fn q2_k_values(self, row: &[u8], ab: &mut [[f32; 2]]) -> (u16, u32) {
        let (mut largest, mut w_max) = (0, 0);
        for (ab, blk) in ab
            .as_chunks_mut::<16>()
            .0
            .iter_mut()
            .zip(row.as_chunks::<84>().0)
        {
            let (d, dmin) = (half_at(blk, 80), half_at(blk, 82));
            largest = largest.max(d & 0x7fff).max(dmin & 0x7fff);
            let (d, dmin) = (finite_half_to_f32(d), finite_half_to_f32(dmin));
            for (ab, &sc) in ab.iter_mut().zip(&blk[..16]) {
                let (a, b) = (d * (sc & 0x0f) as f32, -(dmin * (sc >> 4) as f32));
                *ab = [a, b];
                w_max = w_max.max(table_set_max(a, b, 3.0).to_bits());
            }
        }
        (largest, w_max)
    }

    /// Q3_K: `e_j = fl(d·(sc_j - 32))` of every set of 16.
    #[inline(always)]
    fn q3_k_values(self, row: &[u8], e: &mut [f32]) -> (u16, u32) {
        let (mut largest, mut e_max) = (0, 0);
        for (e, blk) in e
            .as_chunks_mut::<16>()
            .0
            .iter_mut()
            .zip(row.as_chunks::<110>().0)
        {
            let h = half_at(blk, 108);
            largest = largest.max(h & 0x7fff);
            let d = finite_half_to_f32(h);
            for (e, sc) in e
                .iter_mut()
                .zip(q3k_scales(blk[96..108].try_into().expect("12")))
            {
                *e = d * sc as f32;
                e_max = e_max.max(e.to_bits() & 0x7fff_ffff);
            }
        }
        (largest, e_max)
    }

    /// IQ4_XS: `e_j = fl(d·(ls_j - 32))` of every sub-block.
    #[inline(always)]
    fn iq4_xs_values(self, row: &[u8], e: &mut [f32]) -> (u16, u32) {
        let (mut largest, mut e_max) = (0, 0);
        for (e, blk) in e
            .as_chunks_mut::<8>()
            .0
            .iter_mut()
            .zip(row.as_chunks::<136>().0)
        {
            let h = half_at(blk, 0);
            largest = largest.max(h & 0x7fff);
            let d = finite_half_to_f32(h);
            let (high, low) = ([blk[2], blk[3]], blk[4..8].try_into().expect("4 bytes"));
            for (ib, e) in e.iter_mut().enumerate() {
                *e = d * (iq4xs_scale(ib, high, low) - 32) as f32;
                e_max = e_max.max(e.to_bits() & 0x7fff_ffff);
            }
        }
        (largest, e_max)
    }

    /// The codebook types (`ty`): `e_j` of every set (of 16 or 32 weights, in weight order).
    #[inline(always)]
    fn codebook_values(self, ty: GgmlType, row: &[u8], e: &mut [f32]) -> (u16, u32) {
        let per_block = e.len() / (row.len() / ty.block_bytes());
        let mut largest = 0;
        for (blk, e) in row
            .chunks_exact(ty.block_bytes())
            .zip(e.chunks_exact_mut(per_block))
        {
            let h = if ty == GgmlType::IQ1_M {
                iq1m_scale(blk[48..56].try_into().expect("8 bytes"))
            } else {
                half_at(blk, 0)
            };
            largest = largest.max(h & 0x7fff);
            codebook_sets(ty, finite_half_to_f32(h), blk, e);
        }
        // One pass over the row's sets, not a reduction per block.
        let e_max = e.iter().fold(0, |m, e| m.max(e.to_bits() & 0x7fff_ffff));
        (largest, e_max)
    }
}

/// `e_j` of the sets of one block of a codebook type with super-block scale `d`, in weight
/// order: the factor ggml multiplies the set's integer codes by (IQ1: `dl/8`, for the codes
/// `8·(grid ± 1/8)`), computed as ggml computes it, its small integers read straight from the
/// block's bytes (the fields of `quant`'s block structs).
#[inline(always)]
fn codebook_sets(ty: GgmlType, d: f32, blk: &[u8], e: &mut [f32]) {
    let u32_at = |at: usize| u32::from_le_bytes(blk[at..at + 4].try_into().expect("4 bytes"));
    match ty {
        GgmlType::IQ2_XXS => {
            for (ib, e) in e.iter_mut().enumerate() {
                *e = d * (0.5 + (u32_at(6 + 8 * ib) >> 28) as f32) * 0.25;
            }
        }
        GgmlType::IQ2_XS | GgmlType::IQ2_S => {
            let at = if ty == GgmlType::IQ2_XS { 66 } else { 74 };
            for (e, &sc) in e.chunks_exact_mut(2).zip(&blk[at..at + 8]) {
                e[0] = d * (0.5 + (sc & 0x0f) as f32) * 0.25;
                e[1] = d * (0.5 + (sc >> 4) as f32) * 0.25;
            }
        }
        GgmlType::IQ3_XXS => {
            for (ib, e) in e.iter_mut().enumerate() {
                *e = d * (0.5 + (u32_at(66 + 4 * ib) >> 28) as f32) * 0.5;
            }
        }
        GgmlType::IQ3_S => {
            for (ib, e) in e.iter_mut().enumerate() {
                let s = (blk[106 + ib / 2] >> (4 * (ib % 2))) & 0x0f;
                *e = d * (1 + 2 * s as i32) as f32;
            }
        }
        GgmlType::IQ1_S => {
            for (ib, e) in e.iter_mut().enumerate() {
                let s = (u16::from_le_bytes([blk[34 + 2 * ib], blk[35 + 2 * ib]]) >> 12) & 7;
                *e = d * (2 * s as i32 + 1) as f32 * 0.125;
            }
        }
        GgmlType::IQ1_M => {
            for (i, e) in e.iter_mut().enumerate() {
                let (ib, h) = (i / 2, i % 2);
                let at = 48 + 2 * (ib / 2);
                let sc = u16::from_le_bytes([blk[at], blk[at + 1]]) as i32;
                let s = (sc >> (6 * (ib % 2) + 3 * h)) & 7;
                *e = d * (2 * s + 1) as f32 * 0.125;
            }
        }
        _ => unreachable!("a codebook type"),
    }
}

/// The first block of `row` whose scale is NaN or infinite (fp16 fields: `d` before the second
/// field, as the shared scan).
fn first_non_finite(ty: GgmlType, row: &[u8]) -> Option<usize> {
    let blocks = || row.chunks_exact(ty.block_bytes());
    let non_finite = |h: u16| h & 0x7c00 == 0x7c00;
    let at = |offset: usize| blocks().position(|b| non_finite(half_at(b, offset)));
    match ty {
        GgmlType::Q5_1 | GgmlType::Q5_K => at(0).or_else(|| at(2)),
        GgmlType::Q2_K => at(80).or_else(|| at(82)),
        GgmlType::Q3_K => at(108),
        GgmlType::IQ1_M => {
            blocks().position(|b| non_finite(iq1m_scale(&b[48..56].try_into().expect("8 bytes"))))
        }
        _ => at(0),
    }
}

/// The fp16 field at byte `at` of `blk`, as bits.
#[inline(always)]
fn half_at(blk: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([blk[at], blk[at + 1]])
}
