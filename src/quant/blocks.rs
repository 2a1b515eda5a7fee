//! The block structs, byte for byte as ggml lays them out (`ggml-common.h`).
//!
//! Fields are byte arrays (alignment 1) so a block can be read from any offset of a tensor without
//! unsafe code; fp16 values are kept as their little-endian bits.

use super::fp16::f16_to_f32;
use super::GgmlType;

/// Weights per block of the 32-wide formats.
pub const QK32: usize = 32;
/// Weights per super-block of the k-quants.
pub const QK_K: usize = 256;
/// Bytes of packed 6-bit scales/mins in a Q4_K super-block.
pub const K_SCALE_SIZE: usize = 12;

/// A GGML quantized block.
pub trait Block: Copy + Sized {
    const TYPE: GgmlType;
    /// Weights in the block.
    const ELEMS: usize;
    /// Bytes of the block in memory.
    const BYTES: usize;

    /// Reads a block from the first [`Self::BYTES`] bytes of `bytes`.
    fn read(bytes: &[u8]) -> Self;
    /// Writes the block into the first [`Self::BYTES`] bytes of `out`.
    fn write(&self, out: &mut [u8]);
    /// The f32 value of each weight, exactly as ggml's `dequantize_row_*` computes it.
    fn dequantize(&self, out: &mut [f32]);
}

#[inline]
pub(super) fn half(bits: [u8; 2]) -> f32 {
    f16_to_f32(u16::from_le_bytes(bits))
}

/// Declares a block struct of byte-array fields in ggml's order (multi-byte fields as their
/// little-endian bytes), its size checked against ggml's (`$bytes`) at compile time, with
/// `read_fields` and `write_fields` for [`Block::read`] and [`Block::write`].
macro_rules! byte_block {
    (
        $(#[$attr:meta])*
        $name:ident, $bytes:literal {
            $($(#[$field_attr:meta])* $field:ident: $n:expr,)*
        }
    ) => {
        $(#[$attr])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(C)]
        pub struct $name {
            $($(#[$field_attr])* pub $field: [u8; $n],)*
        }

        const _: () = assert!(size_of::<$name>() == $bytes);

        impl $name {
            fn read_fields(b: &[u8]) -> Self {
                let mut at = 0;
                $(let $field = $crate::quant::blocks::arr::<{ $n }>(b, at); at += $n;)*
                let _ = at;
                $name { $($field,)* }
            }

            fn write_fields(&self, out: &mut [u8]) {
                let mut at = 0;
                $(out[at..at + $n].copy_from_slice(&self.$field); at += $n;)*
                let _ = at;
            }
        }
    };
}
pub(super) use byte_block;

/// `block_q4_0`: 32 weights `d * (nibble - 8)`; low nibbles are weights 0..16, high ones 16..32.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ4_0 {
    pub d: [u8; 2],
    pub qs: [u8; 16],
}

/// `block_q4_1`: 32 weights `d * nibble + m`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ4_1 {
    pub d: [u8; 2],
    pub m: [u8; 2],
    pub qs: [u8; 16],
}

/// `block_q5_0`: 32 weights `d * (q5 - 16)`, the fifth bits of all 32 in `qh` (little-endian u32).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ5_0 {
    pub d: [u8; 2],
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}

byte_block! {
    /// `block_q5_1`: 32 weights `d * q5 + m`, the fifth bits of all 32 in `qh` (little-endian u32).
    BlockQ5_1, 24 {
        d: 2,
        m: 2,
        qh: 4,
        qs: 16,
    }
}

/// `block_q8_0`: 32 weights `d * q`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: [u8; 2],
    pub qs: [i8; 32],
}

/// `block_q4_K`: 256 weights in 8 sub-blocks of 32, `d*sc[j] * nibble - dmin*m[j]` with 6-bit
/// `sc`/`m` packed in `scales` (see [`q4k_scale_min`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ4K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}

/// `block_q6_K`: 256 weights in 16 sub-blocks of 16, `d * scales[j] * (q6 - 32)`; the low four
/// bits in `ql`, the high two in `qh`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: [u8; 2],
}

const _: () = assert!(size_of::<BlockQ4_0>() == 18);
const _: () = assert!(size_of::<BlockQ4_1>() == 20);
const _: () = assert!(size_of::<BlockQ5_0>() == 22);
const _: () = assert!(size_of::<BlockQ8_0>() == 34);
const _: () = assert!(size_of::<BlockQ4K>() == 144);
const _: () = assert!(size_of::<BlockQ6K>() == 210);

/// Sub-block `j` (0..8) of a Q4_K super-block: its 6-bit scale and 6-bit min
/// (ggml's `get_scale_min_k4`).
#[inline]
pub fn q4k_scale_min(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

pub(super) fn arr<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    b[at..at + N].try_into().expect("slice of length N")
}

fn arr_i8<const N: usize>(b: &[u8], at: usize) -> [i8; N] {
    std::array::from_fn(|i| b[at + i] as i8)
}

impl Block for BlockQ4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    const ELEMS: usize = QK32;
    const BYTES: usize = 18;

    fn read(b: &[u8]) -> Self {
        BlockQ4_0 {
            d: arr(b, 0),
            qs: arr(b, 2),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.d);
        out[2..18].copy_from_slice(&self.qs);
    }
    fn dequantize(&self, y: &mut [f32]) {
        let d = half(self.d);
        for j in 0..16 {
            let x0 = (self.qs[j] & 0x0f) as i32 - 8;
            let x1 = (self.qs[j] >> 4) as i32 - 8;
            y[j] = x0 as f32 * d;
            y[j + 16] = x1 as f32 * d;
        }
    }
}

