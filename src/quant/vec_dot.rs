//! ggml's own CPU arithmetic for a quantized matmul, the yardstick the library's int8 path is
//! measured against (`ork-probe accuracy`, docs/ACCURACY.md).
//!
//! ggml multiplies quantized weights by f32 activations by first quantizing each activation row
//! to the weight type's "vec-dot type" (Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1, Q8_K for
//! Q4_K/Q6_K: one scale per 32 or per 256 values) and then taking a block-wise integer dot
//! product with one f32 multiply per block. This module is that arithmetic operation for
//! operation: the activation quantizers follow ggml's reference `quantize_row_q8_0_ref`,
//! `quantize_row_q8_1_ref` and `quantize_row_q8_K_ref` (`ggml-quants.c`), and the dot products
//! ggml's generic `ggml_vec_dot_*_generic` (`ggml-cpu/quants.c`), both in IEEE binary32 without
//! fused multiply-adds. `tests/ggml_vec_dot.rs` proves them equal bit for bit to the pinned
//! ggml's own functions (vectors from `tools/ggml_oracle.c`).
//!
//! ggml's SIMD builds differ from these in two ways only: the x86 AVX and ARM NEON Q8_0/Q8_1
//! quantizers round ties to even (`roundf` here rounds them away from zero) and multiply by
//! `127/amax` instead of `1/d`, and the SIMD dot products sum the block products in another
//! order (and may fuse multiply-adds). Both change single roundings, far below the quantization
//! error being measured; the oracle test prints how far the built SIMD path is from this one.
//!
//! Quantized activation rows are kept as ggml's block bytes (`block_q8_0` 34 bytes, `block_q8_1`
//! 36, `block_q8_K` 292), so they compare byte for byte with ggml's.

use super::blocks::{q4k_scale_min, QK32, QK_K};
use super::fp16::{f16_to_f32, f32_to_f16};
use super::{GgmlType, QuantError};

/// ggml's activation block types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VecDotType {
    /// `block_q8_0 { half d; int8 qs[32]; }`
    Q8_0,
    /// `block_q8_1 { half d; half s; int8 qs[32]; }` (`s = d · Σ qs`)
    Q8_1,
    /// `block_q8_K { float d; int8 qs[256]; int16 bsums[16]; }`
    Q8K,
}

impl VecDotType {
    /// The weight types with a dot product here.
    pub const WEIGHTS: [GgmlType; 6] = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ];

    /// The activation type ggml pairs with weights of type `ty` (`vec_dot_type` of ggml-cpu's
    /// type traits); `None` for F32/F16 and the types without a dot product here (all but
    /// [`Self::WEIGHTS`]).
    pub fn for_weights(ty: GgmlType) -> Option<VecDotType> {
        match ty {
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => Some(VecDotType::Q8_0),
            GgmlType::Q4_1 => Some(VecDotType::Q8_1),
            GgmlType::Q4_K | GgmlType::Q6_K => Some(VecDotType::Q8K),
            _ => None,
        }
    }

    /// Values per block.
    pub fn block_elems(self) -> usize {
        match self {
            VecDotType::Q8_0 | VecDotType::Q8_1 => QK32,
            VecDotType::Q8K => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            VecDotType::Q8_0 => 34,
            VecDotType::Q8_1 => 36,
            VecDotType::Q8K => 4 + QK_K + 2 * (QK_K / 16),
        }
    }

    /// Quantizes the activation row `x` (a whole number of blocks) into ggml's block bytes.
    pub fn quantize_row(self, x: &[f32]) -> Result<Vec<u8>, QuantError> {
        if !x.len().is_multiple_of(self.block_elems()) {
            return Err(QuantError::RowNotWholeBlocks {
                ty: GgmlType::F32,
                k: x.len(),
            });
        }
        let mut out = vec![0u8; x.len() / self.block_elems() * self.block_bytes()];
        for (xb, ob) in x
            .chunks_exact(self.block_elems())
            .zip(out.chunks_exact_mut(self.block_bytes()))
        {
            match self {
                VecDotType::Q8_0 => quantize_block_q8_0(xb, ob),
                VecDotType::Q8_1 => quantize_block_q8_1(xb, ob),
                VecDotType::Q8K => quantize_block_q8_k(xb, ob),
            }
        }
        Ok(out)
    }
}

