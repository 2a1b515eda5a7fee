//! The per-row half of the method (see the module docs): the row scale `s_n` and the per-block
//! parameters, computed from the block scales alone. One definition for every kernel path,
//! written as short passes over the tile's rows (gather the fp16 fields, one max per row, one
//! elementwise map per row), each step on one row a [`ScanOps`] method that the x86 paths
//! implement in explicit vector code: the kernel modules call [`TileParams::prepare`] from
//! functions compiled for their instruction set.

mod arith;
mod sets;

use arith::table_range;
pub(super) use arith::{
    finite_half_to_f32, fixed_codes, fixed_scales, multiplier, q4k_scales_mins, table_block_max,
    table_entry, table_fixed, table_set_max, table_value,
};
pub(super) use sets::SetOps;

use super::tile::RowMajor;
use crate::quant::grids::{KVALUES_IQ4NL, KVALUES_MXFP4};
use crate::quant::{GgmlType, QK_K};
use sets::Sets;

/// The parameters of one N-tile's rows, row by row (run `r` of tile row `j` at `j·stride + r`),
/// reused from tile to tile. Row by row, so that a row's scale fields need no transpose; each
/// step still runs over all the tile's rows before the next, so that no row waits for its own
/// reductions and divisions (they overlap across rows, or run 16 rows per vector).
pub(super) struct TileParams {
    ty: GgmlType,
    /// Items per row of every row-by-row array: the runs.
    stride: usize,
    /// Q15 multipliers `m_j`: Q4_0, Q5_0, Q8_0: block `r`'s at `j·stride + r`; Q6_K: sub-blocks
    /// `2r`, `2r + 1` (the two halves of run `r`) at `2(j·stride + r)`, `2(j·stride + r) + 1`.
    m: Vec<i16>,
    /// Q4_1, Q4_K: `[f_j, g_j] = [fl(a_j·inv_n), fl(b_j·inv_n)]` of run `r` at `j·stride + r`,
    /// or, after [`Self::prepare_unscaled`], still `[a_j, b_j]`.
    fg: Vec<[f32; 2]>,
    /// Whether `fg` holds `[f_j, g_j]` and Q6_K's `m` its multipliers (else only the scratch's
    /// `e` and factors hold Q6_K's parameters).
    scaled: bool,
    scratch: Scratch,
}

