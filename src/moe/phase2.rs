//! Phase 2 of a call on the caller's threads: work items taken from an atomic counter, each
//! prepared (`super::gather`), multiplied (`super::product`) and scattered to `dst`; with
//! submitter threads (`super::submit`), the callers prepare and scatter while the submitters
//! run the GEMMs.

use super::call::{plan_items, Call, Item, Prepared, PreparedSlot, Product};
use super::desc::Problem;
use super::gather::prepare_group;
use super::plan::Inputs;
use super::prefetch::inflate_job;
use super::product::product;
use super::resources::Resources;
use super::route::Row;
use super::scatter::{publish, scale_row, Row as ScatterRow, QUAD};
use super::staging::Job;
use super::stats::Stage;
use super::Error;
use crate::npu::{submitter_ways, BackendKind};
use crate::sync::lock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Items a caller thread prepares ahead of the scatters, per submitter thread: enough to keep a
/// core busy while the next ones are prepared, few enough that the streamed experts' B buffers
/// stay a small part of one IOMMU domain.
const AHEAD: usize = 3;

/// The call's phase-2 work items and the slots of its prepared experts (made once).
pub(super) fn items<'c>(res: &Resources, call: &'c Call) -> &'c (Vec<Item>, Vec<PreparedSlot>) {
    call.items.get_or_init(|| {
        let routing = call.routing();
        // A pair's GEMM covers both projections' padded channels.
        let np = res.tiles.pad(call.plan.problem.n) * call.plan.problems().count();
        // The real NPU takes one submit per expert: one is split only over the submitters'
        // cores, when it has a large share of the rows (a dense call's one expert, which
        // would otherwise keep one core busy and the others idle: in two parts per core,
        // `submitter_ways`); where the GEMM runs on the CPU, over the caller's threads.
        let split = if res.device.backend() == BackendKind::Rknn {
            submitter_ways(
                res.submitter_cores().len().max(1),
                call.plan.problem.one_expert(),
            )
        } else {
            call.nth
        };
        let items = plan_items(&routing.groups, np, res.tiles.b_n, split);
        let mut per_group = vec![0; routing.groups.len()];
        for item in &items {
            per_group[item.group] += 1;
        }
        let slots = per_group.into_iter().map(PreparedSlot::new).collect();
        (items, slots)
    })
}

/// The prepared expert of `item`, made now by this thread if no other did. Drop it before
/// the item counts as scattered.
fn prepared(
    res: &Resources,
    call: &Call,
    io: &Inputs,
    item: &Item,
) -> Result<Arc<Prepared>, Error> {
    let (_, prepared) = items(res, call);
    let group = &call.routing().groups[item.group];
    prepared[item.group].get_or_make(|| prepare_group(res, call, io, group))
}

/// `item` is scattered: after its group's last item, the group's buffers go back to the
/// spares.
fn scattered(res: &Resources, call: &Call, item: &Item) {
    if let Some(p) = items(res, call).1[item.group].scattered() {
        res.recycle_prepared(p);
    }
}

/// Phase 2 on one of the caller's threads: take items until none is left, and with submitter
/// threads, scatter their products until every item is done.
pub(super) fn phase2(res: &Resources, call: &Call, io: &Inputs) {
    if call.failed.load(Ordering::Relaxed) {
        return;
    }
    if !res.submitter_cores().is_empty() {
        return phase2_piped(res, call, io);
    }
    let (items, _) = items(res, call);
    while !call.failed.load(Ordering::Relaxed) {
        let i = call.next.fetch_add(1, Ordering::Relaxed);
        let Some(item) = items.get(i) else { break };
        let done = prepared(res, call, io, item).and_then(|prep| {
            let product = product(res, call, &prep, item, None)?;
            scatter_item(res, call, io, &prep, item, product)
        });
        match done {
            Ok(()) => scattered(res, call, item),
            Err(e) => call.fail(e),
        }
    }
}

/// What a caller thread of a piped phase 2 does next.
enum Next {
    Scatter((usize, Product)),
    Prepare,
    Help(Job),
}

/// Phase 2 with submitter threads, on a caller thread: prepares items (weights, gathered A)
/// for the submitters, at most [`AHEAD`] per submitter beyond those already scattered, and
/// scatters the products they hand back, until every item is scattered or the call failed.
fn phase2_piped(res: &Resources, call: &Call, io: &Inputs) {
    let ahead = AHEAD * res.submitter_cores().len();
    while let Some(next) = next_step(res, call, ahead) {
        match next {
            Next::Help(job) => {
                // This call's threads' time, so this call's stage, although another call's
                // expert.
                let t = Instant::now();
                inflate_job(job, res);
                call.clock.add(Stage::Inflate, t);
            }
            Next::Scatter((i, product)) => scatter_done(res, call, io, i, product),
            Next::Prepare => prepare_next(res, call, io),
        }
    }
}

