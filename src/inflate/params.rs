//! The per-row half of the method (see the module docs): the row scale `s_n` and the per-block
//! parameters, computed from the block scales alone. One definition for every kernel path,
//! written as short passes over arrays (gather the fp16 fields, one max, one elementwise map) so
//! that each path's build of it vectorizes: the kernel modules call [`TileParams::prepare`]
//! from functions compiled for their instruction set.

use crate::quant::{GgmlType, K_SCALE_SIZE, QK_K};

/// The parameters of one N-tile's rows in tile order (run `r` of tile row `j` at `r·rows + j`,
/// so a kernel walking native B's order reads them as one stream), reused from tile to tile.
pub(super) struct TileParams {
    ty: GgmlType,
    /// Rows per tile: the stride of the tile-order arrays.
    rows: usize,
    /// Q15 multipliers `m_j`: Q4_0, Q5_0, Q8_0: block `r`'s at `r·rows + j`; Q6_K: sub-blocks
    /// `2r`, `2r + 1` (the two halves of run `r`) at `2(r·rows + j)`, `2(r·rows + j) + 1`.
    pub m: Vec<i16>,
    /// Q4_1, Q4_K: `[f_j, g_j] = [fl(a_j·inv_n), fl(b_j·inv_n)]` of run `r` at `r·rows + j`.
    pub fg: Vec<[f32; 2]>,
    scratch: Scratch,
}

/// The scan's working arrays for a whole tile, row by row (row `j`'s `per_row` values at
/// `j·per_row`), and per row.
struct Scratch {
    /// Values per row in `h0`, `h1`, `sc`, `mn`, `a`, `b`: blocks (Q4_0, Q4_1, Q5_0, Q8_0), runs
    /// (Q4_K) or sub-blocks of 16 (Q6_K).
    per_row: usize,
    /// The first fp16 field of each block (Q4_K, Q6_K: repeated for each run / sub-block).
    h0: Vec<u16>,
    /// Q4_1, Q4_K: the second fp16 field (`m`, `dmin`), laid out like `h0`.
    h1: Vec<u16>,
    /// Q4_K: the 6-bit scale of each run; Q6_K: the signed 8-bit scale of each sub-block.
    sc: Vec<u8>,
    /// Q4_K: the 6-bit min of each run.
    mn: Vec<u8>,
    /// Q4_1, Q4_K: `a_j`, `b_j`; Q6_K: `e_j` in `a`.
    a: Vec<f32>,
    b: Vec<f32>,
    /// The parameters row by row (`runs` per row, every tile row: padding rows zero), 32 bits
    /// each (a multiplier, two Q6_K multipliers, `f_j` and, in `rm2`, `g_j`), and the same
    /// transposed into tile order.
    rm: Vec<u32>,
    rm2: Vec<u32>,
    tm: Vec<u32>,
    tm2: Vec<u32>,
    /// Per row: the largest magnitude of `h0`, then `M_n` / `E_n`, then the row's factor
    /// (`unit_n` or `inv_n`).
    top: Vec<f32>,
    factor: Vec<f32>,
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

/// Runs of 32 weights per Q4_K/Q6_K super-block, and Q6_K sub-blocks of 16.
const RUNS_PER_QK_K: usize = QK_K / 32;
const Q6_K_SUBS: usize = QK_K / 16;

impl TileParams {
    /// Parameters for tiles of `rows` rows of `k` weights of `ty`.
    pub fn new(ty: GgmlType, k: usize, rows: usize) -> TileParams {
        let runs = k / 32;
        let per_row = match ty {
            GgmlType::Q4_K => runs,
            GgmlType::Q6_K => 2 * runs,
            _ => k / ty.block_elems(),
        };
        let per_tile = |used: bool| if used { per_row * rows } else { 0 };
        let (m, fg) = match ty {
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => (runs, 0),
            GgmlType::Q6_K => (2 * runs, 0),
            GgmlType::Q4_1 | GgmlType::Q4_K => (0, runs),
            GgmlType::F32 | GgmlType::F16 => (0, 0),
        };
        let two_halves = matches!(ty, GgmlType::Q4_1 | GgmlType::Q4_K);
        let k_quant = matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K);
        TileParams {
            ty,
            rows,
            m: vec![0; m * rows],
            fg: vec![[0.0; 2]; fg * rows],
            scratch: Scratch {
                per_row,
                h0: vec![0; per_tile(true)],
                h1: vec![0; per_tile(two_halves)],
                sc: vec![0; per_tile(k_quant)],
                mn: vec![0; per_tile(ty == GgmlType::Q4_K)],
                a: vec![0.0; per_tile(two_halves || ty == GgmlType::Q6_K)],
                b: vec![0.0; per_tile(two_halves)],
                rm: vec![0; runs * rows],
                rm2: vec![0; if two_halves { runs * rows } else { 0 }],
                tm: vec![0; runs * rows],
                tm2: vec![0; if two_halves { runs * rows } else { 0 }],
                top: vec![0.0; rows],
                factor: vec![0.0; rows],
            },
        }
    }

