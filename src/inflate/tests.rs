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

/// Every type the inflate takes.
fn inflatable() -> impl Iterator<Item = GgmlType> {
    GgmlType::QUANTIZED.into_iter()
}

#[test]
fn zero_row_gives_zero_weights_and_nan_is_an_error() {
    for ty in inflatable() {
        let k = ty.block_elems();
        let row = vec![0u8; ty.row_bytes(k).unwrap()];
        let (q, s) = inflate_one_row(ty, &row, k);
        // MXFP4 has no zero scale: its smallest, 2^-128, gives s_n = 2^-131.
        let zero_scale = if ty == GgmlType::MXFP4 {
            2f32.powi(-131)
        } else {
            0.0
        };
        assert_eq!(s, zero_scale, "{ty:?}");
        assert!(q.iter().all(|&x| x == 0), "{ty:?}");

        let mut bad = vec![0u8; ty.row_bytes(2 * k).unwrap()];
        let second = &mut bad[ty.block_bytes()..];
        match ty {
            GgmlType::IQ1_M => crate::testutil::set_iq1m_scale(second, 0x7e00),
            GgmlType::MXFP4 => second[0] = crate::quant::MXFP4_E8M0_FINITE_MAX + 1,
            _ => {
                let at = crate::testutil::half_offsets(ty)[0];
                second[at..at + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
            }
        }
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

#[test]
fn mxfp4_codes_are_exact_within_three_binades_of_the_row_maximum() {
    // Blocks at 2^-1, 2^-2, 2^-4, 2^-5 (E8M0 127, 126, 124, 123), every code in each.
    let mut row = Vec::new();
    for e in [127u8, 126, 124, 123] {
        row.push(e);
        row.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    }
    let (q, s) = inflate_one_row(GgmlType::MXFP4, &row, 128);
    assert_eq!(s, 0.5 / 8.0);
    let kv = crate::quant::grids::KVALUES_MXFP4;
    for j in 0..16 {
        let (lo, hi) = (kv[j] as i32, kv[15 - j] as i32);
        assert_eq!(
            (q[j] as i32, q[j + 16] as i32),
            (8 * lo, 8 * hi),
            "code {j}"
        );
        assert_eq!(q[32 + j] as i32, 4 * lo, "code {j}");
        assert_eq!(q[64 + j] as i32, lo, "code {j}");
        // Four binades down: half the code, rounded half up (the fixed-point multiply).
        assert_eq!(q[96 + j] as i32, (lo + 1).div_euclid(2), "code {j}");
    }
}

#[test]
fn iq4_nl_maximal_block_keeps_its_codes() {
    let mut row = Vec::new();
    for d in [0.5f32, -0.25] {
        row.extend(f32_to_f16(d).to_le_bytes());
        row.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    }
    let (q, s) = inflate_one_row(GgmlType::IQ4_NL, &row, 64);
    assert_eq!(s, 0.5);
    let kv = crate::quant::grids::KVALUES_IQ4NL;
    for j in 0..16 {
        assert_eq!(q[j], kv[j], "code {j}");
        assert_eq!(q[16 + j], kv[15 - j], "code {j}");
        // Half the scale, negative: -kv/2 rounded half up.
        assert_eq!(
            q[32 + j] as i32,
            (-(kv[j] as i32) + 1).div_euclid(2),
            "code {j}"
        );
    }
}

#[test]
fn iq2_xxs_codes_scale_to_the_int8_range() {
    // One super-block, d = 1. Sub-block 0 at the largest scale (15), no signs, groups on grid
    // entries 1 (magnitudes 43, 8, ..., 8), 2 (25, 25, 8, ..., 8), 0, 0 (all 8); sub-block 1
    // the same at scale 7 with every sign set.
    let mut blk = [0u8; 66];
    blk[..2].copy_from_slice(&f32_to_f16(1.0).to_le_bytes());
    assert_eq!(crate::quant::grids::IQ2XXS_GRID[1], 0x0808_0808_0808_082b);
    assert_eq!(crate::quant::grids::IQ2XXS_GRID[2], 0x0808_0808_0808_1919);
    blk[2..6].copy_from_slice(&[1, 2, 0, 0]);
    blk[6..10].copy_from_slice(&(15u32 << 28).to_le_bytes());
    blk[10..14].copy_from_slice(&[1, 2, 0, 0]);
    // Sign index 127 in each group (the eighth sign is the parity: all eight set).
    blk[14..18].copy_from_slice(&((7u32 << 28) | 0x0fff_ffff).to_le_bytes());
    let (q, s) = inflate_one_row(GgmlType::IQ2_XXS, &blk, 256);
    // E_n = 1·15.5/4, s_n = 43·E_n/127; the largest code maps to 127.
    assert_eq!(s, 43.0 * 3.875 / 127.0);
    // m = rne(32260.2) = 32260 and (3c·m + 2^14) >> 15: 127, 74, 24 for c = 43, 25, 8.
    assert_eq!(
        q[..16],
        [127, 24, 24, 24, 24, 24, 24, 24, 74, 74, 24, 24, 24, 24, 24, 24]
    );
    assert!(q[16..32].iter().all(|&x| x == 24));
    // Scale 7.5/15.5: m = rne(32260.2·7.5/15.5) = 15610, every code negative.
    let expect = |c: i32| ((3 * -c * 15610 + (1 << 14)) >> 15) as i8;
    assert_eq!(q[32..40], [43, 8, 8, 8, 8, 8, 8, 8].map(expect));
    assert_eq!(q[40..48], [25, 25, 8, 8, 8, 8, 8, 8].map(expect));
}

#[test]
fn mxfp4_takes_every_e8m0_whose_weights_ggml_keeps_finite() {
    // Codes -12 (low nibbles 0xf) and 12 (high nibbles 0x7) at E8M0 252: ∓1.5·2^127, the
    // largest finite MXFP4 weights.
    let top = crate::quant::MXFP4_E8M0_FINITE_MAX;
    let mut row = vec![top];
    row.extend([0x7fu8; 16]);
    let (q, s) = inflate_one_row(GgmlType::MXFP4, &row, 32);
    assert_eq!(s as f64, 2f64.powi(top as i32 - 128) / 8.0);
    assert!(q[..16].iter().all(|&x| x == -96) && q[16..32].iter().all(|&x| x == 96));
}
