//! What the codebook types' SIMD kernels read of a run (a sub-block of 32 weights): its four
//! groups' grid entries and signs straight from the block's bytes, and the table of the signed,
//! stretched codes their rescale looks up. Shared by every path; the scalar reference reads the
//! blocks through `quant`'s accessors instead (tested equal below).
//!
//! A weight's table index is its grid byte's magnitude index (IQ2: `v >> 4` of 8, 25, 43;
//! IQ3_XXS: `v >> 3` of 4, 12, .., 62; IQ3_S: `v >> 1` of 1, 3, .., 15; IQ1: the grid value
//! -1, 0 or 1, plus 1) with [`Codebook::negative`] set where the weight is negative (IQ2, IQ3:
//! its sign bit; IQ1: its group's offset sign).

use super::params::code_scale;
use crate::quant::grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
};
use crate::quant::GgmlType;

/// A codebook type's geometry and table.
#[derive(Clone, Copy)]
pub(super) struct Codebook {
    /// Right shift of a grid byte to its magnitude index (IQ1: none; the kernels add 1).
    pub shift: u32,
    /// Mask of the magnitude index after the shift.
    pub mask: u8,
    /// The table bit of a negative weight: 4 (tables of 8) or 8 (of 16).
    pub negative: u8,
}

impl Codebook {
    pub fn of(ty: GgmlType) -> Codebook {
        let (shift, mask, negative) = match ty {
            GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ2_S => (4, 3, 4),
            GgmlType::IQ3_XXS => (3, 7, 8),
            GgmlType::IQ3_S => (1, 7, 8),
            GgmlType::IQ1_S | GgmlType::IQ1_M => (0, 3, 4),
            _ => unreachable!("a codebook type"),
        };
        Codebook {
            shift,
            mask,
            negative,
        }
    }
}

/// The stretched codes `k·c` of table index `i` (16 entries; tables of 8 repeat theirs).
pub(super) fn table_codes(ty: GgmlType) -> [i16; 16] {
    let magnitudes: &[i32] = match ty {
        GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ2_S => &[8, 25, 43, 0],
        GgmlType::IQ3_XXS => &[4, 12, 20, 28, 36, 44, 52, 62],
        GgmlType::IQ3_S => &[1, 3, 5, 7, 9, 11, 13, 15],
        // 8·(g + 1/8) for g = -1, 0, 1: the negative half is 8·(g - 1/8).
        GgmlType::IQ1_S | GgmlType::IQ1_M => &[-7, 1, 9, 0],
        _ => unreachable!("a codebook type"),
    };
    let (len, k) = (magnitudes.len(), code_scale(ty));
    std::array::from_fn(|i| {
        let (j, negative) = (i % (2 * len) % len, i % (2 * len) >= len);
        let c = match (ty, negative) {
            (GgmlType::IQ1_S | GgmlType::IQ1_M, true) if j < 3 => magnitudes[j] - 2,
            (_, true) => -magnitudes[j],
            _ => magnitudes[j],
        };
        (k * c) as i16
    })
}

/// The KSIGNS-coded types' (IQ2_XXS, IQ2_XS, IQ3_XXS) sign fields of run `ib`: group `l`'s
/// index into `KSIGNS_IQ2XS` is the 7 bits of the word at `shift[l]`. Those bits are the signs
/// of the group's first seven weights; the eighth's makes the group's count of negatives even.
#[inline(always)]
pub(super) fn sign_fields(ty: GgmlType, blk: &[u8], ib: usize) -> (u64, [u32; 4]) {
    let word = |at: usize, len: usize| {
        let mut bytes = [0u8; 8];
        bytes[..len].copy_from_slice(&blk[at..at + len]);
        u64::from_le_bytes(bytes)
    };
    match ty {
        GgmlType::IQ2_XXS => (word(6 + 8 * ib, 4), [0, 7, 14, 21]),
        GgmlType::IQ2_XS => (word(2 + 8 * ib, 8), [9, 25, 41, 57]),
        GgmlType::IQ3_XXS => (word(66 + 4 * ib, 4), [0, 7, 14, 21]),
        _ => unreachable!("a KSIGNS-coded type"),
    }
}

