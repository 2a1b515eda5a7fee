//! The C ABI (`include/ork_moe.h`, generated from this folder by cbindgen), one file per family:
//! [`config`] (the configuration and the context's life), [`tensor`] (descriptors), [`matmul`]
//! (the calls), [`observe`], [`prefetch`], [`log`], [`stats`], `exit` (what a context does when the
//! process exits); this file holds what they share.
//!
//! Conventions, as in rustls-ffi:
//! - every export runs inside [`guard`], so no panic crosses the boundary: a caught panic becomes
//!   `ORK_INTERNAL_ERROR` (exports returning a pointer or nothing map that to NULL / no effect);
//! - every pointer is checked for NULL before use; failures set a thread-local message
//!   ([`ork_last_error`]);
//! - result codes are plain `uint32_t` constants with fixed values; integers from C are matched,
//!   never transmuted into Rust enums;
//! - the context is a `Box` owned by the caller between `ork_ctx_new` and `ork_ctx_free`, shared
//!   by reference otherwise (it is safe to use from several threads at once).
//!
//! Tensor memory is the caller's: each descriptor's data must be valid for the bytes its `ne`/`nb`
//! span (what ggml's own kernels assume too) and stay unchanged, and `dst` unread, during a call.

// The C names (`ork_tensor`, `ork_result`, ...) are the API.
#![allow(non_camel_case_types)]
// The exports are called from C, where `unsafe` means nothing; their pointer contract is stated
// once above and in each function's comment, and every dereference has its SAFETY note.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

pub mod config;
mod exit;
pub mod log;
pub mod matmul;
pub mod observe;
pub mod prefetch;
pub mod stats;
pub mod tensor;

pub use self::config::*;
pub use self::log::*;
pub use self::matmul::*;
pub use self::observe::*;
pub use self::prefetch::*;
pub use self::stats::*;
pub use self::tensor::*;

use crate::moe::{Engine, Error, ErrorKind};
use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Result of every fallible call.
pub type ork_result = u32;
/// Done: `dst` holds the result.
pub const ORK_OK: ork_result = 0;
/// Valid but not taken (weight type, layout, small batch): run your own path. `dst` untouched.
pub const ORK_NOT_HANDLED: ork_result = 1;
/// Inconsistent descriptors or data (NULL, shapes, ids out of range). `dst` untouched, except for
/// NaN/Inf weight scales, which are only seen while inflating (then `dst` may be partly written).
pub const ORK_INVALID_ARGUMENT: ork_result = 2;
/// The device failed; `dst` may be partly written.
pub const ORK_DEVICE_ERROR: ork_result = 3;
/// Out of memory (host or NPU IOMMU domain); `dst` may be partly written.
pub const ORK_OUT_OF_MEMORY: ork_result = 4;
/// A bug: a panic was caught at the boundary.
pub const ORK_INTERNAL_ERROR: ork_result = 5;

/// Version of this ABI; bumped on incompatible changes. Compatible additions keep it, and a
/// caller asks for them: the weight layout codes (`ORK_TYPE_*`) extend version 1, and a library
/// that predates a code declines it by construction (`ork_supports_type` returns 0, the calls
/// return `ORK_NOT_HANDLED`), so a caller offers a layout only where `ork_supports_type` says 1,
/// and a caller that never passes one is unaffected.
pub const ORK_ABI_VERSION: u32 = 1;

/// Opaque context.
pub struct ork_ctx {
    engine: Engine,
}

/// This thread's last failure, kept as the error until [`ork_last_error`] asks for its text: a
/// declined call (every decode step's) allocates and formats nothing.
#[derive(Default)]
struct LastError {
    pending: Option<Error>,
    text: CString,
}

thread_local! {
    static LAST_ERROR: RefCell<LastError> = RefCell::default();
}

fn set_last_error(e: Error) {
    LAST_ERROR.with(|l| l.borrow_mut().pending = Some(e));
}

fn code(kind: ErrorKind) -> ork_result {
    match kind {
        ErrorKind::NotHandled => ORK_NOT_HANDLED,
        ErrorKind::InvalidArgument => ORK_INVALID_ARGUMENT,
        ErrorKind::DeviceError => ORK_DEVICE_ERROR,
        ErrorKind::OutOfMemory => ORK_OUT_OF_MEMORY,
        ErrorKind::Internal => ORK_INTERNAL_ERROR,
    }
}

/// The panic boundary of every export.
fn guard(f: impl FnOnce() -> Result<(), Error>) -> ork_result {
    let e = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => return ORK_OK,
        Ok(Err(e)) => e,
        Err(p) => Error::from_panic(p),
    };
    let kind = e.kind;
    set_last_error(e);
    code(kind)
}

fn invalid(msg: &str) -> Error {
    Error::new(ErrorKind::InvalidArgument, msg)
}

/// The context behind a caller's pointer, or the error for NULL.
fn ctx_ref<'a>(ctx: *const ork_ctx) -> Result<&'a ork_ctx, Error> {
    // SAFETY: a non-NULL `ctx` is a live context from `ork_ctx_new`, by contract.
    unsafe { ctx.as_ref() }.ok_or_else(|| invalid("ctx is NULL"))
}

/// Message of the last failed call on this thread ("" if none). Valid until the next failing
/// call on this thread.
#[no_mangle]
pub extern "C" fn ork_last_error() -> *const c_char {
    LAST_ERROR.with(|l| {
        let mut l = l.borrow_mut();
        if let Some(e) = l.pending.take() {
            l.text = CString::new(e.message().replace('\0', " ")).unwrap_or_default();
        }
        l.text.as_ptr()
    })
}

/// The library version, e.g. "0.1.0" (static string).
#[no_mangle]
pub extern "C" fn ork_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr() as *const c_char
}

/// `ORK_ABI_VERSION` of the library actually loaded.
#[no_mangle]
pub extern "C" fn ork_abi_version() -> u32 {
    ORK_ABI_VERSION
}
