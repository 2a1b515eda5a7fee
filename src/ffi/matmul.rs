//! The calls: `MUL_MAT_ID` (single and cooperative), pairs of them sharing one input, and dense
//! matmuls, each with its metadata-only check.

use super::tensor::{ork_tensor, Call};
use super::{ctx_ref, guard, invalid, ork_ctx, ork_result};
use crate::moe::{Error, ErrorKind};
use std::ffi::c_void;

/// The caller's threads for `ork_mul_mat_id_mt` (and the other `_mt` calls): each of `nth`
/// threads passes its own `ith`, `0 <= ith < nth <= ORK_MAX_THREADS`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ork_threads {
    pub ith: i32,
    pub nth: i32,
    /// A full barrier across the `nth` threads (ggml_barrier); may be NULL only when `nth == 1`.
    pub barrier: Option<unsafe extern "C" fn(arg: *mut c_void)>,
    pub barrier_arg: *mut c_void,
    /// Optional shared scratch; unused by this version (per-call state lives in the context).
    pub scratch: *mut c_void,
    pub scratch_size: usize,
}

/// The most caller threads a cooperative call takes (ggml's own limit is 512).
pub const ORK_MAX_THREADS: i32 = 4096;

/// The caller's threads, checked.
fn threads(th: *const ork_threads) -> Result<ork_threads, Error> {
    // SAFETY: a non-NULL `th` points to a readable ork_threads, by contract.
    let th = *unsafe { th.as_ref() }.ok_or_else(|| invalid("threads: descriptor is NULL"))?;
    if th.nth < 1 || th.nth > ORK_MAX_THREADS || th.ith < 0 || th.ith >= th.nth {
        return Err(invalid(&format!(
            "threads: ith {} / nth {} out of range (0 <= ith < nth <= {ORK_MAX_THREADS})",
            th.ith, th.nth
        )));
    }
    if th.barrier.is_none() && th.nth > 1 {
        return Err(invalid("threads: barrier is NULL with nth > 1"));
    }
    Ok(th)
}

/// The debug log line of a call that ends before the engine runs it (the engine logs those it
/// runs, `Engine::end`).
fn log_refused(entry: &str, e: &Error) {
    let outcome = match e.kind {
        ErrorKind::NotHandled => "declined",
        ErrorKind::InvalidArgument => "invalid argument",
        _ => "failed",
    };
    log::debug!("{entry}: {outcome}: {}", e.message());
}

/// Runs `call` (of the export `entry`) on the library's pool (`th` None) or cooperatively on
/// the caller's threads (`th` as given: checked here).
fn run(
    entry: &str,
    ctx: *const ork_ctx,
    call: Result<Call, Error>,
    th: Option<*const ork_threads>,
) -> ork_result {
    guard(|| {
        let th = th
            .map(threads)
            .transpose()
            .inspect_err(|e| log_refused(entry, e))?;
        // One count and one line per call: by its first thread.
        let first = th.is_none_or(|t| t.ith == 0);
        let planned = ctx_ref(ctx).and_then(|ctx| {
            let call = call?;
            let plan = call.plan(&ctx.engine).inspect_err(|e| {
                if e.kind == ErrorKind::NotHandled && first {
                    ctx.engine.note_declined();
                }
            })?;
            Ok((ctx, call, plan))
        });
        let (ctx, call, plan) = planned.inspect_err(|e| {
            if first {
                log_refused(entry, e)
            }
        })?;
        let io = call.inputs(&plan);
        let Some(th) = th else {
            return ctx.engine.run(plan, &io).map(drop);
        };
        let mut barrier = || {
            if let Some(f) = th.barrier {
                // SAFETY: the caller's barrier function with the caller's argument.
                unsafe { f(th.barrier_arg) }
            }
        };
        ctx.engine
            .run_mt(plan, &io, th.ith as usize, th.nth as usize, &mut barrier)
            .map(drop)
    })
}

/// Metadata-only check (no tensor data read): `ORK_OK` if the call would be handled,
/// `ORK_NOT_HANDLED` if the caller must run its own path, `ORK_INVALID_ARGUMENT` for inconsistent
/// descriptors. Same answer on every thread.
#[no_mangle]
pub extern "C" fn ork_mul_mat_id_check(
    ctx: *const ork_ctx,
    as_: *const ork_tensor,
    b: *const ork_tensor,
    ids: *const ork_tensor,
    dst: *const ork_tensor,
) -> ork_result {
    guard(|| {
        Call::single(as_, b, ids, dst)?
            .plan(&ctx_ref(ctx)?.engine)
            .map(drop)
    })
}

/// `dst[:, slot, token] = as[:, :, ids[slot, token]]^T · b[:, slot % b.ne[1], token]`, on the
/// library's own thread pool. Single caller.
#[no_mangle]
pub extern "C" fn ork_mul_mat_id(
    ctx: *mut ork_ctx,
    as_: *const ork_tensor,
    b: *const ork_tensor,
    ids: *const ork_tensor,
    dst: *const ork_tensor,
) -> ork_result {
    run("ork_mul_mat_id", ctx, Call::single(as_, b, ids, dst), None)
}