    /// Fills the parameters of a tile whose first `rows.len()` rows are `rows` (the others are
    /// padding channels: all-zero parameters, so that every kernel writes zeros for them
    /// whatever bytes it reads as their row) and writes the rows' `s_n` into `scales`. Fails
    /// with (row, block) of the first NaN or infinite scale, in row order. `copy` does the
    /// strided copies.
    #[inline(always)]
    pub fn prepare(
        &mut self,
        copy: impl StridedCopy,
        rows: &[&[u8]],
        scales: &mut [f32],
    ) -> Result<(), (usize, usize)> {
        let (ty, n) = (self.ty, rows.len());
        let sc = &mut self.scratch;
        let per_row = sc.per_row;
        // The row passes: each row's fields, then its largest scale magnitudes (row order gives
        // the first bad block).
        for (j, row) in rows.iter().enumerate() {
            let at = j * per_row..(j + 1) * per_row;
            sc.fields(copy, ty, row, at.clone());
            let per_block = match ty {
                GgmlType::Q4_K => RUNS_PER_QK_K,
                GgmlType::Q6_K => Q6_K_SUBS,
                _ => 1,
            };
            sc.top[j] = largest_half(&sc.h0[at.clone()], per_block).map_err(|b| (j, b))?;
            if !sc.h1.is_empty() {
                largest_half(&sc.h1[at], per_block).map_err(|b| (j, b))?;
            }
        }
        let (top, factor) = (&mut sc.top[..n], &mut sc.factor[..n]);
        let scales = &mut scales[..n];
        match ty {
            GgmlType::Q4_0 | GgmlType::Q5_0 => {
                for ((&largest, unit), s) in top.iter().zip(factor.iter_mut()).zip(scales) {
                    // |w| <= |d|·zp for codes -zp..zp-1; the product with a power of two is
                    // exact.
                    let (inv, s_n) = table_range(largest * zero_point(ty) as f32);
                    // A power-of-two factor: exact, so m_j = rne(fl(d_j·inv_n)·2¹⁵/code_scale).
                    (*unit, *s) = (inv * (32768 / code_scale(ty)) as f32, s_n);
                }
                self.block_multipliers(copy, n);
            }
            GgmlType::Q8_0 => {
                for ((&e_max, unit), s) in top.iter().zip(factor.iter_mut()).zip(scales) {
                    *unit = if e_max > 0.0 { Q8_0_UNIT / e_max } else { 0.0 };
                    *s = e_max;
                }
                self.block_multipliers(copy, n);
            }
            GgmlType::Q4_1 | GgmlType::Q4_K => {
                let (h0, h1) = (&sc.h0[..n * per_row], &sc.h1[..n * per_row]);
                let (a, b) = (&mut sc.a[..n * per_row], &mut sc.b[..n * per_row]);
                if ty == GgmlType::Q4_1 {
                    for (a, &h) in a.iter_mut().zip(h0) {
                        *a = finite_half_to_f32(h);
                    }
                    for (b, &h) in b.iter_mut().zip(h1) {
                        *b = finite_half_to_f32(h);
                    }
                } else {
                    // ggml: w = fl(fl(d·sc)·q) - fl(dmin·m); negating the offset is exact.
                    for ((a, &h), &sc) in a.iter_mut().zip(h0).zip(&sc.sc) {
                        *a = finite_half_to_f32(h) * sc as f32;
                    }
                    for ((b, &h), &mn) in b.iter_mut().zip(h1).zip(&sc.mn) {
                        *b = -(finite_half_to_f32(h) * mn as f32);
                    }
                }
                let rows_ab = a.chunks_exact(per_row).zip(b.chunks_exact(per_row));
                for (((a, b), inv), s) in rows_ab.zip(factor.iter_mut()).zip(scales) {
                    (*inv, *s) = table_range(tables_max(a, b));
                }
                let rows_ab = sc.a.chunks_exact(per_row).zip(sc.b.chunks_exact(per_row));
                let rows_fg = sc
                    .rm
                    .chunks_exact_mut(per_row)
                    .zip(sc.rm2.chunks_exact_mut(per_row));
                for (((a, b), inv), (f, g)) in rows_ab.zip(&sc.factor[..n]).zip(rows_fg) {
                    for (f, &a) in f.iter_mut().zip(a) {
                        *f = (a * inv).to_bits();
                    }
                    for (g, &b) in g.iter_mut().zip(b) {
                        *g = (b * inv).to_bits();
                    }
                }
                sc.rm[n * per_row..].fill(0);
                sc.rm2[n * per_row..].fill(0);
                copy.transpose(&sc.rm, per_row, &mut sc.tm, self.rows);
                copy.transpose(&sc.rm2, per_row, &mut sc.tm2, self.rows);
                for (fg, (&f, &g)) in self.fg.iter_mut().zip(sc.tm.iter().zip(&sc.tm2)) {
                    *fg = [f32::from_bits(f), f32::from_bits(g)];
                }
            }
            GgmlType::Q6_K => {
                let e = &mut sc.a[..n * per_row];
                for ((e, &h), &sc) in e.iter_mut().zip(&sc.h0).zip(&sc.sc) {
                    *e = finite_half_to_f32(h) * (sc as i8) as f32;
                }
                // |fl(d·sc_j)| = fl(|d|·|sc_j|), so this is E_n = max_j |e_j|.
                let rows_e = e.chunks_exact(per_row);
                for ((e, unit), s) in rows_e.zip(factor.iter_mut()).zip(scales) {
                    let e_max = largest_magnitude(e.iter().copied());
                    *unit = if e_max > 0.0 { Q6_K_UNIT / e_max } else { 0.0 };
                    *s = 32.0 * e_max / 127.0;
                }
                let runs = per_row / 2;
                let rows_e = sc.a.chunks_exact(per_row).zip(&sc.factor[..n]);
                for ((e, &unit), m) in rows_e.zip(sc.rm.chunks_exact_mut(runs)) {
                    for (m, e) in m.iter_mut().zip(e.as_chunks::<2>().0) {
                        // The two halves of run r as one 32-bit item, first in the low bits.
                        let [lo, hi] = e.map(|e| multiplier(e, unit) as u16 as u32);
                        *m = lo | hi << 16;
                    }
                }
                sc.rm[n * runs..].fill(0);
                copy.transpose(&sc.rm, runs, &mut sc.tm, self.rows);
                let pairs = self.m.as_chunks_mut::<2>().0;
                for (m, &t) in pairs.iter_mut().zip(&sc.tm) {
                    *m = [t as i16, (t >> 16) as i16];
                }
            }
            GgmlType::F32 | GgmlType::F16 => unreachable!("checked by the caller"),
        }
        Ok(())
    }

