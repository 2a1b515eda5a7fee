//! Quantized expert weights straight into the NPU's native int8 B layout, plus one f32 scale per
//! output channel, without materializing f32 weights.
//!
//! # The method (the definition every kernel reproduces bit for bit)
//!
//! Row `n` (one output channel) gets a scale `s_n` computed from its block scales alone, such that
//! every value the row's blocks can encode maps into `[-127, 127]`. Then each stored quant becomes
//! one int8 `q8` with `w ≈ s_n · q8`. The row scan (`params.rs`) is code every path shares; the
//! per-block work differs between the scalar reference (`scalar.rs`) and the SIMD kernels.
//!
//! Notation: `fl(x)` is an IEEE-754 binary32 operation rounded to nearest-even (no fused
//! multiply-add), `rne(x)` rounds to the nearest integer, ties to even, and `sat8` clamps to
//! `[-128, 127]`. `w(q)` is the f32 value ggml's `dequantize_row_*` gives code `q`.
//!
//! **Table types** (Q4_0, Q4_1, Q5_0, Q4_K): every (sub-)block `j` of 32 weights is `w(q) =
//! fl(fl(c(q)·a_j) + b_j)` with a small integer code `c(q)` (`q-8`, `q`, `q-16`, `q`), the block's
//! scale `a_j` and offset `b_j` (0, Q4_1's `m`, 0, Q4_K's `-fl(dmin·m_j)`); this is exactly ggml's
//! value. `M_n` is the largest `|w(q)|` any code of any block of the row could take (the largest of
//! `|w(q_min)|`, `|w(q_max)|` over the blocks, since `w` is monotonic in `q`), `s_n = fl(M_n/127)`,
//! `inv_n = fl(127/M_n)`. Each (sub-)block gets a table of its 16 codes (32 for Q5_0) and each
//! quant is one lookup (`pshufb`, `tbl`):
//! - Q4_1, Q4_K: `f_j = fl(a_j·inv_n)`, `g_j = fl(b_j·inv_n)`, in fixed point `[F_j, G_j] =
//!   [sat16(rne(f_j·2²¹/t)), sat16(rne(g_j·2⁶))]` with the code step `t = 2¹⁵/codes` (2048 for
//!   16 codes, 1024 for 32), and `lut_j[q] = sat8((sat16(((t·q·F_j + 2¹⁴) >> 15) + G_j) + 2⁵) >>
//!   6)`: `q·f_j + g_j` in units of 2⁻⁶, rounded to the nearest integer (ties up), 8 or 16
//!   entries per 16-bit step where binary32 takes a step per 4 or 8 (`params/arith.rs`:
//!   `table_fixed`, `table_entry`);
//! - Q4_0, Q5_0 (no offset): with `k = 16` (Q4_0) or `8` (Q5_0), so that `k·c` spans -128..128,
//!   `m_j = clamp(rne(fl(a_j·fl(inv_n·2¹⁵/k))), ±32767)` and
//!   `lut_j[q] = sat8((k·c(q)·m_j + 2¹⁴) >> 15)`: a 16-lane fixed-point multiply.
//!
//! Table values lie in `[-127, 127]` (docs/ACCURACY.md).
//!
//! **Rescale types** (Q8_0, Q6_K): `w = fl(e_j·c)` with an integer code `c` (Q8_0: `q`, `e_j = d`;
//! Q6_K: `q-32`, `e_j = fl(d·sc_j)` per sub-block of 16). With `E_n = max_j |e_j|`:
//! - Q8_0: `s_n = E_n`, multiplier `m_j = clamp(rne(fl(e_j·fl(32768/E_n))), ±32767)`,
//!   `q8 = sat8((q·m_j + 2¹⁴) >> 15)`;
//! - Q6_K: `s_n = fl(32·E_n/127)`, `m_j = clamp(rne(fl(e_j·fl(32512/E_n))), ±32767)`,
//!   `q8 = sat8((4·(q-32)·m_j + 2¹⁴) >> 15)` (`32512 = 127·2⁸`, so `4·32·m_j/2¹⁵ ≤ 127`);
//!
//! with `>>` the arithmetic shift: exactly what `pmulhrsw` and `sqrdmulh` compute on 16-bit lanes.
//!
//! **The types with scale sets** (`params/sets.rs`: the other k-quants, Q5_1, the IQ types,
//! MXFP4) follow the same two families, with one parameter set per 16 or 32 weights (two per run
//! for sets of 16):
//! - table types Q5_1, Q5_K (codes 0..=31) and Q2_K (codes 0..=3, sets of 16): `M_n`, `s_n`,
//!   `inv_n`, `f_j`, `g_j` as for Q4_1 and Q4_K. Q5_1's and Q5_K's 32-entry tables as theirs;
//!   Q2_K's 4-entry ones in binary32, `lut_j[q] = sat8(rne(fl(fl(q·f_j) + g_j)))` (four
//!   conversions per eight sets: nothing for fixed point to save);
//! - rescale types, `w = e_j·c` with an integer code `|c| ≤ c_max` and a stretch `k`: Q3_K
//!   (`c = q - 4·!hbit`, `e_j = fl(d·(sc_j - 32))`, sets of 16; `c_max` 4, `k` 32), IQ4_NL and
//!   IQ4_XS (`c` = `kvalues_iq4nl[q]` in -127..=113, `e_j = d` or `fl(d·(ls_j - 32))`; 127, 1),
//!   IQ2_XXS, IQ2_XS, IQ2_S (`c` = ±8, ±25, ±43 from the grid and the signs, `e_j` = ggml's `db`;
//!   43, 3), IQ3_XXS (±4..=±62; 62, 3), IQ3_S (±1..=±15; 15, 9), IQ1_S, IQ1_M (`c = 8·(grid ±
//!   1/8)` in ±1, ±7, ±9, `e_j` = ggml's `dl`/8; 9, 15). With `E_n = max_j |e_j|` and `U =
//!   fl(127·2¹⁵/(k·c_max))`: `s_n = fl(fl(c_max·E_n)/127)`, `m_j = clamp(rne(fl(e_j·fl(U/E_n))),
//!   ±32767)`, `q8 = sat8((k·c·m_j + 2¹⁴) >> 15)` (`k` the smallest with `U ≤ 32768`; IQ4's
//!   32768 is clamped as Q8_0's);
//! - MXFP4, `w = c·2^(x_j - 128)` with `c` = `kvalues_mxfp4[q]` (±12 at most) and an E8M0 byte
//!   `x_j`: `s_n = 2^(x_max - 128)/8`, `m_j = rne(2^(14 + x_j - x_max))`, `q8 = sat8((16·c·m_j +
//!   2¹⁴) >> 15)`, all exact powers of two: blocks within three binades of the row's largest come
//!   through exactly.
//!
//! The codebook types' codes come from their grid entries (`quant::grids`) and signs: integers
//! from the block to int8, as every other type's. The SIMD kernels of the rescale types with at
//! most 16 codes (Q3_K, IQ4_NL, IQ4_XS, MXFP4, and the codebook types: their signed codes)
//! rescale the codes into a table per set and look each weight's index up in it, as Q4_0's do;
//! those of the table types build their tables per run (Q5_1, Q5_K: 32 codes) or per four runs
//! (Q2_K: four sets of 4 codes per table).
//!
//! **Special rows.** A row whose scales are all zero (`M_n = 0` or `E_n = 0`) gets `s_n = 0` and
//! all-zero weights. A NaN or infinite fp16 scale is an error, [`InflateError::NonFiniteScale`];
//! so is an MXFP4 E8M0 byte above [`MXFP4_E8M0_FINITE_MAX`](crate::quant::MXFP4_E8M0_FINITE_MAX)
//! (255 is NaN to ggml's validation; 253 and 254 make ggml's larger weights infinite).
//! Padding channels (`n..pad(n)`) get zero weights and scale 0, padding depth (`k..pad(k)`) zero
//! weights. Subnormal fp16 scales are ordinary finite values (f16→f32 is exact).
//!
//! The error bound that follows is derived, and the NMSE measured, in `docs/ACCURACY.md`.
//!
//! # Work order
//!
//! With 32-deep B tiles, 32 consecutive weights of one row starting at a multiple of 32 are one
//! contiguous 32-byte run of native B, and every (sub-)block of the table types is exactly such a
//! run. The driver scans the rows of one N-tile (32 channels), then the kernel fills the tile run
//! by run in memory order (run `r` of rows 0..32, then run `r + 1`), so the output is written as
//! one sequential stream, like a memcpy.
//!
//! The scan (`params.rs`) copies each row's fp16 fields out of its blocks and finishes every
//! parameter row by row (no transposes: the parameters stay in row order, `stride` items per
//! row), each step in one pass over all the tile's rows, so that no row waits for its own
//! reductions and divisions. The strided copies and Q4_K's scale unpacking are per instruction
//! set (`ScanOps`); everything else is one definition, compiled for each path. The SIMD kernels
//! take each row's blocks and parameters of a group of runs as fixed-size arrays (`tile.rs`),
//! the AVX-512 ones two tile rows per 512-bit step, the AVX2 ones two runs per table build. On
//! x86 the Q4_1/Q4_K/Q2_K/Q6_K/Q3_K kernels do the scan's last step themselves: they multiply
//! each run's `[a_j, b_j]` by the row's `inv_n` (Q6_K, Q3_K: each set's `e_j` by the row's
//! unit, then round and clamp) as they load them (the same operations), which saves a pass over
//! the parameters and the reload of what it stored.

