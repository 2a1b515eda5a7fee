//! The `MUL_MAT_ID` engine: routed-expert matmuls on the NPU device.
//!
//! One call, `dst[:, slot, token] = as[:, :, ids[slot, token]]ᵀ · b[:, slot % b.ne[1], token]`:
//! 1. [`desc::validate`] checks the descriptors (metadata only) and the small-batch policy decides
//!    whether the call is taken ([`Engine::plan`]);
//! 2. phase 1, split over the caller's threads: [`route::Routing`] groups the rows by expert (and
//!    checks every id before anything is written), [`quantize`] turns each activation row into int8
//!    with one scale, once per call;
//! 3. phase 2, experts (or N-slices of a big one) handed out through an atomic counter: the expert's
//!    int8 weights come from the [`cache`] or are inflated now, its rows are gathered into the native
//!    A layout, the GEMM runs on the device (`run_stream_i8` inside the stream envelope, else
//!    `run_i8`), and int32 results become f32 (`C · row scale · channel scale`) written to `dst`.
//!
//! See docs/ENGINE.md for the design reasoning.

mod agreement;
pub mod cache;
mod call;
mod config;
mod corrections;
pub mod desc;
pub mod dispatch;
mod engine;
mod expert;
mod gather;
pub mod outliers;
mod phase1;
mod phase2;
mod plan;
mod prefetch;
mod product;
pub mod quantize;
mod resources;
pub mod route;
mod scatter;
pub mod segments;
mod spares;
mod staging;
mod stats;
mod submit;

pub use config::{Config, Dispatch, MtMode, SmallBatch, MEASURED_ROWS_PER_EXPERT};
pub use engine::Engine;
pub use plan::{Inputs, PairInputs, Plan};
pub use staging::{HeldBytes, HeldWeights, PrefetchStats};
pub use stats::{ExpertRun, Stages, Stats};

/// Why a call was not done. The C boundary maps each kind to its result code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Valid, but not taken here: the caller runs its own path. `dst` is untouched.
    NotHandled,
    /// Inconsistent descriptors or data (ids out of range). `dst` is untouched.
    InvalidArgument,
    /// The device failed; `dst` may be partly written.
    DeviceError,
    /// A buffer could not be allocated; `dst` may be partly written.
    OutOfMemory,
    /// A bug (a caught panic); `dst` may be partly written.
    Internal,
}

/// An error with a message for `ork_last_error`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    message: Message,
}

/// An error's text, formatted when it is read: the small-batch decline is every decode call's
/// answer, and formatting it would cost more than the rest of the decision.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Message {
    Text(String),
    Static(&'static str),
    BelowMinRows {
        tokens: usize,
        rows_per_expert: usize,
        min_rows: u32,
        measured: bool,
    },
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: Message::Text(message.into()),
        }
    }

    /// A call the configuration leaves to the caller, for a fixed reason: no allocation, as it
    /// may be every call's answer.
    pub fn not_handled(reason: &'static str) -> Error {
        Error {
            kind: ErrorKind::NotHandled,
            message: Message::Static(reason),
        }
    }

    /// A call below the small-batch threshold ([`Config::min_rows`]): not handled. `measured`:
    /// under [`Dispatch::Auto`], where the threshold counts tokens.
    pub fn below_min_rows(
        tokens: usize,
        rows_per_expert: usize,
        min_rows: u32,
        measured: bool,
    ) -> Error {
        Error {
            kind: ErrorKind::NotHandled,
            message: Message::BelowMinRows {
                tokens,
                rows_per_expert,
                min_rows,
                measured,
            },
        }
    }

    /// The text `ork_last_error` shows.
    pub fn message(&self) -> std::borrow::Cow<'_, str> {
        match &self.message {
            Message::Text(text) => text.into(),
            Message::Static(text) => (*text).into(),
            Message::BelowMinRows {
                tokens,
                rows_per_expert,
                min_rows,
                measured: false,
            } => format!(
                "{tokens} tokens, {rows_per_expert} rows per expert: below min_rows {min_rows} \
                 (ORK_MIN_ROWS) rows per expert, left to the caller"
            )
            .into(),
            Message::BelowMinRows {
                tokens,
                rows_per_expert,
                min_rows,
                measured: true,
            } => format!(
                "{tokens} tokens, {rows_per_expert} rows per expert: a decode-sized call (under \
                 {min_rows} tokens (ORK_MIN_ROWS) or under {} rows per expert), left to the \
                 caller without measuring it (ORK_DISPATCH=auto)",
                MEASURED_ROWS_PER_EXPERT.min(*min_rows)
            )
            .into(),
        }
    }

    /// A caught panic (its payload) as an [`ErrorKind::Internal`] error.
    pub fn from_panic(payload: Box<dyn std::any::Any + Send>) -> Error {
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown".into());
        Error::new(
            ErrorKind::Internal,
            format!("internal error (panic): {msg}"),
        )
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message())
    }
}

impl std::error::Error for Error {}

impl From<crate::npu::Error> for Error {
    fn from(e: crate::npu::Error) -> Error {
        let kind = match e {
            crate::npu::Error::OutOfMemory { .. } => ErrorKind::OutOfMemory,
            _ => ErrorKind::DeviceError,
        };
        Error::new(kind, format!("device: {e}"))
    }
}

/// `len` copies of `value`, or OutOfMemory instead of aborting the process.
fn try_vec<T: Clone>(len: usize, value: T, what: &str) -> Result<Vec<T>, Error> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| Error::new(ErrorKind::OutOfMemory, format!("cannot allocate {what}")))?;
    v.resize(len, value);
    Ok(v)
}