    /// `m_j = multiplier(d_j, unit_n)` of every block of the first `n` rows (`d_j` in `h0`,
    /// `unit_n` in `factor`), zero for the padding rows.
    #[inline(always)]
    fn block_multipliers(&mut self, copy: impl StridedCopy, n: usize) {
        let sc = &mut self.scratch;
        let per_row = sc.per_row;
        let rows_d = sc.h0.chunks_exact(per_row).zip(&sc.factor[..n]);
        for ((d, &unit), m) in rows_d.zip(sc.rm.chunks_exact_mut(per_row)) {
            for (m, &d) in m.iter_mut().zip(d) {
                *m = multiplier(finite_half_to_f32(d), unit) as u32;
            }
        }
        sc.rm[n * per_row..].fill(0);
        copy.transpose(&sc.rm, per_row, &mut sc.tm, self.rows);
        for (m, &t) in self.m.iter_mut().zip(&sc.tm) {
            *m = t as i16;
        }
    }
}

/// The two strided copies of a scan, the steps a compiler does not vectorize well by itself:
/// the fp16 field of every block of a row into an array, and row-by-row parameters into tile
/// order.
pub(super) trait StridedCopy: Copy {
    /// The fp16 field at byte `AT` of each `BB`-byte block of `row` into `out`, one per block.
    fn halves<const BB: usize, const AT: usize>(self, row: &[u8], out: &mut [u16]);

