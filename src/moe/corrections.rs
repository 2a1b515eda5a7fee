//! The f32 side of the outlier split for one expert's rows: each row's outlier channels (taken
//! out of its int8 row by `super::outliers`) times the weight columns of those channels, added to
//! the int8 result by the scatter.

use super::plan::{Inputs, Plan};
use super::{try_vec, Error, ErrorKind};
use crate::inflate::{dequantize_columns_in, ExpertWeights};
use crate::isa::Isa;

/// The f32 part of the outlier lever for one expert's rows: the weight columns of every outlier
/// channel its rows have, and each row's (column, activation) pairs.
pub(super) struct Corrections {
    /// `columns[(proj · channels + i) · n ..][..n]`: projection `proj`'s weights of the `i`-th
    /// channel, one per output channel (ggml's dequantized values).
    pub columns: Vec<f32>,
    pub channels: usize,
    pub n: usize,
    /// Row `mi`'s pairs are `terms[ends[mi - 1]..ends[mi]]`, in the row's channel order.
    pub terms: Vec<(u32, f32)>,
    pub ends: Vec<u32>,
}

impl Corrections {
    /// `add[n - n0] = Σ x_c · w[n][c]` over row `mi`'s outlier channels, in their order, for
    /// output channels `n0..n0 + add.len()` of projection `proj`; false when the row has none.
    pub fn row(&self, mi: usize, proj: usize, n0: usize, add: &mut [f32]) -> bool {
        let start = if mi == 0 {
            0
        } else {
            self.ends[mi - 1] as usize
        };
        let terms = &self.terms[start..self.ends[mi] as usize];
        if terms.is_empty() {
            return false;
        }
        add.fill(0.0);
        for &(i, x) in terms {
            let col = &self.columns[(proj * self.channels + i as usize) * self.n + n0..];
            for (a, &w) in add.iter_mut().zip(col) {
                *a += x * w;
            }
        }
        true
    }

    /// The correction of expert `e`'s rows (`(activation row, its outlier channels)`), or `None`
    /// when they have no outlier: the dequantized weight columns of their channels, from the
    /// GGML blocks in the call's layout (the same values as ggml's own dequantization), for
    /// every projection of the call.
    pub fn of(
        isa: Isa,
        plan: &Plan,
        io: &Inputs,
        e: usize,
        rows: &[(usize, &[u32])],
    ) -> Result<Option<Corrections>, Error> {
        let mut channels: Vec<u32> = rows.iter().flat_map(|(_, c)| c.iter().copied()).collect();
        if channels.is_empty() {
            return Ok(None);
        }
        channels.sort_unstable();
        channels.dedup();
        let columns = columns(isa, plan, io, e, &channels)?;
        let p = &plan.problem;
        let (mut terms, mut ends) = (Vec::new(), Vec::with_capacity(rows.len()));
        for &(r, chans) in rows {
            let off = p.b_offset(r);
            for &c in chans {
                let i = channels.binary_search(&c).expect("collected above");
                terms.push((i as u32, io.b[off + c as usize]));
            }
            ends.push(terms.len() as u32);
        }
        Ok(Some(Corrections {
            columns,
            channels: channels.len(),
            n: p.n,
            terms,
            ends,
        }))
    }
}

/// The weight columns of `channels` (sorted) in expert `e` of each projection of the call,
/// [`Corrections::columns`].
fn columns(
    isa: Isa,
    plan: &Plan,
    io: &Inputs,
    e: usize,
    channels: &[u32],
) -> Result<Vec<f32>, Error> {
    let n = plan.problem.n;
    let projections: Vec<_> = plan.problems().zip(io.weights()).collect();
    let mut columns = try_vec(
        projections.len() * channels.len() * n,
        0f32,
        "outlier columns",
    )?;
    let wanted: Vec<usize> = channels.iter().map(|&c| c as usize).collect();
    let per_projection = columns.chunks_exact_mut(channels.len() * n);
    for ((q, data), out) in projections.into_iter().zip(per_projection) {
        let (off, len) = q.expert_bytes(e);
        let w = ExpertWeights {
            ty: q.wtype,
            data: &data[off..off + len],
            row_stride: q.w_nb1,
            n: q.n,
            k: q.k,
        };
        dequantize_columns_in(isa, q.layout, &w, &wanted, out)
            .map_err(|err| Error::new(ErrorKind::Internal, format!("outlier columns: {err}")))?;
    }
    Ok(columns)
}
