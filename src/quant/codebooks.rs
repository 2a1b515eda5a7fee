//! The codebook ("i-quant") types: each group of 4 or 8 weights is one entry of a fixed grid
//! (`grids`), with stored signs (IQ2, IQ3) or a stored offset (IQ1), times a sub-block scale.
//! Every value here is a small integer times an fp16 times a small odd integer, so ggml's f32
//! products are exact; the dequantization still follows ggml's operations one by one.

use super::blocks::{byte_block, half, Block, QK_K};
use super::fp16::f16_to_f32;
use super::grids::{
    IQ1S_DELTA, IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
};
use super::GgmlType;

byte_block! {
    /// `block_iq2_xxs`: 8 sub-blocks of 32; per sub-block 4 grid bytes and a little-endian u32 of
    /// four 7-bit sign indices and a 4-bit scale.
    BlockIq2Xxs, 66 {
        d: 2,
        qs: QK_K / 4,
    }
}

byte_block! {
    /// `block_iq2_xs`: 32 little-endian u16 (9-bit grid index, 7-bit sign index), one 4-bit
    /// scale per 16 weights.
    BlockIq2Xs, 74 {
        d: 2,
        qs: QK_K / 4,
        scales: QK_K / 32,
    }
}

byte_block! {
    /// `block_iq2_s`: 32 grid bytes then 32 sign bytes in `qs`, the grid indices' top two bits
    /// in `qh`, one 4-bit scale per 16 weights.
    BlockIq2S, 82 {
        d: 2,
        qs: QK_K / 4,
        qh: QK_K / 32,
        scales: QK_K / 32,
    }
}

byte_block! {
    /// `block_iq3_xxs`: 64 grid bytes, then per sub-block of 32 a little-endian u32 of four 7-bit
    /// sign indices and a 4-bit scale.
    BlockIq3Xxs, 98 {
        d: 2,
        qs: 3 * QK_K / 8,
    }
}

byte_block! {
    /// `block_iq3_s`: 9-bit grid indices (low bytes in `qs`, top bits in `qh`), one sign bit per
    /// weight, one 4-bit scale per sub-block of 32.
    BlockIq3S, 110 {
        d: 2,
        qs: QK_K / 4,
        qh: QK_K / 32,
        signs: QK_K / 8,
        scales: QK_K / 64,
    }
}

byte_block! {
    /// `block_iq1_s`: 11-bit grid indices (low bytes in `qs`, top bits in `qh`); per sub-block
    /// of 32 a little-endian u16 `qh` with the top bits, a 3-bit scale and the offset's sign.
    BlockIq1S, 50 {
        d: 2,
        qs: QK_K / 8,
        qh: QK_K / 16,
    }
}

byte_block! {
    /// `block_iq1_m`: 11-bit grid indices (low bytes in `qs`, top bits and the offsets' signs in
    /// `qh`), one 3-bit scale per 16 weights; the fp16 super-block scale is the top nibbles of
    /// the four little-endian u16 of `scales` ([`iq1m_scale`]).
    BlockIq1M, 56 {
        qs: QK_K / 8,
        qh: QK_K / 16,
        scales: QK_K / 32,
    }
}

/// The sign of weight `j` (0..8) of a group: bit `j` of its sign byte.
#[inline]
fn sign(signs: u8, j: usize) -> f32 {
    if signs & (1 << j) != 0 {
        -1.0
    } else {
        1.0
    }
}

/// The u16 at `2·i` of `bytes`, little-endian.
#[inline]
fn u16_at(bytes: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])
}

/// The u32 at byte `at` of `bytes`, little-endian.
#[inline]
fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

/// The fp16 bits of an IQ1_M super-block's scale: the top nibble of each u16 of `scales`.
#[inline]
pub fn iq1m_scale(scales: &[u8; 8]) -> u16 {
    let sc = |i| u16_at(scales, i);
    (sc(0) >> 12) | ((sc(1) >> 8) & 0x00f0) | ((sc(2) >> 4) & 0x0f00) | (sc(3) & 0xf000)
}

