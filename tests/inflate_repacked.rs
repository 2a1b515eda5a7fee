//! Inflating expert weights from ggml-cpu's repacked layouts gives exactly the plain inflate's
//! native B and channel scales: on vectors made by ggml's own repack code
//! (`tests/data/repack/`, remade by `tools/repack_vectors/make.sh`) for every layout the pinned
//! ggml chooses on x86-64 and aarch64, on every kernel path; and on random experts, every path
//! against the scalar reference.

use ork_moe::inflate::{
    dequantize_columns_in, from_plain, inflate_expert_in_with, inflate_expert_with, to_plain_with,
    ExpertWeights, InflateError, Layout,
};
use ork_moe::isa::Isa;
use ork_moe::layout::Tiles;
use ork_moe::quant::GgmlType;
use ork_moe::testutil::{half_offsets, Rng};
use std::collections::HashMap;

const T: Tiles = Tiles::RK3588;

/// The shapes `repack_vectors` writes: N a multiple of 8 but not of 32, several blocks per row,
/// two experts.
const SHAPES: [&str; 2] = ["k256-n24-e2", "k512-n8-e2"];

/// One vector file: its header's fields and the tensor's bytes.
struct Vectors {
    header: HashMap<String, String>,
    bytes: Vec<u8>,
}

impl Vectors {
    fn read(name: &str) -> Vectors {
        let path = format!("{}/tests/data/repack/{name}", env!("CARGO_MANIFEST_DIR"));
        let file = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let end = file
            .iter()
            .position(|&b| b == b'\n')
            .expect("a header line");
        let line = std::str::from_utf8(&file[..end]).expect("an ASCII header");
        let mut words = line.split_whitespace();
        assert_eq!(
            (words.next(), words.next()),
            (Some("ork-repack-vectors"), Some("1")),
            "{path}"
        );
        let header: HashMap<String, String> = words
            .map(|kv| {
                let (k, v) = kv.split_once('=').expect("key=value");
                (k.to_string(), v.to_string())
            })
            .collect();
        let v = Vectors {
            header,
            bytes: file[end + 1..].to_vec(),
        };
        assert_eq!(v.num("bytes"), v.bytes.len(), "{path}");
        v
    }

    fn num(&self, key: &str) -> usize {
        self.header[key].parse().expect("a number")
    }

    /// Expert `e` (of `experts`), addressed as ggml does: `nb[2]` bytes apart, rows `nb[1]`.
    fn expert(&self, ty: GgmlType, e: usize) -> ExpertWeights<'_> {
        let nb2 = self.num("nb2");
        ExpertWeights {
            ty,
            data: &self.bytes[e * nb2..(e + 1) * nb2],
            row_stride: self.num("nb1"),
            n: self.num("n"),
            k: self.num("k"),
        }
    }
}

/// ggml's plain and repacked bytes of the same tensor.
fn ggml_vectors(ty: GgmlType, layout: Layout, shape: &str) -> (Vectors, Vectors) {
    let plain = Vectors::read(&format!("plain-{}-{shape}.bin", ty.name()));
    let packed = Vectors::read(&format!("{}-{shape}.bin", layout.name(ty)));
    let Layout::Repacked { rows, chunk } = layout else {
        unreachable!()
    };
    assert_eq!(packed.header["layout"], layout.name(ty));
    assert_eq!(
        (packed.num("rows"), packed.num("chunk")),
        (rows, chunk),
        "the file's layout"
    );
    for key in ["type", "k", "n", "experts", "nb1", "nb2", "bytes"] {
        assert_eq!(plain.header[key], packed.header[key], "{key}");
    }
    (plain, packed)
}

struct Inflated {
    b: Vec<i8>,
    scale_bits: Vec<u32>,
}

const SENTINEL: i8 = 0x5a;

