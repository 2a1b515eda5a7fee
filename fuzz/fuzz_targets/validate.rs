//! Descriptor validation on fuzz-built descriptors (types, shapes, strides and data addresses
//! inside a small real buffer, NULL, or near the top of the address space):
//! - `moe::desc::validate` and `ork_mul_mat_id_check` never panic and agree, and so do the dense
//!   entry `ork_mul_mat_check` on `as`, `b`, `dst` and `dense_as_mul_mat_id` then `validate`;
//! - an accepted problem's extents are the descriptors' true extents, its `dst` elements are
//!   distinct and share no byte with an input, its weight and activation rows are distinct;
//! - "outputs overlap" and "dst overlaps" (INVALID_ARGUMENT) are true, by brute force.
#![no_main]

mod common;

use common::{cross_overlap, runs, self_overlap, Bytes};
use libfuzzer_sys::fuzz_target;
use ork_moe::ffi::*;
use ork_moe::moe::desc::{dense_as_mul_mat_id, validate, weight_format, Problem, TensorDesc};
use ork_moe::moe::{Error, ErrorKind};
use std::sync::OnceLock;

/// Brute force only below this many runs.
const LIMIT: usize = 1 << 12;

fn ctx() -> *mut ork_ctx {
    static CTX: OnceLock<usize> = OnceLock::new();
    *CTX.get_or_init(|| {
        // SAFETY: all zeroes is an ork_config (integers, floats and NULL strings).
        let mut cfg: ork_config = unsafe { std::mem::zeroed() };
        cfg.struct_size = size_of::<ork_config>() as u32;
        ork_config_default(&mut cfg);
        cfg.backend = ORK_BACKEND_EMU;
        cfg.min_rows = 0;
        // Every call the check takes runs (no ggml here to time the other path).
        cfg.dispatch = ORK_DISPATCH_ALWAYS;
        ork_ctx_new(&cfg) as usize
    }) as *mut ork_ctx
}

fn dim(b: &mut Bytes) -> i64 {
    match b.below(16) {
        0 => [0, -1, i64::MAX, 1 << 40, 1 << 20][b.below(5)],
        1..=3 => 1,
        4 => 32 * (1 + b.below(16)) as i64,
        _ => 1 + b.below(9) as i64,
    }
}

fn stride(b: &mut Bytes) -> usize {
    match b.below(8) {
        0 => [0, usize::MAX / 2, 1 << 40, 3][b.below(4)],
        1..=3 => 4 * b.below(64),
        4 => 18 * b.below(64),
        _ => b.below(1 << 12),
    }
}

