//! A used expert made ready for its GEMMs: its weights (cached, staged by the prefetch, or
//! inflated now) and its rows gathered into native A `[K/16][M][16]`, with their scales and
//! outlier corrections. The rows come from phase 1's shares, or are quantized here when each
//! has no other reader.

use super::cache::Expert;
use super::call::{Call, Prepared};
use super::corrections::Corrections;
use super::expert::{Source, Weights};
use super::phase1::quantize_rows;
use super::plan::Inputs;
use super::quantize::RowScale;
use super::resources::{Resources, A_K};
use super::route::Group;
use super::stats::{bump, ExpertRun, Stage};
use super::{Error, ErrorKind};
use crate::sync::lock;
use std::sync::Arc;
use std::time::Instant;

/// The expert's weights (cached or inflated now) and its rows gathered into native A.
pub(super) fn prepare_group(
    res: &Resources,
    call: &Call,
    io: &Inputs,
    g: &Group,
) -> Result<Prepared, Error> {
    let expert = weights_of(res, call, io, g)?;
    let t = Instant::now();
    let rows = call.routing().rows_of(g);
    let kp = res.tiles.pad(call.plan.problem.k);
    let mut a = res.spare_a.take(&res.device, rows.len() * kp)?;
    let gathered = if call.quantized_native() {
        gather_in_order(res, call, io, g, a.as_mut_slice())?
    } else if call.quantized_at_gather() {
        gather_quantizing(res, call, io, g, a.as_mut_slice())?
    } else {
        gather_from_shares(res, call, io, g, a.as_mut_slice())?
    };
    a.sync_to_device()?;
    call.clock.add(Stage::Quant, t);
    Ok(Prepared {
        expert,
        a,
        row_scales: gathered.row_scales,
        outliers: gathered.outliers,
    })
}

/// A group's rows in native A: their scales and outlier correction.
struct Gathered {
    row_scales: Vec<RowScale>,
    outliers: Option<Corrections>,
}

/// Expert `g.expert`'s weights of every projection of the call: from the cache, the staging
/// area or inflated now (counted), with the expert traced for [`Call::runs`].
fn weights_of(res: &Resources, call: &Call, io: &Inputs, g: &Group) -> Result<Arc<Expert>, Error> {
    let t = Instant::now();
    let mut weights = vec![Weights {
        problem: &call.plan.problem,
        data: io.weights,
        name: io.name,
    }];
    if let (Some(problem), Some(second)) = (&call.plan.pair, &io.pair) {
        weights.push(Weights {
            problem,
            data: second.weights,
            name: second.name,
        });
    }
    let (expert, source) = res.experts.get(
        &res.device,
        &res.spare_b,
        &res.tiles,
        res.isa,
        &weights,
        g.expert,
    )?;
    if let Source::Inflated(bytes) | Source::Prefetched(bytes) = source {
        bump(&res.counters.experts_inflated, 1);
        bump(&res.counters.bytes_inflated, bytes);
    }
    let group = call
        .routing()
        .groups
        .iter()
        .position(|x| x.expert == g.expert);
    lock(&call.runs).push((
        group.unwrap_or(usize::MAX),
        ExpertRun {
            expert: g.expert,
            rows: g.len,
            hit: matches!(source, Source::Cache),
        },
    ));
    call.clock.add(Stage::Inflate, t);
    Ok(expert)
}

