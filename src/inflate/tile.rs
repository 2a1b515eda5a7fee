//! One N-tile of native B and the loop every kernel fills it with, in memory order, the kernels'
//! operands as fixed-size arrays (outputs carved out once per group of runs, each row's blocks
//! and parameters once per row and group), so that their bodies have no bounds checks.

use super::RUN;

/// One N-tile of native B: `b_n` rows (output channels) × the padded depth, run by run (run `r`
/// of rows `0..b_n` is `b_n · 32` contiguous bytes).
pub(super) struct Tile<'a> {
    pub out: &'a mut [i8],
    pub b_n: usize,
}

impl Tile<'_> {
    /// Zeroes what the rows did not fill: depth padding of `rows` rows, and padding rows.
    pub fn zero_padding(&mut self, rows: usize, runs_filled: usize) {
        let slab = self.b_n * RUN;
        let (filled, depth_padding) = self
            .out
            .split_at_mut((runs_filled * slab).min(self.out.len()));
        depth_padding.fill(0);
        if rows < self.b_n {
            for run in filled.chunks_exact_mut(slab) {
                run[rows * RUN..].fill(0);
            }
        }
    }
}

/// Per-run parameters of a tile's rows, row by row: run `r` of row `j` at `j·stride + r`.
#[derive(Clone, Copy)]
pub(super) struct RowMajor<'a, P> {
    pub items: &'a [P],
    pub stride: usize,
}

/// Calls `convert(r, rows, params, outs)` for every group of `R` consecutive tile rows and of
/// `G` consecutive runs `r..r + G` (`r` a multiple of `G`), run group by run group so that the
/// writes stream through memory. `rows` holds the tile's `b_n` rows; `params[i][g]` and
/// `outs[g][i]` belong to run `r + g` of row `rows[i]`. `b_n` must be a multiple of `R`, `runs`
/// of `G`.
#[inline(always)]
pub(super) fn for_each_group<const G: usize, const R: usize, P>(
    rows: &[&[u8]],
    params: RowMajor<P>,
    tile: &mut Tile,
    runs: usize,
    mut convert: impl FnMut(usize, &[&[u8]; R], [&[P; G]; R], [&mut [[i8; RUN]; R]; G]),
) {
    for_each_group_in::<G, R, P>(rows, params, tile, 0..runs, |r, _, rows, p, outs| {
        convert(r, rows, p, outs)
    });
}

/// [`for_each_group`] over the runs `runs` only, handing `convert` each row's `GB` bytes that
/// hold runs `r..r + G` (run `r` starts at byte `r / G · GB` of its row) as a fixed-size array,
/// so that the kernel reads them without further bounds checks.
#[inline(always)]
pub(super) fn for_each_block_group<const G: usize, const R: usize, const GB: usize, P>(
    rows: &[&[u8]],
    params: RowMajor<P>,
    tile: &mut Tile,
    runs: std::ops::Range<usize>,
    mut convert: impl FnMut(usize, [&[u8; GB]; R], [&[P; G]; R], [&mut [[i8; RUN]; R]; G]),
) {
    for_each_row_block_group::<G, R, GB, P>(rows, params, tile, runs, |r, _, rows, p, outs| {
        convert(r, rows, p, outs)
    });
}

/// [`for_each_block_group`] that also hands `convert` the group's first tile row (`i` in
/// `convert(r, i, rows, params, outs)`), for kernels with per-row operands of their own.
#[inline(always)]
pub(super) fn for_each_row_block_group<const G: usize, const R: usize, const GB: usize, P>(
    rows: &[&[u8]],
    params: RowMajor<P>,
    tile: &mut Tile,
    runs: std::ops::Range<usize>,
    mut convert: impl FnMut(usize, usize, [&[u8; GB]; R], [&[P; G]; R], [&mut [[i8; RUN]; R]; G]),
) {
    for_each_group_in::<G, R, P>(rows, params, tile, runs, |r, i, rows, p, outs| {
        // Runs r..r + G are bytes `r / G · GB..` of each row: a slice, not a division of the
        // row's length by GB.
        let at = r / G * GB;
        let rows = rows.map(|row| row[at..at + GB].try_into().expect("GB bytes"));
        convert(r, i, rows, p, outs)
    });
}

