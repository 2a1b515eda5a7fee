//! Every kernel path's columns, in every layout, against the reference: the plain blocks'
//! [`ExpertWeights::dequantize_column`], bit for bit, on random and adversarial weights, column
//! sets and row counts that exercise the strips, the vectors and the tails.

use super::super::{dequantize_columns_in, from_plain, ExpertWeights, InflateError, Layout};
use crate::isa::Isa;
use crate::quant::GgmlType;
use crate::testutil::{half_offsets, Rng};

/// fp16 scales that stress the decode: zeros of both signs, subnormals, the extremes, the
/// infinities, quiet and signalling NaNs of both signs.
const SPECIAL_HALVES: [u16; 16] = [
    0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x83ff, 0x0400, 0x7bff, 0xfbff, 0x3c00, 0x7c00, 0xfc00,
    0x7e00, 0xfe01, 0x7c01, 0x7d55,
];

/// What is written past the columns, to catch a write out of place.
const SENTINEL: f32 = 1234.5;

/// Every layout of `ty` the decoder takes: plain, and each repacked one ggml has.
fn layouts(ty: GgmlType) -> Vec<Layout> {
    std::iter::once(Layout::Plain)
        .chain(
            Layout::REPACKED
                .iter()
                .filter(|(t, _)| *t == ty)
                .map(|&(_, l)| l),
        )
        .collect()
}

/// `n` rows of `k` weights: random bytes, and in `adversarial` experts special fp16 scales in
/// most blocks (all of Q4_K's and Q6_K's sub-block scales are random bytes either way).
fn expert(ty: GgmlType, n: usize, k: usize, adversarial: bool, rng: &mut Rng) -> Vec<u8> {
    let mut data = rng.blocks(ty, n * k / ty.block_elems(), 0.05);
    if adversarial {
        for block in data.chunks_exact_mut(ty.block_bytes()) {
            for &at in half_offsets(ty) {
                if rng.below(4) > 0 {
                    let h = SPECIAL_HALVES[rng.below(SPECIAL_HALVES.len())];
                    block[at..at + 2].copy_from_slice(&h.to_le_bytes());
                }
            }
        }
    }
    data
}

/// Whether `ty`'s weights are sums `fl(c·a) + b` (see [`assert_columns`]).
fn sums(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1)
}

/// Column sets: none, one, the last, all in order, all backwards with repeats, a run inside one
/// block, and random ones (in order and not).
fn column_sets(k: usize, rng: &mut Rng) -> Vec<Vec<usize>> {
    let mut sets = vec![
        vec![],
        vec![rng.below(k)],
        vec![k - 1],
        (0..k).collect(),
        (0..k).rev().chain([3 % k, 3 % k, 0, k - 1]).collect(),
        (5.min(k - 1)..k.min(12)).collect(),
    ];
    for sorted in [true, false] {
        let mut set: Vec<usize> = (0..1 + rng.below(k)).map(|_| rng.below(k)).collect();
        if sorted {
            set.sort_unstable();
            set.dedup();
        }
        sets.push(set);
    }
    sets
}