fn inflate(
    isa: Isa,
    layout: Layout,
    w: &ExpertWeights,
    tiles: &Tiles,
) -> Result<Inflated, InflateError> {
    let (kp, np) = (tiles.pad(w.k), tiles.pad(w.n));
    let mut b = vec![SENTINEL; tiles.b_len(kp, np) + 64];
    let mut scales = vec![f32::NAN; np + 1];
    inflate_expert_in_with(isa, layout, w, tiles, &mut b, &mut scales)?;
    assert!(
        b[tiles.b_len(kp, np)..].iter().all(|&x| x == SENTINEL),
        "wrote past native B"
    );
    assert!(scales[np].is_nan(), "wrote past the channel scales");
    b.truncate(tiles.b_len(kp, np));
    Ok(Inflated {
        b,
        scale_bits: scales[..np].iter().map(|s| s.to_bits()).collect(),
    })
}

fn assert_same(got: &Inflated, want: &Inflated, what: &str) {
    assert_eq!(got.scale_bits, want.scale_bits, "{what}: channel scales");
    if let Some(i) = (0..want.b.len()).find(|&i| got.b[i] != want.b[i]) {
        panic!(
            "{what}: native B differs first at {i}: {} vs {}",
            got.b[i], want.b[i]
        );
    }
}

#[test]
fn vectors_exist_for_every_layout_ggml_chooses() {
    for (ty, layout) in Layout::REPACKED {
        for shape in SHAPES {
            let (_, packed) = ggml_vectors(ty, layout, shape);
            assert_eq!(packed.num("experts"), 2);
        }
    }
    // And back: every layout ggml chose, for any type the library inflates on any variant, is in
    // the table.
    let dir = format!("{}/tests/data/repack", env!("CARGO_MANIFEST_DIR"));
    let mut repacked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if !name.ends_with(".bin") || name.starts_with("plain-") {
            continue;
        }
        let v = Vectors::read(&name);
        let ty = GgmlType::from_name(&v.header["type"]).expect("a type");
        let layout = Layout::Repacked {
            rows: v.num("rows"),
            chunk: v.num("chunk"),
        };
        assert!(Layout::REPACKED.contains(&(ty, layout)), "{name}");
        repacked += 1;
    }
    assert_eq!(repacked, Layout::REPACKED.len() * SHAPES.len());
}

#[test]
fn ggml_repack_is_the_layout_described() {
    for (ty, layout) in Layout::REPACKED {
        for shape in SHAPES {
            let (plain, packed) = ggml_vectors(ty, layout, shape);
            let what = format!("{} {shape}", layout.name(ty));
            for e in 0..plain.num("experts") {
                let (w_plain, w_packed) = (plain.expert(ty, e), packed.expert(ty, e));
                let mut ours = vec![0u8; w_plain.data.len()];
                from_plain(layout, &w_plain, &mut ours).unwrap();
                assert!(ours == w_packed.data, "{what} expert {e}: from_plain");
                for isa in Isa::available() {
                    let mut back = vec![0u8; w_plain.data.len()];
                    to_plain_with(isa, layout, &w_packed, &mut back).unwrap();
                    assert!(back == w_plain.data, "{what} expert {e} {isa:?}: to_plain");
                }
            }
        }
    }
}

#[test]
fn inflate_from_ggml_repacked_equals_plain_inflate_on_every_path() {
    println!("paths: {:?}", Isa::available());
    for (ty, layout) in Layout::REPACKED {
        for shape in SHAPES {
            let (plain, packed) = ggml_vectors(ty, layout, shape);
            for e in 0..plain.num("experts") {
                let reference = inflate(Isa::Scalar, Layout::Plain, &plain.expert(ty, e), &T)
                    .expect("plain inflate");
                for isa in Isa::available() {
                    let got = inflate(isa, layout, &packed.expert(ty, e), &T).expect("inflate");
                    let what = format!("{} {shape} expert {e} {isa:?}", layout.name(ty));
                    assert_same(&got, &reference, &what);
                }
            }
        }
    }
}

