//! The reference dequantization equals ggml's, bit for bit, on vectors made by the PyPI `gguf`
//! package (`tools/make_quant_vectors.py`): quantizer output, random blocks, edge-case scales and,
//! for the codebook types, blocks that use every grid entry.

use ork_moe::quant::{dequantize_row, GgmlType};

fn read(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/data/quant/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn dequantize_matches_ggml_bit_for_bit() {
    for ty in GgmlType::QUANTIZED {
        let blocks = read(&format!("{}.blocks", ty.name()));
        let expected: Vec<u32> = read(&format!("{}.f32", ty.name()))
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let n_blocks = blocks.len() / ty.block_bytes();
        assert_eq!(
            n_blocks * ty.block_elems(),
            expected.len(),
            "{}: vector files disagree",
            ty.name()
        );
        assert!(n_blocks >= 30, "{}: too few vectors", ty.name());
        let mut out = vec![0f32; expected.len()];
        dequantize_row(ty, &blocks, &mut out).unwrap();
        for (i, (got, want)) in out.iter().zip(&expected).enumerate() {
            assert_eq!(
                got.to_bits(),
                *want,
                "{} weight {i} (block {}): got {got:e}, ggml {:e}",
                ty.name(),
                i / ty.block_elems(),
                f32::from_bits(*want)
            );
        }
    }
}