/// Under the pipe's lock: a product to scatter if one is done, else the next item to prepare if
/// the lookahead `ahead` allows, else a prefetch job to help with, else waits for a change.
/// `None` once every item is scattered or the call failed.
fn next_step(res: &Resources, call: &Call, ahead: usize) -> Option<Next> {
    let (items, _) = items(res, call);
    let pipe = &call.pipe;
    let mut st = lock(&pipe.state);
    loop {
        if call.failed.load(Ordering::Relaxed) || st.scattered == items.len() {
            return None;
        }
        if let Some(done) = st.done.pop_front() {
            return Some(Next::Scatter(done));
        }
        let more = call.next.load(Ordering::Relaxed) < items.len();
        if more && st.queued - st.scattered < ahead {
            return Some(Next::Prepare);
        }
        // Nothing to do but wait for the runs: inflate an expert of a later call, while
        // some runs are still queued (once the submitters took the last ones, the threads
        // stay free for the scatters that end the call).
        if call.helps_prefetch && st.submitted < items.len() {
            if let Some(job) = res.experts.staging().help_job() {
                return Some(Next::Help(job));
            }
        }
        st = pipe.moved.wait(st).unwrap_or_else(|e| e.into_inner());
    }
}

/// Scatters the product of item `i` a submitter handed back.
fn scatter_done(res: &Resources, call: &Call, io: &Inputs, i: usize, product: Product) {
    let item = &items(res, call).0[i];
    let done = prepared(res, call, io, item)
        .and_then(|prep| scatter_item(res, call, io, &prep, item, product));
    match done {
        Ok(()) => scattered(res, call, item),
        Err(e) => call.fail(e),
    }
    lock(&call.pipe.state).scattered += 1;
    call.pipe.moved.notify_all();
}

/// Prepares the next item, if any is left, and queues it for the submitters.
fn prepare_next(res: &Resources, call: &Call, io: &Inputs) {
    let (items, _) = items(res, call);
    let i = call.next.fetch_add(1, Ordering::Relaxed);
    let Some(item) = items.get(i) else { return };
    if let Err(e) = prepared(res, call, io, item) {
        call.fail(e);
        return;
    }
    let mut st = lock(&call.pipe.state);
    st.ready.push_back(i);
    st.queued += 1;
    drop(st);
    call.pipe.moved.notify_all();
}

/// Scatters the f32 results of `item`'s `product` to the call's dst(s).
fn scatter_item(
    res: &Resources,
    call: &Call,
    io: &Inputs,
    prep: &Prepared,
    item: &Item,
    product: Product,
) -> Result<(), Error> {
    let t = Instant::now();
    let p = &call.plan.problem;
    let rows = call.routing().rows_of(&call.routing().groups[item.group]);
    let (n0, n1, m) = (item.n0, item.n1, rows.len());
    let c_int = product.ints(res.tiles.c_len(m, n1 - n0));
    // Channel block j·np.. of a pair's product is projection j's.
    let np = res.tiles.pad(p.n);
    for (j, (p, dst)) in call.plan.problems().zip(io.dsts()).enumerate() {
        let (lo, hi) = (n0.max(j * np), n1.min((j + 1) * np));
        if lo < hi {
            let c_part = &c_int[(lo - n0) * m..(hi - n0) * m];
            let chan = &prep.expert.chan[lo..hi];
            let part = (j, lo - j * np, hi - j * np);
            scatter(res, p, rows, prep, part, chan, c_part, dst);
        }
    }
    res.spare_c.give(product.c);
    call.clock.add(Stage::Scatter, t);
    Ok(())
}

/// `dst[n, slot, token] = C[m][n] · (row_scale[m] · chan[n])` (with a tiny row's power of two
/// and the row's outlier correction, [`ScatterRow`]) for the padded channels `n0..n1` of
/// projection `proj` (`p`), from their native C block `c` and channel scales `chan`
/// ([`scale_row`] per row).
///
/// Native C is `[N/4][M][4]`: the 4 rows of a block hold one 64-byte run per tile, so a block's
/// tiles (one line each) are read from memory once, for its first row, and from L1 for the
/// other three, while every `dst` row is written front to back.
#[allow(clippy::too_many_arguments)]
fn scatter(
    res: &Resources,
    p: &Problem,
    rows: &[Row],
    prep: &Prepared,
    (proj, n0, n1): (usize, usize, usize),
    chan: &[f32],
    c: &[i32],
    dst: &[AtomicU32],
) {
    if n0 >= p.n {
        return; // padding channels only
    }
    let m = rows.len();
    let width = n1.min(p.n) - n0;
    let (chan, _) = chan.as_chunks::<QUAD>();
    let (c, _) = c.as_chunks::<QUAD>();
    let mut add = vec![0f32; if prep.outliers.is_some() { width } else { 0 }];
    for (mi, row) in rows.iter().enumerate() {
        let base = p.dst_offset(row.token as usize, row.slot as usize) + n0;
        let out = &dst[base..base + width];
        let scale = prep.row_scales[mi];
        let corrected = prep
            .outliers
            .as_ref()
            .is_some_and(|o| o.row(mi, proj, n0, &mut add));
        let finish = ScatterRow {
            scale: scale.scale,
            post: scale.post(),
            add: corrected.then_some(&add[..]),
        };
        scale_row(res.isa, c, mi, m, finish, chan, out);
    }
    publish(res.isa);
}
