//! The per-segment lever: one activation scale per K segment (256 or 512 values) instead of one
//! per row, so an outlier channel coarsens only its own segment.
//!
//! Each segment is its own plain int8 GEMM over the segment's K slice (`C_s = A_s · B_s`, exact
//! int32 on any device), and the f32 result is `Σ_s C_s · (row_scale_s · chan_scale)`, summed on
//! the CPU in segment order. Native layouts make the slices free on the CPU: a K slice of native A
//! (`[K/16][M][16]`) is contiguous, and so is the K slice of each 32-channel tile of native B. On
//! the NPU each segment is a separate matmul (its own B of `seg × N`, laid out that way at inflate
//! time, and its own `M × N` int32 output): [`Cost`] counts what that adds.

use super::quantize::{quantize_row_scaled, RowScale};
use crate::gemm::{self, Shape};
use crate::layout::Tiles;
use std::ops::Range;

/// K ranges of the segments of a depth `k` (the last one may be shorter).
pub fn segments(k: usize, seg: usize) -> impl Iterator<Item = Range<usize>> {
    (0..k.div_ceil(seg)).map(move |s| s * seg..((s + 1) * seg).min(k))
}

/// Quantizes `x` segment by segment into `out[..x.len()]` (zeroing the K padding after it),
/// one [`RowScale`] per segment pushed to `scales`.
pub fn quantize_row_segments(x: &[f32], seg: usize, out: &mut [i8], scales: &mut Vec<RowScale>) {
    out[x.len()..].fill(0);
    for r in segments(x.len(), seg) {
        scales.push(quantize_row_scaled(&x[r.clone()], &mut out[r]));
    }
}

/// `c[s]` = the int32 GEMM of segment `s`: native A (`shape.m` rows, padded depth `shape.kp`)
/// times native B (`kp × np`) over the K slice of segment `s` only; `c` holds
/// `kp.div_ceil(seg)` native C matrices of `m × np`. `seg` must be a multiple of the tile depth
/// (32: 256 and 512 are).
pub fn gemm_segments(tiles: &Tiles, shape: Shape, seg: usize, a: &[i8], b: &[i8], c: &mut [i32]) {
    let Shape { m, kp, np } = shape;
    assert!(seg.is_multiple_of(tiles.align) && kp.is_multiple_of(tiles.align));
    let c_len = tiles.c_len(m, np);
    for (r, cs) in segments(kp, seg).zip(c.chunks_exact_mut(c_len)) {
        let a_s = &a[tiles.a_len(m, r.start)..tiles.a_len(m, r.end)];
        for t in 0..np / tiles.b_n {
            let tile = &b[t * tiles.b_n * kp..(t + 1) * tiles.b_n * kp];
            let b_s = &tile[r.start * tiles.b_n..r.end * tiles.b_n];
            let slice = Shape {
                m,
                kp: r.len(),
                np: tiles.b_n,
            };
            let c_t = &mut cs[t * tiles.b_n * m..(t + 1) * tiles.b_n * m];
            gemm::gemm(tiles, slice, a_s, b_s, c_t);
        }
    }
}

/// The segment GEMMs' results ([`gemm_segments`]) of `m` rows and `np` padded channels.
pub struct Segmented<'a> {
    pub tiles: &'a Tiles,
    pub m: usize,
    pub np: usize,
    pub c: &'a [i32],
}

impl Segmented<'_> {
    /// The f32 output of row `r`, channel `n`: `Σ_s C_s[r][n] · (scale_s · chan)`, in segment
    /// order, each term by [`RowScale::output`].
    pub fn output(&self, scales: &[RowScale], r: usize, n: usize, chan: f32) -> f32 {
        let c_len = self.tiles.c_len(self.m, self.np);
        let at = self.tiles.c_index(self.m, r, n);
        scales.iter().enumerate().fold(0f32, |acc, (s, rs)| {
            acc + rs.output(self.c[s * c_len + at], chan)
        })
    }
}

/// What the segments cost on the NPU for one expert's GEMM of `m × k × n`, against one GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cost {
    /// Matmuls (submits, or tasks of one chained submit) per expert: `⌈k/seg⌉` instead of 1.
    pub gemms: usize,
    /// int32 output bytes read back: `gemms · m · n · 4` instead of `m · n · 4`.
    pub output_bytes: usize,
    /// CPU multiply-adds to combine them: `gemms · m · n` (instead of `m · n` multiplies).
    pub combine_macs: usize,
}

pub fn cost(m: usize, k: usize, n: usize, seg: usize) -> Cost {
    let gemms = k.div_ceil(seg);
    Cost {
        gemms,
        output_bytes: gemms * m * n * 4,
        combine_macs: gemms * m * n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    #[test]
    fn segment_gemms_sum_to_the_full_gemm() {
        let t = Tiles::RK3588;
        let (m, k, n) = (5, 768, 64);
        let mut rng = Rng::new(3);
        let (mut a, mut w) = (vec![0i8; m * k], vec![0i8; n * k]);
        rng.fill_i8(&mut a);
        rng.fill_i8(&mut w);
        let (mut an, mut bn) = (vec![0i8; t.a_len(m, k)], vec![0i8; t.b_len(k, n)]);
        t.pack_a(&a, m, k, &mut an);
        t.pack_b(&w, n, k, &mut bn);
        let mut full = vec![0i32; t.c_len(m, n)];
        gemm::reference(&t, Shape { m, kp: k, np: n }, &an, &bn, &mut full);
        for seg in [256, 512] {
            let s = k.div_ceil(seg);
            let mut c = vec![0i32; s * t.c_len(m, n)];
            gemm_segments(&t, Shape { m, kp: k, np: n }, seg, &an, &bn, &mut c);
            for i in 0..t.c_len(m, n) {
                let sum: i32 = (0..s).map(|j| c[j * t.c_len(m, n) + i]).sum();
                assert_eq!(sum, full[i], "seg {seg} element {i}");
            }
            // and each segment is the GEMM of its own slice
            let r = segments(k, seg).last().unwrap();
            let expect: i32 = r
                .clone()
                .map(|kk| a[2 * k + kk] as i32 * w[3 * k + kk] as i32)
                .sum();
            assert_eq!(c[(s - 1) * t.c_len(m, n) + t.c_index(m, 2, 3)], expect);
        }
        assert_eq!(
            cost(32, 2048, 768, 512),
            Cost {
                gemms: 4,
                output_bytes: 4 * 32 * 768 * 4,
                combine_macs: 4 * 32 * 768
            }
        );
    }

    #[test]
    fn an_outlier_coarsens_only_its_segment() {
        let mut x = vec![0.5f32; 1024];
        x[3] = 100.0;
        let (mut q, mut scales) = (vec![0i8; 1024], Vec::new());
        quantize_row_segments(&x, 256, &mut q, &mut scales);
        assert_eq!(scales.len(), 4);
        assert_eq!(scales[0].scale, 100.0 / 127.0);
        assert!(scales[1..].iter().all(|s| s.scale == 0.5 / 127.0));
        assert!(q[256..].iter().all(|&v| v == 127));
    }
}
