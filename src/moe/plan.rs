//! What a call is given: its plan (the validated descriptors and where its GEMMs run), decided
//! from metadata only, and the views of its tensors.

use super::desc::{dense_as_mul_mat_id, validate, Problem, TensorDesc};
use super::{Config, Dispatch, Error, ErrorKind, SmallBatch, MEASURED_ROWS_PER_EXPERT};
use std::sync::atomic::AtomicU32;

/// Views of one call's tensors, built by the caller from a [`Problem`]'s extents. `dst` is atomic
/// so that all threads of a cooperative call may hold it; every element is written by exactly one
/// thread (relaxed stores, plain stores on every target).
pub struct Inputs<'a> {
    /// The whole `as` tensor; its address is part of the cache key.
    pub weights: &'a [u8],
    pub name: Option<&'a str>,
    pub b: &'a [f32],
    pub ids: &'a [i32],
    pub dst: &'a [AtomicU32],
    /// The second projection of a pair ([`Engine::plan_pair`](super::Engine::plan_pair)).
    pub pair: Option<PairInputs<'a>>,
}

/// The second projection's own tensors in a pair call: its weights and its `dst`.
pub struct PairInputs<'a> {
    pub weights: &'a [u8],
    pub name: Option<&'a str>,
    pub dst: &'a [AtomicU32],
}

impl Inputs<'_> {
    /// The weights of each projection of the call: one, or both of a pair.
    pub(super) fn weights(&self) -> impl Iterator<Item = &[u8]> {
        std::iter::once(self.weights).chain(self.pair.as_ref().map(|x| x.weights))
    }

    /// The `dst` of each projection of the call.
    pub(super) fn dsts(&self) -> impl Iterator<Item = &[AtomicU32]> {
        std::iter::once(self.dst).chain(self.pair.as_ref().map(|x| x.dst))
    }
}

/// A call the engine takes: the validated problem and where its GEMMs run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub problem: Problem,
    /// A pair: the second projection, with the same activations, ids, weight type and shape as
    /// `problem` and its own weights and `dst`. Each expert's two projections are one GEMM.
    pub pair: Option<Problem>,
    /// Small batch under [`SmallBatch::Cpu`]: GEMMs on the CPU int8 kernels.
    pub on_cpu: bool,
}

impl Plan {
    /// The projections of the call: one, or both of a pair.
    pub fn problems(&self) -> impl Iterator<Item = &Problem> {
        std::iter::once(&self.problem).chain(&self.pair)
    }

    /// Validates the descriptors and applies the small-batch policy of `config`.
    pub(super) fn single(
        config: &Config,
        w: &TensorDesc,
        b: &TensorDesc,
        ids: &TensorDesc,
        dst: &TensorDesc,
    ) -> Result<Plan, Error> {
        Plan::with_policy(config, validate(w, b, ids, dst)?, None)
    }

    /// [`Plan::single`] for two projections of one input: `w0`/`dst0` and `w1`/`dst1` share `b`
    /// and `ids`, and the weights share type, layout and shape.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn pair(
        config: &Config,
        w0: &TensorDesc,
        w1: &TensorDesc,
        b: &TensorDesc,
        ids: &TensorDesc,
        dst0: &TensorDesc,
        dst1: &TensorDesc,
    ) -> Result<Plan, Error> {
        let (p0, p1) = (validate(w0, b, ids, dst0)?, validate(w1, b, ids, dst1)?);
        check_pair_format(&p0, &p1)?;
        check_pair_apart([(w0, dst0, &p0), (w1, dst1, &p1)])?;
        Plan::with_policy(config, p0, Some(p1))
    }

    /// [`Plan::single`] for a dense matmul `dst = w^T · b` ([`dense_as_mul_mat_id`]), unless the
    /// configuration turns dense calls off.
    pub(super) fn dense(
        config: &Config,
        w: &TensorDesc,
        b: &TensorDesc,
        dst: &TensorDesc,
    ) -> Result<Plan, Error> {
        if !config.dense {
            return Err(Error::not_handled(
                "dense matmuls are turned off (ORK_DENSE=0)",
            ));
        }
        let [w, b, ids, dst] = dense_as_mul_mat_id(w, b, dst)?;
        Plan::single(config, &w, &b, &ids, &dst)
    }

    /// The small-batch policy for a validated call.
    fn with_policy(
        config: &Config,
        problem: Problem,
        pair: Option<Problem>,
    ) -> Result<Plan, Error> {
        check_indexable(config, &problem)?;
        let (tokens, rows) = (problem.n_tokens, problem.rows_per_expert());
        let small = rows < config.min_rows as usize;
        if config.small_batch == SmallBatch::Decline {
            let measured = config.dispatch == Dispatch::Auto;
            let declined = if measured {
                tokens < config.min_rows as usize
                    || rows < MEASURED_ROWS_PER_EXPERT.min(config.min_rows) as usize
            } else {
                small
            };
            if declined {
                return Err(Error::below_min_rows(
                    tokens,
                    rows,
                    config.min_rows,
                    measured,
                ));
            }
        }
        Ok(Plan {
            problem,
            pair,
            on_cpu: small && config.small_batch == SmallBatch::Cpu,
        })
    }
}