/// The scan's working arrays for a whole tile, row by row (`stride` items per row; Q6_K's `e`:
/// `2·stride`); padding rows are zeroed.
struct Scratch {
    rows: usize,
    /// The first fp16 field of each block (the scale `d`; Q4_1, Q4_K, Q6_K: only on the error
    /// path; IQ4_NL's `d`).
    h0: Vec<u16>,
    /// Q4_1, Q4_K: the second fp16 field (`m`, `dmin`; only on the error path).
    h1: Vec<u16>,
    /// Q6_K and the rescale types of [`Sets`]: `e` of each set (one or two per run).
    e: Vec<f32>,
    /// Per row: the largest magnitude bits of its fp16 scale fields, then the largest value its
    /// blocks can encode (`M_n`, `E_n`: fp16 bits for the rescale of a block scale, binary32
    /// bits otherwise), then the row's factor (`unit_n` or `inv_n`) and `s_n`.
    largest_half: Vec<u32>,
    top: Vec<u32>,
    factor: Vec<f32>,
    scale: Vec<f32>,
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
///
/// The rescale types of [`Sets`] stretch their codes (`|c| ≤ c_max`) by the smallest `k` that keeps
/// their multipliers within 16 bits (`127·2¹⁵/(k·c_max) ≤ 32767`, or 32768 clamped as Q8_0's),
/// so that `k·c_max` is close to 128; MXFP4's `16·12 = 192` with power-of-two multipliers.
pub(super) fn code_scale(ty: GgmlType) -> i32 {
    match ty {
        GgmlType::Q4_0 | GgmlType::MXFP4 => 16,
        GgmlType::Q5_0 => 8,
        GgmlType::Q3_K => 32,
        GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ2_S | GgmlType::IQ3_XXS => 3,
        GgmlType::IQ3_S => 9,
        GgmlType::IQ1_S | GgmlType::IQ1_M => 15,
        _ => 1,
    }
}

/// `code_scale·c(q)` for the `N` codes of a Q4_0 (16) or Q5_0 (32) block, or the 16 of the
/// rescale types whose 4-bit codes index a table (IQ4_NL, IQ4_XS, MXFP4).
#[inline]
pub(super) fn scaled_codes<const N: usize>(ty: GgmlType) -> [i16; N] {
    let code = |q: usize| match ty {
        GgmlType::IQ4_NL | GgmlType::IQ4_XS => KVALUES_IQ4NL[q] as i32,
        GgmlType::MXFP4 => KVALUES_MXFP4[q] as i32,
        _ => q as i32 - zero_point(ty),
    };
    std::array::from_fn(|q| (code(q) * code_scale(ty)) as i16)
}

/// `fl(unit / E_n)` scales the rescale types' multipliers.
const Q8_0_UNIT: f32 = 32768.0;
const Q6_K_UNIT: f32 = 32512.0;

/// Runs of 32 weights per Q4_K/Q6_K super-block.
const RUNS_PER_QK_K: usize = QK_K / 32;

/// Magnitude bits (`h & 0x7fff`) at or above which a half is NaN or infinite: finite halves
/// order like their magnitude bits, and NaN/Inf have all exponent bits set.
const NON_FINITE: u32 = 0x7c00;

impl TileParams {
    /// Parameters for tiles of `rows` rows of `k` weights of `ty`.
    pub fn new(ty: GgmlType, k: usize, rows: usize) -> TileParams {
        let stride = k / 32;
        let table = matches!(ty, GgmlType::Q4_1 | GgmlType::Q4_K);
        // Per run and tile row: multipliers, `[f, g]` pairs, the scan's `e`, fp16 fields.
        let (m, fg, e, h0) = match Sets::of(ty) {
            Some(sets) => sets.items(ty),
            None => match ty {
                GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => (1, 0, 0, 1),
                GgmlType::Q6_K => (2, 0, 2, 1),
                GgmlType::Q4_1 | GgmlType::Q4_K => (0, 1, 0, 1),
                _ => (0, 0, 0, 0),
            },
        };
        let per_tile = |items: usize| items * stride * rows;
        TileParams {
            ty,
            stride,
            m: vec![0; per_tile(m)],
            fg: vec![[0.0; 2]; per_tile(fg)],
            scaled: true,
            scratch: Scratch {
                rows,
                h0: vec![0; per_tile(h0)],
                h1: vec![0; per_tile(table as usize)],
                e: vec![0.0; per_tile(e)],
                largest_half: vec![0; rows],
                top: vec![0; rows],
                factor: vec![0.0; rows],
                scale: vec![0.0; rows],
            },
        }
    }

    /// Q4_0, Q5_0, Q8_0: each run's multiplier.
    pub fn m(&self) -> RowMajor<'_, i16> {
        RowMajor {
            items: &self.m,
            stride: self.stride,
        }
    }

