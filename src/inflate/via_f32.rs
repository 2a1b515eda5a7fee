//! The legacy path, kept for comparison: dequantize the whole expert to f32, then quantize each
//! channel symmetrically (`s = max|w|/127`, `q = rne(w·127/max|w|)`) straight into native B.
//!
//! Two plain passes the compiler vectorizes; the second writes each 32-weight run of a row with
//! one contiguous store, as the board's `tile_f32_i8` did.

use super::{check, zero_padding_channels, ExpertWeights, InflateError, Runs, RUN};
use crate::layout::Tiles;
use crate::quant::dequantize_row;

/// Inflates like [`super::inflate_expert`] (same outputs' shape and meaning, different scales),
/// through an f32 copy of the expert. NaN/Inf weights give [`InflateError::NonFiniteScale`]
/// (block index 0: this path only sees the row).
pub fn inflate_expert_via_f32(
    w: &ExpertWeights,
    tiles: &Tiles,
    b_native: &mut [i8],
    chan_scales: &mut [f32],
) -> Result<(), InflateError> {
    let shape = check(w, tiles, b_native.len(), chan_scales.len())?;
    let mut f = vec![0f32; w.n * w.k];
    for (row, out) in f.chunks_exact_mut(w.k.max(1)).enumerate().take(w.n) {
        let bytes = &w.data[row * w.row_stride..row * w.row_stride + shape.row_bytes];
        dequantize_row(w.ty, bytes, out).map_err(InflateError::Quant)?;
    }
    for (row, x) in f.chunks_exact(w.k.max(1)).enumerate().take(w.n) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        // `max` skips NaN, so look for non-finite weights explicitly.
        if !x.iter().all(|v| v.is_finite()) {
            return Err(InflateError::NonFiniteScale { row, block: 0 });
        }
        let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        chan_scales[row] = amax / 127.0;
        let mut runs = Runs {
            out: b_native,
            base: tiles.b_index(shape.kp, row, 0),
            stride: shape.tile_stride,
        };
        for (r, chunk) in x.chunks_exact(RUN).enumerate() {
            for (o, v) in runs.run(r).iter_mut().zip(chunk) {
                *o = (v * inv).round_ties_even() as i8;
            }
        }
        for r in w.k / RUN..shape.kp / RUN {
            runs.run(r).fill(0);
        }
    }
    zero_padding_channels(w.n, &shape, tiles, b_native, chan_scales);
    Ok(())
}
