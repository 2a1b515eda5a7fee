//! The outlier-split lever (LLM.int8()'s decomposition): a row's few largest channels are taken
//! out of its int8 quantization and computed on the CPU in f32 against the dequantized weights.
//!
//! For a row `x`, channels with `|x_c| > factor · RMS(x)` (at most `max_channels`, largest
//! first) are the row's outliers `O`. The int8 row is `x` with `O` zeroed (so its scale comes
//! from the rest), and the device sees a plain int8 GEMM of those rows: NPU and CPU results stay
//! equal bit for bit. The output is `C · (row_scale · chan_scale) + Σ_{c ∈ O} x_c · w[n][c]`. The
//! weight column `w[·][c]` is either ggml's f32 weight ([`weight_columns`]: one weight decoded
//! per output channel) or, cheaper, the inflated expert's own int8 weight
//! times its channel scale ([`native_column`]: N bytes read from the cached native B, no
//! dequantization). Cost: `|O| · N` CPU multiply-adds per row, plus the columns.

use super::quantize::{quantize_row_scaled, RowScale};
use crate::inflate::{ExpertWeights, InflateError};
use crate::layout::Tiles;
use crate::quant::{dequantize_element, GgmlType, QuantError};

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
    let energy: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
    let threshold = rule.factor as f64 * (energy / x.len().max(1) as f64).sqrt();
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

/// The weight columns `channels` (input channels of the expert, each `< w.k`) as ggml
/// dequantizes them: `out[i * w.n + n]` = weight `(n, channels[i])`, the values of
/// [`ExpertWeights::dequantize_column`] ([`dequantize_element`]). Row by row, each row's bytes
/// read once and in order, rather than a column at a time with every weight in another cache
/// line: at real scale (~55 channels per expert, `docs/PERFORMANCE.md`) this decode is the
/// library's largest CPU cost after the GEMM.
pub fn weight_columns(
    w: &ExpertWeights,
    channels: &[u32],
    out: &mut [f32],
) -> Result<(), InflateError> {
    let row_bytes =
        w.ty.row_bytes(w.k)
            .filter(|_| GgmlType::QUANTIZED.contains(&w.ty))
            .filter(|_| channels.iter().all(|&c| (c as usize) < w.k))
            .ok_or(InflateError::Quant(QuantError::RowNotWholeBlocks {
                ty: w.ty,
                k: w.k,
            }))?;
    let needed =
        w.n.checked_sub(1)
            .map_or(0, |r| r * w.row_stride + row_bytes);
    if w.data.len() < needed {
        return Err(InflateError::SourceTooShort {
            needed,
            got: w.data.len(),
        });
    }
    let out = &mut out[..channels.len() * w.n];
    // One loop per type: the type's decode inlined, no dispatch per weight.
    match w.ty {
        GgmlType::Q4_0 => columns_of(GgmlType::Q4_0, w, row_bytes, channels, out),
        GgmlType::Q4_1 => columns_of(GgmlType::Q4_1, w, row_bytes, channels, out),
        GgmlType::Q5_0 => columns_of(GgmlType::Q5_0, w, row_bytes, channels, out),
        GgmlType::Q8_0 => columns_of(GgmlType::Q8_0, w, row_bytes, channels, out),
        GgmlType::Q4_K => columns_of(GgmlType::Q4_K, w, row_bytes, channels, out),
        ty => columns_of(ty, w, row_bytes, channels, out),
    }
    Ok(())
}

/// Rows decoded into a transposed block before their columns are stored: the columns are
/// `n` floats apart (a power of two, often), so storing one row's weights straight into them
/// would put every store in the same cache set; 16 rows fill one cache line per column.
const COLUMN_ROWS: usize = 16;

#[inline(always)]
fn columns_of(
    ty: GgmlType,
    w: &ExpertWeights,
    row_bytes: usize,
    channels: &[u32],
    out: &mut [f32],
) {
    let (be, bb) = (ty.block_elems(), ty.block_bytes());
    let mut block = vec![0f32; COLUMN_ROWS * channels.len()];
    for n0 in (0..w.n).step_by(COLUMN_ROWS) {
        let rows = COLUMN_ROWS.min(w.n - n0);
        for r in 0..rows {
            let at = (n0 + r) * w.row_stride;
            let row = &w.data[at..at + row_bytes];
            for (i, &c) in channels.iter().enumerate() {
                let (blk, e) = (c as usize / be, c as usize % be);
                block[i * COLUMN_ROWS + r] =
                    dequantize_element(ty, &row[blk * bb..(blk + 1) * bb], e);
            }
        }
        for (i, col) in block.chunks_exact(COLUMN_ROWS).enumerate() {
            out[i * w.n + n0..i * w.n + n0 + rows].copy_from_slice(&col[..rows]);
        }
    }
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
    use crate::testutil::Rng;

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
    fn weight_columns_are_ggmls_columns() {
        // 37 rows: not whole blocks of 16 rows; a row stride beyond the row's bytes.
        let (k, n) = (512, 37);
        let channels = [0u32, 5, 31, 32, 300, 301, 511];
        for ty in GgmlType::QUANTIZED {
            let rb = ty.row_bytes(k).unwrap();
            let stride = rb + ty.block_bytes();
            let data = Rng::new(11).blocks(ty, n * stride / ty.block_bytes(), 0.05);
            let w = ExpertWeights {
                ty,
                data: &data,
                row_stride: stride,
                n,
                k,
            };
            let mut cols = vec![0f32; channels.len() * n];
            weight_columns(&w, &channels, &mut cols).unwrap();
            let mut col = vec![0f32; n];
            for (i, &c) in channels.iter().enumerate() {
                w.dequantize_column(c as usize, &mut col).unwrap();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&cols[i * n..(i + 1) * n]), bits(&col), "{ty:?} {c}");
            }
            assert!(weight_columns(&w, &[k as u32], &mut cols).is_err());
            let short = ExpertWeights {
                data: &data[..(n - 1) * stride + rb - 1],
                ..w
            };
            assert!(weight_columns(&short, &channels, &mut cols).is_err());
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