#[test]
fn weight_columns_from_ggml_repacked_equal_the_plain_ones_on_every_path() {
    // The outlier split's f32 weight columns: every column, in an order with runs of one block
    // and repeats, exactly ggml's dequantized values.
    for (ty, layout) in Layout::REPACKED {
        for shape in SHAPES {
            let (plain, packed) = ggml_vectors(ty, layout, shape);
            let (k, n) = (plain.num("k"), plain.num("n"));
            let mut columns: Vec<usize> = (0..k).rev().collect();
            columns.extend([3, 3, 0, k - 1]);
            for e in 0..plain.num("experts") {
                let w = plain.expert(ty, e);
                let mut want = vec![0f32; n * columns.len()];
                for (&c, col) in columns.iter().zip(want.chunks_exact_mut(n)) {
                    w.dequantize_column(c, col).unwrap();
                }
                for isa in Isa::available() {
                    let mut got = vec![f32::NAN; n * columns.len()];
                    dequantize_columns_in(isa, layout, &packed.expert(ty, e), &columns, &mut got)
                        .unwrap();
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    let what = format!("{} {shape} expert {e} {isa:?}", layout.name(ty));
                    assert_eq!(bits(&got), bits(&want), "{what}");
                }
            }
        }
    }
    let (ty, layout) = Layout::REPACKED[0];
    let (_, packed) = ggml_vectors(ty, layout, SHAPES[0]);
    let w = packed.expert(ty, 0);
    let mut out = vec![0f32; w.n];
    assert!(dequantize_columns_in(Isa::Scalar, layout, &w, &[w.k], &mut out).is_err());
    assert!(dequantize_columns_in(Isa::Scalar, layout, &w, &[0, 1], &mut out).is_err());
}

/// `n` rows of `k` weights of random blocks, plain and in `layout`.
fn random_expert(
    ty: GgmlType,
    layout: Layout,
    n: usize,
    k: usize,
    rng: &mut Rng,
) -> (Vec<u8>, Vec<u8>) {
    let plain = rng.blocks(ty, n * k / ty.block_elems(), 0.05);
    let mut packed = vec![0u8; plain.len()];
    from_plain(layout, &plain_weights(ty, &plain, n, k), &mut packed).unwrap();
    (plain, packed)
}

fn plain_weights(ty: GgmlType, data: &[u8], n: usize, k: usize) -> ExpertWeights<'_> {
    ExpertWeights {
        ty,
        data,
        row_stride: ty.row_bytes(k).unwrap(),
        n,
        k,
    }
}

#[test]
fn every_path_matches_scalar_on_random_experts() {
    let mut rng = Rng::new(21);
    for (ty, layout) in Layout::REPACKED {
        // A partial last N-tile, one group; several blocks per row.
        for (n, k) in [
            (40, 3 * ty.block_elems()),
            (layout.rows(), ty.block_elems()),
        ] {
            let (plain, packed) = random_expert(ty, layout, n, k, &mut rng);
            let reference = inflate(
                Isa::Scalar,
                Layout::Plain,
                &plain_weights(ty, &plain, n, k),
                &T,
            )
            .unwrap();
            for isa in Isa::available() {
                let got = inflate(isa, layout, &plain_weights(ty, &packed, n, k), &T).unwrap();
                assert_same(
                    &got,
                    &reference,
                    &format!("{} n={n} {isa:?}", layout.name(ty)),
                );
            }
        }
    }
}

#[test]
fn wider_tiles_inflate_like_plain() {
    let mut rng = Rng::new(22);
    let wide = Tiles {
        b_n: 64,
        align: 64,
        ..T
    };
    for (ty, layout) in Layout::REPACKED {
        let (n, k) = (9 * layout.rows(), 2 * ty.block_elems());
        let (plain, packed) = random_expert(ty, layout, n, k, &mut rng);
        let reference = inflate(
            Isa::Scalar,
            Layout::Plain,
            &plain_weights(ty, &plain, n, k),
            &wide,
        )
        .unwrap();
        for isa in Isa::available() {
            let got = inflate(isa, layout, &plain_weights(ty, &packed, n, k), &wide).unwrap();
            assert_same(
                &got,
                &reference,
                &format!("{} b_n=64 {isa:?}", layout.name(ty)),
            );
        }
    }
}

