//! The outlier-split lever (LLM.int8()'s decomposition): a row's few largest channels are taken
//! out of its int8 quantization and computed on the CPU in f32 against the dequantized weights.
//!
//! For a row `x`, channels with `|x_c| > factor · RMS(x)` (at most `max_channels`, largest
//! first) are the row's outliers `O`. The int8 row is `x` with `O` zeroed (so its scale comes
//! from the rest), and the device sees a plain int8 GEMM of those rows: NPU and CPU results stay
//! equal bit for bit. The output is `C · (row_scale · chan_scale) + Σ_{c ∈ O} x_c · w[n][c]`. The
//! weight column `w[·][c]` is either ggml's f32 weight
//! ([`crate::inflate::dequantize_columns_in`]: one weight decoded per output channel) or, cheaper, the inflated expert's own int8 weight
//! times its channel scale ([`native_column`]: N bytes read from the cached native B, no
//! dequantization). Cost: `|O| · N` CPU multiply-adds per row, plus the columns.

use super::quantize::{quantize_row_scaled, quantize_row_with, RowMax, RowScale};
use crate::layout::Tiles;

/// When a channel is an outlier.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rule {
    /// `|x_c| > factor · RMS(x)`.
    pub factor: f32,
    /// At most this many per row (the largest ones).
    pub max_channels: usize,
}

impl Rule {
    /// LLM.int8()'s magnitude 6 on unit-scale activations, as a multiple of the row's RMS, and
    /// at most 8 channels per row.
    pub const DEFAULT: Rule = Rule {
        factor: 6.0,
        max_channels: 8,
    };
}

/// Picks the row's outlier channels into `channels` (cleared first; largest `|x_c|` first) and
/// quantizes the row without them into `out[..x.len()]` (padding zeroed). `scratch` holds K
/// values (any contents).
pub fn split_row(
    x: &[f32],
    rule: Rule,
    scratch: &mut [f32],
    channels: &mut Vec<usize>,
    out: &mut [i8],
) -> RowScale {
    channels.clear();
    let threshold = rule.factor as f64 * mean_square(x).sqrt();
    let max = RowMax::of(x);
    // Most rows have no outlier, and one pass over the row (the maximum the quantization needs
    // anyway) says so. A NaN or infinite threshold selects nothing, as the filter would.
    let any_outlier = max.amax as f64 > threshold;
    if !any_outlier {
        return quantize_row_with(x, max, out);
    }
    channels.extend((0..x.len()).filter(|&c| (x[c].abs() as f64) > threshold));
    channels.sort_by(|&a, &b| x[b].abs().total_cmp(&x[a].abs()).then(a.cmp(&b)));
    channels.truncate(rule.max_channels);
    let scratch = &mut scratch[..x.len()];
    scratch.copy_from_slice(x);
    for &c in channels.iter() {
        scratch[c] = 0.0;
    }
    quantize_row_scaled(scratch, out)
}

/// The mean of `x_c²`, in f64, summed in eight interleaved lanes (channel `c` in lane `c % 8`,
/// the lanes added in order): independent chains that vectorize, where one running sum is a
/// serial chain of dependent adds, and the same bits on every target.
fn mean_square(x: &[f32]) -> f64 {
    let mut lanes = [0f64; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (lane, &v) in lanes.iter_mut().zip(c) {
            *lane += v as f64 * v as f64;
        }
    }
    for (lane, &v) in lanes.iter_mut().zip(chunks.remainder()) {
        *lane += v as f64 * v as f64;
    }
    lanes.iter().sum::<f64>() / x.len().max(1) as f64
}

/// `Σ_{c ∈ channels} x_c · column_c[n]` in f32, channel order: the row's correction for output
/// channel `n`, with `column(c)` the dequantized weight column of input channel `c`.
pub fn correction<'a>(
    x: &[f32],
    channels: &[usize],
    n: usize,
    column: impl Fn(usize) -> &'a [f32],
) -> f32 {
    channels
        .iter()
        .fold(0f32, |acc, &c| acc + x[c] * column(c)[n])
}

