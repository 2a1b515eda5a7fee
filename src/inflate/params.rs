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

/// The scan's working arrays for a whole tile. The row passes fill row-by-row arrays (row `j`
/// at `j·blocks` or `j·runs`, padding rows zero); one transpose takes them to tile order
/// (`r·rows + j`), where every remaining pass is a plain elementwise loop with one factor per
/// row: vectorized across the tile's rows, without a per-row reduction.
struct Scratch {
    /// Blocks and runs per row.
    blocks: usize,
    runs: usize,
    /// The first fp16 field of each block (the scale `d`), row by row.
    h0: Vec<u16>,
    /// Q4_1, Q4_K: the second fp16 field (`m`, `dmin`), row by row.
    h1: Vec<u16>,
    /// Q4_0, Q4_1, Q5_0, Q8_0: `h0`, `h1` in tile order.
    t0: Vec<u16>,
    t1: Vec<u16>,
    /// Q4_K: the 6-bit scale and min of each run; Q6_K: the 8-bit scale of each sub-block (two
    /// per run); row by row.
    sc: Vec<u8>,
    mn: Vec<u8>,
    /// Q4_K: `d`, `dmin` of each super-block as binary32, row by row; `e`: one of them per
    /// run.
    d: Vec<f32>,
    dmin: Vec<f32>,
    e: Vec<f32>,
    /// Q4_K: `a_j`, `b_j` of each run; Q6_K: `e` of each run's two sub-blocks; row by row,
    /// then in tile order.
    a: Vec<f32>,
    b: Vec<f32>,
    ta: Vec<f32>,
    tb: Vec<f32>,
    /// Per row: the largest scale magnitude (fp16 or binary32 bits), then the row's factor
    /// (`unit_n` or `inv_n`) and `s_n`.
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

/// Runs of 32 weights per Q4_K/Q6_K super-block.
const RUNS_PER_QK_K: usize = QK_K / 32;

impl TileParams {
    /// Parameters for tiles of `rows` rows of `k` weights of `ty`.
    pub fn new(ty: GgmlType, k: usize, rows: usize) -> TileParams {
        let (runs, blocks) = (k / 32, k / ty.block_elems());
        let per_block = matches!(
            ty,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0
        );
        let two_halves = matches!(ty, GgmlType::Q4_1 | GgmlType::Q4_K);
        let k_quant = matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K);
        let tile = |used: bool, n: usize| if used { n * rows } else { 0 };
        let m = match ty {
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => runs,
            GgmlType::Q6_K => 2 * runs,
            _ => 0,
        };
        TileParams {
            ty,
            rows,
            m: vec![0; m * rows],
            fg: vec![[0.0; 2]; tile(two_halves, runs)],
            scratch: Scratch {
                blocks,
                runs,
                h0: vec![0; tile(true, blocks)],
                h1: vec![0; tile(two_halves, blocks)],
                t0: vec![0; tile(per_block, blocks)],
                t1: vec![0; tile(ty == GgmlType::Q4_1, blocks)],
                sc: vec![0; tile(k_quant, if ty == GgmlType::Q6_K { 2 * runs } else { runs })],
                mn: vec![0; tile(ty == GgmlType::Q4_K, runs)],
                d: vec![0.0; tile(k_quant, blocks)],
                dmin: vec![0.0; tile(ty == GgmlType::Q4_K, blocks)],
                e: vec![0.0; tile(ty == GgmlType::Q4_K, runs)],
                a: vec![0.0; tile(k_quant, runs)],
                b: vec![0.0; tile(k_quant, runs)],
                ta: vec![0.0; tile(two_halves || k_quant, runs)],
                tb: vec![0.0; tile(two_halves || k_quant, runs)],
                top: vec![0; rows],
                factor: vec![0.0; rows],
                scale: vec![0.0; rows],
            },
        }
    }