    /// Q6_K: the multipliers of each run's two halves (after [`Self::prepare`]).
    pub fn m_pairs(&self) -> RowMajor<'_, [i16; 2]> {
        assert!(
            self.scaled || !matches!(self.ty, GgmlType::Q6_K | GgmlType::Q3_K),
            "m of a tile prepared unscaled"
        );
        RowMajor {
            items: self.m.as_chunks().0,
            stride: self.stride,
        }
    }

    /// Q4_1, Q4_K: each run's `[f_j, g_j]` (after [`Self::prepare`]).
    pub fn fg(&self) -> RowMajor<'_, [f32; 2]> {
        assert!(self.scaled, "fg of a tile prepared unscaled");
        RowMajor {
            items: &self.fg,
            stride: self.stride,
        }
    }

    /// Q2_K: the `[f_j, g_j]` of each run's two halves (after [`Self::prepare`]).
    pub fn fg_pairs(&self) -> RowMajor<'_, [[f32; 2]; 2]> {
        assert!(self.scaled, "fg of a tile prepared unscaled");
        RowMajor {
            items: self.fg.as_chunks().0,
            stride: self.stride,
        }
    }

    /// Q2_K after [`Self::prepare_unscaled`]: the `[a_j, b_j]` of each run's two halves; with
    /// row `j`'s `factors()[j]` they give `[f_j, g_j]` as for [`Self::ab`].
    #[cfg(target_arch = "x86_64")]
    pub fn ab_pairs(&self) -> RowMajor<'_, [[f32; 2]; 2]> {
        assert!(!self.scaled, "ab of a tile prepared scaled");
        RowMajor {
            items: self.fg.as_chunks().0,
            stride: self.stride,
        }
    }

    /// Q4_1, Q4_K after [`Self::prepare_unscaled`]: each run's `[a_j, b_j]`; with row `j`'s
    /// `factors()[j]` they give `[f_j, g_j] = [fl(a_j·inv_n), fl(b_j·inv_n)]`.
    #[cfg(target_arch = "x86_64")]
    pub fn ab(&self) -> RowMajor<'_, [f32; 2]> {
        assert!(!self.scaled, "ab of a tile prepared scaled");
        RowMajor {
            items: &self.fg,
            stride: self.stride,
        }
    }

    /// Q6_K, Q3_K after [`Self::prepare_unscaled`]: each run's `[e_j, e_j']` (its two
    /// halves'); with row `j`'s `factors()[j]` they give the multipliers `multiplier(e_j,
    /// unit_n)`.
    #[cfg(target_arch = "x86_64")]
    pub fn e_pairs(&self) -> RowMajor<'_, [f32; 2]> {
        assert!(!self.scaled, "e of a tile prepared scaled");
        RowMajor {
            items: self.scratch.e.as_chunks().0,
            stride: self.stride,
        }
    }

    /// Each tile row's factor: Q4_1, Q4_K, Q2_K: `inv_n`; Q6_K: `unit_n = fl(32512/E_n)`, Q3_K:
    /// `fl(U/E_n)` (0 for padding and all-zero rows).
    #[cfg(target_arch = "x86_64")]
    pub fn factors(&self) -> &[f32] {
        &self.scratch.factor
    }

    /// Fills the parameters of a tile whose first `rows.len()` rows are `rows` (the others are
    /// padding channels: all-zero parameters, so that every kernel writes zeros for them
    /// whatever bytes it reads as their row) and writes the rows' `s_n` into `scales`. Fails
    /// with (row, block) of the first NaN or infinite scale, in row order (within a row: `d`
    /// before `m` / `dmin`). `ops` does the steps that are per instruction set.
    #[inline(always)]
    pub fn prepare(
        &mut self,
        ops: impl ScanOps,
        rows: &[&[u8]],
        scales: &mut [f32],
    ) -> Result<(), (usize, usize)> {
        self.prepare_in(ops, rows, scales, true)
    }

    /// [`Self::prepare`], but Q4_1, Q4_K and Q2_K keep `[a_j, b_j]` ([`Self::ab`],
    /// [`Self::ab_pairs`]) and Q6_K and Q3_K their `e_j` ([`Self::e_pairs`]), and leave the
    /// multiplication by `inv_n` or the unit to the kernel, which does it as it loads them: a
    /// pass over the parameters, and the reload of what the scan just stored, fewer.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub fn prepare_unscaled(
        &mut self,
        ops: impl ScanOps,
        rows: &[&[u8]],
        scales: &mut [f32],
    ) -> Result<(), (usize, usize)> {
        self.prepare_in(ops, rows, scales, false)
    }

    #[inline(always)]
    fn prepare_in(
        &mut self,
        ops: impl ScanOps,
        rows: &[&[u8]],
        scales: &mut [f32],
        scale_fg: bool,
    ) -> Result<(), (usize, usize)> {
        if let Some(sets) = Sets::of(self.ty) {
            return sets::prepare(self, sets, ops, rows, scales, scale_fg);
        }
        let (ty, stride, n) = (self.ty, self.stride, rows.len());
        self.scaled = scale_fg;
        let sc = &mut self.scratch;
        // Q4_1 and Q4_K hold `[a_j, b_j]` in `fg` until the row's `inv_n` is known.
        let ab = &mut self.fg;
        sc.fields(ops, ty, rows, stride, ab);
        if n < sc.rows {
            // Padding channels: zero fields, so zero parameters.
            sc.zero_rows(n);
            if let Some(padding) = ab.get_mut(n * stride..) {
                padding.fill([0.0; 2]);
            }
        }
        if let Some(j) = sc.largest_half[..n].iter().position(|&t| t >= NON_FINITE) {
            return Err((j, sc.first_non_finite(ty, rows[j], j, stride)));
        }
        sc.factors(ty);
        let sc = &self.scratch;
        match ty {
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => {
                let rows = self.m.chunks_exact_mut(stride);
                for ((m, h), &unit) in rows.zip(sc.h0.chunks_exact(stride)).zip(&sc.factor) {
                    ops.half_multipliers(h, unit, m);
                }
            }
            GgmlType::Q4_1 | GgmlType::Q4_K if !scale_fg => {}
            GgmlType::Q4_1 | GgmlType::Q4_K => {
                for (fg, &inv) in self.fg.chunks_exact_mut(stride).zip(&sc.factor) {
                    // [a_j, b_j] becomes [fl(a_j·inv_n), fl(b_j·inv_n)].
                    ops.scale(fg.as_flattened_mut(), inv);
                }
            }
            GgmlType::Q6_K if !scale_fg => {}
            GgmlType::Q6_K => {
                let rows = self.m.chunks_exact_mut(2 * stride);
                for ((m, e), &unit) in rows.zip(sc.e.chunks_exact(2 * stride)).zip(&sc.factor) {
                    ops.multipliers(e, unit, m);
                }
            }
            _ => {
                unreachable!("F32, F16: checked by the caller; the types of `Sets`: their own scan")
            }
        }
        scales[..n].copy_from_slice(&sc.scale[..n]);
        Ok(())
    }
}