/// Column `c` of an inflated expert: `out[n] = chan[n] · B[n][c]` for `n < out.len()`, from
/// native B of padded depth `kp` and its channel scales.
pub fn native_column(tiles: &Tiles, kp: usize, b: &[i8], chan: &[f32], c: usize, out: &mut [f32]) {
    for (n, o) in out.iter_mut().enumerate() {
        *o = chan[n] * b[tiles.b_index(kp, n, c)] as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outliers_are_split_off_and_the_rest_keeps_its_resolution() {
        let mut x: Vec<f32> = (0..256)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
            .collect();
        x[7] = -40.0;
        x[100] = 20.0;
        x[200] = 3.0; // large, but below 6 RMS
        let (mut scratch, mut ch, mut q) = (vec![0f32; 256], Vec::new(), vec![0i8; 288]);
        let rs = split_row(&x, Rule::DEFAULT, &mut scratch, &mut ch, &mut q);
        assert_eq!(ch, vec![7, 100]);
        assert_eq!((q[7], q[100]), (0, 0));
        assert_eq!(rs.scale, 3.0 / 127.0);
        assert!(q[256..].iter().all(|&v| v == 0));
        let one = Rule {
            max_channels: 1,
            ..Rule::DEFAULT
        };
        split_row(&x, one, &mut scratch, &mut ch, &mut q);
        assert_eq!(ch, vec![7]);
        let cols = [vec![0.5f32; 4], vec![0.25f32; 4]];
        let col = |c: usize| -> &[f32] {
            if c == 7 {
                &cols[0]
            } else {
                &cols[1]
            }
        };
        assert_eq!(correction(&x, &[7, 100], 2, col), -40.0 * 0.5 + 20.0 * 0.25);
    }

    #[test]
    fn a_row_without_outliers_is_quantized_as_it_is() {
        let mut rng = crate::testutil::Rng::new(5);
        let (mut scratch, mut ch) = (vec![0f32; 768], vec![3]);
        for len in [1, 7, 8, 13, 768] {
            let x: Vec<f32> = (0..len).map(|_| rng.uniform(-1.0, 1.0)).collect();
            let (mut q, mut want) = (vec![1i8; 800], vec![2i8; 800]);
            let rs = split_row(&x, Rule::DEFAULT, &mut scratch, &mut ch, &mut q);
            assert_eq!(rs, quantize_row_scaled(&x, &mut want));
            assert!(ch.is_empty());
            assert_eq!(q, want, "len {len}");
        }
        for bad in [f32::NAN, f32::INFINITY] {
            let mut x = vec![0.5f32; 64];
            x[3] = bad;
            let mut q = vec![1i8; 64];
            let rs = split_row(&x, Rule::DEFAULT, &mut scratch, &mut ch, &mut q);
            assert!(ch.is_empty() && rs.scale.is_nan() && q.iter().all(|&v| v == 0));
        }
    }

    #[test]
    fn mean_square_counts_every_channel_once() {
        // Small integers: every partial sum is exact, so any lane order gives the same value.
        for len in [0usize, 1, 5, 8, 13, 2048] {
            let x: Vec<f32> = (0..len).map(|i| (i % 17) as f32 - 8.0).collect();
            let want: f64 = x.iter().map(|&v| (v * v) as f64).sum::<f64>() / len.max(1) as f64;
            assert_eq!(mean_square(&x), want, "len {len}");
        }
    }

    #[test]
    fn native_column_reads_the_inflated_weights() {
        let t = Tiles::RK3588;
        let (n, k) = (40, 64);
        let w: Vec<i8> = (0..n * k).map(|i| (i % 251) as i8).collect();
        let mut b = vec![0i8; t.b_len(k, t.pad(n))];
        t.pack_b(&w, n, k, &mut b);
        let chan: Vec<f32> = (0..n).map(|i| 0.5 + i as f32).collect();
        let mut col = vec![0f32; n];
        native_column(&t, k, &b, &chan, 33, &mut col);
        for i in 0..n {
            assert_eq!(col[i], chan[i] * w[i * k + 33] as f32);
        }
    }
}