mod codebook;
mod columns;
#[cfg(target_arch = "aarch64")]
mod neon;
mod params;
mod repacked;
mod scalar;
mod tile;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use columns::dequantize_columns_in;
pub use repacked::{from_plain, inflate_expert_in, inflate_expert_in_with, to_plain_with, Layout};

use crate::isa::Isa;
use crate::layout::Tiles;
use crate::quant::{GgmlType, QuantError};
use params::TileParams;
use tile::Tile;

/// One expert's quantized weight matrix as ggml stores it: `n` rows (output channels) of `k`
/// weights of type `ty`, row `i` starting at byte `i * row_stride` of `data`.
#[derive(Clone, Copy, Debug)]
pub struct ExpertWeights<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub row_stride: usize,
    pub n: usize,
    pub k: usize,
}

/// Why an expert could not be inflated. On error the outputs may be partly written.
#[derive(Clone, Debug, PartialEq)]
pub enum InflateError {
    /// Not a quantized type this module handles (F32, F16).
    UnsupportedType(GgmlType),
    /// `k` is not a whole number of blocks.
    Quant(QuantError),
    /// `row_stride` is smaller than one row's bytes.
    StrideTooSmall { row_stride: usize, row_bytes: usize },
    /// `data` ends before the last row does.
    SourceTooShort { needed: usize, got: usize },
    /// An output buffer is too small for the padded shape.
    OutputTooShort {
        buffer: &'static str,
        needed: usize,
        got: usize,
    },
    /// The kernels need 32-deep B tiles and padding to a multiple of the tile sizes.
    UnsupportedTiles(Tiles),
    /// A block scale is NaN or infinite (row, block index within the row).
    NonFiniteScale { row: usize, block: usize },
    /// The requested kernel path cannot run on this CPU.
    IsaUnavailable(Isa),
    /// ggml never stores `ty` in `layout`, so no reader for it exists.
    UnsupportedLayout { ty: GgmlType, layout: Layout },
    /// A repacked layout interleaves rows in groups of `rows`; `n` is not a multiple of it.
    RowsNotWholeGroups { n: usize, rows: usize },
    /// Repacked rows are packed (ggml repacks only contiguous tensors); this stride is not.
    RepackedRowsNotPacked { row_stride: usize, row_bytes: usize },
}

