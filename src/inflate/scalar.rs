//! The scalar reference kernels: the method of the module docs, one weight at a time.

use super::params::{table_value, zero_point, RowParams};
use super::{RowKernel, Runs, RUN};
use crate::quant::GgmlType;

pub(super) fn row_kernel(ty: GgmlType) -> RowKernel {
    match ty {
        GgmlType::Q4_0 => |row, p, runs| nibbles_32(row, p, runs, 18, 2, GgmlType::Q4_0),
        GgmlType::Q4_1 => |row, p, runs| nibbles_32(row, p, runs, 20, 4, GgmlType::Q4_1),
        GgmlType::Q5_0 => q5_0,
        GgmlType::Q8_0 => q8_0,
        GgmlType::Q4_K => q4_k,
        GgmlType::Q6_K => q6_k,
        GgmlType::F32 | GgmlType::F16 => unreachable!("checked by the caller"),
    }
}

/// `lut[q] = sat8(rne(fl(w(q)·inv)))` for the codes `q` of a table type's (sub-)block `j`.
pub(super) fn table<const N: usize>(ty: GgmlType, p: &RowParams, j: usize) -> [i8; N] {
    let zp = zero_point(ty);
    std::array::from_fn(|q| {
        // `as i8` saturates, like the SIMD paths' saturating packs.
        (table_value(q as i32 - zp, p.a[j], p.b[j]) * p.inv).round_ties_even() as i8
    })
}

/// `sat8((x·m + 2¹⁴) >> 15)`: the rescale types' fixed-point multiply.
#[inline]
pub(super) fn rescale(x: i32, m: i16) -> i8 {
    ((x * m as i32 + (1 << 14)) >> 15).clamp(-128, 127) as i8
}

/// Q4_0 and Q4_1: blocks of 32 with the quants in the last 16 bytes, low nibbles first.
fn nibbles_32(
    row: &[u8],
    p: &RowParams,
    runs: &mut Runs,
    block_bytes: usize,
    qs_at: usize,
    ty: GgmlType,
) {
    for (i, blk) in row.chunks_exact(block_bytes).enumerate() {
        let lut: [i8; 16] = table(ty, p, i);
        let out = runs.run(i);
        for (j, &q) in blk[qs_at..qs_at + 16].iter().enumerate() {
            out[j] = lut[(q & 15) as usize];
            out[j + 16] = lut[(q >> 4) as usize];
        }
    }
}

fn q5_0(row: &[u8], p: &RowParams, runs: &mut Runs) {
    for (i, blk) in row.chunks_exact(22).enumerate() {
        let lut: [i8; 32] = table(GgmlType::Q5_0, p, i);
        let qh = u32::from_le_bytes(blk[2..6].try_into().expect("4 bytes"));
        let out = runs.run(i);
        for (j, &q) in blk[6..22].iter().enumerate() {
            let hi0 = ((qh >> j) & 1) << 4;
            let hi1 = ((qh >> (j + 16)) & 1) << 4;
            out[j] = lut[((q & 15) as u32 | hi0) as usize];
            out[j + 16] = lut[((q >> 4) as u32 | hi1) as usize];
        }
    }
}

fn q8_0(row: &[u8], p: &RowParams, runs: &mut Runs) {
    for (i, blk) in row.chunks_exact(34).enumerate() {
        let out = runs.run(i);
        for (o, &q) in out.iter_mut().zip(&blk[2..34]) {
            *o = rescale(q as i8 as i32, p.m[i]);
        }
    }
}

fn q4_k(row: &[u8], p: &RowParams, runs: &mut Runs) {
    for (i, blk) in row.chunks_exact(144).enumerate() {
        for chunk in 0..4 {
            // 32 bytes hold sub-block 2·chunk in the low nibbles, 2·chunk+1 in the high ones.
            let qs = &blk[16 + chunk * 32..16 + chunk * 32 + 32];
            let sub = i * 8 + chunk * 2;
            let (lo, hi): ([i8; 16], [i8; 16]) = (
                table(GgmlType::Q4_K, p, sub),
                table(GgmlType::Q4_K, p, sub + 1),
            );
            let out = runs.run(sub);
            for (o, &q) in out.iter_mut().zip(qs) {
                *o = lo[(q & 15) as usize];
            }
            let out = runs.run(sub + 1);
            for (o, &q) in out.iter_mut().zip(qs) {
                *o = hi[(q >> 4) as usize];
            }
        }
    }
}

/// The four 6-bit codes ggml packs at position `l` of a Q6_K half-block, minus 32, for
/// output runs 0..4 of that half (weights `l`, `l+32`, `l+64`, `l+96`).
#[inline]
pub(super) fn q6_k_codes(ql: &[u8], qh: &[u8], l: usize) -> [i32; 4] {
    let (a, b, h) = (ql[l], ql[l + 32], qh[l]);
    [
        ((a & 15) | ((h & 3) << 4)) as i32 - 32,
        ((b & 15) | (((h >> 2) & 3) << 4)) as i32 - 32,
        ((a >> 4) | (((h >> 4) & 3) << 4)) as i32 - 32,
        ((b >> 4) | (((h >> 6) & 3) << 4)) as i32 - 32,
    ]
}

fn q6_k(row: &[u8], p: &RowParams, runs: &mut Runs) {
    for (i, blk) in row.chunks_exact(210).enumerate() {
        for half in 0..2 {
            let ql = &blk[half * 64..half * 64 + 64];
            let qh = &blk[128 + half * 32..128 + half * 32 + 32];
            // Run `t` of this half has sub-blocks 2t (l < 16) and 2t+1 of the half's 8.
            let m = &p.m[i * 16 + half * 8..i * 16 + half * 8 + 8];
            let first_run = i * 8 + half * 4;
            for l in 0..RUN {
                let codes = q6_k_codes(ql, qh, l);
                for (t, c) in codes.into_iter().enumerate() {
                    runs.run(first_run + t)[l] = rescale(4 * c, m[2 * t + l / 16]);
                }
            }
        }
    }
}