// Each type's groups of 8 weights: `group(ib, l)` is group `l` (0..4) of sub-block `ib` (0..8),
// weights `32·ib + 8·l..+8`; the scale accessors give the stored small integers that scale a
// sub-block (or half of one). The dequantization below and the inflate read blocks through them.

impl BlockIq2Xxs {
    /// Group `(ib, l)`: its grid magnitudes and sign byte.
    #[inline]
    pub fn group(&self, ib: usize, l: usize) -> ([u8; 8], u8) {
        let signs = (u32_at(&self.qs, 8 * ib + 4) >> (7 * l)) & 127;
        (
            IQ2XXS_GRID[self.qs[8 * ib + l] as usize].to_le_bytes(),
            KSIGNS_IQ2XS[signs as usize],
        )
    }

    /// Sub-block `ib`'s 4-bit scale `s`: the weights are `d·(0.5 + s)·0.25` times the codes.
    #[inline]
    pub fn scale(&self, ib: usize) -> u32 {
        u32_at(&self.qs, 8 * ib + 4) >> 28
    }
}

impl BlockIq2Xs {
    /// Group `(ib, l)`: its grid magnitudes and sign byte (the scale: nibble `l / 2` of
    /// `scales[ib]`).
    #[inline]
    pub fn group(&self, ib: usize, l: usize) -> ([u8; 8], u8) {
        let q = u16_at(&self.qs, 4 * ib + l);
        (
            IQ2XS_GRID[(q & 511) as usize].to_le_bytes(),
            KSIGNS_IQ2XS[(q >> 9) as usize],
        )
    }
}

impl BlockIq2S {
    /// Group `(ib, l)`: its grid magnitudes and sign byte (the scale: nibble `l / 2` of
    /// `scales[ib]`).
    #[inline]
    pub fn group(&self, ib: usize, l: usize) -> ([u8; 8], u8) {
        let high = ((self.qh[ib] as usize) << (8 - 2 * l)) & 0x300;
        let (qs, signs) = self.qs.split_at(QK_K / 8);
        (
            IQ2S_GRID[qs[4 * ib + l] as usize | high].to_le_bytes(),
            signs[4 * ib + l],
        )
    }
}

impl BlockIq3Xxs {
    /// Group `(ib, l)`: its grid magnitudes (two grid entries of four) and sign byte.
    #[inline]
    pub fn group(&self, ib: usize, l: usize) -> ([u8; 8], u8) {
        let signs = (u32_at(&self.qs, QK_K / 4 + 4 * ib) >> (7 * l)) & 127;
        let grid = |i: usize| IQ3XXS_GRID[self.qs[8 * ib + 2 * l + i] as usize].to_le_bytes();
        let (g1, g2) = (grid(0), grid(1));
        (
            [g1[0], g1[1], g1[2], g1[3], g2[0], g2[1], g2[2], g2[3]],
            KSIGNS_IQ2XS[signs as usize],
        )
    }

    /// Sub-block `ib`'s 4-bit scale `s`: the weights are `d·(0.5 + s)·0.5` times the codes.
    #[inline]
    pub fn scale(&self, ib: usize) -> u32 {
        u32_at(&self.qs, QK_K / 4 + 4 * ib) >> 28
    }
}

impl BlockIq3S {
    /// Group `(ib, l)`: its grid magnitudes (two grid entries of four) and sign byte.
    #[inline]
    pub fn group(&self, ib: usize, l: usize) -> ([u8; 8], u8) {
        let (qs, qh) = (&self.qs[8 * ib..8 * ib + 8], self.qh[ib] as usize);
        let g1 = IQ3S_GRID[qs[2 * l] as usize | ((qh << (8 - 2 * l)) & 256)].to_le_bytes();
        let g2 = IQ3S_GRID[qs[2 * l + 1] as usize | ((qh << (7 - 2 * l)) & 256)].to_le_bytes();
        (
            [g1[0], g1[1], g1[2], g1[3], g2[0], g2[1], g2[2], g2[3]],
            self.signs[4 * ib + l],
        )
    }