impl std::fmt::Display for InflateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InflateError::UnsupportedType(t) => write!(f, "cannot inflate {} weights", t.name()),
            InflateError::Quant(e) => e.fmt(f),
            InflateError::StrideTooSmall {
                row_stride,
                row_bytes,
            } => {
                write!(
                    f,
                    "row stride {row_stride} is smaller than a row ({row_bytes} bytes)"
                )
            }
            InflateError::SourceTooShort { needed, got } => {
                write!(f, "weights need {needed} bytes, got {got}")
            }
            InflateError::OutputTooShort {
                buffer,
                needed,
                got,
            } => {
                write!(f, "{buffer} needs {needed} elements, got {got}")
            }
            InflateError::UnsupportedTiles(t) => write!(f, "unsupported tile sizes {t:?}"),
            InflateError::NonFiniteScale { row, block } => {
                write!(f, "row {row}, block {block}: NaN or infinite scale")
            }
            InflateError::IsaUnavailable(i) => {
                write!(f, "kernel path {} unavailable here", i.name())
            }
            InflateError::UnsupportedLayout { ty, layout } => {
                write!(f, "{} weights never come in layout {layout:?}", ty.name())
            }
            InflateError::RowsNotWholeGroups { n, rows } => {
                write!(f, "{n} rows do not split into repacked groups of {rows}")
            }
            InflateError::RepackedRowsNotPacked {
                row_stride,
                row_bytes,
            } => write!(
                f,
                "repacked rows must be packed: stride {row_stride}, row {row_bytes} bytes"
            ),
        }
    }
}

