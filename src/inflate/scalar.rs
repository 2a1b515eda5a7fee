//! The scalar reference kernels: the method of the module docs, one weight at a time.
//!
//! Each `*_run` function converts run `r` (weights `32r..32r+32`) of one row, given that run's
//! parameters from [`super::params::TileParams`]; the SIMD kernels share the Q4_K/Q6_K run
//! geometry helpers below.

use super::params::{code_scale, scaled_codes, table_value, PlainOps, TileParams};
use super::params::{table_entry, table_fixed};
use super::tile::for_each_run;
use super::{TileKernel, RUN};
use crate::quant::grids::{KVALUES_IQ4NL, KVALUES_MXFP4};
use crate::quant::{
    Block, BlockIq1M, BlockIq1S, BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs,
    BlockIq4Nl, BlockIq4Xs, BlockMxfp4, BlockQ2K, BlockQ3K, BlockQ5K, BlockQ5_1, GgmlType,
};

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
        GgmlType::Q5_1 => |rows, p, tile, runs| for_each_run(rows, p.fg(), tile, runs, q5_1_run),
        GgmlType::Q5_K => |rows, p, tile, runs| for_each_run(rows, p.fg(), tile, runs, q5_k_run),
        GgmlType::Q2_K => {
            |rows, p, tile, runs| for_each_run(rows, p.fg_pairs(), tile, runs, q2_k_run)
        }
        GgmlType::Q3_K => {
            |rows, p, tile, runs| for_each_run(rows, p.m_pairs(), tile, runs, q3_k_run)
        }
        GgmlType::IQ4_NL => |rows, p, tile, runs| for_each_run(rows, p.m(), tile, runs, iq4_nl_run),
        GgmlType::IQ4_XS => |rows, p, tile, runs| for_each_run(rows, p.m(), tile, runs, iq4_xs_run),
        GgmlType::MXFP4 => |rows, p, tile, runs| for_each_run(rows, p.m(), tile, runs, mxfp4_run),
        GgmlType::IQ2_XXS => {
            |rows, p, tile, runs| for_each_run(rows, p.m(), tile, runs, iq2_xxs_run)
        }
        GgmlType::IQ2_XS => {
            |rows, p, tile, runs| for_each_run(rows, p.m_pairs(), tile, runs, iq2_xs_run)
        }
        GgmlType::IQ2_S => {
            |rows, p, tile, runs| for_each_run(rows, p.m_pairs(), tile, runs, iq2_s_run)
        }
        GgmlType::IQ3_XXS => {
            |rows, p, tile, runs| for_each_run(rows, p.m(), tile, runs, iq3_xxs_run)
        }
        GgmlType::IQ3_S => |rows, p, tile, runs| for_each_run(rows, p.m(), tile, runs, iq3_s_run),
        GgmlType::IQ1_S => |rows, p, tile, runs| for_each_run(rows, p.m(), tile, runs, iq1_s_run),
        GgmlType::IQ1_M => {
            |rows, p, tile, runs| for_each_run(rows, p.m_pairs(), tile, runs, iq1_m_run)
        }
        GgmlType::F32 | GgmlType::F16 => unreachable!("checked by the caller"),
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

/// `lut[q] = sat8(rne(fl(fl(q·f) + g)))` for the 4 codes of a Q2_K set.
fn table<const N: usize>(f: f32, g: f32) -> [i8; N] {
    // `as i8` saturates, like the SIMD paths' saturating packs.
    std::array::from_fn(|q| table_value(q as i32, f, g).round_ties_even() as i8)
}

