//! The outlier split's f32 weight columns, decoded exactly as ggml dequantizes them, straight from
//! the plain or repacked blocks: [`super::ExpertWeights::dequantize_columns`] and
//! [`super::dequantize_columns_in`] validate, this module decodes.
//!
//! Every weight is `w = fl(c·a)`, `fl(fl(c·a) + b)` (Q4_1) or `fl(fl(c·a) − b)` (Q4_K) with an
//! integer code `c` and two parameters of its row's (sub-)block: `a = d` and `b = 0` (Q4_0,
//! Q5_0, Q8_0), `a = d`, `b = m` (Q4_1), `a = fl(d·sc)`, `b = fl(dmin·m)` (Q4_K, sub-blocks of
//! 32), `a = fl(d·sc)` (Q6_K, sub-blocks of 16): the products of
//! [`crate::quant::dequantize_element`] in its order (a product of two is the same either way
//! round), so the same bits. One exception, by the language: where Q4_1's sum adds two NaNs
//! (`d` NaN, or infinite times a zero code, and `m` NaN), Rust leaves open which payload the
//! result carries, and the compiler picks differently from loop to loop; the weight is a NaN
//! either way.
//!
//! The columns are visited block by block (sorted by channel: a block's columns, and a
//! sub-block's, come together), in strips of [`STRIP`] rows: per strip and (sub-)block the rows'
//! parameters are computed once, then each column's weights of the strip are decoded straight
//! from the bytes by offset arithmetic ([`Loc`]: where a byte of the plain block lies in either
//! layout) into its slice of the output, contiguous. One loop per type and layout, no dispatch per
//! weight; the SIMD paths (`x86.rs`, `neon.rs`) take eight rows per step, the scalar code here is their
//! reference and does the rows of a strip that do not fill a step.

/// The (type, rows, chunk) → kernel table of a SIMD path: the module that expands it defines the
/// kernels `q4_0`, `q4_1`, ... and `unsafe_call!` (why calling them is sound on that path).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
macro_rules! kernel_table {
    ($src:expr) => {{
        let k: Kernel = match ($src.ty, $src.rows, $src.chunk) {
            (GgmlType::Q4_0, 1, _) => |s, p, o| unsafe_call!(q4_0::<1, 0>(s, p, o)),
            (GgmlType::Q4_0, 4, 4) => |s, p, o| unsafe_call!(q4_0::<4, 4>(s, p, o)),
            (GgmlType::Q4_0, 4, 8) => |s, p, o| unsafe_call!(q4_0::<4, 8>(s, p, o)),
            (GgmlType::Q4_0, 8, 8) => |s, p, o| unsafe_call!(q4_0::<8, 8>(s, p, o)),
            (GgmlType::Q4_1, 1, _) => |s, p, o| unsafe_call!(q4_1(s, p, o)),
            (GgmlType::Q5_0, 1, _) => |s, p, o| unsafe_call!(q5_0(s, p, o)),
            (GgmlType::Q8_0, 1, _) => |s, p, o| unsafe_call!(q8_0::<1, 0>(s, p, o)),
            (GgmlType::Q8_0, 4, 4) => |s, p, o| unsafe_call!(q8_0::<4, 4>(s, p, o)),
            (GgmlType::Q8_0, 4, 8) => |s, p, o| unsafe_call!(q8_0::<4, 8>(s, p, o)),
            (GgmlType::Q4_K, 1, _) => |s, p, o| unsafe_call!(q4_k::<1, 0>(s, p, o)),
            (GgmlType::Q4_K, 8, 4) => |s, p, o| unsafe_call!(q4_k::<8, 4>(s, p, o)),
            (GgmlType::Q4_K, 8, 8) => |s, p, o| unsafe_call!(q4_k::<8, 8>(s, p, o)),
            (GgmlType::Q6_K, 1, _) => |s, p, o| unsafe_call!(q6_k::<1, 0>(s, p, o)),
            (GgmlType::Q6_K, 8, 4) => |s, p, o| unsafe_call!(q6_k::<8, 4>(s, p, o)),
            (GgmlType::Q6_K, 8, 8) => |s, p, o| unsafe_call!(q6_k::<8, 8>(s, p, o)),
            _ => return None,
        };
        Some(k)
    }};
}

