//! GGML quantized block formats and their reference dequantization.
//!
//! Block structs are plain `#[repr(C)]` byte layouts, exactly as ggml stores them (fp16 fields as
//! raw `u16` bits), so a row of blocks can be viewed straight from a ggml tensor's memory. The
//! `dequantize_*` functions define the f32 value of every weight; they follow ggml's
//! `dequantize_row_*` operation for operation (same products in the same order), so they agree
//! with it bit for bit (proved against vectors from ggml's reference in `tests/quant_vectors.rs`).

mod blocks;
mod dequant;
pub mod fp16;
pub mod vec_dot;

pub use blocks::*;
pub use dequant::*;

/// The GGML tensor types this crate understands, with ggml's numbering (`enum ggml_type`).
// ggml's own spelling (Q4_K, not Q4K) keeps names greppable against ggml's source.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q8_0 = 8,
    Q4_K = 12,
    Q6_K = 14,
}

impl GgmlType {
    /// Every quantized type that expert weights may come in and that [`crate::inflate`] handles.
    pub const QUANTIZED: [GgmlType; 6] = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ];

    /// Maps ggml's type id; `None` for types this crate does not know (the caller declines them).
    pub fn from_id(id: i32) -> Option<GgmlType> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            8 => GgmlType::Q8_0,
            12 => GgmlType::Q4_K,
            14 => GgmlType::Q6_K,
            _ => return None,
        })
    }

    pub fn id(self) -> i32 {
        self as i32
    }

    /// ggml's lower-case name (`type_name` in ggml.c).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "f32",
            GgmlType::F16 => "f16",
            GgmlType::Q4_0 => "q4_0",
            GgmlType::Q4_1 => "q4_1",
            GgmlType::Q5_0 => "q5_0",
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Q4_K => "q4_K",
            GgmlType::Q6_K => "q6_K",
        }
    }

    /// Parses [`GgmlType::name`], case-insensitively.
    pub fn from_name(name: &str) -> Option<GgmlType> {
        [GgmlType::F32, GgmlType::F16]
            .into_iter()
            .chain(GgmlType::QUANTIZED)
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Weights per block.
    pub fn block_elems(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0 => QK32,
            GgmlType::Q4_K | GgmlType::Q6_K => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 => 2,
            GgmlType::Q4_0 => size_of::<BlockQ4_0>(),
            GgmlType::Q4_1 => size_of::<BlockQ4_1>(),
            GgmlType::Q5_0 => size_of::<BlockQ5_0>(),
            GgmlType::Q8_0 => size_of::<BlockQ8_0>(),
            GgmlType::Q4_K => size_of::<BlockQ4K>(),
            GgmlType::Q6_K => size_of::<BlockQ6K>(),
        }
    }

    /// Bytes of one row of `k` weights, or `None` when `k` is not a whole number of blocks.
    pub fn row_bytes(self, k: usize) -> Option<usize> {
        k.is_multiple_of(self.block_elems())
            .then(|| k / self.block_elems() * self.block_bytes())
    }
}

/// Why a buffer cannot be read as a row of blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QuantError {
    /// The row length is not a multiple of the type's block size.
    RowNotWholeBlocks { ty: GgmlType, k: usize },
    /// The byte buffer does not hold exactly the expected number of bytes.
    WrongByteLength { expected: usize, got: usize },
}

impl std::fmt::Display for QuantError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QuantError::RowNotWholeBlocks { ty, k } => write!(
                f,
                "row length {k} is not a multiple of {}'s block size {}",
                ty.name(),
                ty.block_elems()
            ),
            QuantError::WrongByteLength { expected, got } => {
                write!(f, "expected {expected} bytes of blocks, got {got}")
            }
        }
    }
}

impl std::error::Error for QuantError {}
