//! Expert weights in ggml-cpu's repacked layouts (docs/REPACK.md), inflated to exactly the bytes
//! the plain blocks give.
//!
//! ggml's CPU backend stores a weight tensor with its rows interleaved in groups of 4 or 8: block
//! column by block column, one *multi-block* holds block `x` of every row of the group, each field
//! (scales, quants) of the rows side by side, the quants `chunk` bytes at a time from the rows in
//! turn (Q4_0's with the top bit of every nibble flipped). Every layout is a fixed byte permutation
//! of the plain blocks, described here once per type as a list of [`Field`]s.
//!
//! The inflate undoes the permutation one N-tile at a time into a scratch of plain blocks (one
//! tile's rows: L1/L2-resident) and runs the plain kernels on it, so the output equals the plain
//! inflate's by construction and there is one set of inflate kernels. The bulk of the bytes, the
//! quants, go through a SIMD transpose ([`Chunks`]: SSE2 on every x86 path, Advanced SIMD on
//! aarch64); the scale fields are a few bytes per block and take shared scalar code.

mod kscales;
#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
mod x86;

use super::{check, check_weights, inflate_expert_with, ExpertWeights, InflateError, TileInflater};
use crate::isa::Isa;
use crate::layout::Tiles;
use crate::quant::{GgmlType, K_SCALE_SIZE};
use kscales::transpose_q4k_scales;

/// How an expert's blocks are arranged in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// ggml's plain blocks, row after row.
    Plain,
    /// ggml-cpu's repack `<type>_<rows>x<chunk>` (e.g. `q4_0_4x8`): rows interleaved in groups
    /// of `rows`, quants `chunk` bytes at a time.
    Repacked { rows: usize, chunk: usize },
}

impl Layout {
    /// Every repacked layout the pinned ggml-cpu chooses for a type this crate inflates, on any
    /// CPU (docs/REPACK.md says which CPU gets which).
    pub const REPACKED: [(GgmlType, Layout); 16] = [
        (GgmlType::Q4_0, Layout::Repacked { rows: 4, chunk: 4 }),
        (GgmlType::Q4_0, Layout::Repacked { rows: 4, chunk: 8 }),
        (GgmlType::Q4_0, Layout::Repacked { rows: 8, chunk: 8 }),
        (GgmlType::Q8_0, Layout::Repacked { rows: 4, chunk: 4 }),
        (GgmlType::Q8_0, Layout::Repacked { rows: 4, chunk: 8 }),
        (GgmlType::Q4_K, Layout::Repacked { rows: 8, chunk: 4 }),
        (GgmlType::Q4_K, Layout::Repacked { rows: 8, chunk: 8 }),
        (GgmlType::Q6_K, Layout::Repacked { rows: 8, chunk: 4 }),
        (GgmlType::Q6_K, Layout::Repacked { rows: 8, chunk: 8 }),
        (GgmlType::Q2_K, Layout::Repacked { rows: 8, chunk: 8 }),
        (GgmlType::Q5_K, Layout::Repacked { rows: 8, chunk: 4 }),
        (GgmlType::Q5_K, Layout::Repacked { rows: 8, chunk: 8 }),
        (GgmlType::IQ4_NL, Layout::Repacked { rows: 4, chunk: 4 }),
        (GgmlType::IQ4_NL, Layout::Repacked { rows: 8, chunk: 8 }),
        (GgmlType::MXFP4, Layout::Repacked { rows: 4, chunk: 4 }),
        (GgmlType::MXFP4, Layout::Repacked { rows: 8, chunk: 8 }),
    ];

    /// Whether weights of `ty` can come in this layout (and so be inflated from it).
    pub fn supports(self, ty: GgmlType) -> bool {
        match self {
            Layout::Plain => GgmlType::QUANTIZED.contains(&ty),
            Layout::Repacked { .. } => Layout::REPACKED.contains(&(ty, self)),
        }
    }

    /// Rows per interleaved group (1 when plain).
    pub fn rows(self) -> usize {
        match self {
            Layout::Plain => 1,
            Layout::Repacked { rows, .. } => rows,
        }
    }

