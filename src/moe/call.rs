//! The state one call's threads share: its plan, routing, quantized activations, work items and
//! outcome, and how the threads of a cooperative call find it.

use super::cache::Expert;
use super::engine::Plan;
use super::route::{Group, Routing};
use super::stats::StageClock;
use super::{Error, ErrorKind};
use crate::npu::Buffer;
use crate::sync::lock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Identity of a cooperative call: the four data addresses and the caller's thread count.
pub(super) type CallKey = ([usize; 4], usize);

/// One activation share: quantized rows `first..first + scales.len()`, each `kp` bytes.
pub(super) struct QuantShare {
    pub first: usize,
    pub q: Vec<i8>,
    pub scales: Vec<f32>,
}

/// A used expert ready for its GEMMs: weights, its rows in native A (synced), their scales.
pub(super) struct Prepared {
    pub expert: Arc<Expert>,
    pub a: Buffer<i8>,
    pub row_scales: Vec<f32>,
}

pub(super) type PreparedSlot = OnceLock<Result<Prepared, Error>>;

/// A phase-2 work item: padded channels `n0..n1` of group `group`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Item {
    pub group: usize,
    pub n0: usize,
    pub n1: usize,
}

/// State shared by the threads of one call.
pub(super) struct Call {
    pub plan: Plan,
    key: CallKey,
    /// Caller threads that take part (cooperative calls: they join through `key`).
    participants: usize,
    /// Threads that do the work: one quantization share each.
    pub nth: usize,
    /// Caller threads that joined.
    arrived: AtomicUsize,
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
}

impl Call {
    pub fn new(plan: Plan, key: CallKey, participants: usize, nth: usize) -> Call {
        let nth = nth.max(1);
        let rows = plan.problem.act_rows();
        Call {
            chunk: rows.div_ceil(nth),
            plan,
            key,
            participants: participants.max(1),
            nth,
            arrived: AtomicUsize::new(1),
            routing: OnceLock::new(),
            quant: (0..nth).map(|_| OnceLock::new()).collect(),
            items: OnceLock::new(),
            next: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            clock: StageClock::default(),
        }
    }

    /// Records the call's first failure; every thread stops taking work.
    pub fn fail(&self, e: Error) {
        self.failed.store(true, Ordering::Relaxed);
        lock(&self.failure).get_or_insert(e);
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

    /// The prepared experts of a finished call, for their buffers' reuse.
    pub fn into_prepared(self) -> impl Iterator<Item = Prepared> {
        let slots = self.items.into_inner().map(|(_, p)| p).unwrap_or_default();
        slots
            .into_iter()
            .filter_map(|slot| slot.into_inner().and_then(Result::ok))
    }
}

/// Cooperative calls still waiting for some of their threads.
#[derive(Default)]
pub(super) struct Joining(Mutex<Vec<Arc<Call>>>);

impl Joining {
    /// The cooperative call `key` (same plan) still waiting for threads, or a new one made by
    /// `start`. The last of its participants to arrive takes it off the list, so the next call
    /// with the same buffers (the next layer) starts fresh.
    pub fn join(&self, plan: Plan, key: CallKey, start: impl FnOnce(Plan) -> Call) -> Arc<Call> {
        let mut joining = lock(&self.0);
        if let Some(i) = joining.iter().position(|c| c.key == key && c.plan == plan) {
            let call = Arc::clone(&joining[i]);
            if call.arrived.fetch_add(1, Ordering::Relaxed) + 1 >= call.participants {
                joining.swap_remove(i);
            }
            return call;
        }
        let call = Arc::new(start(plan));
        if call.participants > 1 {
            joining.push(Arc::clone(&call));
        }
        call
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
        let parts = if nth > 1 {
            (g.len * nth).div_ceil(total.max(1)).clamp(1, tiles)
        } else {
            1
        };
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

/// A zeroed vector, or OutOfMemory instead of aborting the process.
pub(super) fn try_vec<T: Clone>(len: usize, value: T, what: &str) -> Result<Vec<T>, Error> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| Error::new(ErrorKind::OutOfMemory, format!("cannot allocate {what}")))?;
    v.resize(len, value);
    Ok(v)
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
