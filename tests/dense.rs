//! Dense matmuls (`ork_mul_mat*`, ggml's MUL_MAT of a weight matrix: a prefill's attention
//! projections): the bits of the routed call with one expert that every token routes to, on the
//! single-caller and the cooperative entry points, and the declines that leave ggml its own
//! path (decode sizes, batched operands, `dense = 0`).
mod mmid;

use mmid::*;
use ork_moe::ffi::*;
use ork_moe::quant::GgmlType;
use ork_moe::testutil::Rng;

fn dense_check(ctx: *mut ork_ctx, [a, b, dst]: &[Tensor; 3]) -> ork_result {
    ork_mul_mat_check(ctx, &a.c(), &b.c(), &dst.c())
}

#[test]
fn a_dense_matmul_has_the_bits_of_one_expert_every_token_routes_to() {
    let ctx = context(ORK_BACKEND_EMU, 8, ORK_MIN_ROWS_DECLINE, ORK_MT_COOP);
    let cases = [
        (GgmlType::Q4_0, [512, 96, 40]),
        (GgmlType::Q4_K, [512, 64, 9]),
        (GgmlType::Q6_K, [256, 40, 130]),
        (GgmlType::Q8_0, [1024, 33, 17]),
        // Qwen3-30B-A3B's widest projection (q: N = 32 heads × 128) and its deepest (o: K = 4096,
        // the stream envelope's end), at a few tokens
        (GgmlType::Q4_K, [2048, 4096, 9]),
        (GgmlType::Q4_0, [4096, 256, 12]),
    ];
    for (i, (ty, [k, n, tokens])) in cases.into_iter().enumerate() {
        let mut c = Owned::contiguous(ty, [k, n, 1, 1, tokens, 1], &mut Rng::new(i as u64));
        let want = expected(&c.d, &c.memory());
        let dense = c.d.as_dense();
        let [a, b, dst] = dense;
        assert_eq!(dense_check(ctx, &dense), ORK_OK, "{ty:?}: {}", last_error());
        for nth in [0, 1, 3] {
            c.dst.bytes_mut().fill(SENTINEL);
            let codes = match nth {
                0 => vec![(ork_mul_mat(ctx, &a.c(), &b.c(), &dst.c()), last_error())],
                _ => on_threads(ctx, nth, move |ctx, th| {
                    ork_mul_mat_mt(ctx, &a.c(), &b.c(), &dst.c(), th)
                }),
            };
            assert!(
                codes.iter().all(|(rc, _)| *rc == ORK_OK),
                "{ty:?} on {nth}: {codes:?}"
            );
            check_dst(&c.dst, c.d.dst.addr, &want)
                .unwrap_or_else(|e| panic!("{ty:?} {k}x{n}, {tokens} tokens, {nth} threads: {e}"));
        }
        // The routed form of the same call gives the same bits (one cache entry serves both).
        c.dst.bytes_mut().fill(SENTINEL);
        assert_eq!(call(ctx, &c.d), ORK_OK, "{}", last_error());
        check_dst(&c.dst, c.d.dst.addr, &want).unwrap();
    }
    ork_ctx_free(ctx);
}

#[test]
fn dense_matmuls_ggml_keeps_are_declined_and_bad_ones_rejected() {
    let ctx = context(ORK_BACKEND_EMU, 8, ORK_MIN_ROWS_DECLINE, ORK_MT_COOP);
    let c = Owned::contiguous(GgmlType::Q4_0, [256, 32, 1, 1, 8, 1], &mut Rng::new(7));
    let good = c.d.as_dense();
    assert_eq!(dense_check(ctx, &good), ORK_OK, "{}", last_error());
    let with = |f: &dyn Fn(&mut [Tensor; 3])| {
        let mut d = good;
        f(&mut d);
        d
    };
    let declined = [
        // a decode step: one token, below ORK_MIN_ROWS
        with(&|d| {
            d[1].ne[1] = 1;
            d[2].ne[1] = 1;
        }),
        // batched activations (ggml broadcasts the weights over ne[2])
        with(&|d| {
            d[1].ne = [256, 4, 2, 1];
            d[2].ne = [32, 4, 2, 1];
        }),
        // f16 weights: not a type the library inflates
        with(&|d| d[0].ty = 1),
    ];
    for (i, d) in declined.iter().enumerate() {
        assert_eq!(
            dense_check(ctx, d),
            ORK_NOT_HANDLED,
            "case {i}: {}",
            last_error()
        );
    }
    let rejected = [
        with(&|d| d[2].ne[1] = 7),   // dst has the wrong token count
        with(&|d| d[2].ne[0] = 16),  // dst has the wrong width
        with(&|d| d[1].ne[0] = 128), // b's depth is not a's
        with(&|d| d[1].addr = 0),
        with(&|d| d[0].ne[1] = 0),
    ];
    for (i, d) in rejected.iter().enumerate() {
        assert_eq!(
            dense_check(ctx, d),
            ORK_INVALID_ARGUMENT,
            "case {i}: {}",
            last_error()
        );
    }
    let [a, b, dst] = good;
    assert_eq!(
        ork_mul_mat_check(ctx, std::ptr::null(), &b.c(), &dst.c()),
        ORK_INVALID_ARGUMENT
    );
    assert_eq!(
        ork_mul_mat(std::ptr::null_mut(), &a.c(), &b.c(), &dst.c()),
        ORK_INVALID_ARGUMENT
    );
    ork_ctx_free(ctx);

    // dense = 0: every dense call is left to the caller; routed calls are not affected.
    // SAFETY: all zeroes is an ork_config (integers, floats and NULL strings).
    let mut cfg: ork_config = unsafe { std::mem::zeroed() };
    cfg.struct_size = size_of::<ork_config>() as u32;
    ork_config_default(&mut cfg);
    cfg.dispatch = ORK_DISPATCH_ALWAYS;
    (cfg.backend, cfg.min_rows, cfg.dense) = (ORK_BACKEND_EMU, 8, 0);
    let off = ork_ctx_new(&cfg);
    assert!(!off.is_null(), "{}", last_error());
    assert_eq!(dense_check(off, &good), ORK_NOT_HANDLED);
    assert!(last_error().contains("ORK_DENSE=0"), "{}", last_error());
    assert_eq!(check(off, &c.d), ORK_OK, "{}", last_error());
    ork_ctx_free(off);
}