    /// ggml's name of `ty` in this layout (`q4_0_4x8`; the type's name when plain).
    pub fn name(self, ty: GgmlType) -> String {
        match self {
            Layout::Plain => ty.name().to_string(),
            Layout::Repacked { rows, chunk } => format!("{}_{rows}x{chunk}", ty.name()),
        }
    }
}

/// One field of a row's block, as it lies in the plain block and in a multi-block.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Field {
    /// `len` bytes at `plain` in the block; at `packed` in the multi-block, `chunk` bytes at a
    /// time from the rows in turn (chunk `i` is bytes `(i / rows)·chunk..` of row `i % rows`),
    /// every byte XOR `flip`.
    Interleaved {
        plain: usize,
        packed: usize,
        len: usize,
        chunk: usize,
        flip: u8,
    },
    /// Q4_K's (and Q5_K's) 12 scale bytes at `plain`; at `packed`, eight packings of 12 bytes,
    /// packing `s` holding sub-block `s`'s (scale, min) of rows 0..8 as a block's packing holds
    /// its sub-blocks' (the rows take the place of the sub-blocks).
    Q4KScales { plain: usize, packed: usize },
}

/// The fields of `ty`'s blocks in a multi-block of `rows` rows with quants in `chunk`-byte
/// pieces (ggml's `block_*x*` structs in repack.h; the fp16 arrays are 2-byte chunks).
pub(super) fn fields(ty: GgmlType, rows: usize, chunk: usize) -> Vec<Field> {
    let il = |plain, packed, len, chunk, flip| Field::Interleaved {
        plain,
        packed,
        len,
        chunk,
        flip,
    };
    let r = rows;
    match ty {
        // d[r], qs[16r] with each nibble's top bit flipped (codes q-8 as 4-bit two's complement).
        GgmlType::Q4_0 => vec![il(0, 0, 2, 2, 0), il(2, 2 * r, 16, chunk, 0x88)],
        // d[r], qs[32r].
        GgmlType::Q8_0 => vec![il(0, 0, 2, 2, 0), il(2, 2 * r, 32, chunk, 0)],
        // d[8], dmin[8], scales[96], qs[1024].
        GgmlType::Q4_K => vec![
            il(0, 0, 2, 2, 0),
            il(2, 2 * r, 2, 2, 0),
            Field::Q4KScales {
                plain: 4,
                packed: 4 * r,
            },
            il(16, 16 * r, 128, chunk, 0),
        ],
        // Q4_K's, with the high bits between the scales and the low ones: qh[256] in `chunk`-byte
        // pieces like qs.
        GgmlType::Q5_K => vec![
            il(0, 0, 2, 2, 0),
            il(2, 2 * r, 2, 2, 0),
            Field::Q4KScales {
                plain: 4,
                packed: 4 * r,
            },
            il(16, 16 * r, 32, chunk, 0),
            il(48, 48 * r, 128, chunk, 0),
        ],
        // d[8], dmin[8], scales[128] two bytes at a time (bytes 2s, 2s + 1 of row j at 16s + 2j),
        // qs[512].
        GgmlType::Q2_K => vec![
            il(80, 0, 2, 2, 0),
            il(82, 2 * r, 2, 2, 0),
            il(0, 4 * r, 16, 2, 0),
            il(16, 20 * r, 64, chunk, 0),
        ],
        // d[r], qs[16r]: Q4_0's without the flip (the nibbles index a table).
        GgmlType::IQ4_NL => vec![il(0, 0, 2, 2, 0), il(2, 2 * r, 16, chunk, 0)],
        // e[r] (E8M0 bytes), qs[16r].
        GgmlType::MXFP4 => vec![il(0, 0, 1, 1, 0), il(1, r, 16, chunk, 0)],
        // d[8], scales[128] one byte at a time, ql[1024], qh[512].
        GgmlType::Q6_K => vec![
            il(208, 0, 2, 2, 0),
            il(192, 2 * r, 16, 1, 0),
            il(0, 18 * r, 128, chunk, 0),
            il(128, 146 * r, 64, chunk, 0),
        ],
        _ => Vec::new(),
    }
}

