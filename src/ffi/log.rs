//! The library's log lines: to stderr, or to the host's callback.

use super::guard;
use std::ffi::{c_char, c_void, CString};
use std::sync::RwLock;

/// Log levels: `ork_config.log_level` (the most verbose one delivered) and the `level` argument
/// of an `ork_log_callback`.
pub const ORK_LOG_OFF: u32 = 0;
pub const ORK_LOG_ERROR: u32 = 1;
pub const ORK_LOG_WARN: u32 = 2;
pub const ORK_LOG_INFO: u32 = 3;
pub const ORK_LOG_DEBUG: u32 = 4;
pub const ORK_LOG_TRACE: u32 = 5;

/// Receives the library's log lines: `level` is `ORK_LOG_ERROR` .. `ORK_LOG_TRACE`, `message` one
/// line without a newline, valid only during the call. Called from any of the library's or the
/// caller's threads, possibly at the same time.
pub type ork_log_callback =
    Option<unsafe extern "C" fn(user: *mut c_void, level: u32, message: *const c_char)>;

/// Where log lines go: the host's callback, or stderr when it set none.
#[derive(Clone, Copy)]
struct LogSink {
    callback: ork_log_callback,
    /// The callback's `user` pointer, kept as an address so the sink is `Sync`.
    user: usize,
}

static LOG_SINK: RwLock<LogSink> = RwLock::new(LogSink {
    callback: None,
    user: 0,
});

/// The sink as it is now. The lock is held for the copy only, never while a line is delivered: a
/// callback may set, unset or replace itself ([`ork_set_log_callback`]) on its own thread or
/// another one while lines are being delivered.
fn current_sink() -> LogSink {
    *LOG_SINK.read().unwrap_or_else(|e| e.into_inner())
}

/// The library's `log` backend. Installed into the library's own copy of the `log` crate (the
/// cdylib links its own), never into a host's: a Rust program that links the rlib and has a
/// logger keeps it, and its logger gets the lines.
struct HostLogger;

impl log::Log for HostLogger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &log::Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let msg = r.args().to_string();
        let sink = current_sink();
        match sink.callback {
            Some(callback) => {
                let line = CString::new(msg.replace('\0', " ")).unwrap_or_default();
                let level = level_code(r.level());
                // SAFETY: the host's callback with its own user pointer, as it registered them;
                // `line` outlives the call.
                unsafe { callback(sink.user as *mut c_void, level, line.as_ptr()) }
            }
            None => eprintln!(
                "ork-moe: {}: {msg}",
                r.level().as_str().to_ascii_lowercase()
            ),
        }
    }

    fn flush(&self) {}
}

/// The callback's `level` of a line.
fn level_code(level: log::Level) -> u32 {
    match level {
        log::Level::Error => ORK_LOG_ERROR,
        log::Level::Warn => ORK_LOG_WARN,
        log::Level::Info => ORK_LOG_INFO,
        log::Level::Debug => ORK_LOG_DEBUG,
        log::Level::Trace => ORK_LOG_TRACE,
    }
}

static LOGGER: HostLogger = HostLogger;

/// Routes the library's log lines to stderr, or to the callback of [`ork_set_log_callback`], at
/// most as verbose as `level`. `ork_ctx_new` calls it; Rust tools on the rlib (the probe) call it
/// instead of installing a logger of their own.
pub fn log_install(level: log::LevelFilter) {
    // Fails only when a logger is already set: ours, or a Rust host's own, which then gets the lines.
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(level);
}

/// Sends the library's log lines to `callback` (e.g. a host's logger: the ggml patch forwards
/// them to ggml's log) instead of stderr; NULL goes back to stderr. Which levels are delivered is
/// `ork_config.log_level` (`ORK_LOG`) of the context created last.
///
/// May be called at any time from any thread, the callback itself included (a logger that
/// reconfigures logging): no lock is held while the callback runs. Each line goes to the callback
/// set when its delivery starts, so a line another thread is delivering at that moment may still
/// reach the previous callback and `user`.
#[no_mangle]
pub extern "C" fn ork_set_log_callback(callback: ork_log_callback, user: *mut c_void) {
    let _ = guard(|| {
        *LOG_SINK.write().unwrap_or_else(|e| e.into_inner()) = LogSink {
            callback,
            user: user as usize,
        };
        let _ = log::set_logger(&LOGGER);
        Ok(())
    });
}