fuzz_target!(|data: &[u8]| {
    static ARENA: OnceLock<Vec<u8>> = OnceLock::new();
    let arena = ARENA.get_or_init(|| vec![0u8; 1 << 16]).as_ptr() as usize;
    let mut b = Bytes::new(data);
    let types = [
        0,
        1,
        2,
        3,
        6,
        8,
        12,
        14,
        20,
        26,
        -1,
        9999,
        ORK_TYPE_Q4_0_8X8,
        ORK_TYPE_Q4_K_8X4,
        ORK_TYPE_Q8_0_4X4,
        2 | 16 << ORK_LAYOUT_ROWS_SHIFT | 1 << ORK_LAYOUT_CHUNK_SHIFT,
    ];
    let mut t: [ork_tensor; 4] = std::array::from_fn(|i| {
        let ty = if b.below(4) == 0 {
            b.pick(&types)
        } else {
            [2, 0, 26, 0][i]
        };
        let ne = [
            dim(&mut b),
            dim(&mut b),
            dim(&mut b),
            if b.below(8) == 0 { 2 } else { 1 },
        ];
        let nb = [
            stride(&mut b),
            stride(&mut b),
            stride(&mut b),
            stride(&mut b),
        ];
        let addr = match b.below(16) {
            0 => 0,
            1 => usize::MAX - b.below(1 << 12),
            _ => arena + b.below(1 << 16),
        };
        ork_tensor {
            r#type: ty,
            ne,
            nb,
            data: addr as *mut std::ffi::c_void,
            name: std::ptr::null(),
        }
    });
    // Mostly consistent shapes, so that validation gets past them.
    if b.below(4) != 0 {
        let [w, bb, ids, dst] = &mut t;
        bb.ne[0] = w.ne[0];
        ids.ne[1] = bb.ne[2];
        dst.ne[..3].copy_from_slice(&[w.ne[1], ids.ne[0], bb.ne[2]]);
        if b.below(2) == 0 {
            bb.ne[1] = 1;
        }
        if b.below(2) == 0 {
            w.nb[0] = weight_format(w.r#type).map_or(18, |(t, _)| t.block_bytes());
            bb.nb[0] = 4;
            dst.nb[0] = 4;
        }
    }
    let d: [TensorDesc; 4] = t.map(|t| TensorDesc {
        ty: t.r#type,
        ne: t.ne,
        nb: t.nb,
        addr: t.data as usize,
        name: None,
    });
    let code = |v: &Result<Problem, Error>| match v {
        Ok(_) => ORK_OK,
        Err(e) if e.kind == ErrorKind::NotHandled => ORK_NOT_HANDLED,
        Err(e) => {
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
            ORK_INVALID_ARGUMENT
        }
    };
    let v = validate(&d[0], &d[1], &d[2], &d[3]);
    let rc = ork_mul_mat_id_check(ctx(), &t[0], &t[1], &t[2], &t[3]);
    assert_eq!(rc, code(&v), "{v:?}");
    let dense = dense_as_mul_mat_id(&d[0], &d[1], &d[3])
        .and_then(|[w, b, ids, dst]| validate(&w, &b, &ids, &dst));
    let rc = ork_mul_mat_check(ctx(), &t[0], &t[1], &t[3]);
    assert_eq!(rc, code(&dense), "dense: {dense:?}");

    let ne = |i: usize, j: usize| d[i].ne[j] as usize;
    let used = |i: usize, j: usize| if ne(i, j) > 1 { d[i].nb[j] } else { 0 };
    let dst_dims = |nb0: usize| {
        [
            (ne(3, 0), nb0),
            (ne(3, 1), used(3, 1)),
            (ne(3, 2), used(3, 2)),
        ]
    };
    match &v {
        Ok(p) => {
            let row = p.w_row_bytes;
            let lattices = [
                (
                    row,
                    vec![(p.n, used(0, 1)), (p.n_expert, used(0, 2))],
                    p.w_extent,
                ),
                (
                    4 * p.k,
                    vec![(p.b_rows, used(1, 1)), (p.n_tokens, used(1, 2))],
                    p.b_extent,
                ),
                (
                    4,
                    vec![(p.n_used, used(2, 0)), (p.n_tokens, used(2, 1))],
                    p.ids_extent,
                ),
                (4, dst_dims(4).to_vec(), p.dst_extent),
            ];
            let true_extent = |(inner, dims, _): &(usize, Vec<(usize, usize)>, usize)| {
                inner + dims.iter().map(|&(c, s)| (c - 1) * s).sum::<usize>()
            };
            for l in &lattices {
                assert_eq!(true_extent(l), l.2, "{p:?}");
            }
            let r: Vec<_> = lattices
                .iter()
                .map(|(i, dims, _)| runs(*i, dims, LIMIT))
                .collect();
            if let (Some(w), Some(b)) = (&r[0], &r[1]) {
                assert!(!self_overlap(w) && !self_overlap(b), "{p:?}");
            }
            if let Some(dst) = &r[3] {
                assert!(!self_overlap(dst), "dst elements overlap: {p:?}");
                for (i, input) in r[..3].iter().enumerate() {
                    if let Some(input) = input {
                        assert!(
                            !cross_overlap(d[3].addr, dst, d[i].addr, input),
                            "{i}: {p:?}"
                        );
                    }
                }
            }
        }
        Err(e) if e.message().contains("make outputs overlap") => {
            if let Some(r) = runs(4, &dst_dims(d[3].nb[0]), LIMIT) {
                assert!(self_overlap(&r), "{e}: no two outputs share an element");
            }
        }
        Err(e) if e.message().starts_with("dst overlaps") => {
            let i = ["as", "b", "ids"]
                .iter()
                .position(|w| e.message().ends_with(w))
                .unwrap();
            let (wt, _) = weight_format(d[0].ty).unwrap();
            let input = match i {
                0 => (
                    ne(0, 0) / wt.block_elems() * wt.block_bytes(),
                    [(ne(0, 1), used(0, 1)), (ne(0, 2), used(0, 2))],
                ),
                1 => (
                    4 * ne(1, 0),
                    [(ne(1, 1), used(1, 1)), (ne(1, 2), used(1, 2))],
                ),
                _ => (4, [(ne(2, 0), used(2, 0)), (ne(2, 1), used(2, 1))]),
            };
            let (Some(dst), Some(inp)) =
                (runs(4, &dst_dims(4), LIMIT), runs(input.0, &input.1, LIMIT))
            else {
                return;
            };
            assert!(
                cross_overlap(d[3].addr, &dst, d[i].addr, &inp),
                "{e}: no shared byte"
            );
        }
        Err(_) => {}
    }
});
