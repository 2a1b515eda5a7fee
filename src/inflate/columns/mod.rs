//! The outlier split's f32 weight columns, decoded exactly as ggml dequantizes them, straight from
//! the plain or repacked blocks: [`super::ExpertWeights::dequantize_columns`] and
//! [`dequantize_columns_in`] validate, the rest of this module decodes.
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
//! weight; the SIMD paths (`x86.rs`, `neon.rs`) take eight rows per step, the scalar code
//! (`scalar.rs`) is their reference and does the rows of a strip that do not fill a step.

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
/// ([`scalar::scalar_runs`]) eight rows at a time. Per strip and block, `block(r, x)` of each vector's
/// rows `r..r + 8` (what the block's runs share); per run, `params(block, r, run, set)`, the rows'
/// `(a, b)` (`set`: [`scalar::Decode::set`]); per column, `prepare(column, r0, x, vectors)` of the strip's
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
                    super::scalar::scalar_runs::<D, R, C>(
                        src,
                        plan,
                        first(units)..rows.end,
                        runs,
                        out,
                    );
                }
            })
        }
    };
}

#[cfg(target_arch = "aarch64")]
mod neon;
mod plan;
mod scalar;
mod source;
#[cfg(target_arch = "x86_64")]
mod x86;

use super::repacked::{Groups, Layout};
use super::{ExpertWeights, InflateError};
use crate::isa::Isa;
use crate::quant::{GgmlType, QuantError};
use plan::plan;
use scalar::{scalar_kernel, Q4K, Q4_0, Q4_1, Q5_0, Q6K, Q8_0};
use scalar::{Iq4Nl, Iq4Xs, Mxfp4, Q2K, Q3K, Q5K, Q5_1};
use source::Source;
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
    /// Its weight's place in the block (what the codebook types' decoder reads).
    element: usize,
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

/// Columns `columns` (input channels `< k`, in any order) of `w`'s dequantized weights, `w`
/// stored in `layout`: `out[i·n + r]` = weight `(r, columns[i])` exactly as ggml dequantizes it,
/// the values [`ExpertWeights::dequantize_column`] gives from the same weights in plain blocks,
/// on kernel path `isa`. Read straight from the layout's bytes.
pub fn dequantize_columns_in(
    isa: Isa,
    layout: Layout,
    w: &ExpertWeights,
    columns: &[usize],
    out: &mut [f32],
) -> Result<(), InflateError> {
    if Groups::new(layout, w)?.is_none() {
        return w.dequantize_columns_with(isa, columns, out);
    }
    if !isa.is_available() {
        return Err(InflateError::IsaUnavailable(isa));
    }
    if out.len() < columns.len() * w.n {
        return Err(InflateError::OutputTooShort {
            buffer: "columns",
            needed: columns.len() * w.n,
            got: out.len(),
        });
    }
    if columns.iter().any(|&c| c >= w.k) {
        return Err(InflateError::Quant(QuantError::RowNotWholeBlocks {
            ty: w.ty,
            k: w.k,
        }));
    }
    decode(isa, layout, w, columns, out);
    Ok(())
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
    let src = Source::new(layout, w);
    let plan = plan(&src, columns);
    kernel(isa, &src)(&src, &plan, out);
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
        GgmlType::Q5_1 => scalar_kernel::<Q5_1>(src.rows, src.chunk),
        GgmlType::Q5_K => scalar_kernel::<Q5K>(src.rows, src.chunk),
        GgmlType::Q2_K => scalar_kernel::<Q2K>(src.rows, src.chunk),
        GgmlType::Q3_K => scalar_kernel::<Q3K>(src.rows, src.chunk),
        GgmlType::IQ4_NL => scalar_kernel::<Iq4Nl>(src.rows, src.chunk),
        GgmlType::IQ4_XS => scalar_kernel::<Iq4Xs>(src.rows, src.chunk),
        GgmlType::MXFP4 => scalar_kernel::<Mxfp4>(src.rows, src.chunk),
        // The codebook types (plain blocks only), weight by weight.
        _ => scalar::by_element,
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

#[cfg(test)]
mod tests;
