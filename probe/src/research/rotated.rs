//! The online-Hadamard lever: native int8 B of `W·Rᵀ` (each weight row rotated by [`Rotation`])
//! with per-channel scales, and activation rows rotated by the same `R` ([`quantize_row_rotated`]),
//! so that `C = A_rot · B_rot` is the plain int8 GEMM of `(R·x) · (R·w)ᵀ = x · wᵀ`.
//!
//! The rotation mixes every weight of a row, so the table trick of the direct inflate (one
//! lookup per stored quant) cannot apply: this path dequantizes the expert to f32, rotates each
//! row, and quantizes per channel like the legacy via-f32 path (`s = max|w'|/127`). It would be
//! paid once per expert inflate (the result is what the cache keeps). Cost against the direct
//! inflate: `ork-probe accuracy` (docs/ACCURACY.md).

use super::hadamard::Rotation;
use super::via_f32::{dequantize_expert, quantize_channels};
use ork_moe::inflate::{ExpertWeights, InflateError};
use ork_moe::layout::Tiles;
use ork_moe::moe::quantize::{quantize_row_scaled, RowScale};

/// Why [`inflate_expert_rotated`] failed.
#[derive(Clone, Debug, PartialEq)]
pub enum RotatedError {
    Inflate(InflateError),
    /// A rotation of another order than the expert's K.
    RotationMismatch {
        k: usize,
        rotation_k: usize,
    },
}

impl From<InflateError> for RotatedError {
    fn from(e: InflateError) -> RotatedError {
        RotatedError::Inflate(e)
    }
}

impl std::fmt::Display for RotatedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RotatedError::Inflate(e) => e.fmt(f),
            RotatedError::RotationMismatch { k, rotation_k } => {
                write!(f, "rotation of order {rotation_k} for weights of K = {k}")
            }
        }
    }
}

/// [`ork_moe::moe::quantize::quantize_row`] of the rotated row `R·x` (`rot.k() == x.len()`),
/// `scratch` K values of any contents: the activation side of the lever (the weights' side is
/// [`inflate_expert_rotated`] with the same `rot`).
pub fn quantize_row_rotated(
    rot: &Rotation,
    x: &[f32],
    scratch: &mut [f32],
    out: &mut [i8],
) -> RowScale {
    rot.apply(x, scratch);
    quantize_row_scaled(scratch, out)
}

/// Weight rows rotated together.
const LANES: usize = 16;

/// Inflates `W·Rᵀ` into native B and channel scales (the outputs of
/// [`ork_moe::inflate::inflate_expert`], for rotated weights), on the preconditions of
/// [`super::via_f32::inflate_expert_via_f32`]. `rot.k()` must equal `w.k`.
pub fn inflate_expert_rotated(
    w: &ExpertWeights,
    rot: &Rotation,
    tiles: &Tiles,
    b_native: &mut [i8],
    chan_scales: &mut [f32],
) -> Result<(), RotatedError> {
    if rot.k() != w.k {
        return Err(RotatedError::RotationMismatch {
            k: w.k,
            rotation_k: rot.k(),
        });
    }
    let mut f = dequantize_expert(w)?;
    // LANES rows at a time, interleaved, so each step of the transform is one vector operation
    // for all of them (bit-identical to rotating each row alone).
    let mut lanes = vec![[0f32; LANES]; w.k];
    for group in f.chunks_mut(LANES * w.k.max(1)) {
        for (l, row) in group.chunks_exact(w.k).enumerate() {
            for (v, &x) in lanes.iter_mut().zip(row) {
                v[l] = x;
            }
        }
        rot.apply_lanes(&mut lanes);
        for (l, row) in group.chunks_exact_mut(w.k).enumerate() {
            for (x, v) in row.iter_mut().zip(&lanes) {
                *x = v[l];
            }
        }
    }
    Ok(quantize_channels(
        &f,
        w.n,
        w.k,
        tiles,
        b_native,
        chan_scales,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ork_moe::quant::{dequantize_row, GgmlType};
    use ork_moe::testutil::Rng;

    #[test]
    fn rotated_weights_dot_rotated_activations_give_the_product() {
        let (k, n) = (768, 40);
        let t = Tiles::RK3588;
        let ty = GgmlType::Q4_0;
        let data = Rng::new(4).blocks(ty, n * k / 32, 0.05);
        let w = ExpertWeights {
            ty,
            data: &data,
            row_stride: ty.row_bytes(k).unwrap(),
            n,
            k,
        };
        let rot = Rotation::new(k);
        let mut b = vec![0i8; t.b_len(t.pad(k), t.pad(n))];
        let mut s = vec![0f32; t.pad(n)];
        inflate_expert_rotated(&w, &rot, &t, &mut b, &mut s).unwrap();
        assert!(s[n..].iter().all(|&v| v == 0.0));
        let x: Vec<f32> = {
            let mut r = Rng::new(8);
            (0..k).map(|_| r.normal()).collect()
        };
        let mut rx = vec![0f32; k];
        rot.apply(&x, &mut rx);
        let mut wf = vec![0f32; k];
        for row in 0..n {
            dequantize_row(ty, &data[row * w.row_stride..][..w.row_stride], &mut wf).unwrap();
            let exact: f64 = wf.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
            let got: f64 = (0..k)
                .map(|c| b[t.b_index(t.pad(k), row, c)] as f64 * s[row] as f64 * rx[c] as f64)
                .sum();
            let norm = wf.iter().map(|&v| (v as f64).powi(2)).sum::<f64>().sqrt()
                * x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>().sqrt();
            assert!(
                (got - exact).abs() < 0.02 * norm,
                "row {row}: {got} vs {exact}"
            );
        }
        let wrong = Rotation::new(384);
        assert_eq!(
            inflate_expert_rotated(&w, &wrong, &t, &mut b, &mut s),
            Err(RotatedError::RotationMismatch { k, rotation_k: 384 })
        );
    }
}
