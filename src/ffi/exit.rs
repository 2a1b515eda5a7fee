//! What a context under `ORK_DISPATCH=auto` does when the process exits: its verdicts not yet in
//! the cache file are saved, and printed with `ORK_MOE_STATS` (a patched llama.cpp never frees
//! its context).

use super::ork_ctx;
use crate::moe::dispatch::describe;
use crate::moe::Dispatch;
use crate::sync::lock;
use std::panic::catch_unwind;
use std::sync::{Mutex, Once};

/// The live contexts under `ORK_DISPATCH=auto`, by address.
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
