//! The context's counters.

use super::config::{ORK_BACKEND_AUTO, ORK_BACKEND_CPU, ORK_BACKEND_EMU, ORK_BACKEND_RKNN};
use super::{ctx_ref, guard, invalid, ork_ctx, ork_result};
use crate::npu::BackendKind;

/// Counters since `ork_ctx_new`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ork_stats {
    pub calls: u64,
    pub handled: u64,
    pub declined: u64,
    pub rows: u64,
    pub experts_inflated: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub cache_evictions: u64,
    /// Bytes of native int8 B written by inflation.
    pub bytes_inflated: u64,
    pub submits_run_i8: u64,
    pub submits_stream: u64,
    pub submits_chain: u64,
    /// GEMMs of small batches run on the CPU (`ORK_MIN_ROWS_CPU`).
    pub cpu_gemms: u64,
    /// Cost model of the RK3588 (emulator), not a measurement.
    pub modelled_npu_us: f64,
    /// `ORK_BACKEND_*` of the backend in use.
    pub backend: i32,
}

/// Copies the context's counters into `out`.
#[no_mangle]
pub extern "C" fn ork_ctx_stats(ctx: *const ork_ctx, out: *mut ork_stats) -> ork_result {
    guard(|| {
        let ctx = ctx_ref(ctx)?;
        if out.is_null() {
            return Err(invalid("ork_ctx_stats: out is NULL"));
        }
        let s = ctx.engine.stats();
        let c = ork_stats {
            calls: s.calls,
            handled: s.handled,
            declined: s.declined,
            rows: s.rows,
            experts_inflated: s.experts_inflated,
            cache_hits: s.cache_hits,
            cache_misses: s.cache_misses,
            cache_evictions: s.cache_evictions,
            bytes_inflated: s.bytes_inflated,
            submits_run_i8: s.submits_run_i8,
            submits_stream: s.submits_stream,
            submits_chain: s.submits_chain,
            cpu_gemms: s.cpu_gemms,
            modelled_npu_us: s.modelled_npu_us,
            backend: match s.backend {
                Some(BackendKind::Emu) => ORK_BACKEND_EMU,
                Some(BackendKind::Rknn) => ORK_BACKEND_RKNN,
                Some(BackendKind::Cpu) => ORK_BACKEND_CPU,
                None => ORK_BACKEND_AUTO,
            },
        };
        // SAFETY: `out` is non-NULL and points to a writable ork_stats, by contract.
        unsafe { out.write(c) };
        Ok(())
    })
}
