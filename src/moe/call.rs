//! The state one call's threads share: its plan, routing, quantized activations, work items and
//! outcome, and how the threads of a cooperative call find it.

use super::agreement::Agreement;
use super::cache::Expert;
use super::corrections::Corrections;
use super::plan::Plan;
use super::quantize::RowScale;
use super::route::{Group, Routing};
use super::staging::PrefetchPause;
use super::stats::{ExpertRun, StageClock};
use super::{Error, ErrorKind};
use crate::npu::Buffer;
use crate::sync::lock;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Instant;

/// Identity of a cooperative call: the four data addresses. (Each thread's `nth` is checked
/// against the call's, [`Agreement`], not part of the key: a thread with another `nth` would
/// otherwise start a call of its own and wait for threads that never come.)
pub(super) type CallKey = [usize; 4];

/// One activation share: quantized rows `first..first + scales.len()`, each `kp` bytes, and
/// each row's outlier channels (`outliers[ends[r - 1]..ends[r]]`, none without the lever).
pub(super) struct QuantShare {
    pub first: usize,
    pub q: Vec<i8>,
    pub scales: Vec<RowScale>,
    pub outliers: Vec<u32>,
    pub ends: Vec<u32>,
}

impl QuantShare {
    /// The outlier channels of activation row `r` (an index of the call).
    pub fn outliers_of(&self, r: usize) -> &[u32] {
        let i = r - self.first;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.outliers[start..self.ends[i] as usize]
    }
}

/// A used expert ready for its GEMMs: weights, its rows in native A (synced), their scales, and
/// the outlier correction of its rows.
pub(super) struct Prepared {
    pub expert: Arc<Expert>,
    pub a: Buffer<i8>,
    pub row_scales: Vec<RowScale>,
    pub outliers: Option<Corrections>,
}

/// A group's prepared expert: made by the first thread to need it, shared by its items' threads,
/// and handed back by the thread that scatters its last item, so that a call streaming 128
/// experts holds the buffers of those in flight, not of all 128 until its end.
pub(super) struct PreparedSlot {
    made: OnceLock<Result<Mutex<Option<Arc<Prepared>>>, Error>>,
    /// Items of the group not scattered yet.
    left: AtomicUsize,
}

impl PreparedSlot {
    pub fn new(items: usize) -> PreparedSlot {
        PreparedSlot {
            made: OnceLock::new(),
            left: AtomicUsize::new(items),
        }
    }

    /// The prepared expert, made by `make` unless another thread did.
    pub fn get_or_make(
        &self,
        make: impl FnOnce() -> Result<Prepared, Error>,
    ) -> Result<Arc<Prepared>, Error> {
        match self
            .made
            .get_or_init(|| make().map(|p| Mutex::new(Some(Arc::new(p)))))
        {
            Ok(held) => lock(held).clone().ok_or_else(Self::gone),
            Err(e) => Err(e.clone()),
        }
    }

    /// The prepared expert, made before.
    pub fn get(&self) -> Result<Arc<Prepared>, Error> {
        match self.made.get() {
            Some(Ok(held)) => lock(held).clone().ok_or_else(Self::gone),
            Some(Err(e)) => Err(e.clone()),
            None => Err(Error::new(
                ErrorKind::Internal,
                "an item was queued before its expert was prepared",
            )),
        }
    }

    /// One of the group's items is scattered, its thread holding no `Arc` of the expert any
    /// more: after the last one, the prepared expert, unshared.
    pub fn scattered(&self) -> Option<Prepared> {
        if self.left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return None;
        }
        self.take()
    }

    fn take(&self) -> Option<Prepared> {
        match self.made.get() {
            Some(Ok(held)) => lock(held).take().and_then(Arc::into_inner),
            _ => None,
        }
    }

    fn gone() -> Error {
        Error::new(
            ErrorKind::Internal,
            "an expert's buffers were handed back before its last item",
        )
    }
}

/// A phase-2 work item: padded channels `n0..n1` of group `group`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Item {
    pub group: usize,
    pub n0: usize,
    pub n1: usize,
}

/// The int32 product of one work item (native C of its rows × channels): a device buffer, and
/// for an expert deeper than one device GEMM the sum of its depth segments' products.
pub(super) struct Product {
    pub c: Buffer<i32>,
    pub sum: Option<Vec<i32>>,
}

impl Product {
    /// The product's `len` int32 values.
    pub fn ints(&self, len: usize) -> &[i32] {
        match &self.sum {
            Some(sum) => &sum[..len],
            None => &self.c.as_slice()[..len],
        }
    }
}