impl std::error::Error for InflateError {}

/// Inflates `w` into native B (`b_native`, at least `tiles.b_len(pad(k), pad(n))` long) and the
/// channel scales (`chan_scales`, at least `pad(n)` long), on the best kernel path ([`Isa::best`]).
/// Dequantized weight `(n, k)` ≈ `chan_scales[n] · b_native[tiles.b_index(pad(k), n, k)]`.
pub fn inflate_expert(
    w: &ExpertWeights,
    tiles: &Tiles,
    b_native: &mut [i8],
    chan_scales: &mut [f32],
) -> Result<(), InflateError> {
    inflate_expert_with(Isa::best(), w, tiles, b_native, chan_scales)
}

/// [`inflate_expert`] on an explicit kernel path (tests and benchmarks compare them).
/// Paths without a kernel of their own for `w.ty` use the best lower one of the same
/// architecture; every path gives the same bits.
pub fn inflate_expert_with(
    isa: Isa,
    w: &ExpertWeights,
    tiles: &Tiles,
    b_native: &mut [i8],
    chan_scales: &mut [f32],
) -> Result<(), InflateError> {
    if !isa.is_available() {
        return Err(InflateError::IsaUnavailable(isa));
    }
    let shape = check(w, tiles, b_native.len(), chan_scales.len())?;
    if shape.kp == 0 {
        // No depth: every row is empty, so all-zero (scale 0), and native B has no bytes.
        chan_scales[..shape.np].fill(0.0);
        return Ok(());
    }
    let mut inflater = TileInflater::new(isa, w, tiles);
    let mut rows: Vec<&[u8]> = Vec::with_capacity(tiles.b_n);
    for (t, tile_out) in b_native[..tiles.b_len(shape.kp, shape.np)]
        .chunks_exact_mut(tiles.b_n * shape.kp)
        .enumerate()
    {
        let first = t * tiles.b_n;
        rows.clear();
        rows.extend((first..w.n.min(first + tiles.b_n)).map(|row| w.row(row, shape.row_bytes)));
        inflater.tile(&mut rows, first, tile_out, chan_scales)?;
    }
    chan_scales[w.n..shape.np].fill(0.0);
    Ok(())
}

/// The per-tile half of an inflate, shared by the plain and the repacked drivers: one N-tile of
/// native B and its channel scales from the tile's rows of plain blocks.
struct TileInflater {
    scan: ScanTile,
    kernel: TileKernel,
    params: TileParams,
    b_n: usize,
    runs: usize,
}

impl TileInflater {
    fn new(isa: Isa, w: &ExpertWeights, tiles: &Tiles) -> TileInflater {
        TileInflater {
            scan: scan_tile(isa),
            kernel: tile_kernel(isa, w.ty, tiles.b_n),
            params: TileParams::new(w.ty, w.k, tiles.b_n),
            b_n: tiles.b_n,
            runs: w.k / RUN,
        }
    }

    /// Fills `tile_out` from `rows` (at most `b_n`; `rows[j]` is row `first + j` of the expert;
    /// none for a tile of padding channels only) and sets their channel scales.
    fn tile(
        &mut self,
        rows: &mut Vec<&[u8]>,
        first: usize,
        tile_out: &mut [i8],
        chan_scales: &mut [f32],
    ) -> Result<(), InflateError> {
        if rows.is_empty() {
            tile_out.fill(0);
            return Ok(());
        }
        (self.scan)(&mut self.params, rows, &mut chan_scales[first..]).map_err(|(j, block)| {
            InflateError::NonFiniteScale {
                row: first + j,
                block,
            }
        })?;
        // Padding channels have zero parameters, so any row's bytes inflate to zeros for them.
        rows.resize(self.b_n, rows[0]);
        let mut tile = Tile {
            out: tile_out,
            b_n: self.b_n,
        };
        (self.kernel)(rows, &self.params, &mut tile, self.runs);
        tile.zero_padding(self.b_n, self.runs);
        Ok(())
    }
}

