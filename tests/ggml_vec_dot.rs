//! `quant::vec_dot` against the pinned ggml itself: vectors written by `tools/ggml_oracle.c`
//! (`bash tools/ggml_oracle.sh vectors tests/data/accuracy/oracle`), which calls ggml's
//! reference activation quantizers (`quantize_row_q8_{0,1,K}_ref`), its generic dot products
//! (`ggml_vec_dot_*_generic`) and, for comparison, the built CPU backend's own `from_float` and
//! `vec_dot` (the AVX-512 path on the machine that wrote them).
//!
//! Reference quantizer and generic dot product: equal bit for bit. The SIMD path: printed, and
//! bounded far below the quantization error (its ties round to even and its sums run in another
//! order).

use ork_moe::quant::vec_dot::{vec_dot, VecDotType};
use ork_moe::quant::GgmlType;
use std::path::PathBuf;

const ROWS: usize = 8;
const K: usize = 512;

fn read(ty: GgmlType, ext: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/accuracy/oracle")
        .join(format!("{}.{ext}", ty.name()));
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn reference_quantizers_and_generic_dots_equal_ggml_bit_for_bit() {
    for ty in VecDotType::WEIGHTS {
        let at = VecDotType::for_weights(ty).unwrap();
        let x = f32s(&read(ty, "x.f32"));
        let w = read(ty, "w.blocks");
        let act_ref = read(ty, "act_ref");
        let act_simd = read(ty, "act_simd");
        let dot_ref = f32s(&read(ty, "dot_ref"));
        let dot_simd = f32s(&read(ty, "dot_simd"));
        let (wrow, arow) = (
            ty.row_bytes(K).unwrap(),
            K / at.block_elems() * at.block_bytes(),
        );
        let mut act = Vec::new();
        for r in 0..ROWS {
            let q = at.quantize_row(&x[r * K..(r + 1) * K]).unwrap();
            assert_eq!(
                q,
                act_ref[r * arow..(r + 1) * arow],
                "{}: activation row {r}",
                ty.name()
            );
            act.push(q);
        }
        let (mut simd_act_bytes, mut err2, mut ref2) = (0usize, 0f64, 0f64);
        for r in 0..ROWS {
            simd_act_bytes += act[r]
                .iter()
                .zip(&act_simd[r * arow..(r + 1) * arow])
                .filter(|(a, b)| a != b)
                .count();
        }
        for i in 0..ROWS {
            let wi = &w[i * wrow..(i + 1) * wrow];
            for j in 0..ROWS {
                let got = vec_dot(ty, K, wi, &act[j]).unwrap();
                let want = dot_ref[i * ROWS + j];
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{}: w row {i} . act row {j}: {got:e} vs ggml {want:e}",
                    ty.name()
                );
                let simd = dot_simd[i * ROWS + j] as f64;
                err2 += (simd - want as f64).powi(2);
                ref2 += (want as f64).powi(2);
            }
        }
        let nmse = err2 / ref2;
        println!(
            "{}: reference == ggml; the built SIMD path: {simd_act_bytes} of {} activation \
             bytes differ, NMSE of its dots against the reference {nmse:.1e}",
            ty.name(),
            ROWS * arow
        );
        // Ties and summation order: a small fraction of the int8 quantization error itself
        // (NMSE ~1e-5..1e-4 for these rows).
        assert!(nmse < 1e-6, "{}: SIMD path far off", ty.name());
    }
}