/// The one group of a call whose phase 1 wrote native A's order ([`Call::quantized_native`]):
/// every activation row in order, so A is the shares' blocks side by side.
fn gather_in_order(
    res: &Resources,
    call: &Call,
    io: &Inputs,
    g: &Group,
    a: &mut [i8],
) -> Result<Gathered, Error> {
    let p = &call.plan.problem;
    let rows = call.routing().rows_of(g);
    let m = rows.len();
    let in_order = rows
        .iter()
        .enumerate()
        .all(|(i, row)| p.act_row(row.token as usize, row.slot as usize) == i);
    if m != p.act_rows() || !in_order {
        return Err(Error::new(
            ErrorKind::Internal,
            "a one-expert call's rows are not its activation rows in order",
        ));
    }
    let (mut row_scales, mut outliers) = (Vec::with_capacity(m), Vec::with_capacity(m));
    for cell in &call.quant {
        let share = cell.get().expect("phase 1 quantized every share");
        let n = share.scales.len();
        if n == 0 {
            continue;
        }
        for (kb, block) in share.q.chunks_exact(n * A_K).enumerate() {
            let at = (kb * m + share.first) * A_K;
            a[at..at + n * A_K].copy_from_slice(block);
        }
        row_scales.extend_from_slice(&share.scales);
        outliers.extend((share.first..share.first + n).map(|r| (r, share.outliers_of(r))));
    }
    Ok(Gathered {
        row_scales,
        outliers: Corrections::of(res.isa, &call.plan, io, g.expert, &outliers)?,
    })
}

/// The group's rows quantized now, each read by this group alone ([`Call::quantized_at_gather`]).
fn gather_quantizing(
    res: &Resources,
    call: &Call,
    io: &Inputs,
    g: &Group,
    a: &mut [i8],
) -> Result<Gathered, Error> {
    let p = &call.plan.problem;
    let kp = res.tiles.pad(p.k);
    let rows = call.routing().rows_of(g);
    let act_rows = rows
        .iter()
        .map(|row| p.act_row(row.token as usize, row.slot as usize));
    let own = quantize_rows(res, p, io, 0, act_rows.clone(), false)?;
    let (mut src, mut outliers) = (
        Vec::with_capacity(rows.len()),
        Vec::with_capacity(rows.len()),
    );
    for (i, r) in act_rows.enumerate() {
        src.push(&own.q[i * kp..(i + 1) * kp]);
        outliers.push((r, own.outliers_of(i)));
    }
    let outliers = Corrections::of(res.isa, &call.plan, io, g.expert, &outliers)?;
    fill_native_a(a, kp, &src);
    Ok(Gathered {
        row_scales: own.scales,
        outliers,
    })
}

/// The group's rows from the shares phase 1 quantized.
fn gather_from_shares(
    res: &Resources,
    call: &Call,
    io: &Inputs,
    g: &Group,
    a: &mut [i8],
) -> Result<Gathered, Error> {
    let p = &call.plan.problem;
    let kp = res.tiles.pad(p.k);
    let rows = call.routing().rows_of(g);
    let mut row_scales = Vec::with_capacity(rows.len());
    let (mut src, mut outliers) = (
        Vec::with_capacity(rows.len()),
        Vec::with_capacity(rows.len()),
    );
    for row in rows {
        let r = p.act_row(row.token as usize, row.slot as usize);
        let share = call.quant[r / call.chunk]
            .get()
            .expect("phase 1 quantized every share");
        src.push(&share.q[(r - share.first) * kp..(r - share.first + 1) * kp]);
        row_scales.push(share.scales[r - share.first]);
        outliers.push((r, share.outliers_of(r)));
    }
    let outliers = Corrections::of(res.isa, &call.plan, io, g.expert, &outliers)?;
    fill_native_a(a, kp, &src);
    Ok(Gathered {
        row_scales,
        outliers,
    })
}

/// Copies the rows `src` (`kp` quantized bytes each) into native A `[K/16][M][16]`. Filled in that
/// order, the writes are one sequential stream and each row is read 16 bytes at a time (m rows
/// of 16-byte pieces stay in cache).
fn fill_native_a(a: &mut [i8], kp: usize, src: &[&[i8]]) {
    let m = src.len();
    if m == 0 {
        return;
    }
    for (kb, block) in a[..m * kp].chunks_exact_mut(m * A_K).enumerate() {
        let k0 = kb * A_K;
        for (piece, row) in block.chunks_exact_mut(A_K).zip(src) {
            piece.copy_from_slice(&row[k0..k0 + A_K]);
        }
    }
}