/// A validated expert in a repacked layout: where its row groups are and how to untangle them.
pub(super) struct Groups {
    rows: usize,
    fields: Vec<Field>,
    /// Blocks per row.
    blocks: usize,
    block_bytes: usize,
    row_bytes: usize,
}

impl Groups {
    /// `None` for a plain layout. Checks that ggml has this layout for the type, the weights
    /// as the plain inflate does, that the rows split into whole groups, and that they are
    /// packed.
    pub(super) fn new(layout: Layout, w: &ExpertWeights) -> Result<Option<Groups>, InflateError> {
        let Layout::Repacked { rows, chunk } = layout else {
            return Ok(None);
        };
        if !layout.supports(w.ty) {
            return Err(InflateError::UnsupportedLayout { ty: w.ty, layout });
        }
        let row_bytes = check_weights(w)?;
        if !w.n.is_multiple_of(rows) {
            return Err(InflateError::RowsNotWholeGroups { n: w.n, rows });
        }
        if w.n > 0 && w.row_stride != row_bytes {
            return Err(InflateError::RepackedRowsNotPacked {
                row_stride: w.row_stride,
                row_bytes,
            });
        }
        Ok(Some(Groups {
            rows,
            fields: fields(w.ty, rows, chunk),
            blocks: w.k / w.ty.block_elems(),
            block_bytes: w.ty.block_bytes(),
            row_bytes,
        }))
    }

    /// Row group `g` of the expert (`rows` rows of multi-blocks).
    fn group<'a>(&self, w: &ExpertWeights<'a>, g: usize) -> &'a [u8] {
        let bytes = self.rows * self.row_bytes;
        &w.data[g * bytes..(g + 1) * bytes]
    }
}

/// Inflates `w`, stored in `layout`, on the best kernel path ([`Isa::best`]): the same native B
/// and channel scales as [`super::inflate_expert`] gives for the same weights in plain blocks.
///
/// In a repacked layout, `w.data` starts at the expert's first row group (ggml's `nb[2]` apart
/// from expert to expert), the groups follow each other without gaps, `w.row_stride` must be a
/// plain row's bytes (ggml's `nb[1]`, which it keeps when it repacks), and `w.n` a multiple of
/// `rows` (ggml repacks a tensor only then).
pub fn inflate_expert_in(
    layout: Layout,
    w: &ExpertWeights,
    tiles: &Tiles,
    b_native: &mut [i8],
    chan_scales: &mut [f32],
) -> Result<(), InflateError> {
    inflate_expert_in_with(Isa::best(), layout, w, tiles, b_native, chan_scales)
}

/// [`inflate_expert_in`] on an explicit kernel path; every path gives the same bits.
pub fn inflate_expert_in_with(
    isa: Isa,
    layout: Layout,
    w: &ExpertWeights,
    tiles: &Tiles,
    b_native: &mut [i8],
    chan_scales: &mut [f32],
) -> Result<(), InflateError> {
    let Some(groups) = Groups::new(layout, w)? else {
        return inflate_expert_with(isa, w, tiles, b_native, chan_scales);
    };
    if !isa.is_available() {
        return Err(InflateError::IsaUnavailable(isa));
    }
    let shape = check(w, tiles, b_native.len(), chan_scales.len())?;
    if !tiles.b_n.is_multiple_of(groups.rows) {
        return Err(InflateError::UnsupportedTiles(*tiles));
    }
    let untangle = untangler(isa);
    let mut inflater = TileInflater::new(isa, w, tiles);
    let mut scratch = vec![0u8; tiles.b_n.min(w.n) * shape.row_bytes];
    for (t, tile_out) in b_native[..tiles.b_len(shape.kp, shape.np)]
        .chunks_exact_mut(tiles.b_n * shape.kp)
        .enumerate()
    {
        let first = t * tiles.b_n;
        // The next tile's row groups, while this one is untangled.
        let ahead = (first + tiles.b_n).min(w.n) * shape.row_bytes;
        super::prefetch(&w.data[ahead..(ahead + tiles.b_n * shape.row_bytes).min(w.data.len())]);
        let plain = &mut scratch[..w.n.saturating_sub(first).min(tiles.b_n) * shape.row_bytes];
        for (g, out) in plain
            .chunks_exact_mut(groups.rows * shape.row_bytes)
            .enumerate()
        {
            untangle(&groups, groups.group(w, first / groups.rows + g), out);
        }
        let mut rows: Vec<&[u8]> = plain.chunks_exact(shape.row_bytes).collect();
        inflater.tile(&mut rows, first, tile_out, chan_scales)?;
    }
    chan_scales[w.n..shape.np].fill(0.0);
    Ok(())
}