    /// Fills the parameters of a tile whose first `rows.len()` rows are `rows` (the others are
    /// padding channels: all-zero parameters, so that every kernel writes zeros for them
    /// whatever bytes it reads as their row) and writes the rows' `s_n` into `scales`. Fails
    /// with (row, block) of the first NaN or infinite scale, in row order (within a row: `d`
    /// before `m` / `dmin`). `copy` does the strided copies.
    #[inline(always)]
    pub fn prepare(
        &mut self,
        copy: impl StridedCopy,
        rows: &[&[u8]],
        scales: &mut [f32],
    ) -> Result<(), (usize, usize)> {
        let (ty, n, tile_rows) = (self.ty, rows.len(), self.rows);
        let sc = &mut self.scratch;
        let (blocks, runs) = (sc.blocks, sc.runs);
        for (j, row) in rows.iter().enumerate() {
            sc.fields(copy, ty, row, j);
        }
        // Padding rows: zero fields, so zero parameters.
        if n < tile_rows {
            let h1_len = sc.h1.len();
            sc.h0[n * blocks..].fill(0);
            sc.h1[(n * blocks).min(h1_len)..].fill(0);
        }

        sc.top.fill(0);
        match ty {
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::Q4_1 => {
                copy.transpose16(&sc.h0, blocks, &mut sc.t0, tile_rows);
                let magnitude = |h: u16, _| (h & 0x7fff) as u32;
                reduce_rows(&mut sc.top, &sc.t0, &sc.t0, magnitude);
                if ty == GgmlType::Q4_1 {
                    copy.transpose16(&sc.h1, blocks, &mut sc.t1, tile_rows);
                    reduce_rows(&mut sc.top, &sc.t1, &sc.t1, magnitude);
                }
                // Finite halves order like their magnitude bits, and NaN/Inf have all exponent
                // bits set: a row maximum at or above 0x7c00 means a non-finite scale.
                if let Some(j) = sc.top.iter().position(|&t| t >= 0x7c00) {
                    return Err((j, sc.first_non_finite(j)));
                }
            }
            GgmlType::Q4_K | GgmlType::Q6_K => {
                for j in 0..n {
                    let at = j * blocks..(j + 1) * blocks;
                    largest_half(&sc.h0[at.clone()]).map_err(|b| (j, b))?;
                    if ty == GgmlType::Q4_K {
                        largest_half(&sc.h1[at]).map_err(|b| (j, b))?;
                    }
                }
                sc.per_run_values(ty, n);
                copy.transpose32(&sc.a, runs, &mut sc.ta, tile_rows);
                copy.transpose32(&sc.b, runs, &mut sc.tb, tile_rows);
            }
            GgmlType::F32 | GgmlType::F16 => unreachable!("checked by the caller"),
        }
        let (top, factor, scale) = (&sc.top, &mut sc.factor, &mut sc.scale);
        let per_row = top.iter().zip(factor.iter_mut()).zip(scale.iter_mut());
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
                block_multipliers(&mut self.m, &sc.t0, factor);
            }
            GgmlType::Q8_0 => {
                for ((&largest, unit), s) in per_row {
                    let e_max = finite_half_to_f32(largest as u16);
                    *unit = if e_max > 0.0 { Q8_0_UNIT / e_max } else { 0.0 };
                    *s = e_max;
                }
                block_multipliers(&mut self.m, &sc.t0, factor);
            }
            GgmlType::Q4_1 | GgmlType::Q4_K => {
                if ty == GgmlType::Q4_1 {
                    for (a, &h) in sc.ta.iter_mut().zip(&sc.t0) {
                        *a = finite_half_to_f32(h);
                    }
                    for (b, &h) in sc.tb.iter_mut().zip(&sc.t1) {
                        *b = finite_half_to_f32(h);
                    }
                }
                let (ta, tb) = (&sc.ta, &sc.tb);
                let top = &mut sc.top;
                top.fill(0);
                reduce_rows(top, ta, tb, |a, b| table_block_max(a, b).to_bits());
                let per_row = top.iter().zip(factor.iter_mut()).zip(scale.iter_mut());
                for ((&w_max, inv), s) in per_row {
                    (*inv, *s) = table_range(f32::from_bits(w_max));
                }
                map_rows(&mut self.fg, ta, tb, factor, |a, b, inv| [a * inv, b * inv]);
            }
            GgmlType::Q6_K => {
                let (ta, tb) = (&sc.ta, &sc.tb);
                let top = &mut sc.top;
                // |fl(d·sc_j)| = fl(|d|·|sc_j|), so this is E_n = max_j |e_j|.
                reduce_rows(top, ta, tb, |e0: f32, e1: f32| {
                    (e0.to_bits() & 0x7fff_ffff).max(e1.to_bits() & 0x7fff_ffff)
                });
                let per_row = top.iter().zip(factor.iter_mut()).zip(scale.iter_mut());
                for ((&e_max, unit), s) in per_row {
                    let e_max = f32::from_bits(e_max);
                    *unit = if e_max > 0.0 { Q6_K_UNIT / e_max } else { 0.0 };
                    *s = 32.0 * e_max / 127.0;
                }
                let m = self.m.as_chunks_mut::<2>().0;
                map_rows(m, ta, tb, factor, |e0, e1, unit| {
                    [multiplier(e0, unit), multiplier(e1, unit)]
                });
            }
            GgmlType::F32 | GgmlType::F16 => unreachable!("checked by the caller"),
        }
        scales[..n].copy_from_slice(&sc.scale[..n]);
        Ok(())
    }
}