/// Defines a SIMD path's `drive` (`x86.rs`, `neon.rs`; with the path's target features, its vector
/// type of [`LANES`] f32, that vector's zero and its store): the reference's loops
/// ([`scalar_runs`]) eight rows at a time. Per strip and block, `block(r, x)` of each vector's
/// rows `r..r + 8` (what the block's runs share); per run, `params(block, r, run, set)`, the rows'
/// `(a, b)` (`set`: [`Decode::set`]); per column, `prepare(column, r0, x, vectors)` of the strip's
/// vectors from row `r0`, then `weight(prepared, u, a, b)` of vector `u`. The rows of a strip that
/// fill no vector take the reference. A macro, not one generic function: the loop's closure must
/// be written inside the `#[target_feature]` function to compile with its features (as a generic
/// function's closure the kernels' intrinsics stayed calls, 5× slower).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
macro_rules! simd_drive {
    ($features:literal, $vector:ty, $zero:expr, $store:ident) => {
        #[allow(clippy::too_many_arguments)]
        #[inline]
        #[target_feature(enable = $features)]
        fn drive<D: Decode, const R: usize, const C: usize, B: Copy, P>(
            src: &Source,
            plan: &Plan,
            out: &mut [f32],
            zero: B,
            mut block: impl FnMut(usize, usize) -> B,
            mut params: impl FnMut(&B, usize, &Run, Loc) -> ($vector, $vector),
            mut prepare: impl FnMut(&Column, usize, usize, usize) -> P,
            mut weight: impl FnMut(&P, usize, $vector, $vector) -> $vector,
        ) {
            let n = src.n;
            super::walk(src, plan, |rows, runs| {
                let units = rows.len() / LANES;
                let x = runs[0].x;
                let first = |u: usize| rows.start + u * LANES;
                let mut shared = [zero; super::UNITS];
                for (u, b) in shared[..units].iter_mut().enumerate() {
                    *b = block(first(u), x);
                }
                for run in runs {
                    let set = D::set(src, run.s);
                    let (mut a, mut b) = ([$zero; super::UNITS], [$zero; super::UNITS]);
                    for u in 0..units {
                        (a[u], b[u]) = params(&shared[u], first(u), run, set);
                    }
                    for col in &plan.columns[run.range.clone()] {
                        let prepared = prepare(col, rows.start, x, units);
                        let dst = &mut out[col.slot * n + rows.start..][..units * LANES];
                        for (u, dst) in dst.chunks_exact_mut(LANES).enumerate() {
                            $store(dst, weight(&prepared, u, a[u], b[u]));
                        }
                    }
                }
                if units * LANES < rows.len() {
                    super::scalar_runs::<D, R, C>(src, plan, first(units)..rows.end, runs, out);
                }
            })
        }
    };
}

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
mod x86;

use super::params::finite_half_to_f32;
use super::repacked::{fields, Field, Layout};
use super::ExpertWeights;
use crate::isa::Isa;
use crate::quant::fp16::f16_to_f32;
use crate::quant::{q4k_scale_min, GgmlType, K_SCALE_SIZE};
use std::ops::Range;

/// Rows per pass over the blocks: each column's part of a strip is 256 contiguous bytes of the
/// output (the columns are `n` floats apart, so a pass of a few rows would write partial cache
/// lines, all in the same cache set), and the strip's multi-blocks of one block stay in L1 while
/// all its columns are read from them.
const STRIP: usize = 64;

/// Rows per step of the SIMD paths, and steps per strip.
const LANES: usize = 8;
const UNITS: usize = STRIP / LANES;

/// Where byte `p` of a row's plain block lies: row `r`'s block `x` holds it at
/// `(r / R)·row_step + (r % R)·lane + x·block_step + at` ([`Source`]; `R` rows per group, 1 and
/// `lane = 0` in plain blocks). In a repacked layout `lane` is the piece size of the byte's field
/// and `piece` the byte's place in its piece (0 in plain blocks).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Loc {
    at: usize,
    lane: usize,
    piece: usize,
}

