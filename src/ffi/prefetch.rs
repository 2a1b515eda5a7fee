//! Prefetch: calls announced ahead, whose experts the library's threads inflate while the host
//! computes what comes before them, and the fence after which it reads none of their weights.

#[cfg(doc)]
use super::matmul::ork_mul_mat_id_pair;
use super::tensor::{name, ork_tensor, Call};
use super::{ctx_ref, guard, ork_ctx, ork_result};
use crate::moe::{Error, HeldBytes, HeldWeights};
use std::sync::Arc;

/// `as` memory the host keeps valid until `ork_prefetch_fence` returns ([`ork_prefetch`]'s
/// contract); the engine drops every one of these before its fence returns.
struct HostWeights {
    addr: usize,
    len: usize,
}

impl HeldBytes for HostWeights {
    fn bytes(&self) -> &[u8] {
        // SAFETY: validation checked the pointer non-NULL and its extent within the address
        // space; the host keeps the memory valid and unchanged until the fence, by contract.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }
}

/// Announces a `MUL_MAT_ID` call (or a pair: `as1` and `dst1` non-NULL, as
/// [`ork_mul_mat_id_pair`]) that will come, so that the library's prefetch threads
/// (`ORK_PREFETCH`) inflate its experts while the host computes what comes before it; the call
/// itself must still be made. The host keeps the weights of every call it announces valid and
/// unchanged until [`ork_prefetch_fence`] returns (e.g. announce a graph's calls at its start,
/// fence at its end).
///
/// Without prefetch threads (`ORK_PREFETCH=0`, or none placed) it returns `ORK_OK` at once:
/// nothing is checked or queued. Otherwise the descriptors are checked as the call's check
/// checks them (`ork_mul_mat_id_check`, `ork_mul_mat_id_pair_check`; every descriptor's `data`
/// included, so NULL is `ORK_INVALID_ARGUMENT` as there), and the result is the check's:
/// `ORK_OK` for a call the library takes (its experts queued; a small batch that
/// `ORK_MIN_ROWS_MODE=cpu` runs on the CPU queues nothing), `ORK_NOT_HANDLED` for one it
/// declines (a small batch under the default `decline` among them; nothing queued),
/// `ORK_INVALID_ARGUMENT` for bad descriptors. The memory of `b`, `ids` and `dst` is never read;
/// that of the weights only by the prefetch threads, until the fence.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn ork_prefetch(
    ctx: *mut ork_ctx,
    as0: *const ork_tensor,
    as1: *const ork_tensor,
    b: *const ork_tensor,
    ids: *const ork_tensor,
    dst0: *const ork_tensor,
    dst1: *const ork_tensor,
) -> ork_result {
    guard(|| {
        let ctx = ctx_ref(ctx).inspect_err(|e| log::debug!("ork_prefetch: {e}"))?;
        if !ctx.engine.prefetching() {
            log::debug!("ork_prefetch: no prefetch threads, nothing checked");
            return Ok(());
        }
        match announce(ctx, [as0, as1], b, ids, [dst0, dst1]) {
            Ok(experts) => log::debug!("ork_prefetch: {experts} experts queued"),
            Err(e) => {
                log::debug!("ork_prefetch: {e}");
                return Err(e);
            }
        }
        Ok(())
    })
}

/// Checks and queues an announced call (one projection, or a pair); the number of experts queued.
fn announce(
    ctx: &ork_ctx,
    [as0, as1]: [*const ork_tensor; 2],
    b: *const ork_tensor,
    ids: *const ork_tensor,
    [dst0, dst1]: [*const ork_tensor; 2],
) -> Result<usize, Error> {
    let call = if as1.is_null() && dst1.is_null() {
        Call::single(as0, b, ids, dst0)?
    } else {
        Call::pair(as0, as1, b, ids, dst0, dst1)?
    };
    let plan = call.plan(&ctx.engine)?;
    let descs = [Some(&call.w), call.pair.as_ref().map(|(w, _)| w)];
    let weights = plan
        .problems()
        .zip(descs.into_iter().flatten())
        .zip(call.weights)
        .map(|((p, d), t)| HeldWeights {
            data: Arc::new(HostWeights {
                addr: d.addr,
                len: p.w_extent,
            }),
            name: name(t).map(str::to_owned),
        })
        .collect();
    ctx.engine.prefetch(plan, weights)
}

/// After this returns the library reads none of the weights announced before it
/// ([`ork_prefetch`]): queued experts are dropped and those being inflated are waited for.
/// Experts inflated already stay for their calls.
#[no_mangle]
pub extern "C" fn ork_prefetch_fence(ctx: *mut ork_ctx) -> ork_result {
    guard(|| {
        ctx_ref(ctx)?.engine.prefetch_fence();
        Ok(())
    })
}