/// The engine indexes a call's rows, and their outlier channels, in 32 bits (routed rows, the
/// outlier lists of a share and of an expert): a call beyond that, billions of rows that no host
/// has memory for, is left to the caller.
fn check_indexable(config: &Config, p: &Problem) -> Result<(), Error> {
    let per_row = config.outliers.map_or(1, |r| r.max_channels.clamp(1, p.k));
    match p.rows().checked_mul(per_row) {
        Some(entries) if entries <= u32::MAX as usize => Ok(()),
        _ => Err(Error::new(
            ErrorKind::NotHandled,
            format!(
                "{} rows with up to {per_row} outlier channels each exceed the 2^32 entries a                  call indexes: left to the caller",
                p.rows()
            ),
        )),
    }
}

/// A pair's projections are one GEMM per expert: one weight type, layout and shape.
fn check_pair_format(p0: &Problem, p1: &Problem) -> Result<(), Error> {
    let format = |p: &Problem| (p.wtype, p.layout, p.k, p.n, p.n_expert);
    if format(p0) == format(p1) {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::NotHandled,
        format!(
            "a pair needs weights of one type, layout and shape: {} {}x{}x{} and {} {}x{}x{}",
            p0.layout.name(p0.wtype),
            p0.k,
            p0.n,
            p0.n_expert,
            p1.layout.name(p1.wtype),
            p1.k,
            p1.n,
            p1.n_expert
        ),
    ))
}