/// One requested column: where its weights go, and the byte(s) holding its codes.
#[derive(Clone, Copy, Debug, Default)]
struct Column {
    /// Its weights go to `out[slot·n..][..n]`.
    slot: usize,
    /// The code's bytes: the quant byte, and Q5_0's and Q6_K's high bits.
    q: [Loc; 2],
    /// Right shifts that bring the code's bits of `q` to bit 0.
    shift: [u32; 2],
    /// XOR of the quant byte as stored (Q4_0 repacked: 0x88).
    flip: u8,
}

/// The columns in channel order, in runs of one parameter set (a block's, or a sub-block's),
/// the runs of one block together.
struct Plan {
    columns: Vec<Column>,
    runs: Vec<Run>,
    /// `runs[range]` for each block with columns, in order.
    blocks: Vec<Range<usize>>,
}

/// Columns `columns[range]` of the plan: those of block `x`'s parameter set `s`.
#[derive(Clone, Debug)]
struct Run {
    x: usize,
    s: usize,
    range: Range<usize>,
}

/// A validated expert as the decoders read it.
struct Source<'a> {
    data: &'a [u8],
    ty: GgmlType,
    n: usize,
    /// Rows per interleaved group (1 in plain blocks) and bytes per quant piece (0).
    rows: usize,
    chunk: usize,
    /// Bytes from one group (plain: one row) to the next.
    row_step: usize,
    /// Bytes from one (multi-)block to the next.
    block_step: usize,
    /// The repacked layout's fields (none in plain blocks).
    fields: Vec<Field>,
    /// Where the block's fp16 fields lie: `d`, and Q4_1's `m` or Q4_K's `dmin`.
    d: Loc,
    m: Loc,
}

impl Source<'_> {
    /// Where plain byte `p` of a block lies.
    fn loc(&self, p: usize) -> Loc {
        for field in &self.fields {
            if let Field::Interleaved {
                plain,
                packed,
                len,
                chunk,
                ..
            } = *field
            {
                if (plain..plain + len).contains(&p) {
                    let i = p - plain;
                    return Loc {
                        at: packed + i / chunk * self.rows * chunk + i % chunk,
                        lane: chunk,
                        piece: i % chunk,
                    };
                }
            }
        }
        Loc {
            at: p,
            lane: 0,
            piece: 0,
        }
    }

    /// The XOR of plain byte `p` as stored.
    fn flip(&self, p: usize) -> u8 {
        self.fields
            .iter()
            .find_map(|f| match *f {
                Field::Interleaved {
                    plain, len, flip, ..
                } if (plain..plain + len).contains(&p) => Some(flip),
                _ => None,
            })
            .unwrap_or(0)
    }

    /// Where the Q4_K scale packing of sub-block `s` of the group's rows lies (repacked; the
    /// rows' own 12 bytes in plain blocks).
    fn q4k_scales(&self, s: usize) -> Loc {
        let packed = self.fields.iter().find_map(|f| match *f {
            Field::Q4KScales { packed, .. } => Some(packed),
            _ => None,
        });
        Loc {
            at: packed.map_or(4, |p| p + s * K_SCALE_SIZE),
            ..Loc::default()
        }
    }

    /// Offset of row `r`'s byte at `loc` in block `x` (`R` the layout's rows per group).
    #[inline(always)]
    fn offset<const R: usize>(&self, r: usize, x: usize, loc: Loc) -> usize {
        r / R * self.row_step + r % R * loc.lane + x * self.block_step + loc.at
    }

    #[inline(always)]
    fn byte<const R: usize>(&self, r: usize, x: usize, loc: Loc) -> u8 {
        self.data[self.offset::<R>(r, x, loc)]
    }
}

/// One byte of a column's block for each row of a strip's vectors of [`LANES`] rows (the SIMD
/// paths). Vector `u` reads from [`Window::vector`]`(u)`, `step` bytes after vector `u - 1`:
/// in plain blocks the four bytes at each `j·row_step` (`span = 7·row_step + 4` bytes in all);
/// in eight rows of 4-byte pieces 32 bytes (`span = 32`); otherwise the bytes at 0 and at
/// `second` (groups of four rows: the next group's, 16 bytes each for 4-byte pieces; 8-byte
/// pieces: the next four rows', 32 bytes each): `span = second + 16` or `second + 32`. The
/// window is `(units - 1)·step + span` bytes. Each row's bits start `bits` into its bytes.
#[derive(Clone, Copy)]
struct Window<'a> {
    bytes: &'a [u8],
    step: usize,
    second: usize,
    row_step: usize,
    bits: u32,
    units: usize,
}

