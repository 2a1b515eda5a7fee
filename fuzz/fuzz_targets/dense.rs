//! Dense matmuls (`ork_mul_mat*`) from fuzz-built descriptors: weight types and layout codes,
//! shapes (batched, empty, negative, past the address space), strides, and data anywhere in a
//! real arena of fuzz bytes (NaN and infinite scales included), NULL, or near the top of the
//! address space:
//! - `ork_mul_mat_check` never panics and gives `dense_as_mul_mat_id` then `validate`'s code;
//! - a call the check takes, whose tensors lie in the arena, runs single or cooperative: it
//!   returns OK or (a bad weight scale) INVALID_ARGUMENT, changes no byte outside `dst`'s
//!   elements, and when OK leaves the arena byte for byte as the routed call of one expert that
//!   every token routes to leaves a copy of it (`ork_mul_mat_id`, checked against an independent
//!   reference by the `call` target).
#![no_main]

mod common;
#[path = "../../tests/mmid/mod.rs"]
mod mmid;

use common::{addr, arena_bytes, code, desc, dim, dst_bytes, stride, Arena, Bytes, ARENA};
use libfuzzer_sys::fuzz_target;
use ork_moe::ffi::*;
use ork_moe::moe::desc::{dense_as_mul_mat_id, validate, weight_format};
use std::sync::OnceLock;

fn ctx() -> *mut ork_ctx {
    static CTX: OnceLock<usize> = OnceLock::new();
    *CTX.get_or_init(|| {
        mmid::context(ORK_BACKEND_EMU, 0, ORK_MIN_ROWS_DECLINE, ORK_MT_COOP) as usize
    }) as *mut ork_ctx
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes::new(data);
    // The entry point a call the check takes runs through: single, or 1 or 2 threads.
    let nth = b.below(3);
    let types = [
        2,
        8,
        12,
        14,
        3,
        6,
        ORK_TYPE_Q4_0_8X8,
        ORK_TYPE_Q8_0_4X4,
        0,
        20,
        -1,
    ];
    let ty = if b.below(4) == 0 {
        b.pick(&types)
    } else {
        b.pick(&types[..2])
    };
    let (block, block_bytes) =
        weight_format(ty).map_or((32, 18), |(g, _)| (g.block_elems(), g.block_bytes()));
    let (k, n, t) = (block * (1 + b.below(2)), 1 + b.below(40), 1 + b.below(12));
    let row = k / block * block_bytes;
    let bytes = arena_bytes(&b.take(64));
    let arena = Arena::new(&bytes);
    let a0 = arena.addr();
    let tensor = |ty: i32, ne: [i64; 4], nb: [usize; 4], addr: usize| ork_tensor {
        r#type: ty,
        ne,
        nb,
        data: addr as *mut std::ffi::c_void,
        name: std::ptr::null(),
    };
    let (ki, ni, ti) = (k as i64, n as i64, t as i64);
    let w = tensor(
        ty,
        [dim(&mut b, ki), dim(&mut b, ni), dim(&mut b, 1), 1],
        [
            stride(&mut b, block_bytes),
            stride(&mut b, row),
            stride(&mut b, row * n),
            0,
        ],
        addr(&mut b, a0),
    );
    let x = tensor(
        0,
        [dim(&mut b, ki), dim(&mut b, ti), dim(&mut b, 1), 1],
        [4, stride(&mut b, 4 * k), stride(&mut b, 4 * k * t), 0],
        addr(&mut b, a0),
    );
    let dst = tensor(
        0,
        [dim(&mut b, ni), dim(&mut b, ti), 1, 1],
        [stride(&mut b, 4), stride(&mut b, 4 * n), 0, 0],
        addr(&mut b, a0),
    );
    let routed = dense_as_mul_mat_id(&desc(&w), &desc(&x), &desc(&dst))
        .and_then(|[w, b, ids, d]| validate(&w, &b, &ids, &d));
    let rc = ork_mul_mat_check(ctx(), &w, &x, &dst);
    assert_eq!(rc, code(&routed), "{routed:?}");
    let Ok(p) = routed else { return };
    let fits = arena.holds(w.data as usize, p.w_extent)
        && arena.holds(x.data as usize, p.b_extent)
        && arena.holds(dst.data as usize, p.dst_extent);
    if !fits {
        return;
    }

    // Runs on the arena, through the single or the cooperative entry point.
    let codes = if nth == 0 {
        vec![ork_mul_mat(ctx(), &w, &x, &dst)]
    } else {
        let [wt, xt, dt] = [w, x, dst].map(|t| mmid::Tensor {
            ty: t.r#type,
            ne: t.ne,
            nb: t.nb,
            addr: t.data as usize,
        });
        mmid::on_threads(ctx(), nth, move |ctx, th| {
            ork_mul_mat_mt(ctx, &wt.c(), &xt.c(), &dt.c(), th)
        })
        .into_iter()
        .map(|(rc, _)| rc)
        .collect()
    };
    let rc = codes[0];
    assert!(
        codes.iter().all(|&c| c == rc),
        "threads disagree: {codes:?}"
    );
    assert!(rc == ORK_OK || rc == ORK_INVALID_ARGUMENT, "{rc}: {p:?}");
    // Nothing outside dst's elements changed.
    let off = dst.data as usize - a0;
    let mut element = vec![false; ARENA];
    for i in dst_bytes(&p) {
        element[off + i] = true;
    }
    let after = arena.bytes();
    if let Some(i) = (0..ARENA).find(|&i| !element[i] && after[i] != bytes[i]) {
        panic!("arena byte {i}, outside dst, changed: {p:?}");
    }
    if rc != ORK_OK {
        return;
    }
    // The routed call of one expert, on a copy of the arena as it was, leaves the same bytes.
    let copy = Arena::new(&bytes);
    let mut ids = mmid::Arena::new(4 * p.n_tokens);
    for i in 0..p.n_tokens {
        ids.put_i32(4 * i, 0);
    }
    let [wr, xr, dr] = [w, x, dst].map(|t| copy.moved(&arena, &t));
    let per_token = |t: ork_tensor| ork_tensor {
        ne: [t.ne[0], 1, t.ne[1], 1],
        nb: [t.nb[0], t.nb[1], t.nb[1], 0],
        ..t
    };
    let (xr, dr) = (per_token(xr), per_token(dr));
    let idr = tensor(26, [1, p.n_tokens as i64, 1, 1], [4, 4, 0, 0], ids.addr());
    let rc = ork_mul_mat_id(ctx(), &wr, &xr, &idr, &dr);
    assert_eq!(rc, ORK_OK, "routed: {}", mmid::last_error());
    assert!(
        copy.bytes() == arena.bytes(),
        "dense and routed differ: {p:?}"
    );
});
