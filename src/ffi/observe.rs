//! The caller's own times, for `ORK_DISPATCH=auto`: the library times its own path inside each
//! call; a patched llama.cpp times the calls it ran itself and reports them here.

use super::tensor::{ork_tensor, Call};
use super::{ctx_ref, guard, invalid, ork_ctx, ork_result};

/// The caller ran a call on its own path in `seconds` of wall time: one the library declined
/// (`ORK_NOT_HANDLED` from the call itself, not from its `_check`), described as it was offered.
/// `as1` and `dst1` are NULL but for a pair (`ork_mul_mat_id_pair_mt`); `ids`, `as1` and `dst1`
/// are all NULL for a dense matmul (`ork_mul_mat_mt`). Metadata only: no tensor data is read.
/// `ORK_OK` when taken as a sample (or ignored: any `ORK_DISPATCH` but `auto`), `ORK_NOT_HANDLED`
/// for a call the library never takes, `ORK_INVALID_ARGUMENT` for bad descriptors or a time that
/// is negative or not finite.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn ork_observe(
    ctx: *const ork_ctx,
    as0: *const ork_tensor,
    as1: *const ork_tensor,
    b: *const ork_tensor,
    ids: *const ork_tensor,
    dst0: *const ork_tensor,
    dst1: *const ork_tensor,
    seconds: f64,
) -> ork_result {
    guard(|| {
        let ctx = ctx_ref(ctx)?;
        if !seconds.is_finite() || seconds < 0.0 {
            return Err(invalid(&format!("ork_observe: seconds {seconds}")));
        }
        let call = match (as1.is_null() && dst1.is_null(), ids.is_null()) {
            (true, true) => Call::dense(as0, b, dst0)?,
            (true, false) => Call::single(as0, b, ids, dst0)?,
            (false, _) => Call::pair(as0, as1, b, ids, dst0, dst1)?,
        };
        let plan = call.plan(&ctx.engine)?;
        ctx.engine.observe(&plan, seconds);
        Ok(())
    })
}
