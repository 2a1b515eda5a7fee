//! The shapes and buffers the board refuses to run: envelopes per primitive, and one IOMMU domain
//! per submit.

use super::RUN_MAX_K;
use crate::npu::envelope::{in_stream_envelope, STREAM_K_MULTIPLE, STREAM_MAX_K};
use crate::npu::error::{Error, Result};
use crate::npu::kinds::Primitive;
use crate::npu::submit::MatMul;

/// Rejects a submit of `gemms` the board cannot run: each GEMM inside the envelope of
/// `primitive`, and its operands in C's `domain` (the board faults and soft-resets the NPU on a
/// submit that mixes domains).
pub(super) fn check_submit(primitive: Primitive, gemms: &[MatMul], domain: u32) -> Result<()> {
    for g in gemms {
        check_envelope(primitive, g.k)?;
        for found in [g.a.domain(), g.b.domain()] {
            if found != domain {
                return Err(Error::DomainMismatch {
                    expected: domain,
                    found,
                });
            }
        }
    }
    Ok(())
}

/// Rejects a depth `k` outside what `primitive` computes correctly on the board.
fn check_envelope(primitive: Primitive, k: usize) -> Result<()> {
    let reason = match primitive {
        Primitive::RunI8 if k > RUN_MAX_K => format!("K={k} > {RUN_MAX_K}"),
        Primitive::ChainI8 | Primitive::StreamI8 if !in_stream_envelope(k) => {
            format!("K={k} needs K % {STREAM_K_MULTIPLE} == 0 and K <= {STREAM_MAX_K}")
        }
        _ => return Ok(()),
    };
    Err(Error::Envelope { primitive, reason })
}
