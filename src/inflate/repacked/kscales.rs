//! The K-quants' 12-byte scale packings of a repacked group (Q4_K, Q5_K): a multi-block holds
//! one packing per sub-block with the rows in the sub-blocks' places, which is a transpose of the
//! rows' own packings.

use super::super::params::q4k_scales_mins;
use crate::quant::K_SCALE_SIZE;

/// Transposes the (scale, min) pairs of eight Q4_K scale packings: packing `i` of the result
/// holds pair `i` of every input packing. Maps a multi-block's scale groups to its rows' scale
/// bytes, and back (the map is its own inverse).
pub(super) fn transpose_q4k_scales(packings: [&[u8; K_SCALE_SIZE]; 8]) -> [[u8; K_SCALE_SIZE]; 8] {
    let mut scales = [0u64; 8];
    let mut mins = [0u64; 8];
    for ((s, m), p) in scales.iter_mut().zip(&mut mins).zip(packings) {
        let (sc, mn) = q4k_scales_mins(p);
        (*s, *m) = (u64::from_le_bytes(sc), u64::from_le_bytes(mn));
    }
    let (scales, mins) = (transpose8x8(scales), transpose8x8(mins));
    std::array::from_fn(|i| q4k_pack(scales[i].to_le_bytes(), mins[i].to_le_bytes()))
}

/// The 8×8 byte matrix transpose, row `r` the bytes of `m[r]` (little-endian): three rounds of
/// swapping the off-diagonal 4×4, 2×2 and 1×1 blocks with word operations.
fn transpose8x8(mut m: [u64; 8]) -> [u64; 8] {
    for (s, low) in [
        (4, 0x0000_0000_ffff_ffffu64),
        (2, 0x0000_ffff_0000_ffff),
        (1, 0x00ff_00ff_00ff_00ff),
    ] {
        for r in (0..8).filter(|r| r & s == 0) {
            let t = ((m[r] >> (8 * s)) ^ m[r + s]) & low;
            m[r + s] ^= t;
            m[r] ^= t << (8 * s);
        }
    }
    m
}

/// The Q4_K packing of eight 6-bit scales and mins: the inverse of [`q4k_scales_mins`].
pub(super) fn q4k_pack(scales: [u8; 8], mins: [u8; 8]) -> [u8; K_SCALE_SIZE] {
    let word =
        |v: &[u8; 8], i: usize| u32::from_le_bytes(v[4 * i..4 * i + 4].try_into().expect("4"));
    let (s0, s1, m0, m1) = (
        word(&scales, 0),
        word(&scales, 1),
        word(&mins, 0),
        word(&mins, 1),
    );
    let (top2, low4) = (0x0303_0303, 0x0f0f_0f0f);
    // Sub-blocks 0..4 keep six bits each; 4..8 put their top two bits above those of 0..4 and
    // their low nibbles (scale | min << 4) into the last word.
    let words = [
        s0 | ((s1 >> 4) & top2) << 6,
        m0 | ((m1 >> 4) & top2) << 6,
        (s1 & low4) | (m1 & low4) << 4,
    ];
    let mut out = [0u8; K_SCALE_SIZE];
    for (o, w) in out.chunks_exact_mut(4).zip(words) {
        o.copy_from_slice(&w.to_le_bytes());
    }
    out
}