#[test]
fn a_bad_scale_is_reported_at_its_plain_row_and_block() {
    let mut rng = Rng::new(23);
    for (ty, layout) in Layout::REPACKED {
        let (n, k) = (2 * layout.rows(), 3 * ty.block_elems());
        let mut plain = rng.blocks(ty, n * k / ty.block_elems(), 0.05);
        let (row, block) = (layout.rows() + 1, 2);
        let at = row * ty.row_bytes(k).unwrap() + block * ty.block_bytes();
        match half_offsets(ty).first() {
            Some(h) => plain[at + h..at + h + 2].copy_from_slice(&0x7c00u16.to_le_bytes()), // +inf
            None => plain[at] = 0xff, // MXFP4's E8M0 NaN
        }
        let mut packed = vec![0u8; plain.len()];
        from_plain(layout, &plain_weights(ty, &plain, n, k), &mut packed).unwrap();
        let want = inflate_expert_with(
            Isa::Scalar,
            &plain_weights(ty, &plain, n, k),
            &T,
            &mut vec![0; T.b_len(T.pad(k), T.pad(n))],
            &mut vec![0.0; T.pad(n)],
        );
        assert_eq!(want, Err(InflateError::NonFiniteScale { row, block }));
        for isa in Isa::available() {
            let got = inflate(isa, layout, &plain_weights(ty, &packed, n, k), &T).map(|_| ());
            assert_eq!(got, want.clone(), "{} {isa:?}", layout.name(ty));
        }
    }
}

#[test]
fn what_ggml_never_repacks_is_an_error_value() {
    let ty = GgmlType::Q4_0;
    let layout = Layout::Repacked { rows: 8, chunk: 8 };
    let (plain, packed) = random_expert(ty, layout, 16, 64, &mut Rng::new(24));
    let w = plain_weights(ty, &packed, 16, 64);
    let (mut b, mut s) = (vec![0i8; T.b_len(64, 32)], vec![0f32; 32]);
    let mut run = |layout, w: &ExpertWeights, tiles: &Tiles| {
        inflate_expert_in_with(Isa::Scalar, layout, w, tiles, &mut b, &mut s)
    };
    assert_eq!(run(layout, &w, &T), Ok(()));
    assert_eq!(
        run(layout, &ExpertWeights { n: 12, ..w }, &T),
        Err(InflateError::RowsNotWholeGroups { n: 12, rows: 8 })
    );
    for (ty, layout) in [
        (GgmlType::Q4_1, Layout::Repacked { rows: 4, chunk: 4 }),
        (GgmlType::Q5_0, Layout::Repacked { rows: 8, chunk: 8 }),
        (GgmlType::Q4_0, Layout::Repacked { rows: 8, chunk: 4 }),
        (GgmlType::Q6_K, Layout::Repacked { rows: 4, chunk: 8 }),
        (GgmlType::IQ4_NL, Layout::Repacked { rows: 4, chunk: 8 }),
        (GgmlType::MXFP4, Layout::Repacked { rows: 8, chunk: 4 }),
    ] {
        let w = ExpertWeights { ty, ..w };
        assert_eq!(
            run(layout, &w, &T),
            Err(InflateError::UnsupportedLayout { ty, layout })
        );
    }
    assert_eq!(
        run(
            layout,
            &ExpertWeights {
                data: &packed[..500],
                ..w
            },
            &T
        ),
        Err(InflateError::SourceTooShort {
            needed: 16 * 36,
            got: 500
        })
    );
    assert_eq!(
        run(
            layout,
            &ExpertWeights {
                row_stride: 40,
                n: 8,
                ..w
            },
            &T
        ),
        Err(InflateError::RepackedRowsNotPacked {
            row_stride: 40,
            row_bytes: 36
        })
    );
    let narrow = Tiles { b_n: 4, ..T };
    assert_eq!(
        run(layout, &w, &narrow),
        Err(InflateError::UnsupportedTiles(narrow))
    );
    let mut out = vec![0u8; plain.len() - 1];
    assert_eq!(
        to_plain_with(Isa::Scalar, layout, &w, &mut out),
        Err(InflateError::OutputTooShort {
            buffer: "blocks",
            needed: plain.len(),
            got: plain.len() - 1
        })
    );
}