/// The reference columns, then every path's, from `stored` in `layout`; equal bit for bit, and
/// nothing written past them. Only where Q4_1's or Q5_1's sum meets two NaNs (`d` or the product
/// NaN, and `m`) both must merely be NaN: Rust leaves open which operand's payload such a sum
/// carries, and the compiler's choice differs from loop to loop.
fn assert_columns(
    plain: &ExpertWeights,
    layout: Layout,
    stored: &ExpertWeights,
    columns: &[usize],
    what: &str,
) {
    let n = plain.n;
    let mut want = vec![0f32; columns.len() * n];
    for (&c, col) in columns.iter().zip(want.chunks_exact_mut(n.max(1))) {
        plain.dequantize_column(c, col).unwrap();
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for isa in Isa::available() {
        let mut got = vec![SENTINEL; columns.len() * n + 7];
        dequantize_columns_in(isa, layout, stored, columns, &mut got).unwrap();
        let (got, past) = got.split_at(columns.len() * n);
        let same = |i: usize| {
            got[i].to_bits() == want[i].to_bits()
                || sums(plain.ty) && got[i].is_nan() && want[i].is_nan()
        };
        if let Some(i) = (0..got.len()).find(|&i| !same(i)) {
            panic!(
                "{what} {isa:?}: column {} row {}: {:e} ({:#010x}), want {:e} ({:#010x})",
                columns[i / n],
                i % n,
                got[i],
                got[i].to_bits(),
                want[i],
                want[i].to_bits()
            );
        }
        assert_eq!(
            bits(past),
            bits(&[SENTINEL; 7]),
            "{what} {isa:?}: wrote past"
        );
    }
}

#[test]
fn every_path_and_layout_gives_the_reference_columns() {
    println!("paths: {:?}", Isa::available());
    let mut rng = Rng::new(31);
    for ty in GgmlType::QUANTIZED {
        for layout in layouts(ty) {
            let rows = layout.rows();
            // One group; a strip and a partial vector (x4 layouts: half of one); two strips and
            // a vector; plain blocks also row counts of no whole vector.
            let mut ns = vec![rows, 64 + 4.max(rows), 136];
            if layout == Layout::Plain {
                ns.extend([1, 7, 37, 70]);
            }
            for n in ns {
                for blocks in [1, 3] {
                    let k = blocks * ty.block_elems();
                    for adversarial in [false, true] {
                        let plain = expert(ty, n, k, adversarial, &mut rng);
                        let w = ExpertWeights::contiguous(ty, &plain, k, n).unwrap();
                        let mut stored = vec![0u8; plain.len()];
                        from_plain(layout, &w, &mut stored).unwrap();
                        let s = ExpertWeights { data: &stored, ..w };
                        for columns in column_sets(k, &mut rng) {
                            let what = format!(
                                "{} n={n} k={k} adversarial={adversarial} {} columns",
                                layout.name(ty),
                                columns.len()
                            );
                            assert_columns(&w, layout, &s, &columns, &what);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn plain_rows_with_a_stride_and_an_odd_start_give_the_reference_columns() {
    let mut rng = Rng::new(32);
    for ty in GgmlType::QUANTIZED {
        let (n, k) = (45, 3 * ty.block_elems());
        let row_bytes = ty.row_bytes(k).unwrap();
        // Rows 3 blocks and 5 bytes apart, starting 1 byte into the buffer; the last row ends
        // the buffer.
        let stride = row_bytes + 5;
        let mut data = vec![0u8; 1 + (n - 1) * stride + row_bytes];
        for r in 0..n {
            let row = expert(ty, 1, k, true, &mut rng);
            data[1 + r * stride..][..row_bytes].copy_from_slice(&row);
        }
        let w = ExpertWeights {
            ty,
            data: &data[1..],
            row_stride: stride,
            n,
            k,
        };
        for columns in column_sets(k, &mut rng) {
            let what = format!("{} stride {stride}", ty.name());
            assert_columns(&w, Layout::Plain, &w, &columns, &what);
        }
    }
}

/// The columns of every type against ggml's dequantization of whole rows
/// ([`crate::quant::dequantize_row`]), on the best path: the reference above is one weight at
/// a time, this is the independent check of it.
#[test]
fn columns_are_the_dequantized_rows() {
    let mut rng = Rng::new(34);
    for ty in GgmlType::QUANTIZED {
        let (n, k) = (19, 2 * ty.block_elems());
        for adversarial in [false, true] {
            let data = expert(ty, n, k, adversarial, &mut rng);
            let w = ExpertWeights::contiguous(ty, &data, k, n).unwrap();
            let columns: Vec<usize> = (0..k).collect();
            let mut got = vec![0f32; k * n];
            w.dequantize_columns(&columns, &mut got).unwrap();
            let mut row = vec![0f32; k];
            for (r, bytes) in data.chunks_exact(ty.row_bytes(k).unwrap()).enumerate() {
                crate::quant::dequantize_row(ty, bytes, &mut row).unwrap();
                for (c, &want) in row.iter().enumerate() {
                    let g = got[c * n + r];
                    let same =
                        g.to_bits() == want.to_bits() || sums(ty) && g.is_nan() && want.is_nan();
                    assert!(
                        same,
                        "{} row {r} column {c}: {g:e}, want {want:e}",
                        ty.name()
                    );
                }
            }
        }
    }
}

#[test]
fn bad_calls_are_errors() {
    let ty = GgmlType::Q4_0;
    let layout = Layout::Repacked { rows: 8, chunk: 8 };
    let (n, k) = (16, 64);
    let data = expert(ty, n, k, false, &mut Rng::new(33));
    let w = ExpertWeights::contiguous(ty, &data, k, n).unwrap();
    let mut out = vec![0f32; 2 * n];
    for layout in [Layout::Plain, layout] {
        let column_beyond_k = dequantize_columns_in(Isa::Scalar, layout, &w, &[0, k], &mut out);
        assert!(
            matches!(column_beyond_k, Err(InflateError::Quant(_))),
            "{column_beyond_k:?}"
        );
        assert_eq!(
            dequantize_columns_in(Isa::Scalar, layout, &w, &[0, 1, 2], &mut out),
            Err(InflateError::OutputTooShort {
                buffer: "columns",
                needed: 3 * n,
                got: 2 * n
            })
        );
        let short = ExpertWeights {
            data: &data[..data.len() - 1],
            ..w
        };
        assert!(matches!(
            dequantize_columns_in(Isa::Scalar, layout, &short, &[0], &mut out),
            Err(InflateError::SourceTooShort { .. })
        ));
        let missing = Isa::ALL.into_iter().find(|isa| !isa.is_available());
        if let Some(isa) = missing {
            assert_eq!(
                dequantize_columns_in(isa, layout, &w, &[0], &mut out),
                Err(InflateError::IsaUnavailable(isa))
            );
        }
    }
    let odd = ExpertWeights { n: 12, ..w };
    assert_eq!(
        dequantize_columns_in(Isa::Scalar, layout, &odd, &[0], &mut out),
        Err(InflateError::RowsNotWholeGroups { n: 12, rows: 8 })
    );
    let q4_1 = ExpertWeights {
        ty: GgmlType::Q4_1,
        ..w
    };
    assert!(matches!(
        dequantize_columns_in(Isa::Scalar, layout, &q4_1, &[0], &mut out),
        Err(InflateError::UnsupportedLayout { .. })
    ));
}