impl Window<'_> {
    /// Where vector `u` reads its `span` bytes: inside the window, which [`Source::window`]
    /// makes `(units - 1)·step + span` long, for the `u < units` this checks.
    #[inline(always)]
    fn vector(&self, u: usize) -> *const u8 {
        assert!(u < self.units, "a vector of the strip");
        self.bytes.as_ptr().wrapping_add(u * self.step)
    }
}

impl Source<'_> {
    /// Byte `loc` of block `x` for the rows of vectors `0..units` (rows `r0 + 8u..`), the code
    /// `shift` more bits into it (`R` rows per group, `C` bytes per piece; `R = 1` plain).
    #[inline(always)]
    fn window<const R: usize, const C: usize>(
        &self,
        r0: usize,
        units: usize,
        x: usize,
        loc: Loc,
        shift: u32,
    ) -> Window<'_> {
        let (first, step, skip, span) = match (R, C) {
            (1, _) => {
                // The word must end inside the block: the last bytes' word starts earlier.
                let at = loc.at.min(self.ty.block_bytes() - 4);
                let first = r0 * self.row_step + x * self.block_step + at;
                let span = (LANES - 1) * self.row_step + 4;
                (first, LANES * self.row_step, loc.at - at, span)
            }
            (8 | 4, 4 | 8) => {
                // From row 0's piece of the vector's first group.
                let first = r0 / R * self.row_step + x * self.block_step + loc.at - loc.piece;
                let span = if R == 4 { self.row_step } else { 0 } + R * C;
                (first, LANES / R * self.row_step, loc.piece, span)
            }
            _ => unreachable!("no layout has {R} rows of {C}-byte pieces"),
        };
        let len = units.checked_sub(1).map_or(0, |u| u * step + span);
        Window {
            bytes: &self.data[first..first + len],
            step,
            second: if R == 4 { self.row_step } else { 32 },
            row_step: self.row_step,
            bits: (8 * skip) as u32 + shift,
            units,
        }
    }
}

/// Decodes `columns` of `w` (validated: a type and layout it can be in, whole row groups, the
/// data long enough, every column `< k`, `out` at least `columns.len()·n`) on kernel path `isa`
/// (available).
pub(super) fn decode(
    isa: Isa,
    layout: Layout,
    w: &ExpertWeights,
    columns: &[usize],
    out: &mut [f32],
) {
    let (rows, chunk, row_step, block_step, fields) = match layout {
        Layout::Plain => (1, 0, w.row_stride, w.ty.block_bytes(), Vec::new()),
        Layout::Repacked { rows, chunk } => (
            rows,
            chunk,
            rows * w.row_stride,
            rows * w.ty.block_bytes(),
            fields(w.ty, rows, chunk),
        ),
    };
    let mut src = Source {
        data: w.data,
        ty: w.ty,
        n: w.n,
        rows,
        chunk,
        row_step,
        block_step,
        fields,
        d: Loc::default(),
        m: Loc::default(),
    };
    let d = if w.ty == GgmlType::Q6_K { 208 } else { 0 };
    (src.d, src.m) = (src.loc(d), src.loc(2));
    let plan = plan(&src, columns);
    kernel(isa, &src)(&src, &plan, out);
}

/// Weights per parameter set of `ty`: Q4_K's sub-blocks of 32 and Q6_K's of 16, else the block.
fn set_elems(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q6_K => 16,
        _ => 32,
    }
}

