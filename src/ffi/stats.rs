//! The context's counters, and its dispatch verdicts at the process's exit.

use super::config::{ORK_BACKEND_AUTO, ORK_BACKEND_CPU, ORK_BACKEND_EMU, ORK_BACKEND_RKNN};
use super::{ctx_ref, guard, invalid, ork_ctx, ork_result};
use crate::moe::dispatch::describe;
use crate::moe::Dispatch;
use crate::npu::BackendKind;
use crate::sync::lock;
use std::panic::catch_unwind;
use std::sync::{Mutex, Once};

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

/// The live contexts under `ORK_DISPATCH=auto`, by address: when the process exits, their
/// verdicts not yet in the cache file are saved, and printed with `ORK_MOE_STATS` (a patched
/// llama.cpp never frees its context).
static AUTO_CONTEXTS: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// Adds `ctx` to the contexts seen at exit when it dispatches by measurement.
pub(super) fn watch_until_exit(ctx: *mut ork_ctx) {
    // SAFETY: `ctx` is the live context `ork_ctx_from_engine` just made.
    let Some(c) = (unsafe { ctx.as_ref() }) else {
        return;
    };
    if c.engine.config().dispatch != Dispatch::Auto {
        return;
    }
    static REGISTERED: Once = Once::new();
    REGISTERED.call_once(|| {
        // SAFETY: `at_exit` takes no arguments and lets no panic out.
        unsafe { libc::atexit(at_exit) };
    });
    lock(&AUTO_CONTEXTS).push(ctx as usize);
}

/// Removes `ctx` (about to be freed) from the contexts seen at exit.
pub(super) fn forget(ctx: *mut ork_ctx) {
    lock(&AUTO_CONTEXTS).retain(|&c| c != ctx as usize);
}

extern "C" fn at_exit() {
    let _ = catch_unwind(|| {
        for &addr in lock(&AUTO_CONTEXTS).iter() {
            // SAFETY: a context in the list is live: `ork_ctx_free` removes it before freeing.
            let engine = &unsafe { &*(addr as *const ork_ctx) }.engine;
            engine.save_dispatch();
            if engine.config().print_verdicts {
                for (class, verdict) in engine.dispatch_verdicts() {
                    eprintln!("ork-moe dispatch: {class}: {}", describe(&verdict));
                }
            }
        }
    });
}