/// Writes `w`, stored in `layout`, as plain blocks into `out` (`n` rows, packed), on kernel path
/// `isa`: ggml's repack undone.
pub fn to_plain_with(
    isa: Isa,
    layout: Layout,
    w: &ExpertWeights,
    out: &mut [u8],
) -> Result<(), InflateError> {
    let groups = Groups::new(layout, w)?;
    if !isa.is_available() {
        return Err(InflateError::IsaUnavailable(isa));
    }
    let row_bytes = checked_row_bytes(w, out.len())?;
    let out = &mut out[..w.n * row_bytes];
    match groups {
        None => {
            for (r, row) in out.chunks_exact_mut(row_bytes).enumerate() {
                row.copy_from_slice(w.row(r, row_bytes));
            }
        }
        Some(groups) => {
            let untangle = untangler(isa);
            for (g, rows) in out.chunks_exact_mut(groups.rows * row_bytes).enumerate() {
                untangle(&groups, groups.group(w, g), rows);
            }
        }
    }
    Ok(())
}

/// Writes `w` (plain blocks) into `out` in `layout`, as ggml's repack does (groups packed, no
/// gaps): to make repacked experts for tests and benchmarks. Scalar code.
pub fn from_plain(layout: Layout, w: &ExpertWeights, out: &mut [u8]) -> Result<(), InflateError> {
    let Some(groups) = Groups::new(layout, w)? else {
        return to_plain_with(Isa::Scalar, Layout::Plain, w, out);
    };
    let row_bytes = checked_row_bytes(w, out.len())?;
    let group_bytes = groups.rows * row_bytes;
    for (g, dst) in out[..w.n * row_bytes]
        .chunks_exact_mut(group_bytes)
        .enumerate()
    {
        let rows: Vec<&[u8]> = (g * groups.rows..(g + 1) * groups.rows)
            .map(|r| w.row(r, row_bytes))
            .collect();
        tangle_group(&groups, &rows, dst);
    }
    Ok(())
}

/// Checks `w` and an output of `out_len` bytes for a conversion; returns `w`'s row bytes.
fn checked_row_bytes(w: &ExpertWeights, out_len: usize) -> Result<usize, InflateError> {
    let row_bytes = check_weights(w)?;
    if out_len < w.n * row_bytes {
        return Err(InflateError::OutputTooShort {
            buffer: "blocks",
            needed: w.n * row_bytes,
            got: out_len,
        });
    }
    Ok(row_bytes)
}

/// Untangles one row group (`src`, its multi-blocks) into its rows' plain blocks (`out`, rows
/// `row_bytes` apart).
type Untangle = fn(&Groups, &[u8], &mut [u8]);

fn untangler(isa: Isa) -> Untangle {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        return untangle_group::<x86::Sse2>;
    }
    #[cfg(target_arch = "aarch64")]
    if isa != Isa::Scalar {
        return untangle_group::<neon::Neon>;
    }
    let _ = isa;
    untangle_group::<Scalar>
}

/// One interleaved field across a row group: in each of `blocks` multi-blocks (`packed_block`
/// bytes apart) the rows' `len` bytes each at `packed`, to go to `plain` of each row's blocks.
#[derive(Clone, Copy, Debug)]
struct Span {
    blocks: usize,
    packed_block: usize,
    packed: usize,
    plain: usize,
    len: usize,
    block_bytes: usize,
    row_bytes: usize,
    flip: u8,
}