/// The columns in channel order, in runs of one parameter set, each located.
fn plan(src: &Source, columns: &[usize]) -> Plan {
    let (be, set) = (src.ty.block_elems(), set_elems(src.ty));
    let mut order: Vec<usize> = (0..columns.len()).collect();
    order.sort_by_key(|&i| columns[i]);
    let mut plan = Plan {
        columns: Vec::with_capacity(columns.len()),
        runs: Vec::new(),
        blocks: Vec::new(),
    };
    for (i, slot) in order.into_iter().enumerate() {
        let (x, e) = (columns[slot] / be, columns[slot] % be);
        plan.columns.push(locate(src, slot, e));
        match plan.runs.last_mut() {
            Some(run) if (run.x, run.s) == (x, e / set) => run.range.end = i + 1,
            last => {
                let new_block = last.is_none_or(|run| run.x != x);
                plan.runs.push(Run {
                    x,
                    s: e / set,
                    range: i..i + 1,
                });
                let r = plan.runs.len() - 1;
                match plan.blocks.last_mut() {
                    Some(block) if !new_block => block.end = r + 1,
                    _ => plan.blocks.push(r..r + 1),
                }
            }
        }
    }
    plan
}

/// Element `e` of a block, for output slot `slot`, located: the bytes of its code and their
/// shifts.
fn locate(src: &Source, slot: usize, e: usize) -> Column {
    let (bytes, shift): ([usize; 2], [u32; 2]) = match src.ty {
        GgmlType::Q4_0 => ([2 + e % 16, 0], [4 * (e / 16) as u32, 0]),
        GgmlType::Q4_1 => ([4 + e % 16, 0], [4 * (e / 16) as u32, 0]),
        GgmlType::Q5_0 => (
            [6 + e % 16, 2 + e / 8],
            [4 * (e / 16) as u32, (e % 8) as u32],
        ),
        GgmlType::Q8_0 => ([2 + e, 0], [0, 0]),
        GgmlType::Q4_K => {
            let (chunk, l) = (e / 64, e % 64);
            ([16 + chunk * 32 + l % 32, 0], [4 * (l / 32) as u32, 0])
        }
        GgmlType::Q6_K => {
            let (h, quarter, l) = (e / 128, e % 128 / 32, e % 32);
            (
                [h * 64 + l + 32 * (quarter % 2), 128 + h * 32 + l],
                [4 * (quarter / 2) as u32, 2 * quarter as u32],
            )
        }
        _ => unreachable!("validated: a type the engine takes"),
    };
    Column {
        slot,
        q: bytes.map(|p| src.loc(p)),
        shift,
        flip: src.flip(bytes[0]),
    }
}

/// Decodes a plan's columns into the output.
type Kernel = fn(&Source, &Plan, &mut [f32]);

/// The kernel for `src`'s type and layout on `isa`.
fn kernel(isa: Isa, src: &Source) -> Kernel {
    #[cfg(target_arch = "x86_64")]
    if let Some(k) = x86::kernel(isa, src) {
        return k;
    }
    #[cfg(target_arch = "aarch64")]
    if let Some(k) = neon::kernel(isa, src) {
        return k;
    }
    let _ = isa;
    match src.ty {
        GgmlType::Q4_0 => scalar_kernel::<Q4_0>(src.rows, src.chunk),
        GgmlType::Q4_1 => scalar_kernel::<Q4_1>(src.rows, src.chunk),
        GgmlType::Q5_0 => scalar_kernel::<Q5_0>(src.rows, src.chunk),
        GgmlType::Q8_0 => scalar_kernel::<Q8_0>(src.rows, src.chunk),
        GgmlType::Q4_K => scalar_kernel::<Q4K>(src.rows, src.chunk),
        GgmlType::Q6_K => scalar_kernel::<Q6K>(src.rows, src.chunk),
        _ => unreachable!("validated: a type the engine takes"),
    }
}

fn scalar_kernel<D: Decode>(rows: usize, chunk: usize) -> Kernel {
    match (rows, chunk) {
        (1, _) => scalar::<D, 1, 0>,
        (4, 4) => scalar::<D, 4, 4>,
        (4, 8) => scalar::<D, 4, 8>,
        (8, 4) => scalar::<D, 8, 4>,
        (8, 8) => scalar::<D, 8, 8>,
        other => unreachable!("no layout has {other:?} rows and bytes per piece"),
    }
}