/// Run `ib`'s eight grid indices of an IQ3 type (4-byte entries of `IQ3XXS_GRID` or
/// `IQ3S_GRID`), two per group.
#[inline(always)]
pub(super) fn iq3_indices(ty: GgmlType, blk: &[u8], ib: usize) -> [usize; 8] {
    let q = &blk[2 + 8 * ib..10 + 8 * ib];
    match ty {
        GgmlType::IQ3_XXS => std::array::from_fn(|e| q[e] as usize),
        GgmlType::IQ3_S => {
            let qh = blk[66 + ib] as usize;
            std::array::from_fn(|e| q[e] as usize | (qh << (8 - e)) & 256)
        }
        _ => unreachable!("an IQ3 type"),
    }
}

/// The sign word of [`groups`] from a KSIGNS-coded type's [`sign_fields`].
#[inline(always)]
fn ksigns(ty: GgmlType, blk: &[u8], ib: usize) -> u32 {
    let (word, shift) = sign_fields(ty, blk, ib);
    u32::from_le_bytes(shift.map(|s| KSIGNS_IQ2XS[(word >> s & 127) as usize]))
}

/// An IQ3 run's grid entries ([`iq3_indices`] into `table`) paired into [`groups`]' four.
#[inline(always)]
fn iq3_pairs(table: &[u32], ty: GgmlType, blk: &[u8], ib: usize) -> [u64; 4] {
    let e = iq3_indices(ty, blk, ib).map(|i| table[i] as u64);
    std::array::from_fn(|l| e[2 * l] | e[2 * l + 1] << 32)
}

/// Run `ib` (sub-block) of a codebook block: its four groups' grid entries (8 bytes each,
/// little-endian) and their sign bytes (bit `j` of byte `l`: weight `8l + j` negative; IQ1: all
/// eight bits alike, its group's offset sign), as one word.
#[inline(always)]
pub(super) fn groups(ty: GgmlType, blk: &[u8], ib: usize) -> ([u64; 4], u32) {
    let u16_at = |at: usize| u16::from_le_bytes([blk[at], blk[at + 1]]);
    let u32_at = |at: usize| u32::from_le_bytes(blk[at..at + 4].try_into().expect("4 bytes"));
    let signs = |s: [u8; 4]| u32::from_le_bytes(s);
    match ty {
        GgmlType::IQ2_XXS => {
            let q = &blk[2 + 8 * ib..];
            (
                std::array::from_fn(|l| IQ2XXS_GRID[q[l] as usize]),
                ksigns(ty, blk, ib),
            )
        }
        GgmlType::IQ2_XS => {
            // The run's four 16-bit codes: a grid index in bits 0..9, the sign field above.
            let (codes, _) = sign_fields(ty, blk, ib);
            let grid = std::array::from_fn(|l| IQ2XS_GRID[(codes >> (16 * l) & 511) as usize]);
            (grid, ksigns(ty, blk, ib))
        }
        GgmlType::IQ2_S => {
            let qh = blk[66 + ib] as usize;
            let grid = std::array::from_fn(|l| {
                IQ2S_GRID[blk[2 + 4 * ib + l] as usize | ((qh << (8 - 2 * l)) & 0x300)]
            });
            (grid, u32_at(34 + 4 * ib))
        }
        GgmlType::IQ3_XXS => (iq3_pairs(&IQ3XXS_GRID, ty, blk, ib), ksigns(ty, blk, ib)),
        GgmlType::IQ3_S => (iq3_pairs(&IQ3S_GRID, ty, blk, ib), u32_at(74 + 4 * ib)),
        GgmlType::IQ1_S => {
            let qh = u16_at(34 + 2 * ib) as usize;
            let grid = std::array::from_fn(|l| {
                IQ1S_GRID[blk[2 + 4 * ib + l] as usize | ((qh >> (3 * l)) & 7) << 8]
            });
            let negative = if qh & 0x8000 != 0 { u32::MAX } else { 0 };
            (grid, negative)
        }
        GgmlType::IQ1_M => {
            let nibble = |l: usize| (blk[32 + 2 * ib + l / 2] >> (4 * (l % 2))) as usize;
            let grid =
                std::array::from_fn(|l| IQ1S_GRID[blk[4 * ib + l] as usize | (nibble(l) & 7) << 8]);
            let s = std::array::from_fn(|l| if nibble(l) & 8 != 0 { 0xff } else { 0 });
            (grid, signs(s))
        }
        _ => unreachable!("a codebook type"),
    }
}

