//! GGML quantized block formats and their reference dequantization.
//!
//! Block structs are plain `#[repr(C)]` byte layouts, exactly as ggml stores them (fp16 fields as
//! raw `u16` bits), so a row of blocks can be viewed straight from a ggml tensor's memory. The
//! `dequantize_*` functions define the f32 value of every weight; they follow ggml's
//! `dequantize_row_*` operation for operation (same products in the same order), so they agree
//! with it bit for bit (proved against vectors from ggml's reference in `tests/quant_vectors.rs`).

mod blocks;
mod codebooks;
mod dequant;
pub mod fp16;
pub mod grids;
mod kquants;
mod nonlinear;
pub mod vec_dot;

pub use blocks::*;
pub use codebooks::*;
pub use dequant::*;
pub use kquants::*;
pub use nonlinear::*;

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
    Q5_1 = 7,
    Q8_0 = 8,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    IQ1_M = 29,
    MXFP4 = 39,
}

impl GgmlType {
    /// The quantized types the engine takes: every kernel path of [`crate::inflate`] handles
    /// them in plain blocks, and in ggml's repacked layouts those of
    /// [`crate::inflate::Layout::REPACKED`].
    pub const QUANTIZED: [GgmlType; 20] = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q5_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q5_K,
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
        GgmlType::MXFP4,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ2_S,
        GgmlType::IQ3_XXS,
        GgmlType::IQ3_S,
        GgmlType::IQ1_S,
        GgmlType::IQ1_M,
    ];

    /// Every type this crate knows, in ggml's order.
    pub const ALL: [GgmlType; 22] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ3_XXS,
        GgmlType::IQ1_S,
        GgmlType::IQ4_NL,
        GgmlType::IQ3_S,
        GgmlType::IQ2_S,
        GgmlType::IQ4_XS,
        GgmlType::IQ1_M,
        GgmlType::MXFP4,
    ];

    /// Maps ggml's type id; `None` for types this crate does not know (the caller declines them).
    pub fn from_id(id: i32) -> Option<GgmlType> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            10 => GgmlType::Q2_K,
            11 => GgmlType::Q3_K,
            12 => GgmlType::Q4_K,
            13 => GgmlType::Q5_K,
            14 => GgmlType::Q6_K,
            16 => GgmlType::IQ2_XXS,
            17 => GgmlType::IQ2_XS,
            18 => GgmlType::IQ3_XXS,
            19 => GgmlType::IQ1_S,
            20 => GgmlType::IQ4_NL,
            21 => GgmlType::IQ3_S,
            22 => GgmlType::IQ2_S,
            23 => GgmlType::IQ4_XS,
            29 => GgmlType::IQ1_M,
            39 => GgmlType::MXFP4,
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
            GgmlType::Q5_1 => "q5_1",
            GgmlType::Q2_K => "q2_K",
            GgmlType::Q3_K => "q3_K",
            GgmlType::Q4_K => "q4_K",
            GgmlType::Q5_K => "q5_K",
            GgmlType::Q6_K => "q6_K",
            GgmlType::IQ2_XXS => "iq2_xxs",
            GgmlType::IQ2_XS => "iq2_xs",
            GgmlType::IQ3_XXS => "iq3_xxs",
            GgmlType::IQ1_S => "iq1_s",
            GgmlType::IQ4_NL => "iq4_nl",
            GgmlType::IQ3_S => "iq3_s",
            GgmlType::IQ2_S => "iq2_s",
            GgmlType::IQ4_XS => "iq4_xs",
            GgmlType::IQ1_M => "iq1_m",
            GgmlType::MXFP4 => "mxfp4",
        }
    }

    /// Parses [`GgmlType::name`], case-insensitively.
    pub fn from_name(name: &str) -> Option<GgmlType> {
        GgmlType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Weights per block.
    pub fn block_elems(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 => 1,
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::IQ4_NL
            | GgmlType::MXFP4 => QK32,
            _ => QK_K,
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
            GgmlType::Q5_1 => size_of::<BlockQ5_1>(),
            GgmlType::Q2_K => size_of::<BlockQ2K>(),
            GgmlType::Q3_K => size_of::<BlockQ3K>(),
            GgmlType::Q4_K => size_of::<BlockQ4K>(),
            GgmlType::Q5_K => size_of::<BlockQ5K>(),
            GgmlType::Q6_K => size_of::<BlockQ6K>(),
            GgmlType::IQ2_XXS => size_of::<BlockIq2Xxs>(),
            GgmlType::IQ2_XS => size_of::<BlockIq2Xs>(),
            GgmlType::IQ3_XXS => size_of::<BlockIq3Xxs>(),
            GgmlType::IQ1_S => size_of::<BlockIq1S>(),
            GgmlType::IQ4_NL => size_of::<BlockIq4Nl>(),
            GgmlType::IQ3_S => size_of::<BlockIq3S>(),
            GgmlType::IQ2_S => size_of::<BlockIq2S>(),
            GgmlType::IQ4_XS => size_of::<BlockIq4Xs>(),
            GgmlType::IQ1_M => size_of::<BlockIq1M>(),
            GgmlType::MXFP4 => size_of::<BlockMxfp4>(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names_map_back_to_every_type() {
        for ty in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(ty.id()), Some(ty));
            assert_eq!(GgmlType::from_name(ty.name()), Some(ty));
            assert_eq!(ty.row_bytes(ty.block_elems()), Some(ty.block_bytes()));
        }
        let known = (-1..64).filter_map(GgmlType::from_id).count();
        assert_eq!(known, GgmlType::ALL.len());
        assert_eq!(GgmlType::QUANTIZED.len(), GgmlType::ALL.len() - 2);
    }
}