    /// `src` holds `rows` rows of `per_row` items; `dst[r·rows + j] = src[j·per_row + r]`.
    fn transpose(self, src: &[u32], per_row: usize, dst: &mut [u32], rows: usize);
}

/// [`StridedCopy`] by plain loads and stores.
#[derive(Clone, Copy)]
pub(super) struct PlainCopy;

impl StridedCopy for PlainCopy {
    #[inline(always)]
    fn halves<const BB: usize, const AT: usize>(self, row: &[u8], out: &mut [u16]) {
        gather_repeated::<BB, AT, 1>(row, out);
    }

    #[inline(always)]
    fn transpose(self, src: &[u32], per_row: usize, dst: &mut [u32], rows: usize) {
        transpose_plain(src, per_row, dst, rows, 0..rows, 0);
    }
}

/// [`StridedCopy::transpose`] of the items `runs_from..` of rows `rows_of`, by plain loads and
/// stores (the SIMD versions' edges).
#[inline(always)]
pub(super) fn transpose_plain(
    src: &[u32],
    per_row: usize,
    dst: &mut [u32],
    rows: usize,
    rows_of: std::ops::Range<usize>,
    runs_from: usize,
) {
    for j in rows_of {
        let row = &src[j * per_row..(j + 1) * per_row];
        for (run, &v) in dst.chunks_exact_mut(rows).zip(row).skip(runs_from) {
            run[j] = v;
        }
    }
}