/// `m_j = multiplier(d_j, unit_n)` of every block of a tile (`d_j` in tile order in `d`).
#[inline(always)]
fn block_multipliers(m: &mut [i16], d: &[u16], unit: &[f32]) {
    map_rows(m, d, d, unit, |d, _, unit| {
        multiplier(finite_half_to_f32(d), unit)
    });
}

/// Rows per strip of the tile-order passes: 16 consecutive rows of a run as fixed-size arrays,
/// one vector register wide.
const STRIP: usize = 16;

/// `top[j] = max(top[j], key(a, b))` over the items `a`, `b` of row `j` of two tile-order
/// arrays (`top.len()` rows). A strip's maxima stay in registers across the runs.
#[inline(always)]
fn reduce_rows<A: Copy, B: Copy>(top: &mut [u32], a: &[A], b: &[B], key: impl Fn(A, B) -> u32) {
    let rows = top.len();
    let runs = a.chunks_exact(rows).zip(b.chunks_exact(rows));
    let (strips, rest) = top.as_chunks_mut::<STRIP>();
    for (c, top) in strips.iter_mut().enumerate() {
        let mut acc = *top;
        for (a, b) in runs.clone() {
            let (a, b) = (&a.as_chunks::<STRIP>().0[c], &b.as_chunks::<STRIP>().0[c]);
            acc = std::array::from_fn(|k| acc[k].max(key(a[k], b[k])));
        }
        *top = acc;
    }
    let done = rows - rest.len();
    for (a, b) in runs {
        for ((t, &a), &b) in rest.iter_mut().zip(&a[done..]).zip(&b[done..]) {
            *t = (*t).max(key(a, b));
        }
    }
}

/// `out[i] = f(a[i], b[i], factor[j])` over tile-order arrays, `j` the row of item `i`
/// (`factor.len()` rows), a strip at a time.
#[inline(always)]
fn map_rows<A: Copy, B: Copy, O>(
    out: &mut [O],
    a: &[A],
    b: &[B],
    factor: &[f32],
    f: impl Fn(A, B, f32) -> O,
) {
    let rows = factor.len();
    let (factor_strips, factor_rest) = factor.as_chunks::<STRIP>();
    let runs = out
        .chunks_exact_mut(rows)
        .zip(a.chunks_exact(rows).zip(b.chunks_exact(rows)));
    for (out, (a, b)) in runs {
        let (out_strips, out_rest) = out.as_chunks_mut::<STRIP>();
        let strips = out_strips.iter_mut().zip(a.as_chunks::<STRIP>().0);
        for ((out, a), (b, factor)) in
            strips.zip(b.as_chunks::<STRIP>().0.iter().zip(factor_strips))
        {
            *out = std::array::from_fn(|k| f(a[k], b[k], factor[k]));
        }
        let done = rows - factor_rest.len();
        let rest = out_rest
            .iter_mut()
            .zip(&a[done..])
            .zip(&b[done..])
            .zip(factor_rest);
        for (((o, &a), &b), &x) in rest {
            *o = f(a, b, x);
        }
    }
}