/// The `N` entries (16: Q4_1, Q4_K; 32: Q5_1, Q5_K) of a run with parameters `fg`:
/// [`table_entry`].
fn fixed_table<const N: usize>(fg: [f32; 2]) -> [i8; N] {
    let fixed = table_fixed::<N>(fg);
    std::array::from_fn(|q| table_entry::<N>(q as i32, fixed))
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

fn q4_1_run(row: &[u8], &fg: &[f32; 2], r: usize, out: &mut [i8; RUN]) {
    nibbles(&row[r * 20 + 4..], &fixed_table(fg), out);
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

fn q4_k_run(row: &[u8], &fg: &[f32; 2], r: usize, out: &mut [i8; RUN]) {
    let (at, shift) = (q4_k_pair_source(r & !1), 4 * (r % 2));
    let lut: [i8; 16] = fixed_table(fg);
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

/// Block `i` of a row of `B` blocks.
fn block<B: Block>(row: &[u8], i: usize) -> B {
    B::read(&row[i * B::BYTES..])
}

/// The rescale types' int8: the run's 32 integer codes through the multiplier of their set
/// (`m` holds one per 32 or one per 16 weights), stretched by `k` ([`code_scale`]).
fn rescale_run(ty: GgmlType, codes: &[i32; RUN], m: &[i16], out: &mut [i8; RUN]) {
    let (k, per_set) = (code_scale(ty), RUN / m.len());
    for (l, (o, &c)) in out.iter_mut().zip(codes).enumerate() {
        *o = rescale(k * c, m[l / per_set]);
    }
}

/// Sixteen quant bytes as 32 codes through `values`, low nibbles first.
fn nibble_codes(qs: &[u8], values: &[i8; 16]) -> [i32; RUN] {
    std::array::from_fn(|l| values[((qs[l % 16] >> (4 * (l / 16))) & 15) as usize] as i32)
}

fn q5_1_run(row: &[u8], &fg: &[f32; 2], r: usize, out: &mut [i8; RUN]) {
    let blk: BlockQ5_1 = block(row, r);
    let lut: [i8; 32] = fixed_table(fg);
    let qh = u32::from_le_bytes(blk.qh);
    for (l, o) in out.iter_mut().enumerate() {
        let nibble = (blk.qs[l % 16] >> (4 * (l / 16))) & 15;
        *o = lut[(nibble as u32 | (((qh >> l) & 1) << 4)) as usize];
    }
}

/// Run `r` is sub-block `s = r % 8` of its super-block: nibble `s % 2` of `qs[32·(s/2)..]`, bit
/// `s` of `qh[l]`.
fn q5_k_run(row: &[u8], &fg: &[f32; 2], r: usize, out: &mut [i8; RUN]) {
    let (blk, s): (BlockQ5K, _) = (block(row, r / 8), r % 8);
    let lut: [i8; 32] = fixed_table(fg);
    let ql = &blk.qs[32 * (s / 2)..32 * (s / 2) + 32];
    for (o, (&q, &h)) in out.iter_mut().zip(ql.iter().zip(&blk.qh)) {
        *o = lut[(((q >> (4 * (s % 2))) & 15) | (((h >> s) & 1) << 4)) as usize];
    }
}

/// Run `r` is sub-blocks `2s`, `2s + 1` (`s = r % 8`): 2-bit field `s % 4` of the 32 bytes
/// `qs[32·(s/4)..]`, the first 16 through the first table.
fn q2_k_run(row: &[u8], fg: &[[f32; 2]; 2], r: usize, out: &mut [i8; RUN]) {
    let (blk, s): (BlockQ2K, _) = (block(row, r / 8), r % 8);
    let luts: [[i8; 4]; 2] = fg.map(|[f, g]| table(f, g));
    let q = &blk.qs[32 * (s / 4)..32 * (s / 4) + 32];
    for (l, (o, &q)) in out.iter_mut().zip(q).enumerate() {
        *o = luts[l / 16][((q >> (2 * (s % 4))) & 3) as usize];
    }
}

/// Run `r` is sub-blocks `2s`, `2s + 1` (`s = r % 8`): 2-bit field `s % 4` of `qs[32·(s/4)..]`
/// minus 4 where bit `s` of `hmask[l]` is clear.
fn q3_k_run(row: &[u8], m: &[i16; 2], r: usize, out: &mut [i8; RUN]) {
    let (blk, s): (BlockQ3K, _) = (block(row, r / 8), r % 8);
    let q = &blk.qs[32 * (s / 4)..32 * (s / 4) + 32];
    let codes = std::array::from_fn(|l| {
        let low = ((q[l] >> (2 * (s % 4))) & 3) as i32;
        low - if blk.hmask[l] & (1 << s) != 0 { 0 } else { 4 }
    });
    rescale_run(GgmlType::Q3_K, &codes, m, out);
}

fn iq4_nl_run(row: &[u8], m: &i16, r: usize, out: &mut [i8; RUN]) {
    let blk: BlockIq4Nl = block(row, r);
    let codes = nibble_codes(&blk.qs, &KVALUES_IQ4NL);
    rescale_run(GgmlType::IQ4_NL, &codes, std::slice::from_ref(m), out);
}

fn iq4_xs_run(row: &[u8], m: &i16, r: usize, out: &mut [i8; RUN]) {
    let (blk, ib): (BlockIq4Xs, _) = (block(row, r / 8), r % 8);
    let codes = nibble_codes(&blk.qs[16 * ib..16 * ib + 16], &KVALUES_IQ4NL);
    rescale_run(GgmlType::IQ4_XS, &codes, std::slice::from_ref(m), out);
}

fn mxfp4_run(row: &[u8], m: &i16, r: usize, out: &mut [i8; RUN]) {
    let blk: BlockMxfp4 = block(row, r);
    let codes = nibble_codes(&blk.qs, &KVALUES_MXFP4);
    rescale_run(GgmlType::MXFP4, &codes, std::slice::from_ref(m), out);
}

/// The IQ2/IQ3 codes of a sub-block: each group's grid magnitudes with their signs.
fn signed_codes(group: impl Fn(usize) -> ([u8; 8], u8)) -> [i32; RUN] {
    let groups: [_; 4] = std::array::from_fn(group);
    std::array::from_fn(|l| {
        let (grid, signs) = groups[l / 8];
        let c = grid[l % 8] as i32;
        if signs & (1 << (l % 8)) != 0 {
            -c
        } else {
            c
        }
    })
}

fn iq2_xxs_run(row: &[u8], m: &i16, r: usize, out: &mut [i8; RUN]) {
    let (blk, ib): (BlockIq2Xxs, _) = (block(row, r / 8), r % 8);
    let codes = signed_codes(|l| blk.group(ib, l));
    rescale_run(GgmlType::IQ2_XXS, &codes, std::slice::from_ref(m), out);
}

fn iq2_xs_run(row: &[u8], m: &[i16; 2], r: usize, out: &mut [i8; RUN]) {
    let (blk, ib): (BlockIq2Xs, _) = (block(row, r / 8), r % 8);
    rescale_run(
        GgmlType::IQ2_XS,
        &signed_codes(|l| blk.group(ib, l)),
        m,
        out,
    );
}

fn iq2_s_run(row: &[u8], m: &[i16; 2], r: usize, out: &mut [i8; RUN]) {
    let (blk, ib): (BlockIq2S, _) = (block(row, r / 8), r % 8);
    rescale_run(GgmlType::IQ2_S, &signed_codes(|l| blk.group(ib, l)), m, out);
}

fn iq3_xxs_run(row: &[u8], m: &i16, r: usize, out: &mut [i8; RUN]) {
    let (blk, ib): (BlockIq3Xxs, _) = (block(row, r / 8), r % 8);
    let codes = signed_codes(|l| blk.group(ib, l));
    rescale_run(GgmlType::IQ3_XXS, &codes, std::slice::from_ref(m), out);
}

fn iq3_s_run(row: &[u8], m: &i16, r: usize, out: &mut [i8; RUN]) {
    let (blk, ib): (BlockIq3S, _) = (block(row, r / 8), r % 8);
    let codes = signed_codes(|l| blk.group(ib, l));
    rescale_run(GgmlType::IQ3_S, &codes, std::slice::from_ref(m), out);
}

/// IQ1's codes `8·(grid ± 1/8)`: the grid values (-1, 0, 1) times 8, plus or minus 1.
fn iq1_codes(group: impl Fn(usize) -> ([i8; 8], bool)) -> [i32; RUN] {
    let groups: [_; 4] = std::array::from_fn(group);
    std::array::from_fn(|l| {
        let (grid, negative) = groups[l / 8];
        8 * grid[l % 8] as i32 + if negative { -1 } else { 1 }
    })
}

fn iq1_s_run(row: &[u8], m: &i16, r: usize, out: &mut [i8; RUN]) {
    let (blk, ib): (BlockIq1S, _) = (block(row, r / 8), r % 8);
    let negative = blk.scale(ib).1;
    let codes = iq1_codes(|l| (blk.group(ib, l), negative));
    rescale_run(GgmlType::IQ1_S, &codes, std::slice::from_ref(m), out);
}

fn iq1_m_run(row: &[u8], m: &[i16; 2], r: usize, out: &mut [i8; RUN]) {
    let (blk, ib): (BlockIq1M, _) = (block(row, r / 8), r % 8);
    rescale_run(GgmlType::IQ1_M, &iq1_codes(|l| blk.group(ib, l)), m, out);
}
