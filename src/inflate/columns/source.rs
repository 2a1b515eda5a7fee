//! A validated expert as the column decoders read it ([`Source`]: where each byte of a row's
//! plain block lies, in plain or repacked blocks), and the bytes a strip's SIMD vectors read
//! ([`Window`]).

use super::super::repacked::{fields, Field, Layout};
use super::super::ExpertWeights;
use super::{Loc, LANES};
use crate::quant::{GgmlType, K_SCALE_SIZE};

/// A validated expert as the decoders read it.
pub(super) struct Source<'a> {
    pub(super) data: &'a [u8],
    pub(super) ty: GgmlType,
    pub(super) n: usize,
    /// Rows per interleaved group (1 in plain blocks) and bytes per quant piece (0).
    pub(super) rows: usize,
    pub(super) chunk: usize,
    /// Bytes from one group (plain: one row) to the next.
    pub(super) row_step: usize,
    /// Bytes from one (multi-)block to the next.
    pub(super) block_step: usize,
    /// The repacked layout's fields (none in plain blocks).
    fields: Vec<Field>,
    /// Where the block's fp16 fields lie: `d`, and the second one (Q4_1's and Q5_1's `m`, the
    /// k-quants' `dmin`).
    pub(super) d: Loc,
    pub(super) m: Loc,
}

impl<'a> Source<'a> {
    /// `w` stored in `layout` (validated) as the decoders read it.
    pub(super) fn new(layout: Layout, w: &ExpertWeights<'a>) -> Source<'a> {
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
        let (d, m) = match w.ty {
            GgmlType::Q6_K => (208, 2),
            GgmlType::Q2_K => (80, 82),
            GgmlType::Q3_K => (108, 2),
            _ => (0, 2),
        };
        (src.d, src.m) = (src.loc(d), src.loc(m));
        src
    }

    /// Where plain byte `p` of a block lies.
    pub(super) fn loc(&self, p: usize) -> Loc {
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
    pub(super) fn flip(&self, p: usize) -> u8 {
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
    pub(super) fn q4k_scales(&self, s: usize) -> Loc {
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
    pub(super) fn offset<const R: usize>(&self, r: usize, x: usize, loc: Loc) -> usize {
        r / R * self.row_step + r % R * loc.lane + x * self.block_step + loc.at
    }

    #[inline(always)]
    pub(super) fn byte<const R: usize>(&self, r: usize, x: usize, loc: Loc) -> u8 {
        self.data[self.offset::<R>(r, x, loc)]
    }

    /// Byte `loc` of block `x` for the rows of vectors `0..units` (rows `r0 + 8u..`), the code
    /// `shift` more bits into it (`R` rows per group, `C` bytes per piece; `R = 1` plain).
    #[inline(always)]
    pub(super) fn window<const R: usize, const C: usize>(
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

/// One byte of a column's block for each row of a strip's vectors of [`LANES`] rows (the SIMD
/// paths). Vector `u` reads from [`Window::vector`]`(u)`, `step` bytes after vector `u - 1`:
/// in plain blocks the four bytes at each `j·row_step` (`span = 7·row_step + 4` bytes in all);
/// in eight rows of 4-byte pieces 32 bytes (`span = 32`); otherwise the bytes at 0 and at
/// `second` (groups of four rows: the next group's, 16 bytes each for 4-byte pieces; 8-byte
/// pieces: the next four rows', 32 bytes each): `span = second + 16` or `second + 32`. The
/// window is `(units - 1)·step + span` bytes. Each row's bits start `bits` into its bytes.
#[derive(Clone, Copy)]
pub(super) struct Window<'a> {
    bytes: &'a [u8],
    step: usize,
    pub(super) second: usize,
    pub(super) row_step: usize,
    pub(super) bits: u32,
    units: usize,
}

impl Window<'_> {
    /// Where vector `u` reads its `span` bytes: inside the window, which [`Source::window`]
    /// makes `(units - 1)·step + span` long, for the `u < units` this checks.
    #[inline(always)]
    pub(super) fn vector(&self, u: usize) -> *const u8 {
        assert!(u < self.units, "a vector of the strip");
        self.bytes.as_ptr().wrapping_add(u * self.step)
    }
}