/// Calls `f(rows, runs)` for every strip of rows and every block's runs of the plan.
#[inline(always)]
fn walk(src: &Source, plan: &Plan, mut f: impl FnMut(Range<usize>, &[Run])) {
    let strip_bytes = STRIP / src.rows * src.row_step;
    for r0 in (0..src.n).step_by(STRIP) {
        // The next strip's rows (groups) lie together: fetch them while this one is decoded.
        let ahead = ((r0 / src.rows + STRIP / src.rows) * src.row_step).min(src.data.len());
        super::prefetch(&src.data[ahead..(ahead + strip_bytes).min(src.data.len())]);
        for block in &plan.blocks {
            f(r0..src.n.min(r0 + STRIP), &plan.runs[block.clone()]);
        }
    }
}

fn scalar<D: Decode, const R: usize, const C: usize>(src: &Source, plan: &Plan, out: &mut [f32]) {
    walk(src, plan, |rows, runs| {
        scalar_runs::<D, R, C>(src, plan, rows, runs, out)
    });
}

/// The reference: rows `rows` (at most a strip, whole groups) of one block's runs, one weight
/// at a time (`R` rows per group, their quant pieces `C` bytes; `R = 1`, `C = 0` plain). The
/// rows' fp16 fields are converted once for all runs; bytes are read a group at a time, one
/// bounds check per group.
#[inline(always)]
fn scalar_runs<D: Decode, const R: usize, const C: usize>(
    src: &Source,
    plan: &Plan,
    rows: Range<usize>,
    runs: &[Run],
    out: &mut [f32],
) {
    let x = runs[0].x;
    // The group's bytes at `loc`, `lane` apart, from the row group starting at row `r`.
    let group = |r: usize, loc: Loc, lane: usize, len: usize| {
        let at = src.offset::<R>(r, x, loc);
        &src.data[at..at + (R - 1) * lane + len]
    };
    let (mut d, mut m) = ([0f32; STRIP], [0f32; STRIP]);
    for (r, (d, m)) in rows
        .clone()
        .step_by(R)
        .zip(d.chunks_exact_mut(R).zip(m.chunks_exact_mut(R)))
    {
        let halves = |loc: Loc, out: &mut [f32]| {
            // fp16 fields are 2-byte pieces.
            let h = group(r, loc, 2, 2);
            for (j, o) in out.iter_mut().enumerate() {
                *o = half(u16::from_le_bytes([h[2 * j], h[2 * j + 1]]));
            }
        };
        halves(src.d, d);
        if D::M {
            halves(src.m, m);
        }
    }
    let (mut a, mut b) = ([0f32; STRIP], [0f32; STRIP]);
    for run in runs {
        let set = D::set(src, run.s);
        for (i, r) in rows.clone().enumerate() {
            (a[i], b[i]) = D::params::<R>(src, r, x, run.s, set, d[i], m[i]);
        }
        for col in &plan.columns[run.range.clone()] {
            let dst = &mut out[col.slot * src.n + rows.start..][..rows.len()];
            for (g, (r, dst)) in rows
                .clone()
                .step_by(R)
                .zip(dst.chunks_exact_mut(R))
                .enumerate()
            {
                let q0 = group(r, col.q[0], C, 1);
                let q1 = group(r, col.q[if D::TWO_BYTES { 1 } else { 0 }], C, 1);
                for (j, o) in dst.iter_mut().enumerate() {
                    let i = g * R + j;
                    *o = D::weight([q0[j * C], q1[j * C]], col, a[i], b[i]);
                }
            }
        }
    }
}

/// binary16 → binary32, exact for every half: branch-free for the finite scales real weights
/// have.
#[inline(always)]
fn half(h: u16) -> f32 {
    if h & 0x7c00 == 0x7c00 {
        f16_to_f32(h)
    } else {
        finite_half_to_f32(h)
    }
}

/// One type's decode: the parameters of a row's parameter set and a weight from them.
trait Decode {
    /// Whether a code takes a second byte (`Column::q[1]`).
    const TWO_BYTES: bool = false;
    /// Whether the block has a second fp16 field (`Source::m`).
    const M: bool = false;

    /// Where parameter set `s`'s own bytes lie (Q4_K's scale packing, Q6_K's scale), if any.
    fn set(_src: &Source, _s: usize) -> Loc {
        Loc::default()
    }

