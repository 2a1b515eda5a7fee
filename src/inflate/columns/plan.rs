//! The requested columns in the order the decoders visit them: by block and parameter set, each
//! column's code bytes located in the layout.

use super::source::Source;
use super::{Column, Plan, Run};
use crate::quant::GgmlType;

/// Weights per parameter set of `ty`: the k-quants' and IQ4_XS's sub-blocks (Q6_K, Q2_K and
/// Q3_K: of 16), else the block of 32.
fn set_elems(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q6_K | GgmlType::Q2_K | GgmlType::Q3_K => 16,
        _ => 32,
    }
}

/// The columns in channel order, in runs of one parameter set, each located.
pub(super) fn plan(src: &Source, columns: &[usize]) -> Plan {
    let (be, set) = (src.ty.block_elems(), set_elems(src.ty));
    let mut order: Vec<usize> = (0..columns.len()).collect();
    order.sort_by_key(|&i| columns[i]);
    let mut plan = Plan {
        columns: Vec::with_capacity(columns.len()),
        runs: Vec::new(),
        blocks: Vec::new(),
    };
    for (i, slot) in order.into_iter().enumerate() {
        let (x, e) = (columns[slot] / be, columns[slot] % be);
        plan.columns.push(locate(src, slot, e));
        match plan.runs.last_mut() {
            Some(run) if (run.x, run.s) == (x, e / set) => run.range.end = i + 1,
            last => {
                let new_block = last.is_none_or(|run| run.x != x);
                plan.runs.push(Run {
                    x,
                    s: e / set,
                    range: i..i + 1,
                });
                let r = plan.runs.len() - 1;
                match plan.blocks.last_mut() {
                    Some(block) if !new_block => block.end = r + 1,
                    _ => plan.blocks.push(r..r + 1),
                }
            }
        }
    }
    plan
}

/// Element `e` of a block, for output slot `slot`, located: the bytes of its code and their
/// shifts.
fn locate(src: &Source, slot: usize, e: usize) -> Column {
    let (bytes, shift): ([usize; 2], [u32; 2]) = match src.ty {
        GgmlType::Q4_0 => ([2 + e % 16, 0], [4 * (e / 16) as u32, 0]),
        GgmlType::Q4_1 => ([4 + e % 16, 0], [4 * (e / 16) as u32, 0]),
        GgmlType::Q5_0 => (
            [6 + e % 16, 2 + e / 8],
            [4 * (e / 16) as u32, (e % 8) as u32],
        ),
        GgmlType::Q8_0 => ([2 + e, 0], [0, 0]),
        GgmlType::Q4_K => {
            let (chunk, l) = (e / 64, e % 64);
            ([16 + chunk * 32 + l % 32, 0], [4 * (l / 32) as u32, 0])
        }
        GgmlType::Q6_K => {
            let (h, quarter, l) = (e / 128, e % 128 / 32, e % 32);
            (
                [h * 64 + l + 32 * (quarter % 2), 128 + h * 32 + l],
                [4 * (quarter / 2) as u32, 2 * quarter as u32],
            )
        }
        GgmlType::Q5_1 => (
            [8 + e % 16, 4 + e / 8],
            [4 * (e / 16) as u32, (e % 8) as u32],
        ),
        GgmlType::Q5_K => {
            let (chunk, l) = (e / 64, e % 64);
            (
                [48 + chunk * 32 + l % 32, 16 + l % 32],
                [4 * (l / 32) as u32, (2 * chunk + l / 32) as u32],
            )
        }
        GgmlType::Q2_K => (
            [16 + 32 * (e / 128) + e % 32, 0],
            [2 * (e % 128 / 32) as u32, 0],
        ),
        GgmlType::Q3_K => {
            let (half, j) = (e / 128, e % 128 / 32);
            (
                [32 + 32 * half + e % 32, e % 32],
                [2 * j as u32, (4 * half + j) as u32],
            )
        }
        GgmlType::IQ4_NL => ([2 + e % 16, 0], [4 * (e / 16) as u32, 0]),
        GgmlType::IQ4_XS => (
            [8 + 16 * (e / 32) + e % 16, 0],
            [4 * (e % 32 / 16) as u32, 0],
        ),
        GgmlType::MXFP4 => ([1 + e % 16, 0], [4 * (e / 16) as u32, 0]),
        // The codebook types' decoder reads the weight through its place in the block.
        _ => ([0, 0], [0, 0]),
    };
    Column {
        slot,
        q: bytes.map(|p| src.loc(p)),
        shift,
        flip: src.flip(bytes[0]),
        element: e,
    }
}