/// Cooperative form: ALL `th->nth` threads call it with identical tensors. Phase 1 (routing,
/// activation quantization) is split by `th->ith`, then `th->barrier`, then phase 2 hands
/// experts out through an atomic counter, then `th->barrier` once more so that every thread
/// returns the same code. Accept / decline depends on metadata only.
///
/// Every thread calls the barrier equally often: twice for a call that runs; once when the
/// threads turn out to disagree (another `nth` on one of them, one `ith` on two, or one that had
/// not come when the first barrier returned), which every thread returns as
/// `ORK_INVALID_ARGUMENT` naming the disagreement, `dst` untouched; never for a call declined or
/// refused from its descriptors, nor (`ORK_MT_COOP`) for out-of-range ids. A thread whose own
/// `th` is out of range returns `ORK_INVALID_ARGUMENT` at once, without the barrier.
#[no_mangle]
pub extern "C" fn ork_mul_mat_id_mt(
    ctx: *mut ork_ctx,
    as_: *const ork_tensor,
    b: *const ork_tensor,
    ids: *const ork_tensor,
    dst: *const ork_tensor,
    th: *const ork_threads,
) -> ork_result {
    run(
        "ork_mul_mat_id_mt",
        ctx,
        Call::single(as_, b, ids, dst),
        Some(th),
    )
}

/// Check of a pair: two `MUL_MAT_ID`s of one input (`b`, `ids`), e.g. a MoE FFN's gate and up,
/// with weights `as0`, `as1` of one type and shape and outputs `dst0`, `dst1`. `ORK_OK` if
/// [`ork_mul_mat_id_pair`] would compute both (each expert's two weight matrices as one GEMM);
/// otherwise the caller runs them as two calls. Metadata only, same answer on every thread.
#[no_mangle]
pub extern "C" fn ork_mul_mat_id_pair_check(
    ctx: *const ork_ctx,
    as0: *const ork_tensor,
    as1: *const ork_tensor,
    b: *const ork_tensor,
    ids: *const ork_tensor,
    dst0: *const ork_tensor,
    dst1: *const ork_tensor,
) -> ork_result {
    guard(|| {
        let call = Call::pair(as0, as1, b, ids, dst0, dst1)?;
        call.plan(&ctx_ref(ctx)?.engine).map(drop)
    })
}

/// `dst0 = mul_mat_id(as0, b, ids)` and `dst1 = mul_mat_id(as1, b, ids)` in one call, on the
/// library's own pool. Results are bit for bit those of two `ork_mul_mat_id` calls.
#[no_mangle]
pub extern "C" fn ork_mul_mat_id_pair(
    ctx: *mut ork_ctx,
    as0: *const ork_tensor,
    as1: *const ork_tensor,
    b: *const ork_tensor,
    ids: *const ork_tensor,
    dst0: *const ork_tensor,
    dst1: *const ork_tensor,
) -> ork_result {
    let call = Call::pair(as0, as1, b, ids, dst0, dst1);
    run("ork_mul_mat_id_pair", ctx, call, None)
}

/// The cooperative form of [`ork_mul_mat_id_pair`] (as [`ork_mul_mat_id_mt`]).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn ork_mul_mat_id_pair_mt(
    ctx: *mut ork_ctx,
    as0: *const ork_tensor,
    as1: *const ork_tensor,
    b: *const ork_tensor,
    ids: *const ork_tensor,
    dst0: *const ork_tensor,
    dst1: *const ork_tensor,
    th: *const ork_threads,
) -> ork_result {
    let call = Call::pair(as0, as1, b, ids, dst0, dst1);
    run("ork_mul_mat_id_pair_mt", ctx, call, Some(th))
}

/// Check of a dense matmul, ggml's `MUL_MAT` of a weight matrix: `dst = a^T · b` with `a` [K, N]
/// weights (a type or layout code as `as` of [`ork_mul_mat_id`]), `b` [K, T] f32, `dst` [N, T]
/// f32, all 2-D. It runs as a `MUL_MAT_ID` with one expert that every token routes to, so the
/// same rules decide (`ORK_MIN_ROWS` counts T); batched operands are `ORK_NOT_HANDLED`, and so is
/// every call with `ORK_DENSE=0`. Metadata only, same answer on every thread.
#[no_mangle]
pub extern "C" fn ork_mul_mat_check(
    ctx: *const ork_ctx,
    a: *const ork_tensor,
    b: *const ork_tensor,
    dst: *const ork_tensor,
) -> ork_result {
    guard(|| {
        Call::dense(a, b, dst)?
            .plan(&ctx_ref(ctx)?.engine)
            .map(drop)
    })
}

/// The dense matmul of [`ork_mul_mat_check`] on the library's own pool. Single caller.
#[no_mangle]
pub extern "C" fn ork_mul_mat(
    ctx: *mut ork_ctx,
    a: *const ork_tensor,
    b: *const ork_tensor,
    dst: *const ork_tensor,
) -> ork_result {
    run("ork_mul_mat", ctx, Call::dense(a, b, dst), None)
}

/// The cooperative form of [`ork_mul_mat`] (as [`ork_mul_mat_id_mt`]).
#[no_mangle]
pub extern "C" fn ork_mul_mat_mt(
    ctx: *mut ork_ctx,
    a: *const ork_tensor,
    b: *const ork_tensor,
    dst: *const ork_tensor,
    th: *const ork_threads,
) -> ork_result {
    run("ork_mul_mat_mt", ctx, Call::dense(a, b, dst), Some(th))
}
