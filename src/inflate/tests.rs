//! Hand-checked cases of the method; the exhaustive comparisons live in `tests/inflate*.rs`.

use super::*;
use crate::quant::fp16::f32_to_f16;

fn inflate_one_row(ty: GgmlType, row: &[u8], k: usize) -> (Vec<i8>, f32) {
    let t = Tiles::RK3588;
    let w = ExpertWeights {
        ty,
        data: row,
        row_stride: row.len(),
        n: 1,
        k,
    };
    let mut b = vec![99i8; t.b_len(t.pad(k), 32)];
    let mut s = vec![9f32; 32];
    inflate_expert_with(Isa::Scalar, &w, &t, &mut b, &mut s).unwrap();
    assert!(
        s[1..].iter().all(|&x| x == 0.0),
        "padding channels have scale 0"
    );
    let kp = t.pad(k);
    assert!(
        (1..32).all(|n| (0..kp).all(|c| b[t.b_index(kp, n, c)] == 0)),
        "padding channels are zero"
    );
    ((0..k).map(|c| b[t.b_index(kp, 0, c)]).collect(), s[0])
}

#[test]
fn q4_0_block_maps_codes_through_its_table() {
    // Two blocks: d = 1 (the row maximum) and d = -0.5.
    let mut row = Vec::new();
    for d in [1.0f32, -0.5] {
        row.extend(f32_to_f16(d).to_le_bytes());
        row.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    }
    let (q, s) = inflate_one_row(GgmlType::Q4_0, &row, 64);
    assert_eq!(s, 8.0 / 127.0);
    // Block 0's multiplier is 127/8·2¹¹ = 32512, block 1's -16256: code c maps to c·127/8 and
    // -c·127/16, rounded half up.
    let expect = |c: f64, scale: f64| (c * scale + 0.5).floor() as i8;
    for j in 0..16 {
        let (c0, c1) = (j as f64 - 8.0, 7.0 - j as f64);
        assert_eq!(q[j], expect(c0, 127.0 / 8.0), "code {c0}");
        assert_eq!(q[j + 16], expect(c1, 127.0 / 8.0), "code {c1}");
        assert_eq!(q[32 + j], expect(c0, -127.0 / 16.0), "code {c0}");
    }
    assert_eq!((q[0], q[16]), (-127, 111));
}

#[test]
fn q8_0_maximal_block_is_copied_exactly() {
    let mut row = Vec::new();
    for d in [0.25f32, 0.125] {
        row.extend(f32_to_f16(d).to_le_bytes());
        row.extend((0..32).map(|j| (j as i8 * 8 - 127) as u8));
    }
    let (q, s) = inflate_one_row(GgmlType::Q8_0, &row, 64);
    assert_eq!(s, 0.25);
    for j in 0..32 {
        let orig = j as i32 * 8 - 127;
        assert_eq!(q[j] as i32, orig);
        // Half the scale: orig/2 rounded half up.
        assert_eq!(q[32 + j] as i32, (orig + 1).div_euclid(2));
    }
}

#[test]
fn zero_row_gives_zero_scale_and_weights_and_nan_is_an_error() {
    for ty in GgmlType::QUANTIZED {
        let k = ty.block_elems();
        let row = vec![0u8; ty.row_bytes(k).unwrap()];
        let (q, s) = inflate_one_row(ty, &row, k);
        assert_eq!(s, 0.0, "{ty:?}");
        assert!(q.iter().all(|&x| x == 0), "{ty:?}");

        let mut bad = vec![0u8; ty.row_bytes(2 * k).unwrap()];
        let at = ty.block_bytes() + crate::testutil::half_offsets(ty)[0];
        bad[at..at + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
        let w = ExpertWeights {
            ty,
            data: &bad,
            row_stride: bad.len(),
            n: 1,
            k: 2 * k,
        };
        let t = Tiles::RK3588;
        let mut b = vec![0i8; t.b_len(t.pad(2 * k), 32)];
        let mut s = vec![0f32; 32];
        assert_eq!(
            inflate_expert_with(Isa::Scalar, &w, &t, &mut b, &mut s),
            Err(InflateError::NonFiniteScale { row: 0, block: 1 }),
            "{ty:?}"
        );
    }
}

/// Found by fuzzing (fuzz/ decode): K = 0 divided by a zero tile depth.
#[test]
fn zero_depth_gives_zero_scales_on_every_path() {
    let t = Tiles::RK3588;
    for isa in Isa::available() {
        for ty in GgmlType::QUANTIZED {
            let w = ExpertWeights {
                ty,
                data: &[],
                row_stride: 0,
                n: 3,
                k: 0,
            };
            let mut s = vec![9f32; 32];
            inflate_expert_with(isa, &w, &t, &mut [], &mut s).unwrap();
            assert!(s.iter().all(|&x| x == 0.0), "{isa:?} {ty:?}");
        }
    }
}

#[test]
fn dequantize_column_is_the_column_of_dequantize_row() {
    let (k, n) = (512, 5);
    for ty in GgmlType::QUANTIZED {
        let rb = ty.row_bytes(k).unwrap();
        let data = crate::testutil::Rng::new(6).blocks(ty, n * k / ty.block_elems(), 0.05);
        let w = ExpertWeights {
            ty,
            data: &data,
            row_stride: rb,
            n,
            k,
        };
        let mut rows = vec![0f32; n * k];
        for (r, out) in rows.chunks_exact_mut(k).enumerate() {
            crate::quant::dequantize_row(ty, &data[r * rb..(r + 1) * rb], out).unwrap();
        }
        let mut col = vec![0f32; n];
        for c in [0, 31, 300, 511] {
            w.dequantize_column(c, &mut col).unwrap();
            for r in 0..n {
                assert_eq!(
                    col[r].to_bits(),
                    rows[r * k + c].to_bits(),
                    "{} ({r},{c})",
                    ty.name()
                );
            }
        }
        assert!(w.dequantize_column(k, &mut col).is_err());
        let short = ExpertWeights {
            data: &data[..data.len() - 1],
            ..w
        };
        assert!(short.dequantize_column(0, &mut col).is_err());
    }
}

#[test]
fn dequantize_columns_are_the_single_columns() {
    // 37 rows: not whole blocks of 16 rows; a row stride beyond the row's bytes.
    let (k, n) = (512, 37);
    let channels = [0usize, 5, 31, 32, 300, 301, 511];
    for ty in GgmlType::QUANTIZED {
        let rb = ty.row_bytes(k).unwrap();
        let stride = rb + ty.block_bytes();
        let data = crate::testutil::Rng::new(11).blocks(ty, n * stride / ty.block_bytes(), 0.05);
        let w = ExpertWeights {
            ty,
            data: &data,
            row_stride: stride,
            n,
            k,
        };
        let mut cols = vec![0f32; channels.len() * n];
        w.dequantize_columns(&channels, &mut cols).unwrap();
        let mut col = vec![0f32; n];
        for (i, &c) in channels.iter().enumerate() {
            w.dequantize_column(c, &mut col).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&cols[i * n..(i + 1) * n]), bits(&col), "{ty:?} {c}");
        }
        assert!(w.dequantize_columns(&[k], &mut cols).is_err());
        let short = ExpertWeights {
            data: &data[..(n - 1) * stride + rb - 1],
            ..w
        };
        assert!(short.dequantize_columns(&channels, &mut cols).is_err());
    }
}