impl Span {
    /// Where the span's bytes end in the group (`rows` rows) and in its rows' plain blocks
    /// (groups have at least one block).
    fn ends(&self, rows: usize) -> (usize, usize) {
        let last = self.blocks - 1;
        (
            last * self.packed_block + self.packed + rows * self.len,
            (rows - 1) * self.row_bytes + last * self.block_bytes + self.plain + self.len,
        )
    }
}

/// The byte transposes that undo a multi-block's fields.
trait Chunks {
    /// For every multi-block `x` of `span`, gives row `j` (of `R`) the field's bytes at
    /// `out[j·row_bytes + x·block_bytes + plain..]`: chunk `i` (`C` bytes) of the field goes to
    /// row `i % R` at byte `(i / R)·C`, every byte XOR `flip`.
    fn untangle<const R: usize, const C: usize>(src: &[u8], out: &mut [u8], span: &Span);

    /// One multi-block's Q4_K scales (`packings`, eight of 12 bytes, packing `s` holding
    /// sub-block `s` of the 8 rows) into each row's 12 scale bytes, row `j`'s at
    /// `out[j·row_bytes..]`: [`transpose_q4k_scales`], the reference.
    #[inline(always)]
    fn q4k_scales(packings: &[u8; 8 * K_SCALE_SIZE], out: &mut [u8], row_bytes: usize) {
        let groups = packings.as_chunks::<K_SCALE_SIZE>().0;
        let rows = transpose_q4k_scales(std::array::from_fn(|s| &groups[s]));
        for (j, scales) in rows.iter().enumerate() {
            out[j * row_bytes..j * row_bytes + K_SCALE_SIZE].copy_from_slice(scales);
        }
    }
}

/// The reference: one chunk at a time, as one 64-bit word.
struct Scalar;

impl Chunks for Scalar {
    #[inline(always)]
    fn untangle<const R: usize, const C: usize>(src: &[u8], out: &mut [u8], span: &Span) {
        if (C, span.len, span.flip) == (2, 2, 0) {
            return halves::<R>(src, out, span);
        }
        for x in 0..span.blocks {
            let from = x * span.packed_block + span.packed;
            let at = x * span.block_bytes + span.plain;
            for (i, chunk) in src[from..from + R * span.len].chunks_exact(C).enumerate() {
                let to = at + (i % R) * span.row_bytes + (i / R) * C;
                out[to..to + C].copy_from_slice(&flipped::<C>(chunk, span.flip));
            }
        }
    }
}

/// `chunk` (`C <= 8` bytes), every byte XOR `flip`, as one word operation.
#[inline(always)]
fn flipped<const C: usize>(chunk: &[u8], flip: u8) -> [u8; C] {
    let mut word = [0u8; 8];
    word[..C].copy_from_slice(chunk);
    let word = (u64::from_ne_bytes(word) ^ u64::from_ne_bytes([flip; 8])).to_ne_bytes();
    word[..C].try_into().expect("C <= 8")
}

/// [`Chunks::untangle`] of an fp16 array (one 2-byte chunk per row, never flipped), block by
/// block: every path's code, it moves two bytes per row and block.
#[inline(always)]
fn halves<const R: usize>(src: &[u8], out: &mut [u8], span: &Span) {
    for x in 0..span.blocks {
        let from = x * span.packed_block + span.packed;
        let words: [u64; 2] = std::array::from_fn(|w| {
            let at = from + 8 * w.min(R / 4 - 1);
            u64::from_le_bytes(src[at..at + 8].try_into().expect("8 bytes"))
        });
        let at = x * span.block_bytes + span.plain;
        for j in 0..R {
            let half = (words[j / 4] >> (16 * (j % 4))) as u16;
            let to = at + j * span.row_bytes;
            out[to..to + 2].copy_from_slice(&half.to_le_bytes());
        }
    }
}

