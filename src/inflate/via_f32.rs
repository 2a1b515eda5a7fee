//! The legacy path, kept for comparison: dequantize the whole expert to f32, then quantize each
//! channel symmetrically (`s = max|w|/127`, `q = rne(w·127/max|w|)`) straight into native B.
//!
//! Two plain passes the compiler vectorizes. The second writes native B in memory order, 32
//! weights per store, as the board's `tile_f32_i8` did. The rotated inflate (`rotated.rs`) runs
//! the same two passes with its rotation in between.

use super::params::rne_i32;
use super::{check, ExpertWeights, InflateError, Shape, Tile, RUN};
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
    let f = dequantize_expert(w, &shape)?;
    quantize_channels(&f, w, &shape, tiles, b_native, chan_scales)
}

/// The expert as f32, row-major `n × k`.
pub(super) fn dequantize_expert(
    w: &ExpertWeights,
    shape: &Shape,
) -> Result<Vec<f32>, InflateError> {
    let k = w.k.max(1);
    let mut f = vec![0f32; w.n * w.k];
    for (row, out) in f.chunks_exact_mut(k).enumerate() {
        dequantize_row(w.ty, w.row(row, shape.row_bytes), out).map_err(InflateError::Quant)?;
    }
    Ok(f)
}

/// Per-channel symmetric int8 of the f32 rows `f` (`w.n × w.k`) into native B and the scales.
pub(super) fn quantize_channels(
    f: &[f32],
    w: &ExpertWeights,
    shape: &Shape,
    tiles: &Tiles,
    b_native: &mut [i8],
    chan_scales: &mut [f32],
) -> Result<(), InflateError> {
    let k = w.k.max(1);
    let mut inv = vec![0f32; w.n];
    for (row, x) in f.chunks_exact(k).enumerate() {
        // Magnitude bits order like the magnitudes and NaN/Inf sort above every finite value,
        // so one integer max (which vectorizes) gives max|w| and catches non-finite weights.
        let amax_bits = x.iter().fold(0u32, |m, v| m.max(v.to_bits() & 0x7fff_ffff));
        if amax_bits >= f32::INFINITY.to_bits() {
            return Err(InflateError::NonFiniteScale { row, block: 0 });
        }
        let amax = f32::from_bits(amax_bits);
        (chan_scales[row], inv[row]) = if amax > 0.0 {
            (amax / 127.0, 127.0 / amax)
        } else {
            (0.0, 0.0)
        };
    }
    let tiles_out =
        b_native[..tiles.b_len(shape.kp, shape.np)].chunks_exact_mut(tiles.b_n * shape.kp);
    for (t, tile_out) in tiles_out.enumerate() {
        let rows = t * tiles.b_n..w.n.min((t + 1) * tiles.b_n);
        let mut tile = Tile {
            out: tile_out,
            b_n: tiles.b_n,
        };
        for r in 0..w.k / RUN {
            for (j, row) in rows.clone().enumerate() {
                let x = &f[row * w.k + r * RUN..row * w.k + r * RUN + RUN];
                for (o, v) in tile.run(r, j).iter_mut().zip(x) {
                    // |v·inv| <= 127·(1 + 2⁻²²): well inside rne_i32's range, and the result fits i8.
                    *o = rne_i32(v * inv[row]) as i8;
                }
            }
        }
        tile.zero_padding(rows.len(), w.k / RUN);
    }
    chan_scales[w.n..shape.np].fill(0.0);
    Ok(())
}