    /// Sub-block `ib`'s 4-bit scale `s`: the weights are `d·(1 + 2s)` times the codes.
    #[inline]
    pub fn scale(&self, ib: usize) -> i32 {
        ((self.scales[ib / 2] >> (4 * (ib % 2))) & 0x0f) as i32
    }
}

impl BlockIq1S {
    /// Group `(ib, l)`: its grid values (-1, 0, 1).
    #[inline]
    pub fn group(&self, ib: usize, l: usize) -> [i8; 8] {
        let high = ((u16_at(&self.qh, ib) >> (3 * l)) & 7) as usize;
        IQ1S_GRID[self.qs[4 * ib + l] as usize | (high << 8)]
            .to_le_bytes()
            .map(|g| g as i8)
    }

    /// Sub-block `ib`'s 3-bit scale `s` (the weights are `d·(2s + 1)·(grid ± IQ1S_DELTA)`) and
    /// whether its offset is negative.
    #[inline]
    pub fn scale(&self, ib: usize) -> (i32, bool) {
        let qh = u16_at(&self.qh, ib);
        (((qh >> 12) & 7) as i32, qh & 0x8000 != 0)
    }
}

impl BlockIq1M {
    /// Group `(ib, l)`: its grid values (-1, 0, 1) and whether its offset is negative.
    #[inline]
    pub fn group(&self, ib: usize, l: usize) -> ([i8; 8], bool) {
        // Groups 0 and 2 take the low nibble of their qh byte, 1 and 3 the high one.
        let nibble = (self.qh[2 * ib + l / 2] >> (4 * (l % 2))) as usize;
        let grid = IQ1S_GRID[self.qs[4 * ib + l] as usize | ((nibble & 7) << 8)];
        (grid.to_le_bytes().map(|g| g as i8), nibble & 8 != 0)
    }

    /// The 3-bit scale `s` of half `h` (0, 1) of sub-block `ib`: its weights are
    /// `d·(2s + 1)·(grid ± IQ1S_DELTA)`.
    #[inline]
    pub fn scale(&self, ib: usize, h: usize) -> i32 {
        let sc = u16_at(&self.scales, ib / 2) as i32;
        (sc >> (6 * (ib % 2) + 3 * h)) & 7
    }
}

impl Block for BlockIq2Xxs {
    const TYPE: GgmlType = GgmlType::IQ2_XXS;
    const ELEMS: usize = QK_K;
    const BYTES: usize = 66;

    fn read(b: &[u8]) -> Self {
        Self::read_fields(b)
    }
    fn write(&self, out: &mut [u8]) {
        self.write_fields(out)
    }
    fn dequantize(&self, y: &mut [f32]) {
        let d = half(self.d);
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let db = d * (0.5 + self.scale(ib) as f32) * 0.25;
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let (grid, signs) = self.group(ib, l);
                for (j, y) in y.iter_mut().enumerate() {
                    *y = db * grid[j] as f32 * sign(signs, j);
                }
            }
        }
    }
}

impl Block for BlockIq2Xs {
    const TYPE: GgmlType = GgmlType::IQ2_XS;
    const ELEMS: usize = QK_K;
    const BYTES: usize = 74;

    fn read(b: &[u8]) -> Self {
        Self::read_fields(b)
    }
    fn write(&self, out: &mut [u8]) {
        self.write_fields(out)
    }
    fn dequantize(&self, y: &mut [f32]) {
        let d = half(self.d);
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let sc = self.scales[ib];
            let db = [
                d * (0.5 + (sc & 0x0f) as f32) * 0.25,
                d * (0.5 + (sc >> 4) as f32) * 0.25,
            ];
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let (grid, signs) = self.group(ib, l);
                for (j, y) in y.iter_mut().enumerate() {
                    *y = db[l / 2] * grid[j] as f32 * sign(signs, j);
                }
            }
        }
    }
}

impl Block for BlockIq2S {
    const TYPE: GgmlType = GgmlType::IQ2_S;
    const ELEMS: usize = QK_K;
    const BYTES: usize = 82;