fn untangle_group<T: Chunks>(g: &Groups, src: &[u8], out: &mut [u8]) {
    for field in &g.fields {
        match *field {
            Field::Interleaved {
                plain,
                packed,
                len,
                chunk,
                flip,
            } => {
                let span = Span {
                    blocks: g.blocks,
                    packed_block: g.rows * g.block_bytes,
                    packed,
                    plain,
                    len,
                    block_bytes: g.block_bytes,
                    row_bytes: g.row_bytes,
                    flip,
                };
                match (g.rows, chunk) {
                    (4, 1) => T::untangle::<4, 1>(src, out, &span),
                    (4, 2) => T::untangle::<4, 2>(src, out, &span),
                    (4, 4) => T::untangle::<4, 4>(src, out, &span),
                    (4, 8) => T::untangle::<4, 8>(src, out, &span),
                    (8, 1) => T::untangle::<8, 1>(src, out, &span),
                    (8, 2) => T::untangle::<8, 2>(src, out, &span),
                    (8, 4) => T::untangle::<8, 4>(src, out, &span),
                    (8, 8) => T::untangle::<8, 8>(src, out, &span),
                    other => unreachable!("no layout interleaves {other:?}"),
                }
            }
            Field::Q4KScales { plain, packed } => {
                for x in 0..g.blocks {
                    let at = x * g.rows * g.block_bytes + packed;
                    let packings = src[at..at + 8 * K_SCALE_SIZE].try_into().expect("96 bytes");
                    T::q4k_scales(packings, &mut out[x * g.block_bytes + plain..], g.row_bytes);
                }
            }
        }
    }
}

/// The inverse of [`untangle_group`]: the rows' plain blocks into one row group of multi-blocks.
fn tangle_group(g: &Groups, rows: &[&[u8]], dst: &mut [u8]) {
    for x in 0..g.blocks {
        let block = &mut dst[x * g.rows * g.block_bytes..(x + 1) * g.rows * g.block_bytes];
        for field in &g.fields {
            match *field {
                Field::Interleaved {
                    plain,
                    packed,
                    len,
                    chunk,
                    flip,
                } => {
                    for i in 0..g.rows * len / chunk {
                        let from = x * g.block_bytes + plain + (i / g.rows) * chunk;
                        let to = packed + i * chunk;
                        for (d, &b) in block[to..to + chunk]
                            .iter_mut()
                            .zip(&rows[i % g.rows][from..from + chunk])
                        {
                            *d = b ^ flip;
                        }
                    }
                }
                Field::Q4KScales { plain, packed } => {
                    let at = x * g.block_bytes + plain;
                    let groups = transpose_q4k_scales(std::array::from_fn(|j| {
                        rows[j][at..at + K_SCALE_SIZE].try_into().expect("12 bytes")
                    }));
                    for (s, scales) in groups.iter().enumerate() {
                        let to = packed + s * K_SCALE_SIZE;
                        block[to..to + K_SCALE_SIZE].copy_from_slice(scales);
                    }
                }
            }
        }
    }
}

/// [`halves`] for the SIMD paths, with the bounds checked once: the scalar reference's per-store checks cost as much as the copies.
#[inline(always)]
fn halves_checked_once<const R: usize>(src: &[u8], out: &mut [u8], span: &Span) {
    let (src_end, out_end) = span.ends(R);
    assert!(
        src.len() >= src_end && out.len() >= out_end,
        "the span lies inside the group"
    );
    for x in 0..span.blocks {
        let from = x * span.packed_block + span.packed;
        let to = x * span.block_bytes + span.plain;
        for j in 0..R {
            // SAFETY: `from + 2j + 2 <= src_end` and `to + j·row_bytes + 2 <= out_end`, both
            // inside their slices (asserted above); unaligned 2-byte accesses.
            unsafe {
                let half = src
                    .as_ptr()
                    .add(from + 2 * j)
                    .cast::<u16>()
                    .read_unaligned();
                let dst = out.as_mut_ptr().add(to + j * span.row_bytes).cast::<u16>();
                dst.write_unaligned(half);
            }
        }
    }
}

#[cfg(test)]
mod tests;