impl Scratch {
    /// Each row's scale fields (Q4_1, Q4_K: its `[a_j, b_j]` into `ab`; Q6_K: its `e`) into
    /// the row-by-row arrays, the largest magnitude of its fp16 fields into `largest_half` and
    /// the largest value its blocks can take (`M_n`, `E_n`; from finite fields) into `top`. One
    /// loop per type, over the rows' chunks of the arrays: no per-row dispatch or offsets.
    #[inline(always)]
    fn fields(
        &mut self,
        ops: impl ScanOps,
        ty: GgmlType,
        rows: &[&[u8]],
        stride: usize,
        ab: &mut [[f32; 2]],
    ) {
        let found = self.largest_half.iter_mut().zip(self.top.iter_mut());
        // A loop written out per type (not a closure, which would keep the x86 steps, built
        // for their instruction sets, from being inlined into it).
        macro_rules! each_row {
            ($items:expr, |$row:ident, $chunk:ident| $step:expr) => {
                for ((&$row, $chunk), (largest, top)) in rows.iter().zip($items).zip(found) {
                    let (l, t): (u16, u32) = $step;
                    (*largest, *top) = (l as u32, t);
                }
            };
        }
        let h0 = self.h0.chunks_exact_mut(stride);
        // The largest |d| is the largest fp16 magnitude.
        let same = |largest: u16| (largest, largest as u32);
        match ty {
            GgmlType::Q4_0 => each_row!(h0, |r, h| same(ops.halves::<18, 0>(r, h))),
            GgmlType::Q5_0 => each_row!(h0, |r, h| same(ops.halves::<22, 0>(r, h))),
            GgmlType::Q8_0 => each_row!(h0, |r, h| same(ops.halves::<34, 0>(r, h))),
            GgmlType::Q4_1 => {
                each_row!(ab.chunks_exact_mut(stride), |r, ab| ops.q4_1_values(r, ab))
            }
            GgmlType::Q4_K => {
                each_row!(ab.chunks_exact_mut(stride), |r, ab| ops.q4_k_values(r, ab))
            }
            GgmlType::Q6_K => {
                let e = self.e.chunks_exact_mut(2 * stride);
                each_row!(e, |r, e| ops.q6_k_values(r, e))
            }
            _ => {
                unreachable!("F32, F16: checked by the caller; the types of `Sets`: their own scan")
            }
        }
    }

    /// Rows `n..` of the scratch arrays: zero.
    fn zero_rows(&mut self, n: usize) {
        let from = |len: usize| n * len / self.rows;
        let (h0, h1, e) = (from(self.h0.len()), from(self.h1.len()), from(self.e.len()));
        self.h0[h0..].fill(0);
        self.h1[h1..].fill(0);
        self.e[e..].fill(0.0);
        self.largest_half[n..].fill(0);
        self.top[n..].fill(0);
    }