/// Phase 2 with submitter threads (an offloaded device): items the caller's threads prepared wait
/// in `ready` for a submitter (one per NPU core), their products in `done` for a caller thread's
/// scatter. One lock and one condition for both queues: a call has a few hundred items at most.
#[derive(Default)]
pub(super) struct Pipe {
    pub state: Mutex<PipeState>,
    pub moved: Condvar,
}

#[derive(Default)]
pub(super) struct PipeState {
    pub ready: VecDeque<usize>,
    pub done: VecDeque<(usize, Product)>,
    /// Items put into `ready`, taken by submitters, and scattered.
    pub queued: usize,
    pub submitted: usize,
    pub scattered: usize,
}

/// State shared by the threads of one call.
pub(super) struct Call {
    pub plan: Plan,
    key: CallKey,
    /// Threads that do the work: one quantization share each.
    pub nth: usize,
    /// The caller threads that take part (cooperative calls: they join through `key`), and
    /// whether they agree on `nth` and `ith`.
    pub agreement: Agreement,
    /// Activation rows per quantization share.
    pub chunk: usize,
    pub routing: OnceLock<Result<Routing, Error>>,
    pub quant: Vec<OnceLock<QuantShare>>,
    /// Phase-2 work items and, per group, its prepared expert (made by the first thread to need it).
    pub items: OnceLock<(Vec<Item>, Vec<PreparedSlot>)>,
    pub next: AtomicUsize,
    pub failed: AtomicBool,
    failure: Mutex<Option<Error>>,
    pub clock: StageClock,
    pub pipe: Pipe,
    /// The used experts as prepared, with their group index (the engine's order).
    pub runs: Mutex<Vec<(usize, ExpertRun)>>,
    /// With prefetch threads: they pause until the call is gone.
    pub prefetch_pause: Option<PrefetchPause>,
    /// With prefetch threads, a call that does not pause them: its threads take prefetch jobs
    /// while they wait for its NPU runs.
    pub helps_prefetch: bool,
    /// When the first thread came: the library's time on the call ends at its result.
    pub started: Instant,
    /// Declined by `ORK_DISPATCH` when the first thread came: every thread returns it.
    pub declined: Option<Error>,
}

impl Call {
    pub fn new(plan: Plan, key: CallKey, participants: usize, nth: usize) -> Call {
        let nth = nth.max(1);
        let rows = plan.problem.act_rows();
        Call {
            chunk: rows.div_ceil(nth),
            started: Instant::now(),
            declined: None,
            plan,
            key,
            nth,
            agreement: Agreement::new(participants.max(1)),
            routing: OnceLock::new(),
            quant: (0..nth).map(|_| OnceLock::new()).collect(),
            items: OnceLock::new(),
            next: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            clock: StageClock::default(),
            pipe: Pipe::default(),
            runs: Mutex::new(Vec::new()),
            prefetch_pause: None,
            helps_prefetch: false,
        }
    }

    /// Its activation rows are quantized where each expert gathers them, not in phase 1: each
    /// row has one reader, so that is no extra work, saves a pass over the rows, and overlaps
    /// the earlier experts' NPU runs instead of keeping the NPU idle until phase 1 ends. A dense
    /// call's one expert keeps phase 1, which spreads the rows over every thread.
    pub fn quantized_at_gather(&self) -> bool {
        let p = &self.plan.problem;
        p.rows_read_once() && !p.one_expert()
    }

    /// Phase 1 writes its shares in native A's order (`[K/16][rows][16]`): a call of one expert
    /// whose rows are each read once (a dense matmul's) gathers every row, in order, so its A is
    /// the shares' blocks side by side, copied whole instead of 16 bytes at a time.
    pub fn quantized_native(&self) -> bool {
        let p = &self.plan.problem;
        p.one_expert() && p.rows_read_once()
    }

    /// Records the call's first failure; every thread stops taking work.
    pub fn fail(&self, e: Error) {
        self.failed.store(true, Ordering::Relaxed);
        lock(&self.failure).get_or_insert(e);
        // Threads waiting in the pipe look at `failed` again (taking the lock first: none of
        // them can be between its check and its wait).
        drop(lock(&self.pipe.state));
        self.pipe.moved.notify_all();
    }

    pub fn result(&self) -> Result<super::Stages, Error> {
        if let Some(Err(e)) = self.routing.get() {
            return Err(e.clone());
        }
        match lock(&self.failure).clone() {
            Some(e) => Err(e),
            None => Ok(self.clock.get()),
        }
    }

