//! The legacy inflate, kept for comparison: dequantize the whole expert to f32, then quantize each
//! channel symmetrically (`s = max|w|/127`, `q = rne(w·127/max|w|)`) into native B.
//!
//! Two plain passes the compiler vectorizes. The second quantizes one N-tile's rows at a time
//! (`quantize_row_with`: the activations' quantizer is the same per-row rule) and writes native B
//! in memory order, one tile run per copy, as the board's `tile_f32_i8` did. The rotated inflate
//! (`rotated.rs`) runs the same two passes with its rotation in between.

use ork_moe::inflate::{ExpertWeights, InflateError};
use ork_moe::layout::Tiles;
use ork_moe::moe::quantize::{quantize_row_with, RowMax};
use ork_moe::quant::{dequantize_row, QuantError};

/// Inflates like [`ork_moe::inflate::inflate_expert`] (same outputs' shape and meaning, different
/// scales), through an f32 copy of the expert. NaN/Inf weights give
/// [`InflateError::NonFiniteScale`] (block index 0: this path only sees the row). Panics when
/// `w.data` is shorter than its rows, an output is shorter than the padded shape, or `tiles.b_k`
/// does not divide K (what `inflate_expert` reports as errors).
pub fn inflate_expert_via_f32(
    w: &ExpertWeights,
    tiles: &Tiles,
    b_native: &mut [i8],
    chan_scales: &mut [f32],
) -> Result<(), InflateError> {
    let f = dequantize_expert(w)?;
    quantize_channels(&f, w.n, w.k, tiles, b_native, chan_scales)
}

/// The expert as f32, row-major `n × k`.
pub(super) fn dequantize_expert(w: &ExpertWeights) -> Result<Vec<f32>, InflateError> {
    let row_bytes =
        w.ty.row_bytes(w.k)
            .ok_or(InflateError::Quant(QuantError::RowNotWholeBlocks {
                ty: w.ty,
                k: w.k,
            }))?;
    let mut f = vec![0f32; w.n * w.k];
    for (row, out) in f.chunks_exact_mut(w.k.max(1)).enumerate() {
        let bytes = &w.data[row * w.row_stride..][..row_bytes];
        dequantize_row(w.ty, bytes, out).map_err(InflateError::Quant)?;
    }
    Ok(f)
}

/// Per-channel symmetric int8 of the f32 rows `f` (`n × k`) into native B and the scales.
pub(super) fn quantize_channels(
    f: &[f32],
    n: usize,
    k: usize,
    tiles: &Tiles,
    b_native: &mut [i8],
    chan_scales: &mut [f32],
) -> Result<(), InflateError> {
    let (kp, np) = (tiles.pad(k), tiles.pad(n));
    let run = tiles.b_k;
    assert!(
        k.is_multiple_of(run),
        "K = {k} is not a whole number of {run}-deep runs"
    );
    // One N-tile's rows, quantized row-major before they are laid out.
    let mut q = vec![0i8; tiles.b_n * k];
    let tiles_out = b_native[..tiles.b_len(kp, np)].chunks_exact_mut(tiles.b_n * kp);
    for (t, tile_out) in tiles_out.enumerate() {
        let rows = t * tiles.b_n..n.min((t + 1) * tiles.b_n);
        for (row, q) in rows.clone().zip(q.chunks_exact_mut(k.max(1))) {
            let x = &f[row * k..(row + 1) * k];
            let max = RowMax::of(x);
            if !max.finite {
                return Err(InflateError::NonFiniteScale { row, block: 0 });
            }
            chan_scales[row] = quantize_row_with(x, max, q).folded();
        }
        // Run `r` of the tile's row `j` is `b_k` contiguous bytes at `(r·b_n + j)·b_k`.
        for (r, slab) in tile_out.chunks_exact_mut(tiles.b_n * run).enumerate() {
            for (j, out) in slab.chunks_exact_mut(run).enumerate() {
                if j < rows.len() && r * run < k {
                    out.copy_from_slice(&q[j * k + r * run..][..run]);
                } else {
                    out.fill(0);
                }
            }
        }
    }
    chan_scales[n..np].fill(0.0);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ork_moe::quant::GgmlType;
    use ork_moe::testutil::Rng;

    const T: Tiles = Tiles::RK3588;
    /// Written past the end of the outputs to catch out-of-bounds writes.
    const SENTINEL: i8 = 0x5a;

    #[test]
    fn every_weight_is_within_half_a_step_of_ggmls() {
        let mut rng = Rng::new(4);
        for ty in GgmlType::QUANTIZED {
            let (n, k) = (37, 4 * ty.block_elems().max(256));
            let data = rng.blocks(ty, n * k / ty.block_elems(), 0.05);
            let rb = ty.row_bytes(k).unwrap();
            let w = ExpertWeights {
                ty,
                data: &data,
                row_stride: rb,
                n,
                k,
            };
            let (kp, np) = (T.pad(k), T.pad(n));
            let mut b = vec![SENTINEL; T.b_len(kp, np) + 64];
            let mut s = vec![f32::NAN; np + 1];
            inflate_expert_via_f32(&w, &T, &mut b, &mut s).unwrap();
            assert!(b[T.b_len(kp, np)..].iter().all(|&x| x == SENTINEL));
            assert!(s[np].is_nan() && s[n..np].iter().all(|&v| v == 0.0));
            let (mut f, mut err2, mut sig2) = (vec![0f32; k], 0f64, 0f64);
            for row in 0..np {
                if row < n {
                    dequantize_row(ty, &data[row * rb..(row + 1) * rb], &mut f).unwrap();
                } else {
                    f.fill(0.0);
                }
                let s = s[row] as f64;
                for c in 0..kp {
                    let (x, q) = (
                        f.get(c).map_or(0.0, |&x| x as f64),
                        b[T.b_index(kp, row, c)],
                    );
                    let e = x - s * q as f64;
                    let within = if s > 0.0 {
                        e.abs() <= (0.5 + 1e-4) * s
                    } else {
                        x == 0.0 && q == 0
                    };
                    assert!(within, "{ty:?} ({row}, {c}): {x} vs {s}·{q}");
                    (err2, sig2) = (err2 + e * e, sig2 + x * x);
                }
            }
            assert!(err2 / sig2 < 1e-3, "{ty:?}: NMSE {}", err2 / sig2);
        }
    }

    #[test]
    fn a_non_finite_scale_is_an_error_of_its_row() {
        let (ty, n, k) = (GgmlType::Q4_0, 4, 64);
        let mut data = Rng::new(6).blocks(ty, n * k / 32, 0.05);
        data[2 * 36 + 18..2 * 36 + 20].copy_from_slice(&0xfc00u16.to_le_bytes()); // -inf, row 2 block 1
        let w = ExpertWeights::contiguous(ty, &data, k, n).unwrap();
        let (mut b, mut s) = (vec![0i8; T.b_len(64, 32)], vec![0f32; 32]);
        assert_eq!(
            inflate_expert_via_f32(&w, &T, &mut b, &mut s),
            Err(InflateError::NonFiniteScale { row: 2, block: 0 })
        );
    }
}