impl Block for BlockQ4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    const ELEMS: usize = QK32;
    const BYTES: usize = 20;

    fn read(b: &[u8]) -> Self {
        BlockQ4_1 {
            d: arr(b, 0),
            m: arr(b, 2),
            qs: arr(b, 4),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.d);
        out[2..4].copy_from_slice(&self.m);
        out[4..20].copy_from_slice(&self.qs);
    }
    fn dequantize(&self, y: &mut [f32]) {
        let d = half(self.d);
        let m = half(self.m);
        for j in 0..16 {
            let x0 = (self.qs[j] & 0x0f) as i32;
            let x1 = (self.qs[j] >> 4) as i32;
            y[j] = x0 as f32 * d + m;
            y[j + 16] = x1 as f32 * d + m;
        }
    }
}

impl Block for BlockQ5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    const ELEMS: usize = QK32;
    const BYTES: usize = 22;

    fn read(b: &[u8]) -> Self {
        BlockQ5_0 {
            d: arr(b, 0),
            qh: arr(b, 2),
            qs: arr(b, 6),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.d);
        out[2..6].copy_from_slice(&self.qh);
        out[6..22].copy_from_slice(&self.qs);
    }
    fn dequantize(&self, y: &mut [f32]) {
        let d = half(self.d);
        let qh = u32::from_le_bytes(self.qh);
        for j in 0..16 {
            let xh0 = ((qh >> j) << 4) & 0x10;
            let xh1 = (qh >> (j + 12)) & 0x10;
            let x0 = ((self.qs[j] as u32 & 0x0f) | xh0) as i32 - 16;
            let x1 = ((self.qs[j] as u32 >> 4) | xh1) as i32 - 16;
            y[j] = x0 as f32 * d;
            y[j + 16] = x1 as f32 * d;
        }
    }
}