/// The codebook types, for the tests of every path's code for them.
#[cfg(test)]
pub(super) const CODEBOOK_TYPES: [GgmlType; 7] = [
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{
        Block, BlockIq1M, BlockIq1S, BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs,
    };
    use crate::testutil::Rng;

    /// The codes `quant`'s accessors give group `l` of run `ib`: grid values with their signs
    /// (IQ1: `8·grid ± 1`).
    fn reference(ty: GgmlType, blk: &[u8], ib: usize, l: usize) -> [i32; 8] {
        let signed = |(grid, signs): ([u8; 8], u8)| {
            std::array::from_fn(|j| {
                let c = grid[j] as i32;
                if signs >> j & 1 != 0 {
                    -c
                } else {
                    c
                }
            })
        };
        let iq1 = |(grid, negative): ([i8; 8], bool)| {
            grid.map(|g| 8 * g as i32 + if negative { -1 } else { 1 })
        };
        match ty {
            GgmlType::IQ2_XXS => signed(BlockIq2Xxs::read(blk).group(ib, l)),
            GgmlType::IQ2_XS => signed(BlockIq2Xs::read(blk).group(ib, l)),
            GgmlType::IQ2_S => signed(BlockIq2S::read(blk).group(ib, l)),
            GgmlType::IQ3_XXS => signed(BlockIq3Xxs::read(blk).group(ib, l)),
            GgmlType::IQ3_S => signed(BlockIq3S::read(blk).group(ib, l)),
            GgmlType::IQ1_S => {
                let b = BlockIq1S::read(blk);
                iq1((b.group(ib, l), b.scale(ib).1))
            }
            GgmlType::IQ1_M => iq1(BlockIq1M::read(blk).group(ib, l)),
            _ => unreachable!(),
        }
    }

    #[test]
    fn groups_and_tables_give_the_accessors_codes() {
        let mut rng = Rng::new(41);
        for ty in CODEBOOK_TYPES {
            let cb = Codebook::of(ty);
            let table = table_codes(ty);
            let k = code_scale(ty) as i16;
            for _ in 0..300 {
                let mut blk = vec![0u8; ty.block_bytes()];
                rng.fill_bytes(&mut blk);
                for ib in 0..8 {
                    let (grid, signs) = groups(ty, &blk, ib);
                    for (l, &group) in grid.iter().enumerate() {
                        let want = reference(ty, &blk, ib, l);
                        for (j, &want) in want.iter().enumerate() {
                            let g = (group >> (8 * j)) as u8;
                            let index = if cb.shift == 0 {
                                (g as i8 + 1) as u8
                            } else {
                                (g >> cb.shift) & cb.mask
                            };
                            let negative = signs >> (8 * l + j) & 1 != 0;
                            let i = index | if negative { cb.negative } else { 0 };
                            assert_eq!(table[i as usize], k * want as i16, "{ty:?} {ib} {l} {j}");
                        }
                    }
                }
            }
        }
    }
}
