//! Submitter threads (an offloaded device, as the RK3588's NPU under librknnrt): one per NPU
//! core, they run the GEMMs of the items the caller's threads prepared (`super::phase2`) and hand
//! the products back for their scatter.

use super::call::Call;
use super::phase2::items;
use super::product::product;
use super::resources::Resources;
use super::Error;
use crate::npu::CoreMask;
use crate::sync::lock;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::Ordering;

/// Runs `phase2` (the caller's threads' share of phase 2) with this call's submitter threads
/// alive, if it has any: they start once the work items exist and end with the call's GEMMs.
pub(super) fn with_submitters<R>(res: &Resources, call: &Call, phase2: impl FnOnce() -> R) -> R {
    let cores = res.submitter_cores();
    if cores.is_empty() || call.failed.load(Ordering::Relaxed) {
        return phase2();
    }
    items(res, call);
    std::thread::scope(|scope| {
        for core in cores {
            scope.spawn(move || {
                // A panic must end the call, not leave the other threads waiting for items.
                let r = panic::catch_unwind(AssertUnwindSafe(|| submitter(res, call, core)));
                if let Err(p) = r {
                    call.fail(Error::from_panic(p));
                }
            });
        }
        phase2()
    })
}

/// A submitter thread: runs the GEMMs of the items the caller's threads prepared, on `core`,
/// until every item is submitted or the call failed.
fn submitter(res: &Resources, call: &Call, core: CoreMask) {
    let (items, prepared) = items(res, call);
    let pipe = &call.pipe;
    loop {
        let mut st = lock(&pipe.state);
        let i = loop {
            if call.failed.load(Ordering::Relaxed) || st.submitted == items.len() {
                return;
            }
            if let Some(i) = st.ready.pop_front() {
                st.submitted += 1;
                break i;
            }
            st = pipe.moved.wait(st).unwrap_or_else(|e| e.into_inner());
        };
        drop(st);
        let item = &items[i];
        // The expert's `Arc` is dropped before the product is handed on.
        let product = prepared[item.group]
            .get()
            .and_then(|prep| product(res, call, &prep, item, Some(core)));
        match product {
            Ok(product) => {
                lock(&pipe.state).done.push_back((i, product));
                pipe.moved.notify_all();
            }
            Err(e) => call.fail(e),
        }
    }
}