    /// Every row's factor (`unit_n` or `inv_n`) and `s_n` from its `top`, a strip of rows per
    /// vector.
    #[inline(always)]
    fn factors(&mut self, ty: GgmlType) {
        let per_row = self.top.iter().zip(&mut self.factor).zip(&mut self.scale);
        match ty {
            GgmlType::Q4_0 | GgmlType::Q5_0 => {
                for ((&largest, unit), s) in per_row {
                    // |w| <= |d|·zp for codes -zp..zp-1; the product with a power of two is
                    // exact.
                    let w_max = finite_half_to_f32(largest as u16) * zero_point(ty) as f32;
                    let (inv, s_n) = table_range(w_max);
                    // A power-of-two factor: exact, so m_j = rne(fl(d_j·inv_n)·2¹⁵/code_scale).
                    (*unit, *s) = (inv * (32768 / code_scale(ty)) as f32, s_n);
                }
            }
            GgmlType::Q8_0 => {
                for ((&largest, unit), s) in per_row {
                    let e_max = finite_half_to_f32(largest as u16);
                    *unit = if e_max > 0.0 { Q8_0_UNIT / e_max } else { 0.0 };
                    *s = e_max;
                }
            }
            GgmlType::Q4_1 | GgmlType::Q4_K => {
                for ((&w_max, inv), s) in per_row {
                    (*inv, *s) = table_range(f32::from_bits(w_max));
                }
            }
            GgmlType::Q6_K => {
                for ((&e_max, unit), s) in per_row {
                    let e_max = f32::from_bits(e_max);
                    *unit = if e_max > 0.0 { Q6_K_UNIT / e_max } else { 0.0 };
                    *s = 32.0 * e_max / 127.0;
                }
            }
            _ => {
                unreachable!("F32, F16: checked by the caller; the types of `Sets`: their own scan")
            }
        }
    }

    /// The first block of row `j` with a NaN or infinite `d`, else with one in its second fp16
    /// field.
    fn first_non_finite(&mut self, ty: GgmlType, row: &[u8], j: usize, stride: usize) -> usize {
        let at = j * stride..(j + 1) * stride;
        match ty {
            GgmlType::Q4_1 => {
                gather_halves::<20, 0>(row, &mut self.h0[at.clone()]);
                gather_halves::<20, 2>(row, &mut self.h1[at.clone()]);
            }
            GgmlType::Q4_K => {
                gather_halves::<144, 0>(row, &mut self.h0[at.clone()]);
                gather_halves::<144, 2>(row, &mut self.h1[at.clone()]);
            }
            GgmlType::Q6_K => gather_halves::<210, 208>(row, &mut self.h0[at.clone()]),
            _ => {}
        }
        let bad = |h: &[u16]| h.iter().position(|&h| h & 0x7c00 == 0x7c00);
        bad(&self.h0[at.clone()])
            .or_else(|| self.h1.get(at).and_then(bad))
            .expect("a non-finite half exists")
    }
}

/// The scan's steps on one row's arrays. Each default method is the definition (plain loads,
/// stores and arithmetic: the scalar path's, and the portable one the compiler vectorizes for
/// aarch64); the x86 paths override them with explicit vector code, each tested equal to the
/// definition bit for bit. Explicit, because left to itself the compiler vectorizes these short
/// row loops badly (across rows, with gathers, or with scalar remainders).
pub(super) trait ScanOps: SetOps {
    /// The fp16 field at byte `AT` of each `BB`-byte block of `row` into `out`, one per block;
    /// returns their largest magnitude bits (`h & 0x7fff`).
    #[inline(always)]
    fn halves<const BB: usize, const AT: usize>(self, row: &[u8], out: &mut [u16]) -> u16 {
        gather_halves::<BB, AT>(row, out);
        let blocks = (row.len() / BB).min(out.len());
        out[..blocks].iter().map(|&h| h & 0x7fff).max().unwrap_or(0)
    }

    /// Q4_K: `[a_j, b_j] = [fl(d·sc_j), -fl(dmin·m_j)]` of every run of `row` into `ab`;
    /// returns the largest magnitude bits (`h & 0x7fff`) of the row's `d` and `dmin` fields and
    /// the binary32 bits of `M_n`, the largest [`table_block_max`] of its runs. If a field is NaN
    /// or infinite, `ab` and `M_n` are unspecified.
    #[inline(always)]
    fn q4_k_values(self, row: &[u8], ab: &mut [[f32; 2]]) -> (u16, u32) {
        let ab = ab.as_chunks_mut::<RUNS_PER_QK_K>().0;
        let (mut largest, mut w_max) = (0, 0);
        for (ab, blk) in ab.iter_mut().zip(row.as_chunks::<144>().0) {
            let (d, dmin) = (
                u16::from_le_bytes([blk[0], blk[1]]),
                u16::from_le_bytes([blk[2], blk[3]]),
            );
            largest = largest.max(d & 0x7fff).max(dmin & 0x7fff);
            let (d, dmin) = (finite_half_to_f32(d), finite_half_to_f32(dmin));
            let (sc, mn) = q4k_scales_mins(blk[4..16].try_into().expect("12 bytes"));
            for ((ab, sc), mn) in ab.iter_mut().zip(sc).zip(mn) {
                // ggml: w = fl(fl(d·sc)·q) - fl(dmin·m); negating the offset is exact.
                let (a, b) = (d * sc as f32, -(dmin * mn as f32));
                *ab = [a, b];
                w_max = w_max.max(table_block_max(a, b).to_bits());
            }
        }
        (largest, w_max)
    }