impl Scratch {
    /// Copies row `row`'s scale fields into `at` of the row-by-row arrays.
    #[inline(always)]
    fn fields(
        &mut self,
        copy: impl StridedCopy,
        ty: GgmlType,
        row: &[u8],
        at: std::ops::Range<usize>,
    ) {
        let (h0, h1) = (&mut self.h0[at.clone()], &mut self.h1);
        match ty {
            GgmlType::Q4_0 => copy.halves::<18, 0>(row, h0),
            GgmlType::Q5_0 => copy.halves::<22, 0>(row, h0),
            GgmlType::Q8_0 => copy.halves::<34, 0>(row, h0),
            GgmlType::Q4_1 => {
                copy.halves::<20, 0>(row, h0);
                copy.halves::<20, 2>(row, &mut h1[at]);
            }
            GgmlType::Q4_K => {
                gather_repeated::<144, 0, RUNS_PER_QK_K>(row, h0);
                gather_repeated::<144, 2, RUNS_PER_QK_K>(row, &mut h1[at.clone()]);
                let subs = self.sc[at.clone()].as_chunks_mut::<8>().0.iter_mut();
                let subs = subs.zip(self.mn[at].as_chunks_mut::<8>().0);
                for ((sc, mn), blk) in subs.zip(row.as_chunks::<144>().0) {
                    (*sc, *mn) = q4k_scales_mins(blk[4..16].try_into().expect("12 bytes"));
                }
            }
            GgmlType::Q6_K => {
                gather_repeated::<210, 208, Q6_K_SUBS>(row, h0);
                let scales = self.sc[at].as_chunks_mut::<Q6_K_SUBS>().0;
                for (sc, blk) in scales.iter_mut().zip(row.as_chunks::<210>().0) {
                    *sc = blk[192..208].try_into().expect("16 bytes");
                }
            }
            GgmlType::F32 | GgmlType::F16 => unreachable!("checked by the caller"),
        }
    }
}

/// The fp16 field at byte `AT` of each `BB`-byte block of `row`, each written `REPEAT` times.
#[inline(always)]
fn gather_repeated<const BB: usize, const AT: usize, const REPEAT: usize>(
    row: &[u8],
    out: &mut [u16],
) {
    let out = out.as_chunks_mut::<REPEAT>().0;
    for (h, blk) in out.iter_mut().zip(row.as_chunks::<BB>().0) {
        *h = [u16::from_le_bytes([blk[AT], blk[AT + 1]]); REPEAT];
    }
}

/// The largest magnitude of the finite halves `h` as f32, or, if one is NaN or infinite, the
/// index of the first such block (`per_block` consecutive halves per block).
#[inline(always)]
fn largest_half(h: &[u16], per_block: usize) -> Result<f32, usize> {
    // Finite halves order like their magnitude bits, and NaN/Inf have all exponent bits set,
    // so one integer max finds both the largest value and any non-finite one.
    let largest = h.iter().fold(0i16, |m, &h| m.max((h & 0x7fff) as i16));
    if largest >= 0x7c00 {
        let bad = h.iter().position(|&h| h & 0x7c00 == 0x7c00);
        return Err(bad.expect("a non-finite half exists") / per_block);
    }
    Ok(finite_half_to_f32(largest as u16))
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

/// `M_n` of a Q4_1/Q4_K row: the largest [`table_block_max`] of its blocks.
#[inline(always)]
fn tables_max(a: &[f32], b: &[f32]) -> f32 {
    largest_magnitude(a.iter().zip(b).map(|(&a, &b)| table_block_max(a, b)))
}

/// Largest `|w|` over the codes 0..=15 of a Q4_1/Q4_K block, `w = fl(fl(q·a) + b)`: `w` is
/// monotonic in `q`, so it is `|w|` at one end.
#[inline(always)]
fn table_block_max(a: f32, b: f32) -> f32 {
    larger(b.abs(), (15.0 * a + b).abs())
}

/// The largest `|x|` of finite values. Non-negative binary32 values order like their bits, so
/// this is an integer max, which (unlike a float max) the compiler may reassociate: it vectorizes.
#[inline(always)]
fn largest_magnitude(x: impl Iterator<Item = f32>) -> f32 {
    f32::from_bits(x.fold(0, |m, x| m.max(x.to_bits() & 0x7fff_ffff)))
}

/// All eight 6-bit scales and mins of a Q4_K super-block at once, with 32-bit word operations
/// (the same unpacking as [`crate::quant::q4k_scale_min`], which decodes one at a time; tested equal).
#[inline(always)]
fn q4k_scales_mins(packed: &[u8; K_SCALE_SIZE]) -> ([u8; 8], [u8; 8]) {
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
