//! The shapes chain and stream submits take on the NPU backends: the hardware's full-K reduction
//! schedule is right only inside them. Both NPU backends refuse the rest, so the engine behaves
//! the same on each.

/// Chain and stream: the full-K reduction schedule is right only for K a multiple of this...
pub const STREAM_K_MULTIPLE: usize = 512;
/// ...and up to this K.
pub const STREAM_MAX_K: usize = 4096;

/// Whether a GEMM of depth `k` (padded) may go to `run_chain_i8` / `run_stream_i8` on the NPU
/// backends: `K % 512 == 0 && K <= 4096`, outside which the hardware's full-K reduction schedule is
/// wrong. Outside it, use `run_i8`.
pub fn in_stream_envelope(k: usize) -> bool {
    k.is_multiple_of(STREAM_K_MULTIPLE) && k <= STREAM_MAX_K
}
