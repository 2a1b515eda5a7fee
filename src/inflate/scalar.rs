//! The scalar reference kernels: the method of the module docs, one weight at a time.
//!
//! Each `*_run` function converts run `r` (weights `32r..32r+32`) of one row, given that run's
//! parameters from [`super::params::TileParams`]; the SIMD kernels share the Q4_K/Q6_K run
//! geometry helpers below.

use super::params::{scaled_codes, table_value, PlainOps, TileParams};
use super::tile::for_each_run;
use super::{TileKernel, RUN};
use crate::quant::GgmlType;

pub(super) fn tile_kernel(ty: GgmlType) -> TileKernel {
    match ty {
        GgmlType::Q4_0 => |rows, p, tile, runs| for_each_run(rows, p.m(), tile, runs, q4_0_run),
        GgmlType::Q4_1 => |rows, p, tile, runs| for_each_run(rows, p.fg(), tile, runs, q4_1_run),
        GgmlType::Q5_0 => |rows, p, tile, runs| for_each_run(rows, p.m(), tile, runs, q5_0_run),
        GgmlType::Q8_0 => |rows, p, tile, runs| for_each_run(rows, p.m(), tile, runs, q8_0_run),
        GgmlType::Q4_K => |rows, p, tile, runs| for_each_run(rows, p.fg(), tile, runs, q4_k_run),
        GgmlType::Q6_K => {
            |rows, p, tile, runs| for_each_run(rows, p.m_pairs(), tile, runs, q6_k_run)
        }
        _ => unreachable!("checked by the caller"),
    }
}

/// The scan of the scalar path (and of paths without one of their own).
pub(super) fn scan_tile(
    p: &mut TileParams,
    rows: &[&[u8]],
    scales: &mut [f32],
) -> Result<(), (usize, usize)> {
    p.prepare(PlainOps, rows, scales)
}

/// `lut[q] = sat8(rne(fl(fl(q·f) + g)))` for the 16 codes of a Q4_1/Q4_K (sub-)block.
fn table(f: f32, g: f32) -> [i8; 16] {
    // `as i8` saturates, like the SIMD paths' saturating packs.
    std::array::from_fn(|q| table_value(q as i32, f, g).round_ties_even() as i8)
}

/// `sat8((x·m + 2¹⁴) >> 15)`: the rescale types' fixed-point multiply.
fn rescale(x: i32, m: i16) -> i8 {
    ((x * m as i32 + (1 << 14)) >> 15).clamp(-128, 127) as i8
}

/// 16 quant bytes through a table, low nibbles first (Q4_0, Q4_1).
fn nibbles(qs: &[u8], lut: &[i8; 16], out: &mut [i8; RUN]) {
    for (j, &q) in qs[..16].iter().enumerate() {
        out[j] = lut[(q & 15) as usize];
        out[j + 16] = lut[(q >> 4) as usize];
    }
}

fn q4_0_run(row: &[u8], &m: &i16, r: usize, out: &mut [i8; RUN]) {
    let codes: [i16; 16] = scaled_codes(GgmlType::Q4_0);
    nibbles(
        &row[r * 18 + 2..],
        &codes.map(|c| rescale(c as i32, m)),
        out,
    );
}

fn q4_1_run(row: &[u8], &[f, g]: &[f32; 2], r: usize, out: &mut [i8; RUN]) {
    nibbles(&row[r * 20 + 4..], &table(f, g), out);
}

fn q5_0_run(row: &[u8], &m: &i16, r: usize, out: &mut [i8; RUN]) {
    let blk = &row[r * 22..r * 22 + 22];
    let codes: [i16; 32] = scaled_codes(GgmlType::Q5_0);
    let lut = codes.map(|c| rescale(c as i32, m));
    let qh = u32::from_le_bytes(blk[2..6].try_into().expect("4 bytes"));
    for (j, &q) in blk[6..22].iter().enumerate() {
        let hi0 = ((qh >> j) & 1) << 4;
        let hi1 = ((qh >> (j + 16)) & 1) << 4;
        out[j] = lut[((q & 15) as u32 | hi0) as usize];
        out[j + 16] = lut[((q >> 4) as u32 | hi1) as usize];
    }
}

fn q8_0_run(row: &[u8], &m: &i16, r: usize, out: &mut [i8; RUN]) {
    for (o, &q) in out.iter_mut().zip(&row[r * 34 + 2..]) {
        *o = rescale(q as i8 as i32, m);
    }
}

/// Where runs `r` and `r + 1` (`r` even) of a Q4_K row live: the 32 quant bytes whose low
/// nibbles are sub-block `r` and whose high nibbles are sub-block `r + 1`.
#[inline(always)]
pub(super) fn q4_k_pair_source(r: usize) -> usize {
    (r / 8) * 144 + 16 + (r % 8 / 2) * 32
}

fn q4_k_run(row: &[u8], &[f, g]: &[f32; 2], r: usize, out: &mut [i8; RUN]) {
    let (at, shift) = (q4_k_pair_source(r & !1), 4 * (r % 2));
    let lut = table(f, g);
    for (o, &q) in out.iter_mut().zip(&row[at..at + 32]) {
        *o = lut[((q >> shift) & 15) as usize];
    }
}

/// Where run `r` of a Q6_K row lives. Run `t` (0..4) of a 128-weight half takes, for
/// `l` in 0..32: the low (t < 2) or high nibble of `ql[l + 32·(t % 2)]` and bits `2t, 2t+1` of
/// `qh[l]`, with the scales of the row's sub-blocks `2r` (l < 16) and `2r + 1`. Returns the
/// byte offsets of the 32 `ql` and 32 `qh` bytes, the `ql` shift and the `qh` shift.
#[inline(always)]
fn q6_k_run_source(r: usize) -> (usize, usize, u32, u32) {
    let (block, w) = (r / 8, r % 8);
    let (half, t) = (w / 4, w % 4);
    let base = block * 210;
    (
        base + half * 64 + (t % 2) * 32,
        base + 128 + half * 32,
        4 * (t / 2) as u32,
        2 * t as u32,
    )
}

fn q6_k_run(row: &[u8], m: &[i16; 2], r: usize, out: &mut [i8; RUN]) {
    let (ql, qh, ql_shift, qh_shift) = q6_k_run_source(r);
    for l in 0..RUN {
        let code = ((row[ql + l] >> ql_shift) & 15) | (((row[qh + l] >> qh_shift) & 3) << 4);
        out[l] = rescale(4 * (code as i32 - 32), m[l / 16]);
    }
}