    /// The routing, once computed (after phase 1).
    pub fn routing(&self) -> &Routing {
        match self.routing.get() {
            Some(Ok(r)) => r,
            _ => unreachable!("phase 2 runs only after a successful routing"),
        }
    }

    /// The prepared experts a finished call still holds (a failed call's), for their buffers'
    /// reuse.
    pub fn into_prepared(self) -> impl Iterator<Item = Prepared> {
        let slots = self.items.into_inner().map(|(_, p)| p).unwrap_or_default();
        slots.into_iter().filter_map(|slot| slot.take())
    }
}

/// Cooperative calls still waiting for some of their threads.
#[derive(Default)]
pub(super) struct Joining(Mutex<Vec<Arc<Call>>>);

impl Joining {
    /// The cooperative call `key` (same plan) still waiting for threads, or a new one made by
    /// `start`, joined by the thread `(ith, nth)`. A call stays on the list until its threads'
    /// agreement is decided ([`Joining::verdict`]): a thread too many, or with another `nth`,
    /// still finds it and makes it fail, where a call of its own would wait for threads that
    /// never come.
    pub fn join(
        &self,
        plan: Plan,
        key: CallKey,
        (ith, nth): (usize, usize),
        start: impl FnOnce(Plan) -> Call,
    ) -> Arc<Call> {
        let mut joining = lock(&self.0);
        if let Some(call) = joining.iter().find(|c| c.key == key && c.plan == plan) {
            call.agreement.join(ith, nth);
            return Arc::clone(call);
        }
        let call = Arc::new(start(plan));
        call.agreement.join(ith, nth);
        if nth > 1 {
            joining.push(Arc::clone(&call));
        }
        call
    }

    /// After the call's first barrier: whether its threads agree, decided once, by the first
    /// thread to ask (which gets `true` too). Deciding takes the call off the list, so that
    /// the next call with the same buffers (the next layer) starts fresh; under the list's lock,
    /// so that no thread joins between the two.
    pub fn verdict<'c>(&self, call: &'c Arc<Call>) -> (&'c Result<(), Error>, bool) {
        call.agreement.verdict(|| {
            let mut joining = lock(&self.0);
            joining.retain(|c| !Arc::ptr_eq(c, call));
            call.agreement.decide()
        })
    }

    /// Takes a call its threads do not run (declined) off the list once all of them came, so
    /// that the next call with the same buffers starts fresh.
    pub fn leave_when_all_came(&self, call: &Arc<Call>) {
        let mut joining = lock(&self.0);
        if call.agreement.all_joined() {
            joining.retain(|c| !Arc::ptr_eq(c, call));
        }
    }

    /// Takes `call` off the list if it is still there: a call that ends before its first
    /// barrier (its routing failed), so that a thread coming later starts afresh.
    pub fn leave(&self, call: &Arc<Call>) {
        lock(&self.0).retain(|c| !Arc::ptr_eq(c, call));
    }
}

/// Splits each group's padded channels into parts so that no part holds much more than
/// `1/nth` of all rows × channels: only an expert with more than its share of the rows is split,
/// in whole `tile`-channel tiles.
pub(super) fn plan_items(groups: &[Group], np: usize, tile: usize, nth: usize) -> Vec<Item> {
    let total: usize = groups.iter().map(|g| g.len).sum();
    let tiles = np / tile;
    let mut items = Vec::new();
    for (gi, g) in groups.iter().enumerate() {
        let parts = crate::npu::expert_parts(g.len, total, nth, tiles);
        for p in 0..parts {
            let (t0, t1) = (p * tiles / parts, (p + 1) * tiles / parts);
            items.push(Item {
                group: gi,
                n0: t0 * tile,
                n1: t1 * tile,
            });
        }
    }
    items
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_split_only_the_oversized_expert() {
        let group = |expert, start, len| Group { expert, start, len };
        let groups = [group(3, 0, 90), group(1, 90, 6), group(2, 96, 4)];
        let one = plan_items(&groups, 768, 32, 1);
        assert_eq!(one.len(), 3);
        assert!(one.iter().all(|i| (i.n0, i.n1) == (0, 768)));
        let two = plan_items(&groups, 768, 32, 2);
        assert_eq!(two.iter().filter(|i| i.group == 0).count(), 2);
        let item = |group, n0, n1| Item { group, n0, n1 };
        assert_eq!(two[..2], [item(0, 0, 384), item(0, 384, 768)]);
        assert_eq!(two.len(), 4);
    }
}