impl Block for BlockQ5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    const ELEMS: usize = QK32;
    const BYTES: usize = 24;

    fn read(b: &[u8]) -> Self {
        Self::read_fields(b)
    }
    fn write(&self, out: &mut [u8]) {
        self.write_fields(out)
    }
    fn dequantize(&self, y: &mut [f32]) {
        let d = half(self.d);
        let m = half(self.m);
        let qh = u32::from_le_bytes(self.qh);
        for j in 0..16 {
            let xh0 = ((qh >> j) << 4) & 0x10;
            let xh1 = (qh >> (j + 12)) & 0x10;
            let x0 = (self.qs[j] as u32 & 0x0f) | xh0;
            let x1 = (self.qs[j] as u32 >> 4) | xh1;
            y[j] = x0 as f32 * d + m;
            y[j + 16] = x1 as f32 * d + m;
        }
    }
}

impl Block for BlockQ8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const ELEMS: usize = QK32;
    const BYTES: usize = 34;

    fn read(b: &[u8]) -> Self {
        BlockQ8_0 {
            d: arr(b, 0),
            qs: arr_i8(b, 2),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.d);
        for (o, q) in out[2..34].iter_mut().zip(self.qs) {
            *o = q as u8;
        }
    }
    fn dequantize(&self, y: &mut [f32]) {
        let d = half(self.d);
        for (y, &q) in y.iter_mut().zip(&self.qs) {
            *y = q as f32 * d;
        }
    }
}

impl Block for BlockQ4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
    const ELEMS: usize = QK_K;
    const BYTES: usize = 144;

    fn read(b: &[u8]) -> Self {
        BlockQ4K {
            d: arr(b, 0),
            dmin: arr(b, 2),
            scales: arr(b, 4),
            qs: arr(b, 16),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[..2].copy_from_slice(&self.d);
        out[2..4].copy_from_slice(&self.dmin);
        out[4..16].copy_from_slice(&self.scales);
        out[16..144].copy_from_slice(&self.qs);
    }
    fn dequantize(&self, y: &mut [f32]) {
        let d = half(self.d);
        let min = half(self.dmin);
        for chunk in 0..4 {
            let q = &self.qs[chunk * 32..chunk * 32 + 32];
            let (sc0, m0) = q4k_scale_min(2 * chunk, &self.scales);
            let (sc1, m1) = q4k_scale_min(2 * chunk + 1, &self.scales);
            let (d1, m1f) = (d * sc0 as f32, min * m0 as f32);
            let (d2, m2f) = (d * sc1 as f32, min * m1 as f32);
            let y = &mut y[chunk * 64..chunk * 64 + 64];
            for l in 0..32 {
                y[l] = d1 * (q[l] & 0x0f) as f32 - m1f;
                y[l + 32] = d2 * (q[l] >> 4) as f32 - m2f;
            }
        }
    }
}

impl Block for BlockQ6K {
    const TYPE: GgmlType = GgmlType::Q6_K;
    const ELEMS: usize = QK_K;
    const BYTES: usize = 210;

    fn read(b: &[u8]) -> Self {
        BlockQ6K {
            ql: arr(b, 0),
            qh: arr(b, 128),
            scales: arr_i8(b, 192),
            d: arr(b, 208),
        }
    }
    fn write(&self, out: &mut [u8]) {
        out[..128].copy_from_slice(&self.ql);
        out[128..192].copy_from_slice(&self.qh);
        for (o, s) in out[192..208].iter_mut().zip(self.scales) {
            *o = s as u8;
        }
        out[208..210].copy_from_slice(&self.d);
    }
    fn dequantize(&self, y: &mut [f32]) {
        let d = half(self.d);
        for half_block in 0..2 {
            let ql = &self.ql[half_block * 64..half_block * 64 + 64];
            let qh = &self.qh[half_block * 32..half_block * 32 + 32];
            let sc = &self.scales[half_block * 8..half_block * 8 + 8];
            let y = &mut y[half_block * 128..half_block * 128 + 128];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                y[l] = d * sc[is] as f32 * q1 as f32;
                y[l + 32] = d * sc[is + 2] as f32 * q2 as f32;
                y[l + 64] = d * sc[is + 4] as f32 * q3 as f32;
                y[l + 96] = d * sc[is + 6] as f32 * q4 as f32;
            }
        }
    }
}