    /// Q6_K: `e = fl(d·sc)` of every sub-block of `row` into `e` (two per run); returns the
    /// largest magnitude bits of the row's `d` fields and the binary32 bits of `E_n`, the
    /// largest `|e|`. If a `d` is NaN or infinite, `e` and `E_n` are unspecified.
    #[inline(always)]
    fn q6_k_values(self, row: &[u8], e: &mut [f32]) -> (u16, u32) {
        let (mut largest, mut e_max) = (0, 0);
        for (e, blk) in e
            .as_chunks_mut::<16>()
            .0
            .iter_mut()
            .zip(row.as_chunks::<210>().0)
        {
            // `d` is the block's last two bytes.
            let h = u16::from_le_bytes([blk[208], blk[209]]);
            largest = largest.max(h & 0x7fff);
            let d = finite_half_to_f32(h);
            for (e, &sc) in e.iter_mut().zip(&blk[192..208]) {
                *e = d * (sc as i8) as f32;
                // |fl(d·sc_j)| = fl(|d|·|sc_j|), so this is E_n = max_j |e_j|.
                e_max = e_max.max(e.to_bits() & 0x7fff_ffff);
            }
        }
        (largest, e_max)
    }

    /// Q4_1: `ab[j] = [a_j, b_j] = [d, m]` of every block of `row` as binary32 (exact for
    /// finite halves); returns the largest magnitude bits of the row's `d` and `m` fields and
    /// the binary32 bits of `M_n`, the largest [`table_block_max`]. If a field is NaN or
    /// infinite, `ab` and `M_n` are unspecified.
    #[inline(always)]
    fn q4_1_values(self, row: &[u8], ab: &mut [[f32; 2]]) -> (u16, u32) {
        let (mut largest, mut w_max) = (0, 0);
        for (ab, blk) in ab.iter_mut().zip(row.as_chunks::<20>().0) {
            let (d, m) = (
                u16::from_le_bytes([blk[0], blk[1]]),
                u16::from_le_bytes([blk[2], blk[3]]),
            );
            largest = largest.max(d & 0x7fff).max(m & 0x7fff);
            let (a, b) = (finite_half_to_f32(d), finite_half_to_f32(m));
            *ab = [a, b];
            w_max = w_max.max(table_block_max(a, b).to_bits());
        }
        (largest, w_max)
    }

    /// `m[i] = multiplier(d, unit)` of the finite halves `d = h[i]`.
    #[inline(always)]
    fn half_multipliers(self, h: &[u16], unit: f32, m: &mut [i16]) {
        for (m, &h) in m.iter_mut().zip(h) {
            *m = multiplier(finite_half_to_f32(h), unit);
        }
    }

    /// `m[i] = multiplier(e[i], unit)`.
    #[inline(always)]
    fn multipliers(self, e: &[f32], unit: f32, m: &mut [i16]) {
        for (m, &e) in m.iter_mut().zip(e) {
            *m = multiplier(e, unit);
        }
    }

    /// `x[i] = fl(x[i]·factor)`.
    #[inline(always)]
    fn scale(self, x: &mut [f32], factor: f32) {
        for x in x {
            *x *= factor;
        }
    }
}

/// [`ScanOps`] as defined: plain loads, stores and arithmetic.
#[derive(Clone, Copy)]
pub(super) struct PlainOps;

impl ScanOps for PlainOps {}
impl SetOps for PlainOps {}

/// The fp16 field at byte `AT` of each `BB`-byte block of `row` into `out`, one per block.
#[inline(always)]
pub(super) fn gather_halves<const BB: usize, const AT: usize>(row: &[u8], out: &mut [u16]) {
    for (h, blk) in out.iter_mut().zip(row.as_chunks::<BB>().0) {
        *h = u16::from_le_bytes(blk[AT..AT + 2].try_into().expect("2 bytes"));
    }
}

#[cfg(test)]
mod tests;
