//! Block decoding and inflate of arbitrary bytes:
//! - `quant::dequantize_row` never panics, and accepts exactly a whole row of blocks;
//! - `inflate::inflate_expert_with` gives the same bits (weights and channel scales) or the same
//!   error on every kernel path this CPU has as on the scalar reference;
//! - a block ggml dequantizes to a non-finite value (for MXFP4, one whose E8M0 byte can give
//!   one) makes `NonFiniteScale` name the first row that has one and one of its bad blocks; otherwise every weight is within its bound of ggml's value
//!   (`|w - s_n·q8| <= s_n·(1 + 2⁻⁷)`, docs/ACCURACY.md).
#![no_main]

mod common;

use common::Bytes;
use libfuzzer_sys::fuzz_target;
use ork_moe::inflate::{inflate_expert_with, ExpertWeights, InflateError};
use ork_moe::isa::Isa;
use ork_moe::layout::Tiles;
use ork_moe::quant::{dequantize_row, GgmlType, MXFP4_E8M0_FINITE_MAX};

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes::new(data);
    let all = [GgmlType::F32, GgmlType::F16];
    let ty = if b.below(8) == 0 {
        b.pick(&all)
    } else {
        b.pick(&GgmlType::QUANTIZED)
    };
    let be = ty.block_elems();
    let k = if b.below(8) == 0 {
        b.below(600)
    } else {
        be * (1 + b.below(if be == 1 { 64 } else { 1024 / be }))
    };
    let n = 1 + b.below(40);
    let row_bytes = ty.row_bytes(k);
    let stride = match (row_bytes, b.below(4)) {
        (Some(r), 0) => r + b.below(64),
        (Some(r), 1) => r.saturating_sub(b.below(4)),
        (Some(r), _) => r,
        (None, _) => b.below(256),
    };
    let len = match b.below(8) {
        0 => b.below(1 << 14),
        _ => (n - 1) * stride + row_bytes.unwrap_or(0),
    };
    let bytes = b.take(len);

    // Dequantize: Ok exactly for a whole row.
    let mut row = vec![0f32; k];
    let one_row = row_bytes.map_or(0, |r| r.min(bytes.len()));
    let r = dequantize_row(ty, &bytes[..one_row], &mut row);
    assert_eq!(r.is_ok(), row_bytes == Some(one_row), "{ty:?} k={k} {r:?}");

    if !GgmlType::QUANTIZED.contains(&ty) {
        return;
    }
    let tiles = Tiles::RK3588;
    let (kp, np) = (tiles.pad(k), tiles.pad(n));
    let short = b.below(16) == 0 && kp > 0;
    let b_len = tiles.b_len(kp, np) - short as usize;
    let w = ExpertWeights {
        ty,
        data: &bytes,
        row_stride: stride,
        n,
        k,
    };
    let run = |isa: Isa| {
        let (mut b8, mut chan) = (vec![0x55i8; b_len], vec![f32::NAN; np]);
        let r = inflate_expert_with(isa, &w, &tiles, &mut b8, &mut chan);
        (
            r,
            b8,
            chan.iter().map(|c| c.to_bits()).collect::<Vec<u32>>(),
        )
    };
    let (reference, b8, chan) = run(Isa::Scalar);
    for isa in Isa::available() {
        let (r, b8_isa, chan_isa) = run(isa);
        assert_eq!(r, reference, "{isa:?}");
        if r.is_ok() {
            assert!(
                b8_isa == b8 && chan_isa == chan,
                "{isa:?} differs from scalar ({ty:?} k={k} n={n})"
            );
        }
    }
    let Some(row_bytes) = row_bytes else {
        assert!(
            matches!(reference, Err(InflateError::Quant(_))),
            "{reference:?}"
        );
        return;
    };
    if short || (n > 1 && stride < row_bytes) || bytes.len() < (n - 1) * stride + row_bytes {
        assert!(
            reference.is_err(),
            "accepted a bad shape: {ty:?} k={k} n={n} stride={stride} len={}",
            bytes.len()
        );
        return;
    }
    // A block is bad when ggml dequantizes it to a non-finite value: a NaN or infinite fp16
    // scale (IQ1_M's nibble-assembled one included) does so whatever the codes (inf · 0 is NaN).
    // An MXFP4 block is bad by its E8M0 byte alone, above MXFP4_E8M0_FINITE_MAX, where only
    // its larger codes overflow; every other block is finite.
    let (bb, be) = (ty.block_bytes(), ty.block_elems());
    let bad_blocks = |r: usize| -> Vec<usize> {
        let row = &bytes[r * stride..r * stride + row_bytes];
        let mut block = vec![0f32; be];
        (0..row_bytes / bb)
            .filter(|&i| {
                let raw = &row[i * bb..(i + 1) * bb];
                dequantize_row(ty, raw, &mut block).unwrap();
                let non_finite = block.iter().any(|w| !w.is_finite());
                if ty == GgmlType::MXFP4 {
                    let above = raw[0] > MXFP4_E8M0_FINITE_MAX;
                    assert!(above || !non_finite, "E8M0 {} overflows", raw[0]);
                    return above;
                }
                non_finite
            })
            .collect()
    };
    if let Some(first) = (0..n).find(|&r| !bad_blocks(r).is_empty()) {
        match reference {
            Err(InflateError::NonFiniteScale { row, block }) => {
                assert_eq!(row, first);
                assert!(
                    bad_blocks(row).contains(&block),
                    "block {block} of row {row} is finite"
                );
            }
            other => panic!("NaN/Inf scale in row {first}: {other:?}"),
        }
        return;
    }
    reference.expect("finite scales inflate");
    let mut wf = vec![0f32; k];
    for r in 0..n {
        dequantize_row(ty, &bytes[r * stride..r * stride + row_bytes], &mut wf).unwrap();
        let s = f32::from_bits(chan[r]) as f64;
        for (i, &x) in wf.iter().enumerate() {
            let q8 = b8[tiles.b_index(kp, r, i)] as f64;
            let err = (x as f64 - s * q8).abs();
            assert!(
                err <= s * (1.0 + 1.0 / 128.0) * (1.0 + 1e-6),
                "{ty:?} row {r} k {i}: w {x}, s {s}, q8 {q8}"
            );
        }
    }
});