/// Asks for `bytes` in the cache ahead of their use (a hint: no result depends on it), for the
/// readers whose order the hardware prefetcher does not follow: the untangle of repacked experts
/// (field by field over a row group) and the outlier columns (block by block over a strip of
/// rows). On x86, with the weights out of cache, the inflate from q4_0_8x8 is 1.2–1.5× faster with
/// it (`ork-probe board`). Not on aarch64: whether the A76 needs it is for the board check (the
/// same measurement) to show.
#[inline(always)]
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    x86::prefetch(bytes);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

impl<'a> ExpertWeights<'a> {
    /// `n` rows of `k` weights of `ty` back to back in `data` (the row stride is one row).
    pub fn contiguous(
        ty: GgmlType,
        data: &'a [u8],
        k: usize,
        n: usize,
    ) -> Result<ExpertWeights<'a>, InflateError> {
        let row_stride = ty
            .row_bytes(k)
            .ok_or(InflateError::Quant(QuantError::RowNotWholeBlocks { ty, k }))?;
        Ok(ExpertWeights {
            ty,
            data,
            row_stride,
            n,
            k,
        })
    }

    fn row(&self, row: usize, row_bytes: usize) -> &[u8] {
        &self.data[row * self.row_stride..row * self.row_stride + row_bytes]
    }

    /// Column `c` (input channel `c < k`) of the dequantized weights, `out[n]` = weight `(n, c)`
    /// exactly as ggml dequantizes it (one weight decoded per row,
    /// [`crate::quant::dequantize_element`]). For the outlier-split lever, which needs a few
    /// columns in f32.
    pub fn dequantize_column(&self, c: usize, out: &mut [f32]) -> Result<(), InflateError> {
        let row_bytes = self
            .ty
            .row_bytes(self.k)
            .filter(|_| GgmlType::QUANTIZED.contains(&self.ty) && c < self.k)
            .ok_or(InflateError::Quant(QuantError::RowNotWholeBlocks {
                ty: self.ty,
                k: self.k,
            }))?;
        let needed = if self.n == 0 {
            0
        } else {
            (self.n - 1) * self.row_stride + row_bytes
        };
        if self.data.len() < needed {
            return Err(InflateError::SourceTooShort {
                needed,
                got: self.data.len(),
            });
        }
        let (be, bb) = (self.ty.block_elems(), self.ty.block_bytes());
        for (n, o) in out[..self.n].iter_mut().enumerate() {
            let at = n * self.row_stride + c / be * bb;
            *o = crate::quant::dequantize_element(self.ty, &self.data[at..at + bb], c % be);
        }
        Ok(())
    }
    /// Columns `columns` (input channels, each `< k`, in any order) of the dequantized weights:
    /// `out[i·n + r]` = weight `(r, columns[i])`, the values of [`Self::dequantize_column`], on
    /// the best kernel path ([`Isa::best`]). Block by block, each row's block scales decoded once
    /// for all its columns (`columns/`): at real scale (~55 outlier channels per expert,
    /// `docs/PERFORMANCE.md`) this decode runs for every down-projection expert of a prefill.
    pub fn dequantize_columns(
        &self,
        columns: &[usize],
        out: &mut [f32],
    ) -> Result<(), InflateError> {
        self.dequantize_columns_with(Isa::best(), columns, out)
    }

    /// [`Self::dequantize_columns`] on an explicit kernel path; every path gives the same bits.
    pub fn dequantize_columns_with(
        &self,
        isa: Isa,
        columns: &[usize],
        out: &mut [f32],
    ) -> Result<(), InflateError> {
        let row_bytes = self
            .ty
            .row_bytes(self.k)
            .filter(|_| GgmlType::QUANTIZED.contains(&self.ty))
            .filter(|_| columns.iter().all(|&c| c < self.k))
            .ok_or(InflateError::Quant(QuantError::RowNotWholeBlocks {
                ty: self.ty,
                k: self.k,
            }))?;
        let needed = self
            .n
            .checked_sub(1)
            .map_or(0, |r| r * self.row_stride + row_bytes);
        if self.data.len() < needed {
            return Err(InflateError::SourceTooShort {
                needed,
                got: self.data.len(),
            });
        }
        let Some(out) = out.get_mut(..columns.len() * self.n) else {
            return Err(InflateError::OutputTooShort {
                buffer: "columns",
                needed: columns.len() * self.n,
                got: out.len(),
            });
        };
        if !isa.is_available() {
            return Err(InflateError::IsaUnavailable(isa));
        }
        columns::decode(isa, Layout::Plain, self, columns, out);
        Ok(())
    }
}