    /// `(a, b)` of row `r`, block `x`, parameter set `s` (its bytes at `set`), from the block's
    /// fp16 fields `d` and `m` (0 if none); by default the block's scale alone.
    #[inline(always)]
    fn params<const R: usize>(
        _src: &Source,
        _r: usize,
        _x: usize,
        _s: usize,
        _set: Loc,
        d: f32,
        _m: f32,
    ) -> (f32, f32) {
        (d, 0.0)
    }

    /// The weight of column `col` from its code's bytes `q` (as stored) and its row's
    /// parameters.
    fn weight(q: [u8; 2], col: &Column, a: f32, b: f32) -> f32;
}

struct Q4_0;
struct Q4_1;
struct Q5_0;
struct Q8_0;
struct Q4K;
struct Q6K;

impl Decode for Q4_0 {
    #[inline(always)]
    fn weight(q: [u8; 2], col: &Column, a: f32, _: f32) -> f32 {
        let c = (((q[0] ^ col.flip) >> col.shift[0]) & 15) as i32 - 8;
        c as f32 * a
    }
}

impl Decode for Q4_1 {
    const M: bool = true;

    #[inline(always)]
    fn params<const R: usize>(
        _: &Source,
        _: usize,
        _: usize,
        _: usize,
        _: Loc,
        d: f32,
        m: f32,
    ) -> (f32, f32) {
        (d, m)
    }

    #[inline(always)]
    fn weight(q: [u8; 2], col: &Column, a: f32, b: f32) -> f32 {
        let c = (q[0] >> col.shift[0]) & 15;
        c as f32 * a + b
    }
}

impl Decode for Q5_0 {
    const TWO_BYTES: bool = true;

    #[inline(always)]
    fn weight(q: [u8; 2], col: &Column, a: f32, _: f32) -> f32 {
        let (lo, hi) = ((q[0] >> col.shift[0]) & 15, (q[1] >> col.shift[1]) & 1);
        let c = (lo | hi << 4) as i32 - 16;
        c as f32 * a
    }
}

impl Decode for Q8_0 {
    #[inline(always)]
    fn weight(q: [u8; 2], _: &Column, a: f32, _: f32) -> f32 {
        q[0] as i8 as f32 * a
    }
}

impl Decode for Q4K {
    const M: bool = true;

    fn set(src: &Source, s: usize) -> Loc {
        src.q4k_scales(s)
    }

    /// Plain blocks: sub-block `s` of the row's scale packing; repacked: the group's packing of
    /// sub-block `s` holds the rows' pairs in the sub-blocks' places.
    #[inline(always)]
    fn params<const R: usize>(
        src: &Source,
        r: usize,
        x: usize,
        s: usize,
        set: Loc,
        d: f32,
        dmin: f32,
    ) -> (f32, f32) {
        let at = src.offset::<R>(r, x, set);
        let packing: &[u8; K_SCALE_SIZE] = src.data[at..at + K_SCALE_SIZE]
            .try_into()
            .expect("12 bytes");
        let (sc, m) = q4k_scale_min(if R == 1 { s } else { r % R }, packing);
        (d * sc as f32, dmin * m as f32)
    }

    #[inline(always)]
    fn weight(q: [u8; 2], col: &Column, a: f32, b: f32) -> f32 {
        let c = (q[0] >> col.shift[0]) & 15;
        c as f32 * a - b
    }
}

impl Decode for Q6K {
    const TWO_BYTES: bool = true;

    fn set(src: &Source, s: usize) -> Loc {
        src.loc(192 + s)
    }

    #[inline(always)]
    fn params<const R: usize>(
        src: &Source,
        r: usize,
        x: usize,
        _: usize,
        set: Loc,
        d: f32,
        _: f32,
    ) -> (f32, f32) {
        (d * src.byte::<R>(r, x, set) as i8 as f32, 0.0)
    }

    #[inline(always)]
    fn weight(q: [u8; 2], col: &Column, a: f32, _: f32) -> f32 {
        let (lo, hi) = ((q[0] >> col.shift[0]) & 15, (q[1] >> col.shift[1]) & 3);
        let c = (lo | hi << 4) as i32 - 32;
        c as f32 * a
    }
}

#[cfg(test)]
mod tests;