/// The two strided copies of a scan, the steps a compiler does not vectorize well by itself:
/// the fp16 field of every block of a row into an array, and row-by-row arrays into tile order.
pub(super) trait StridedCopy: Copy {
    /// The fp16 field at byte `AT` of each `BB`-byte block of `row` into `out`, one per block.
    fn halves<const BB: usize, const AT: usize>(self, row: &[u8], out: &mut [u16]);

    /// `src` holds `rows` rows of `per_row` items; `dst[r·rows + j] = src[j·per_row + r]`.
    fn transpose16(self, src: &[u16], per_row: usize, dst: &mut [u16], rows: usize);

    /// [`StridedCopy::transpose16`] of 32-bit items.
    fn transpose32(self, src: &[f32], per_row: usize, dst: &mut [f32], rows: usize);
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
    fn transpose16(self, src: &[u16], per_row: usize, dst: &mut [u16], rows: usize) {
        transpose_plain(src, per_row, dst, rows, 0..rows, 0);
    }

    #[inline(always)]
    fn transpose32(self, src: &[f32], per_row: usize, dst: &mut [f32], rows: usize) {
        transpose_plain(src, per_row, dst, rows, 0..rows, 0);
    }
}

/// [`StridedCopy::transpose16`] of the items `items_from..` of rows `rows_of`, by plain loads
/// and stores (the SIMD versions' edges).
#[inline(always)]
pub(super) fn transpose_plain<T: Copy>(
    src: &[T],
    per_row: usize,
    dst: &mut [T],
    rows: usize,
    rows_of: std::ops::Range<usize>,
    items_from: usize,
) {
    for j in rows_of {
        let row = &src[j * per_row..(j + 1) * per_row];
        for (run, &v) in dst.chunks_exact_mut(rows).zip(row).skip(items_from) {
            run[j] = v;
        }
    }
}

impl Scratch {
    /// Row `j`'s scale fields (and, for the K-quants, its per-run values) into the row-by-row
    /// arrays.
    #[inline(always)]
    fn fields(&mut self, copy: impl StridedCopy, ty: GgmlType, row: &[u8], j: usize) {
        let (blocks, runs) = (self.blocks, self.runs);
        let h0 = &mut self.h0[j * blocks..(j + 1) * blocks];
        match ty {
            GgmlType::Q4_0 => copy.halves::<18, 0>(row, h0),
            GgmlType::Q5_0 => copy.halves::<22, 0>(row, h0),
            GgmlType::Q8_0 => copy.halves::<34, 0>(row, h0),
            GgmlType::Q4_1 => {
                copy.halves::<20, 0>(row, h0);
                copy.halves::<20, 2>(row, &mut self.h1[j * blocks..(j + 1) * blocks]);
            }
            GgmlType::Q4_K => {
                let h1 = &mut self.h1[j * blocks..(j + 1) * blocks];
                let sc = self.sc[j * runs..(j + 1) * runs]
                    .as_chunks_mut::<RUNS_PER_QK_K>()
                    .0;
                let mn = self.mn[j * runs..(j + 1) * runs]
                    .as_chunks_mut::<RUNS_PER_QK_K>()
                    .0;
                let sb = h0.iter_mut().zip(h1.iter_mut()).zip(sc.iter_mut().zip(mn));
                for (((h0, h1), (sc, mn)), blk) in sb.zip(row.as_chunks::<144>().0) {
                    (*h0, *h1) = (
                        u16::from_le_bytes([blk[0], blk[1]]),
                        u16::from_le_bytes([blk[2], blk[3]]),
                    );
                    (*sc, *mn) = q4k_scales_mins(blk[4..16].try_into().expect("12 bytes"));
                }
            }
            GgmlType::Q6_K => {
                let sc = self.sc[2 * j * runs..2 * (j + 1) * runs]
                    .as_chunks_mut::<16>()
                    .0;
                for ((h0, sc), blk) in h0.iter_mut().zip(sc).zip(row.as_chunks::<210>().0) {
                    *h0 = u16::from_le_bytes([blk[208], blk[209]]);
                    *sc = blk[192..208].try_into().expect("16 bytes");
                }
            }
            GgmlType::F32 | GgmlType::F16 => unreachable!("checked by the caller"),
        }
    }