/// Weights per contiguous run of native B (the B tile depth the kernels require).
const RUN: usize = 32;

/// Padded sizes and strides of a validated call.
struct Shape {
    kp: usize,
    np: usize,
    row_bytes: usize,
}

fn check(
    w: &ExpertWeights,
    tiles: &Tiles,
    b_len: usize,
    scales_len: usize,
) -> Result<Shape, InflateError> {
    let row_bytes = check_weights(w)?;
    if tiles.b_k != RUN
        || tiles.b_n == 0
        || !tiles.align.is_multiple_of(tiles.b_k)
        || !tiles.align.is_multiple_of(tiles.b_n)
    {
        return Err(InflateError::UnsupportedTiles(*tiles));
    }
    let (kp, np) = (tiles.pad(w.k), tiles.pad(w.n));
    if b_len < tiles.b_len(kp, np) {
        return Err(InflateError::OutputTooShort {
            buffer: "b_native",
            needed: tiles.b_len(kp, np),
            got: b_len,
        });
    }
    if scales_len < np {
        return Err(InflateError::OutputTooShort {
            buffer: "chan_scales",
            needed: np,
            got: scales_len,
        });
    }
    Ok(Shape { kp, np, row_bytes })
}

/// Checks the weights alone (type, whole blocks, stride, length); returns a row's bytes.
fn check_weights(w: &ExpertWeights) -> Result<usize, InflateError> {
    if !GgmlType::QUANTIZED.contains(&w.ty) {
        return Err(InflateError::UnsupportedType(w.ty));
    }
    let row_bytes =
        w.ty.row_bytes(w.k)
            .ok_or(InflateError::Quant(QuantError::RowNotWholeBlocks {
                ty: w.ty,
                k: w.k,
            }))?;
    if w.n > 1 && w.row_stride < row_bytes {
        return Err(InflateError::StrideTooSmall {
            row_stride: w.row_stride,
            row_bytes,
        });
    }
    let needed = if w.n == 0 {
        0
    } else {
        (w.n - 1) * w.row_stride + row_bytes
    };
    if w.data.len() < needed {
        return Err(InflateError::SourceTooShort {
            needed,
            got: w.data.len(),
        });
    }
    Ok(row_bytes)
}

/// Fills runs `0..runs` of a tile's `b_n` rows (`rows[j]` with its parameters in `params`).
type TileKernel = fn(&[&[u8]], &TileParams, &mut Tile, usize);

/// Fills a tile's parameters from its rows' bytes and writes their `s_n`; fails with (row in
/// the tile, block) of the first non-finite scale.
type ScanTile = fn(&mut TileParams, &[&[u8]], &mut [f32]) -> Result<(), (usize, usize)>;

/// The kernel for `ty` on `isa`, for tiles of `b_n` rows (the scalar one for types without a
/// kernel of the path's own).
fn tile_kernel(isa: Isa, ty: GgmlType, b_n: usize) -> TileKernel {
    #[cfg(target_arch = "x86_64")]
    if let Some(k) = x86::tile_kernel(isa, ty, b_n) {
        return k;
    }
    #[cfg(target_arch = "aarch64")]
    if let Some(k) = neon::tile_kernel(isa, ty) {
        return k;
    }
    let _ = (isa, b_n);
    scalar::tile_kernel(ty)
}

/// The tile scan built for `isa` (the same code, vectorized for the path's instruction set).
fn scan_tile(isa: Isa) -> ScanTile {
    #[cfg(target_arch = "x86_64")]
    if let Some(s) = x86::scan_tile(isa) {
        return s;
    }
    #[cfg(target_arch = "aarch64")]
    if matches!(isa, Isa::Neon | Isa::NeonDot) {
        return neon::scan_tile;
    }
    let _ = isa;
    scalar::scan_tile
}

#[cfg(test)]
mod tests;
