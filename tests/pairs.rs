//! Pairs (`ork_mul_mat_id_pair`) that ggml does not make but a caller may: one tensor as both
//! projections, and projections whose rows lie at different strides. Each gives the bits of its
//! two single calls, also when the weights at the same address change between calls (the
//! expert cache must see it).
mod mmid;

use mmid::*;
use ork_moe::ffi::*;
use ork_moe::quant::GgmlType;
use ork_moe::testutil::Rng;

const TY: GgmlType = GgmlType::Q4_0;
const SHAPE: [usize; 6] = [256, 64, 4, 2, 8, 1];

fn pair(ctx: *mut ork_ctx, [w0, w1, b, ids, d0, d1]: [Tensor; 6]) -> ork_result {
    let [w0, w1, b, ids, d0, d1] = [w0, w1, b, ids, d0, d1].map(|t| t.c());
    ork_mul_mat_id_pair(ctx, &w0, &w1, &b, &ids, &d0, &d1)
}

#[test]
fn one_tensor_as_both_projections_is_not_served_stale() {
    let ctx = context(ORK_BACKEND_EMU, 0, ORK_MIN_ROWS_DECLINE, ORK_MT_COOP);
    let rng = &mut Rng::new(1);
    let mut c = Owned::contiguous(TY, SHAPE, rng);
    let mut up_dst = Arena::new(c.dst.bytes().len());
    let d1 = Tensor {
        addr: up_dst.addr(),
        ..c.d.dst
    };
    for round in 0..3 {
        if round > 0 {
            // New weights at the same address.
            let fresh = Owned::contiguous(TY, SHAPE, rng);
            c.w.bytes_mut().copy_from_slice(fresh.w.bytes());
        }
        let want = expected(&c.d, &c.memory());
        c.dst.bytes_mut().fill(SENTINEL);
        up_dst.bytes_mut().fill(SENTINEL);
        let d = c.d;
        let rc = pair(ctx, [d.w, d.w, d.b, d.ids, d.dst, d1]);
        assert_eq!(rc, ORK_OK, "{}", last_error());
        check_dst(&c.dst, d.dst.addr, &want).unwrap_or_else(|e| panic!("round {round}: {e}"));
        check_dst(&up_dst, d1.addr, &want).unwrap_or_else(|e| panic!("round {round}: {e}"));
    }
    ork_ctx_free(ctx);
}

#[test]
fn projections_with_other_row_strides_give_their_single_calls_bits() {
    let ctx = context(ORK_BACKEND_EMU, 0, ORK_MIN_ROWS_DECLINE, ORK_MT_COOP);
    let rng = &mut Rng::new(2);
    let mut gate = Owned::contiguous(TY, SHAPE, rng);
    let plain = Owned::contiguous(TY, SHAPE, rng);
    let [_, n, n_expert, ..] = SHAPE;
    // The up projection's rows 32 bytes apart beyond their length, the gaps junk.
    let row = gate.d.w.nb[1];
    let padded = row + 32;
    let mut up_w = Arena::new(padded * n * n_expert);
    up_w.bytes_mut().fill(0xFF);
    for r in 0..n * n_expert {
        let src = &plain.w.bytes()[r * row..(r + 1) * row];
        up_w.bytes_mut()[r * padded..r * padded + row].copy_from_slice(src);
    }
    let mut up_dst = Arena::new(gate.dst.bytes().len());
    let up = Descs {
        w: Tensor {
            nb: [gate.d.w.nb[0], padded, padded * n, padded * n * n_expert],
            addr: up_w.addr(),
            ..gate.d.w
        },
        dst: Tensor {
            addr: up_dst.addr(),
            ..gate.d.dst
        },
        ..gate.d
    };
    let want_up = expected(
        &up,
        &Memory {
            w: &up_w,
            ..gate.memory()
        },
    );
    let want_gate = expected(&gate.d, &gate.memory());
    gate.dst.bytes_mut().fill(SENTINEL);
    up_dst.bytes_mut().fill(SENTINEL);
    let g = gate.d;
    let rc = pair(ctx, [g.w, up.w, g.b, g.ids, g.dst, up.dst]);
    assert_eq!(rc, ORK_OK, "{}", last_error());
    check_dst(&gate.dst, g.dst.addr, &want_gate).unwrap();
    check_dst(&up_dst, up.dst.addr, &want_up).unwrap();
    ork_ctx_free(ctx);
}