    /// Q4_K: `a_j = fl(d·sc_j)`, `b_j = -fl(dmin·m_j)` of every run; Q6_K: `e` of its two
    /// sub-blocks, `fl(d·sc)`; rows `n..` zero.
    #[inline(always)]
    fn per_run_values(&mut self, ty: GgmlType, n: usize) {
        let (blocks, runs) = (self.blocks, self.runs);
        for (d, &h) in self.d[..n * blocks].iter_mut().zip(&self.h0) {
            *d = finite_half_to_f32(h);
        }
        // Q4_K in flat passes (each super-block's factor spread to its runs first): a loop over
        // super-blocks with an inner loop of 8 gets vectorized across super-blocks, with
        // byte-by-byte gathers, on AVX2.
        let (a, b) = (&mut self.a[..n * runs], &mut self.b[..n * runs]);
        if ty == GgmlType::Q4_K {
            for (dmin, &h) in self.dmin[..n * blocks].iter_mut().zip(&self.h1) {
                *dmin = finite_half_to_f32(h);
            }
            let spread = self.e[..n * runs].as_chunks_mut::<RUNS_PER_QK_K>().0;
            for (e, &d) in spread.iter_mut().zip(&self.d) {
                *e = [d; RUNS_PER_QK_K];
            }
            // ggml: w = fl(fl(d·sc)·q) - fl(dmin·m); negating the offset is exact.
            for ((a, &d), &sc) in a.iter_mut().zip(&self.e).zip(&self.sc) {
                *a = d * sc as f32;
            }
            let spread = self.e[..n * runs].as_chunks_mut::<RUNS_PER_QK_K>().0;
            for (e, &dmin) in spread.iter_mut().zip(&self.dmin) {
                *e = [dmin; RUNS_PER_QK_K];
            }
            for ((b, &dmin), &mn) in b.iter_mut().zip(&self.e).zip(&self.mn) {
                *b = -(dmin * mn as f32);
            }
        } else {
            let (a, b) = (
                a.as_chunks_mut::<RUNS_PER_QK_K>().0,
                b.as_chunks_mut::<RUNS_PER_QK_K>().0,
            );
            let sc = self.sc.as_chunks::<16>().0;
            // Run i of a super-block: sub-blocks 2i (its first 16 weights) and 2i + 1.
            for (((a, b), sc), &d) in a.iter_mut().zip(b).zip(sc).zip(&self.d) {
                let e: [f32; 16] = std::array::from_fn(|i| d * (sc[i] as i8) as f32);
                *a = std::array::from_fn(|i| e[2 * i]);
                *b = std::array::from_fn(|i| e[2 * i + 1]);
            }
        }
        self.a[n * runs..].fill(0.0);
        self.b[n * runs..].fill(0.0);
    }

    /// The first block of row `j` with a NaN or infinite `d`, else with one in `h1`.
    fn first_non_finite(&self, j: usize) -> usize {
        let bad = |h: &[u16]| h.iter().position(|&h| h & 0x7c00 == 0x7c00);
        let at = j * self.blocks..(j + 1) * self.blocks;
        bad(&self.h0[at.clone()])
            .or_else(|| self.h1.get(at).and_then(bad))
            .expect("a non-finite half exists")
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
/// index of the first such one.
#[inline(always)]
fn largest_half(h: &[u16]) -> Result<f32, usize> {
    // Finite halves order like their magnitude bits, and NaN/Inf have all exponent bits set,
    // so one integer max finds both the largest value and any non-finite one.
    let largest = h.iter().fold(0i16, |m, &h| m.max((h & 0x7fff) as i16));
    if largest >= 0x7c00 {
        let bad = h.iter().position(|&h| h & 0x7c00 == 0x7c00);
        return Err(bad.expect("a non-finite half exists"));
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

/// Largest `|w|` over the codes 0..=15 of a Q4_1/Q4_K block, `w = fl(fl(q·a) + b)`: `w` is
/// monotonic in `q`, so it is `|w|` at one end.
#[inline(always)]
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