/// Runs per step of [`for_each_block`].
pub(super) const GROUP: usize = 4;

/// For formats of one `BB`-byte block per run (`GB = GROUP·BB`): calls `step(blocks, params,
/// outs)` for run `r` of every group of `R` tile rows (`blocks[i]`, `params[i]`: block `r` of
/// the group's row `i` and its parameter), `r` in `0..runs`. Runs go [`GROUP`] at a time (one
/// bounds check per row and group), the last `runs % GROUP` one at a time.
#[inline(always)]
pub(super) fn for_each_block<const R: usize, const BB: usize, const GB: usize, P: Copy>(
    rows: &[&[u8]],
    params: RowMajor<P>,
    tile: &mut Tile,
    runs: usize,
    mut step: impl FnMut([&[u8; BB]; R], [P; R], &mut [[i8; RUN]; R]),
) {
    const { assert!(GB == GROUP * BB) };
    let full = runs / GROUP * GROUP;
    for_each_block_group::<GROUP, R, GB, P>(rows, params, tile, 0..full, |_, rows, p, out| {
        let blocks = rows.map(|row| row.as_chunks::<BB>().0);
        for g in 0..GROUP {
            step(blocks.map(|b| &b[g]), p.map(|p| p[g]), &mut *out[g]);
        }
    });
    for_each_block_group::<1, R, BB, P>(rows, params, tile, full..runs, |_, rows, p, [out]| {
        step(rows, p.map(|[p]| *p), out)
    });
}

#[inline(always)]
fn for_each_group_in<const G: usize, const R: usize, P>(
    rows: &[&[u8]],
    params: RowMajor<P>,
    tile: &mut Tile,
    runs: std::ops::Range<usize>,
    mut convert: impl FnMut(usize, usize, &[&[u8]; R], [&[P; G]; R], [&mut [[i8; RUN]; R]; G]),
) {
    let b_n = tile.b_n;
    let stride = params.stride;
    assert!(
        b_n.is_multiple_of(R)
            && runs.start.is_multiple_of(G)
            && runs.len().is_multiple_of(G)
            && rows.len() == b_n
            && runs.end <= stride
            && params.items.len() >= b_n * stride,
        "tile of {b_n} rows in groups of {R}, runs {runs:?} in groups of {G}, stride {stride}"
    );
    let groups = b_n / R;
    let rows = &rows.as_chunks::<R>().0[..groups];
    let out = &mut tile.out.as_chunks_mut::<RUN>().0[runs.start * b_n..runs.end * b_n];
    // Each row group's parameters as one slice (`R·stride` items), so that a run group's
    // are an offset into it: no multiply and one bounds check per row.
    let params = &params.items[..b_n * stride];
    for (n, out) in out.chunks_exact_mut(G * b_n).enumerate() {
        let r = runs.start + n * G;
        let mut outs = out
            .chunks_exact_mut(b_n)
            .map(|run| &mut run.as_chunks_mut::<R>().0[..groups]);
        let mut outs: [_; G] = std::array::from_fn(|_| outs.next().expect("G runs"));
        for (i, (rows, p)) in rows.iter().zip(params.chunks_exact(R * stride)).enumerate() {
            let ps = std::array::from_fn(|k| {
                p[k * stride + r..k * stride + r + G]
                    .try_into()
                    .expect("G runs")
            });
            let mut runs = outs.iter_mut();
            let outs = std::array::from_fn(|_| &mut runs.next().expect("G runs")[i]);
            convert(r, i * R, rows, ps, outs);
        }
    }
}

/// [`for_each_group`] one run of one row at a time: `convert(row, param, r, out)`.
#[inline(always)]
pub(super) fn for_each_run<P>(
    rows: &[&[u8]],
    params: RowMajor<P>,
    tile: &mut Tile,
    runs: usize,
    mut convert: impl FnMut(&[u8], &P, usize, &mut [i8; RUN]),
) {
    for_each_group::<1, 1, P>(rows, params, tile, runs, |r, [row], [[p]], [[out]]| {
        convert(row, p, r, out)
    });
}
