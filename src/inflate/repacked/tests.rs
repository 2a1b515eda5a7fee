//! The layout descriptions and the scale transforms; the comparisons with ggml's own repack and
//! across kernel paths live in `tests/inflate_repacked.rs`.

use super::super::params::q4k_scales_mins;
use super::kscales::q4k_pack;
use super::*;
use crate::testutil::Rng;

#[test]
fn fields_cover_each_block_and_multi_block_exactly_once() {
    for (ty, layout) in Layout::REPACKED {
        let Layout::Repacked { rows, chunk } = layout else {
            unreachable!()
        };
        let bb = ty.block_bytes();
        let (mut plain, mut packed) = (vec![0u8; bb], vec![0u8; rows * bb]);
        for field in fields(ty, rows, chunk) {
            let (p, q, len) = match field {
                Field::Interleaved {
                    plain, packed, len, ..
                } => (plain, packed, len),
                Field::Q4KScales { plain, packed } => (plain, packed, K_SCALE_SIZE),
            };
            plain[p..p + len].iter_mut().for_each(|b| *b += 1);
            packed[q..q + rows * len].iter_mut().for_each(|b| *b += 1);
        }
        let name = layout.name(ty);
        assert!(plain.iter().all(|&b| b == 1), "{name}: plain {plain:?}");
        assert!(packed.iter().all(|&b| b == 1), "{name}: packed");
    }
}

#[test]
fn q4k_pack_inverts_the_unpacking() {
    let mut rng = Rng::new(11);
    for _ in 0..1000 {
        let mut packed = [0u8; K_SCALE_SIZE];
        rng.fill_bytes(&mut packed);
        let (scales, mins) = q4k_scales_mins(&packed);
        assert_eq!(q4k_pack(scales, mins), packed);
    }
}

#[test]
fn q4k_scale_transpose_moves_pairs_and_is_its_own_inverse() {
    let mut rng = Rng::new(12);
    for _ in 0..100 {
        let mut rows = [[0u8; K_SCALE_SIZE]; 8];
        rows.iter_mut().for_each(|r| rng.fill_bytes(r));
        let groups = transpose_q4k_scales(rows.each_ref());
        for (s, group) in groups.iter().enumerate() {
            let (sc, mn) = q4k_scales_mins(group);
            for (j, row) in rows.iter().enumerate() {
                let (row_sc, row_mn) = q4k_scales_mins(row);
                assert_eq!(
                    (sc[j], mn[j]),
                    (row_sc[s], row_mn[s]),
                    "sub-block {s} row {j}"
                );
            }
        }
        assert_eq!(transpose_q4k_scales(groups.each_ref()), rows);
    }
}

#[test]
fn every_layout_round_trips_on_every_path() {
    let mut rng = Rng::new(13);
    for (ty, layout) in Layout::REPACKED {
        let (n, k) = (2 * layout.rows(), 3 * ty.block_elems());
        let plain = rng.blocks(ty, n * k / ty.block_elems(), 0.05);
        let w = ExpertWeights {
            ty,
            data: &plain,
            row_stride: ty.row_bytes(k).unwrap(),
            n,
            k,
        };
        let mut packed = vec![0u8; plain.len()];
        from_plain(layout, &w, &mut packed).unwrap();
        assert_ne!(packed, plain, "{}", layout.name(ty));
        for isa in Isa::available() {
            let mut back = vec![0u8; plain.len()];
            to_plain_with(
                isa,
                layout,
                &ExpertWeights { data: &packed, ..w },
                &mut back,
            )
            .unwrap();
            assert_eq!(back, plain, "{} {isa:?}", layout.name(ty));
        }
    }
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[test]
fn the_simd_q4k_scale_transpose_is_the_references() {
    #[cfg(target_arch = "aarch64")]
    type Simd = neon::Neon;
    #[cfg(target_arch = "x86_64")]
    type Simd = x86::Sse2;
    let mut rng = Rng::new(14);
    for row_bytes in [K_SCALE_SIZE, 13, 144, 432] {
        for _ in 0..200 {
            let mut packings = [0u8; 8 * K_SCALE_SIZE];
            rng.fill_bytes(&mut packings);
            let (mut want, mut got) = (vec![0xa5u8; 8 * row_bytes], vec![0xa5u8; 8 * row_bytes]);
            <Scalar as Chunks>::q4k_scales(&packings, &mut want, row_bytes);
            <Simd as Chunks>::q4k_scales(&packings, &mut got, row_bytes);
            assert_eq!(got, want, "row bytes {row_bytes}");
        }
    }
}