/// `d = amax/127`, `q = roundf(x · (1/d))` (ties away from zero), `d` stored as fp16.
/// Returns `d` (f32) and writes the quants.
fn q8_block(x: &[f32], qs: &mut [u8]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in qs.iter_mut().zip(x) {
        // A subnormal `d` makes `id` infinite (tiny rows). C's conversion of ±inf to int8 is
        // undefined; x86 builds give 0 (cvttss2si's 0x80000000, truncated), kept here. The
        // block's fp16 `d` is 0 then, so the quants never count.
        let v = v * id;
        *q = if v.is_finite() {
            v.round() as i8 as u8
        } else {
            0
        };
    }
    d
}

fn quantize_block_q8_0(x: &[f32], out: &mut [u8]) {
    let d = q8_block(x, &mut out[2..34]);
    out[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
}

fn quantize_block_q8_1(x: &[f32], out: &mut [u8]) {
    let d = q8_block(x, &mut out[4..36]);
    let sum: i32 = out[4..36].iter().map(|&q| q as i8 as i32).sum();
    out[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    out[2..4].copy_from_slice(&f32_to_f16(sum as f32 * d).to_le_bytes());
}

/// ggml's `nearest_int`: the integer read from the low mantissa bits of `v + 1.5·2²³`
/// (ties to even). Outside ±2²² (ggml asserts against it, release builds do not) the bits are
/// kept as ggml's arithmetic leaves them.
fn nearest_int(v: f32) -> i32 {
    ((v + 12_582_912.0).to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

fn quantize_block_q8_k(x: &[f32], out: &mut [u8]) {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        out.fill(0);
        return;
    }
    let iscale = -127.0 / max;
    let qs = &mut out[4..4 + QK_K];
    for (q, &v) in qs.iter_mut().zip(x) {
        // `MIN(127, v)` then the implicit conversion to int8_t (modular).
        *q = nearest_int(iscale * v).min(127) as i8 as u8;
    }
    let sums: Vec<i16> = qs
        .chunks_exact(16)
        .map(|c| c.iter().map(|&q| q as i8 as i32).sum::<i32>() as i16)
        .collect();
    for (o, s) in out[4 + QK_K..].chunks_exact_mut(2).zip(sums) {
        o.copy_from_slice(&s.to_le_bytes());
    }
    out[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
}

fn half(b: &[u8]) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

fn q8(b: &[u8]) -> impl Iterator<Item = i32> + '_ {
    b.iter().map(|&q| q as i8 as i32)
}

/// ggml's `vec_dot` of one weight row (`w`, `k` weights of `ty` in ggml's block bytes) with one
/// activation row quantized by [`VecDotType::quantize_row`] of [`VecDotType::for_weights`]`(ty)`.
pub fn vec_dot(ty: GgmlType, k: usize, w: &[u8], act: &[u8]) -> Result<f32, QuantError> {
    let at = VecDotType::for_weights(ty).ok_or(QuantError::RowNotWholeBlocks { ty, k })?;
    let n_blocks = super::check_row(ty, w.len(), k)?;
    let expected = k / at.block_elems() * at.block_bytes();
    if act.len() != expected {
        return Err(QuantError::WrongByteLength {
            expected,
            got: act.len(),
        });
    }
    let (bw, ba) = (ty.block_bytes(), at.block_bytes());
    let blocks = (0..n_blocks).map(|i| (&w[i * bw..(i + 1) * bw], &act[i * ba..(i + 1) * ba]));
    Ok(match ty {
        GgmlType::Q4_0 => blocks.fold(0f32, |sumf, (x, y)| {
            let qs = &x[2..18];
            let (lo, hi) = (&y[2..18], &y[18..34]);
            let s0: i32 = qs
                .iter()
                .zip(q8(lo))
                .map(|(&q, a)| ((q & 15) as i32 - 8) * a)
                .sum();
            let s1: i32 = qs
                .iter()
                .zip(q8(hi))
                .map(|(&q, a)| ((q >> 4) as i32 - 8) * a)
                .sum();
            sumf + (s0 + s1) as f32 * half(&x[..2]) * half(&y[..2])
        }),
        GgmlType::Q4_1 => blocks.fold(0f32, |sumf, (x, y)| {
            let qs = &x[4..20];
            let (lo, hi) = (&y[4..20], &y[20..36]);
            let s0: i32 = qs
                .iter()
                .zip(q8(lo))
                .map(|(&q, a)| (q & 15) as i32 * a)
                .sum();
            let s1: i32 = qs
                .iter()
                .zip(q8(hi))
                .map(|(&q, a)| (q >> 4) as i32 * a)
                .sum();
            // `sumf += a + b`: the block's two terms are added first.
            sumf + ((half(&x[..2]) * half(&y[..2])) * (s0 + s1) as f32
                + half(&x[2..4]) * half(&y[2..4]))
        }),
        GgmlType::Q5_0 => blocks.fold(0f32, |sumf, (x, y)| {
            let qh = u32::from_le_bytes([x[2], x[3], x[4], x[5]]);
            let qs = &x[6..22];
            let (mut s0, mut s1) = (0i32, 0i32);
            for j in 0..16 {
                let h0 = ((qh >> j) << 4) & 0x10;
                let h1 = (qh >> (j + 12)) & 0x10;
                s0 += (((qs[j] as u32 & 15) | h0) as i32 - 16) * y[2 + j] as i8 as i32;
                s1 += (((qs[j] as u32 >> 4) | h1) as i32 - 16) * y[18 + j] as i8 as i32;
            }
            sumf + (half(&x[..2]) * half(&y[..2])) * (s0 + s1) as f32
        }),
        GgmlType::Q8_0 => blocks.fold(0f32, |sumf, (x, y)| {
            let s: i32 = q8(&x[2..34]).zip(q8(&y[2..34])).map(|(a, b)| a * b).sum();
            sumf + s as f32 * (half(&x[..2]) * half(&y[..2]))
        }),
        GgmlType::Q4_K | GgmlType::Q6_K => vec_dot_k(ty, blocks),
        _ => unreachable!("no vec-dot type"),
    })
}

/// The k-quant dot products: per super-block, eight int32 lanes (`aux32[l]`, lane = position
/// mod 8) of `scale · q · a`, added as `d · aux32[l]` into eight f32 sums that are only summed
/// at the end; Q4_K subtracts `dmin · Σ bsums·min` per super-block from the running total.
fn vec_dot_k<'a>(ty: GgmlType, blocks: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> f32 {
    let mut sums = [0f32; 8];
    let mut sumf = 0f32;
    let mut a = [0i32; QK_K];
    for (x, y) in blocks {
        let yd = f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
        let yq = &y[4..4 + QK_K];
        let mut aux32 = [0i32; 8];
        // `scales[j]` covers `a[j·g..(j+1)·g]`, g = 32 (Q4_K) or 16 (Q6_K).
        let (scales, g, d): (Vec<i32>, usize, f32) = if ty == GgmlType::Q4_K {
            let sc: [u8; 12] = x[4..16].try_into().expect("12 bytes");
            let qs = &x[16..144];
            for (j, chunk) in qs.chunks_exact(32).enumerate() {
                for l in 0..32 {
                    a[64 * j + l] = (chunk[l] & 15) as i32;
                    a[64 * j + 32 + l] = (chunk[l] >> 4) as i32;
                }
            }
            let bsums = &y[4 + QK_K..];
            let mut sumi = 0i32;
            for j in 0..QK_K / 16 {
                let bs = i16::from_le_bytes([bsums[2 * j], bsums[2 * j + 1]]) as i32;
                sumi += bs * q4k_scale_min(j / 2, &sc).1 as i32;
            }
            let dmin = half(&x[2..4]) * yd;
            sumf -= dmin * sumi as f32;
            let scales = (0..8).map(|j| q4k_scale_min(j, &sc).0 as i32).collect();
            (scales, 32, half(&x[..2]) * yd)
        } else {
            let (ql, qh) = (&x[..128], &x[128..192]);
            for h in 0..2 {
                let (ql, qh, a) = (&ql[64 * h..], &qh[32 * h..], &mut a[128 * h..]);
                for l in 0..32 {
                    a[l] = ((ql[l] & 15) | ((qh[l] & 3) << 4)) as i32 - 32;
                    a[l + 32] = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                    a[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                    a[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                }
            }
            let scales = x[192..208].iter().map(|&s| s as i8 as i32).collect();
            (scales, 16, half(&x[208..210]) * yd)
        };
        for (i, (&ai, yi)) in a.iter().zip(q8(yq)).enumerate() {
            aux32[i % 8] += scales[i / g] * (ai * yi);
        }
        for (s, &v) in sums.iter_mut().zip(&aux32) {
            *s += d * v as f32;
        }
    }
    sums.iter().fold(sumf, |acc, &s| acc + s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize_row;
    use crate::testutil::Rng;

    /// The dot product of the dequantized operands, in f64: ggml's result must be within the
    /// binary32 rounding of the block sums of it.
    #[test]
    fn vec_dot_equals_the_dequantized_dot_product() {
        let mut rng = Rng::new(11);
        let k = 512;
        for ty in GgmlType::ALL {
            let has = VecDotType::for_weights(ty).is_some();
            assert_eq!(has, VecDotType::WEIGHTS.contains(&ty), "{}", ty.name());
        }
        for ty in VecDotType::WEIGHTS {
            let at = VecDotType::for_weights(ty).unwrap();
            let w = rng.blocks(ty, k / ty.block_elems(), 0.05);
            let x: Vec<f32> = (0..k).map(|_| rng.normal()).collect();
            let act = at.quantize_row(&x).unwrap();
            let mut wf = vec![0f32; k];
            dequantize_row(ty, &w, &mut wf).unwrap();
            let af = dequantize_act(at, &act);
            let exact: f64 = wf.iter().zip(&af).map(|(&a, &b)| a as f64 * b as f64).sum();
            let scale: f64 = wf
                .iter()
                .zip(&af)
                .map(|(&a, &b)| (a as f64 * b as f64).abs())
                .sum();
            let got = vec_dot(ty, k, &w, &act).unwrap() as f64;
            // Q4_1's `s` is an fp16 of `d·Σq`: that one term is rounded to 11 bits.
            let tol = if ty == GgmlType::Q4_1 { 2e-3 } else { 1e-5 };
            assert!(
                (got - exact).abs() <= tol * scale,
                "{}: {got} vs {exact}",
                ty.name()
            );
        }
    }

    /// The activation row a quantized one stands for (`d·q`; ggml's `dequantize_row_q8_*`).
    fn dequantize_act(at: VecDotType, b: &[u8]) -> Vec<f32> {
        b.chunks_exact(at.block_bytes())
            .flat_map(|blk| {
                let (d, qs) = match at {
                    VecDotType::Q8_0 => (half(blk), &blk[2..]),
                    VecDotType::Q8_1 => (half(blk), &blk[4..]),
                    VecDotType::Q8K => (
                        f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]),
                        &blk[4..4 + QK_K],
                    ),
                };
                qs.iter()
                    .map(move |&q| d * q as i8 as f32)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn q8_k_block_by_hand() {
        let mut x = [0.5f32; QK_K];
        x[3] = -2.0;
        let b = VecDotType::Q8K.quantize_row(&x).unwrap();
        let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        assert_eq!(d, 1.0 / (-127.0 / -2.0));
        assert_eq!(b[4 + 3] as i8, -127);
        // 0.5 · 63.5 = 31.75 → 32
        assert_eq!(b[4] as i8, 32);
        let bsum0 = i16::from_le_bytes([b[4 + QK_K], b[5 + QK_K]]);
        assert_eq!(bsum0, 15 * 32 - 127);
        // ties: 0.5 · 127 / 1 = 63.5 → roundf gives 64 (away from zero) in Q8_0
        let mut y = [0.5f32; 32];
        y[0] = 1.0;
        let q = VecDotType::Q8_0.quantize_row(&y).unwrap();
        assert_eq!(q[3] as i8, 64);
    }

    #[test]
    fn tiny_rows_quantize_to_zero_as_in_ggml() {
        // Q8_0: d = 1e-40/127 rounds to fp16 0. Q8_K: -127/max overflows to -inf, every quant
        // comes out 0 and d = -0.
        let x = [1e-40f32; QK_K];
        let b = VecDotType::Q8_0.quantize_row(&x).unwrap();
        assert_eq!(&b[..2], &[0, 0]);
        let b = VecDotType::Q8K.quantize_row(&x).unwrap();
        assert!(b[4..4 + QK_K].iter().all(|&q| q == 0));
        assert_eq!(
            f32::from_le_bytes([b[0], b[1], b[2], b[3]]).to_bits(),
            (-0f32).to_bits()
        );
    }
}
