//! Prefetch: calls announced ahead, whose experts the library's threads inflate while the host
//! computes what comes before them, and the fence after which it reads none of their weights.

#[cfg(doc)]
use super::matmul::ork_mul_mat_id_pair;
use super::tensor::{name, ork_tensor, Call};
use super::{ctx_ref, guard, ork_ctx, ork_result};
use crate::moe::{HeldBytes, HeldWeights};
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
/// (`ORK_PREFETCH`) inflate its experts while the host computes what comes before it. Metadata
/// only: `b`, `ids` and `dst` are not read, and the call itself must still be made. The host
/// keeps the weights of every call it announces valid and unchanged until
/// [`ork_prefetch_fence`] returns (e.g. announce a graph's calls at its start, fence at its end).
/// `ORK_OK` when queued or when there is nothing to do (a small batch; without prefetch threads
/// nothing is checked), `ORK_NOT_HANDLED` for a call the library would decline,
/// `ORK_INVALID_ARGUMENT` for bad descriptors.
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
        let ctx = ctx_ref(ctx)?;
        if !ctx.engine.prefetching() {
            return Ok(());
        }
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
    })
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