    fn read(b: &[u8]) -> Self {
        Self::read_fields(b)
    }
    fn write(&self, out: &mut [u8]) {
        self.write_fields(out)
    }
    fn dequantize(&self, y: &mut [f32]) {
        let d = half(self.d);
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let sc = self.scales[ib];
            let db = [
                d * (0.5 + (sc & 0x0f) as f32) * 0.25,
                d * (0.5 + (sc >> 4) as f32) * 0.25,
            ];
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let (grid, signs) = self.group(ib, l);
                for (j, y) in y.iter_mut().enumerate() {
                    *y = db[l / 2] * grid[j] as f32 * sign(signs, j);
                }
            }
        }
    }
}

impl Block for BlockIq3Xxs {
    const TYPE: GgmlType = GgmlType::IQ3_XXS;
    const ELEMS: usize = QK_K;
    const BYTES: usize = 98;

    fn read(b: &[u8]) -> Self {
        Self::read_fields(b)
    }
    fn write(&self, out: &mut [u8]) {
        self.write_fields(out)
    }
    fn dequantize(&self, y: &mut [f32]) {
        let d = half(self.d);
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let db = d * (0.5 + self.scale(ib) as f32) * 0.5;
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let (grid, signs) = self.group(ib, l);
                for (j, y) in y.iter_mut().enumerate() {
                    *y = db * grid[j] as f32 * sign(signs, j);
                }
            }
        }
    }
}

impl Block for BlockIq3S {
    const TYPE: GgmlType = GgmlType::IQ3_S;
    const ELEMS: usize = QK_K;
    const BYTES: usize = 110;

    fn read(b: &[u8]) -> Self {
        Self::read_fields(b)
    }
    fn write(&self, out: &mut [u8]) {
        self.write_fields(out)
    }
    fn dequantize(&self, y: &mut [f32]) {
        let d = half(self.d);
        // ggml walks sub-blocks in pairs that share a scale byte; the order of the products is
        // the same.
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let db = d * (1 + 2 * self.scale(ib)) as f32;
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let (grid, signs) = self.group(ib, l);
                for (j, y) in y.iter_mut().enumerate() {
                    *y = db * grid[j] as f32 * sign(signs, j);
                }
            }
        }
    }
}

impl Block for BlockIq1S {
    const TYPE: GgmlType = GgmlType::IQ1_S;
    const ELEMS: usize = QK_K;
    const BYTES: usize = 50;

    fn read(b: &[u8]) -> Self {
        Self::read_fields(b)
    }
    fn write(&self, out: &mut [u8]) {
        self.write_fields(out)
    }
    fn dequantize(&self, y: &mut [f32]) {
        let d = half(self.d);
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let (scale, negative) = self.scale(ib);
            let dl = d * (2 * scale + 1) as f32;
            let delta = if negative { -IQ1S_DELTA } else { IQ1S_DELTA };
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                for (y, g) in y.iter_mut().zip(self.group(ib, l)) {
                    *y = dl * (g as f32 + delta);
                }
            }
        }
    }
}

impl Block for BlockIq1M {
    const TYPE: GgmlType = GgmlType::IQ1_M;
    const ELEMS: usize = QK_K;
    const BYTES: usize = 56;

    fn read(b: &[u8]) -> Self {
        Self::read_fields(b)
    }
    fn write(&self, out: &mut [u8]) {
        self.write_fields(out)
    }
    fn dequantize(&self, y: &mut [f32]) {
        let d = f16_to_f32(iq1m_scale(&self.scales));
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let dl = [0, 1].map(|h| d * (2 * self.scale(ib, h) + 1) as f32);
            for (l, y) in y.chunks_exact_mut(8).enumerate() {
                let (grid, negative) = self.group(ib, l);
                let delta = if negative { -IQ1S_DELTA } else { IQ1S_DELTA };
                for (y, g) in y.iter_mut().zip(grid) {
                    *y = dl[l / 2] * (g as f32 + delta);
                }
            }
        }
    }
}