/// Each dst apart from the other dst and the other projection's weights (validation checked it
/// against its own inputs): `InvalidArgument` for a byte they share, declined when their extents
/// interleave and sharing is not ruled out cheaply (as validation does for one projection).
fn check_pair_apart(
    [(w0, dst0, p0), (w1, dst1, p1)]: [(&TensorDesc, &TensorDesc, &Problem); 2],
) -> Result<(), Error> {
    let (d0, d1) = (p0.dst_span(dst0.addr), p1.dst_span(dst1.addr));
    let (a0, a1) = (p0.weight_span(w0.addr), p1.weight_span(w1.addr));
    let weights = "the other projection's weights";
    for (dst, other, what) in [
        (&d0, &d1, "the other dst"),
        (&d0, &a1, weights),
        (&d1, &a0, weights),
    ] {
        match dst.shares_bytes(other) {
            Some(false) => {}
            Some(true) => {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!("pair: a dst overlaps {what}"),
                ))
            }
            None => {
                return Err(Error::new(
                    ErrorKind::NotHandled,
                    format!("pair: a dst and {what} interleave in memory: left to the caller"),
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::moe::desc::GGML_TYPE_I32;
    use crate::moe::outliers::Rule;

    fn t(ty: i32, ne: [i64; 3], nb: [usize; 3], addr: usize) -> TensorDesc<'static> {
        TensorDesc {
            ty,
            ne: [ne[0], ne[1], ne[2], 1],
            nb: [nb[0], nb[1], nb[2], nb[2] * ne[2] as usize],
            addr,
            name: None,
        }
    }

    /// A pair of 2 experts of 4 rows of 32 Q8_0 weights, 2 slots of 3 tokens, dst rows `nb1`
    /// apart at `dst0` and `dst1`; the weights at 0x10000 and 0x20000.
    fn pair(dst0: usize, dst1: usize, nb1: usize) -> Result<Plan, Error> {
        let config = Config {
            min_rows: 0,
            ..Config::default()
        };
        let w = |addr| t(8, [32, 4, 2], [34, 34, 136], addr);
        let b = t(0, [32, 1, 3], [4, 128, 128], 0x30000);
        let ids = t(GGML_TYPE_I32, [2, 3, 1], [4, 8, 24], 0x40000);
        let dst = |addr| t(0, [4, 2, 3], [4, nb1, 2 * nb1], addr);
        Plan::pair(
            &config,
            &w(0x10000),
            &w(0x20000),
            &b,
            &ids,
            &dst(dst0),
            &dst(dst1),
        )
    }

    #[test]
    fn a_call_of_more_rows_than_32_bits_index_is_declined() {
        // 2^31 tokens of 2 slots, on address ranges far apart (metadata only).
        let tokens = 1i64 << 31;
        let w = t(8, [32, 1, 4], [34, 34, 34], 1 << 40);
        let b = t(0, [32, 1, tokens], [4, 128, 128], 1 << 41);
        let ids = t(GGML_TYPE_I32, [2, tokens, 1], [4, 8, 0], 1 << 42);
        let dst = t(0, [1, 2, tokens], [4, 4, 8], 1 << 43);
        let config = |outliers| Config {
            min_rows: 0,
            outliers,
            ..Config::default()
        };
        let e = Plan::single(&config(Some(Rule::DEFAULT)), &w, &b, &ids, &dst).unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotHandled, "{e}");
        assert!(e.message().contains("exceed the 2^32 entries"), "{e}");
        // Without the outlier lists, 2^32 rows is one too many; 2^32 - 2 fit.
        assert!(Plan::single(&config(None), &w, &b, &ids, &dst).is_err());
        let fewer = |t: TensorDesc<'static>, i: usize| {
            let mut t = t;
            t.ne[i] = tokens - 1;
            t
        };
        let (b, ids, dst) = (fewer(b, 2), fewer(ids, 1), fewer(dst, 2));
        assert!(Plan::single(&config(None), &w, &b, &ids, &dst).is_ok());
    }

    #[test]
    fn a_pair_refuses_a_shared_byte_and_declines_interleaved_rows() {
        assert!(pair(0x50000, 0x60000, 16).is_ok());
        // One dst for both: shared.
        let e = pair(0x50000, 0x50000, 16).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
        assert!(e.message().contains("overlaps the other dst"), "{e}");
        // Rows of 16 bytes 32 apart, the other dst's rows in the gaps: no byte shared.
        let e = pair(0x50000, 0x50010, 32).unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotHandled, "{e}");
        assert!(e.message().contains("interleave"), "{e}");
        // A dst on the other projection's weights.
        let e = pair(0x50000, 0x10000, 16).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
        assert!(
            e.message().contains("the other projection's weights"),
            "{e}"
        );
    }

    /// A routed call of `tokens` tokens over `experts` experts of 4 rows of 32 Q8_0 weights,
    /// `slots` slots each, broadcast activations.
    fn routed(config: &Config, experts: i64, slots: i64, tokens: i64) -> Result<Plan, Error> {
        let per_token = 4 * slots as usize;
        let w = t(8, [32, 4, experts], [34, 34, 136], 0x10000);
        let b = t(0, [32, 1, tokens], [4, 128, 128], 1 << 32);
        let ids = t(
            GGML_TYPE_I32,
            [slots, tokens, 1],
            [4, per_token, per_token * tokens as usize],
            1 << 33,
        );
        let dst = t(0, [4, slots, tokens], [4, 16, 4 * per_token], 1 << 34);
        Plan::single(config, &w, &b, &ids, &dst)
    }

    #[test]
    fn under_auto_min_rows_counts_tokens_and_two_rows_per_expert_are_measured() {
        use {Dispatch::*, SmallBatch::*};
        // 8 slots over 16 experts: `tokens / 2` rows per expert, rounded up.
        let declined = |tokens, dispatch, small_batch| {
            let config = Config {
                dispatch,
                small_batch,
                ..Config::default()
            };
            routed(&config, 16, 8, tokens)
                .map(|plan| plan.on_cpu)
                .map_err(|e| {
                    assert_eq!(e.kind, ErrorKind::NotHandled, "{e}");
                    e.message().into_owned()
                })
        };
        // always: below 8 rows per expert (15 tokens) is declined, or run on the CPU.
        assert!(declined(14, Always, Decline)
            .unwrap_err()
            .contains("7 rows per expert: below min_rows 8"));
        assert_eq!(declined(15, Always, Decline), Ok(false));
        assert_eq!(declined(14, Always, Cpu), Ok(true));
        // auto: a decode-sized call is declined (fewer than 8 tokens, or 1 row per expert) ...
        for tokens in [1, 3, 7] {
            let e = declined(tokens, Auto, Decline).unwrap_err();
            assert!(e.contains("a decode-sized call"), "{e}");
            assert!(e.contains("ORK_DISPATCH=auto"), "{e}");
        }
        // ... and from 8 tokens (4 rows per expert) every call is taken, to be measured.
        assert_eq!(declined(8, Auto, Decline), Ok(false));
        assert_eq!(declined(14, Auto, Decline), Ok(false));
        // With the CPU mode asked for, nothing is declined: small calls run on the CPU.
        assert_eq!(declined(1, Auto, Cpu), Ok(true));
        assert_eq!(declined(16, Auto, Cpu), Ok(false));
    }

    #[test]
    fn under_auto_one_row_per_expert_is_declined_however_many_tokens() {
        // 64 experts, 1 slot: 100 tokens are 2 rows per expert, 63 tokens 1.
        let config = Config {
            dispatch: Dispatch::Auto,
            ..Config::default()
        };
        let call = |tokens| routed(&config, 64, 1, tokens);
        let e = call(63).unwrap_err();
        assert!(e.message().contains("63 tokens, 1 rows per expert"), "{e}");
        assert!(e.message().contains("under 2 rows per expert"), "{e}");
        assert!(call(100).is_ok());
        // min_rows 0 turns the floor off.
        let config = Config {
            min_rows: 0,
            ..config
        };
        assert!(routed(&config, 64, 1, 1).is_ok());
    }
}
