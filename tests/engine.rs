//! The engine itself (no C boundary) on odd shapes: N not a multiple of 32, K = 256·odd, 1, 3 and
//! 8 slots, broadcast and per-slot activations, strided `dst` rows with sentinels between them.
//! The emulated NPU (on this CPU's fastest kernels) must give the bits of the oracle, the CPU
//! backend on the scalar kernels (a plain triple-loop int8 GEMM), single-caller and cooperative
//! runs too, and be within int8 accuracy of an f64 reference. Experts in ggml-cpu's
//! repacked layouts give the plain experts' bits. On the rknn backend (the stand-in runtime) the
//! whole engine, prefetch threads included, gives the emulator's bits.

mod standin;

use ork_moe::inflate::{from_plain, ExpertWeights, Layout};
use ork_moe::isa::Isa;
use ork_moe::moe::desc::{weight_code, TensorDesc, GGML_TYPE_I32};
use ork_moe::moe::{
    Config, Dispatch, Engine, ErrorKind, HeldBytes, HeldWeights, Inputs, PairInputs, PrefetchStats,
};
use ork_moe::npu::{rknn, BackendChoice, DeviceConfig};
use ork_moe::quant::{dequantize_row, GgmlType};
use ork_moe::testutil::Rng;
use standin::{Sdk, Standin};
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Barrier};

/// Bits written between and after `dst` rows; an engine that writes them has gone out of bounds.
const SENTINEL: u32 = 0x7fc0_dead;

#[derive(Clone, Copy, Debug)]
struct Shape {
    ty: GgmlType,
    k: usize,
    n: usize,
    n_expert: usize,
    n_used: usize,
    n_tokens: usize,
    /// Activation rows per token: 1 (broadcast to every slot) or `n_used`.
    b_rows: usize,
    /// Extra f32 elements after each `dst` row.
    dst_gap: usize,
}

/// One call's tensors, laid out with the strides of `Shape`.
struct Case {
    s: Shape,
    /// How `weights` holds the experts' blocks.
    layout: Layout,
    weights: Vec<u8>,
    /// Bytes between experts (more than N rows: a view into a larger tensor).
    expert_stride: usize,
    b: Vec<f32>,
    ids: Vec<i32>,
}

impl Case {
    fn new(s: Shape, seed: u64) -> Case {
        let mut rng = Rng::new(seed);
        let row = s.ty.row_bytes(s.k).expect("K is whole blocks");
        let expert_stride = s.n * row + s.ty.block_bytes();
        let mut weights = vec![0u8; s.n_expert * expert_stride];
        for e in 0..s.n_expert {
            let blocks = rng.blocks(s.ty, s.n * s.k / s.ty.block_elems(), 0.02);
            weights[e * expert_stride..][..s.n * row].copy_from_slice(&blocks);
        }
        let b = (0..s.k * s.b_rows * s.n_tokens)
            .map(|_| rng.uniform(-1.0, 1.0))
            .collect();
        // Distinct experts per token, as a router's top-k gives them.
        let mut ids = Vec::with_capacity(s.n_used * s.n_tokens);
        for _ in 0..s.n_tokens {
            let mut chosen: Vec<i32> = Vec::new();
            while chosen.len() < s.n_used {
                let e = rng.below(s.n_expert) as i32;
                if !chosen.contains(&e) {
                    chosen.push(e);
                }
            }
            ids.extend(chosen);
        }
        Case {
            s,
            layout: Layout::Plain,
            weights,
            expert_stride,
            b,
            ids,
        }
    }

    /// The same weights, every expert repacked into `layout` as ggml-cpu does (at the same
    /// expert stride).
    fn repacked(&self, layout: Layout) -> Case {
        let s = &self.s;
        let row = s.ty.row_bytes(s.k).unwrap();
        let mut weights = self.weights.clone();
        for (from, to) in self
            .weights
            .chunks(self.expert_stride)
            .zip(weights.chunks_mut(self.expert_stride))
        {
            let w = ExpertWeights {
                ty: s.ty,
                data: from,
                row_stride: row,
                n: s.n,
                k: s.k,
            };
            from_plain(layout, &w, to).expect("a layout of this type");
        }
        Case {
            layout,
            weights,
            b: self.b.clone(),
            ids: self.ids.clone(),
            ..*self
        }
    }

    fn dst_row(&self) -> usize {
        self.s.n + self.s.dst_gap
    }

    fn dst_len(&self) -> usize {
        self.dst_row() * self.s.n_used * self.s.n_tokens
    }

    fn descs(&self, dst: &[AtomicU32]) -> [TensorDesc<'_>; 4] {
        self.descs_on(&self.weights, dst)
    }

    /// [`Case::descs`] with this case's weights bytes at `weights` (a copy the test keeps).
    fn descs_on(&self, weights: &[u8], dst: &[AtomicU32]) -> [TensorDesc<'_>; 4] {
        let s = &self.s;
        let row = s.ty.row_bytes(s.k).unwrap();
        let t = |ty: i32, ne: [usize; 3], nb: [usize; 3], addr: usize| TensorDesc {
            ty,
            ne: [ne[0] as i64, ne[1] as i64, ne[2] as i64, 1],
            nb: [nb[0], nb[1], nb[2], nb[2] * ne[2]],
            addr,
            name: Some("blk.0.ffn_gate_exps.weight"),
        };
        let w = t(
            weight_code(s.ty, self.layout),
            [s.k, s.n, s.n_expert],
            [s.ty.block_bytes(), row, self.expert_stride],
            weights.as_ptr() as usize,
        );
        let b = t(
            GgmlType::F32.id(),
            [s.k, s.b_rows, s.n_tokens],
            [4, 4 * s.k, 4 * s.k * s.b_rows],
            self.b.as_ptr() as usize,
        );
        let ids = t(
            GGML_TYPE_I32,
            [s.n_used, s.n_tokens, 1],
            [4, 4 * s.n_used, 4 * s.n_used * s.n_tokens],
            self.ids.as_ptr() as usize,
        );
        let d = t(
            GgmlType::F32.id(),
            [s.n, s.n_used, s.n_tokens],
            [4, 4 * self.dst_row(), 4 * self.dst_row() * s.n_used],
            dst.as_ptr() as usize,
        );
        [w, b, ids, d]
    }

    /// `dst` after one call on `engine`: from a single caller, or from `threads` cooperating.
    fn run(&self, engine: &Engine, threads: usize) -> Vec<u32> {
        self.run_on(&self.weights, engine, threads)
    }

    /// [`Case::run`] on a copy `weights` of this case's weights.
    fn run_on(&self, weights: &[u8], engine: &Engine, threads: usize) -> Vec<u32> {
        let dst: Vec<AtomicU32> = (0..self.dst_len())
            .map(|_| AtomicU32::new(SENTINEL))
            .collect();
        let [w, b, ids, d] = self.descs_on(weights, &dst);
        let plan = engine.plan(&w, &b, &ids, &d).expect("a valid call");
        let p = &plan.problem;
        let io = Inputs {
            weights: &weights[..p.w_extent],
            name: w.name,
            b: &self.b[..p.b_extent / 4],
            ids: &self.ids[..p.ids_extent / 4],
            dst: &dst[..p.dst_extent / 4],
            pair: None,
        };
        run_plan(engine, plan, &io, threads);
        dst.into_iter().map(AtomicU32::into_inner).collect()
    }

    /// The same activations and ids with other weights: the second projection of a pair.
    fn sibling(&self, seed: u64) -> Case {
        Case {
            weights: Case::new(self.s, seed).weights,
            b: self.b.clone(),
            ids: self.ids.clone(),
            ..*self
        }
    }

    /// Both `dst`s of the pair (`self`, `second`) in one call on `engine`.
    fn run_pair(&self, second: &Case, engine: &Engine, threads: usize) -> (Vec<u32>, Vec<u32>) {
        self.run_pair_on(second, [&self.weights, &second.weights], engine, threads)
    }

    /// [`Case::run_pair`] on copies `weights` of the two cases' weights.
    fn run_pair_on(
        &self,
        second: &Case,
        weights: [&[u8]; 2],
        engine: &Engine,
        threads: usize,
    ) -> (Vec<u32>, Vec<u32>) {
        let new_dst = || -> Vec<AtomicU32> {
            (0..self.dst_len())
                .map(|_| AtomicU32::new(SENTINEL))
                .collect()
        };
        let (dst0, dst1) = (new_dst(), new_dst());
        let [w0, b, ids, d0] = self.descs_on(weights[0], &dst0);
        let [w1, _, _, d1] = second.descs_on(weights[1], &dst1);
        let plan = engine
            .plan_pair(&w0, &w1, &b, &ids, &d0, &d1)
            .expect("a valid pair");
        let (p0, p1) = (&plan.problem, plan.pair.as_ref().expect("a pair plan"));
        let io = Inputs {
            weights: &weights[0][..p0.w_extent],
            name: w0.name,
            b: &self.b[..p0.b_extent / 4],
            ids: &self.ids[..p0.ids_extent / 4],
            dst: &dst0[..p0.dst_extent / 4],
            pair: Some(PairInputs {
                weights: &weights[1][..p1.w_extent],
                name: w1.name,
                dst: &dst1[..p1.dst_extent / 4],
            }),
        };
        run_plan(engine, plan, &io, threads);
        let bits = |d: Vec<AtomicU32>| d.into_iter().map(AtomicU32::into_inner).collect();
        (bits(dst0), bits(dst1))
    }

    /// The f64 result of the dequantized weights and the f32 activations, `[token][slot][n]`.
    fn reference(&self) -> Vec<f64> {
        let s = &self.s;
        let row = s.ty.row_bytes(s.k).unwrap();
        let mut w = vec![0f32; s.k];
        let mut out = vec![0f64; s.n * s.n_used * s.n_tokens];
        for t in 0..s.n_tokens {
            for slot in 0..s.n_used {
                let e = self.ids[t * s.n_used + slot] as usize;
                let x = &self.b[(t * s.b_rows + slot % s.b_rows) * s.k..][..s.k];
                for n in 0..s.n {
                    let at = e * self.expert_stride + n * row;
                    dequantize_row(s.ty, &self.weights[at..at + row], &mut w).unwrap();
                    let dot: f64 = w.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum();
                    out[(t * s.n_used + slot) * s.n + n] = dot;
                }
            }
        }
        out
    }
}

/// Runs `plan` from a single caller, or from `threads` cooperating through a barrier.
fn run_plan(engine: &Engine, plan: ork_moe::moe::Plan, io: &Inputs, threads: usize) {
    if threads == 1 {
        engine.run(plan, io).expect("the call runs");
        return;
    }
    let barrier = Barrier::new(threads);
    std::thread::scope(|scope| {
        for ith in 0..threads {
            let (plan, barrier) = (plan.clone(), &barrier);
            scope.spawn(move || {
                let mut wait = || {
                    barrier.wait();
                };
                engine
                    .run_mt(plan, io, ith, threads, &mut wait)
                    .expect("the cooperative call runs");
            });
        }
    });
}

fn engine(backend: BackendChoice) -> Engine {
    engine_on(backend, DeviceConfig::default().host.threads)
}

/// An emulator engine whose GEMMs go through `n` submitter threads (one per NPU core, as on rknn).
fn engine_with_submitters(n: usize) -> Engine {
    let mut device = DeviceConfig {
        backend: BackendChoice::Emu,
        ..DeviceConfig::default()
    };
    device.host.threads = DeviceConfig::default().host.threads;
    Engine::new(Config {
        device,
        min_rows: 0,
        submitters: Some(n),
        dispatch: Dispatch::Always,
        ..Config::default()
    })
    .expect("the emulator opens")
}

/// An engine whose single-caller runs use `threads` threads.
fn engine_on(backend: BackendChoice, threads: usize) -> Engine {
    engine_with(backend, threads, Isa::best())
}

/// The oracle: the CPU backend on the scalar kernels, whose int8 GEMM is the plain triple loop
/// (`gemm::reference`), independent of the fast kernels every other engine here runs.
fn oracle() -> Engine {
    engine_with(
        BackendChoice::Cpu,
        DeviceConfig::default().host.threads,
        Isa::Scalar,
    )
}

/// An engine on `backend` whose single-caller runs use `threads` threads and whose host kernels
/// (CPU GEMMs, inflate, scatter) take the path `isa`.
fn engine_with(backend: BackendChoice, threads: usize, isa: Isa) -> Engine {
    let mut device = DeviceConfig {
        backend,
        ..DeviceConfig::default()
    };
    device.host.threads = threads;
    device.host.isa = isa;
    Engine::new(Config {
        device,
        // Every call through the device path, whatever its size.
        min_rows: 0,
        dispatch: Dispatch::Always,
        ..Config::default()
    })
    .expect("the backend opens")
}

/// A dense matmul's call: one expert with every row.
const DENSE: Shape = Shape {
    ty: GgmlType::Q4_K,
    k: 512,
    n: 200,
    n_expert: 1,
    n_used: 1,
    n_tokens: 40,
    b_rows: 1,
    dst_gap: 3,
};

const SHAPES: [Shape; 20] = [
    Shape {
        ty: GgmlType::Q4_0,
        k: 768,
        n: 100,
        n_expert: 8,
        n_used: 3,
        n_tokens: 5,
        b_rows: 3,
        dst_gap: 7,
    },
    Shape {
        ty: GgmlType::Q4_K,
        k: 1280,
        n: 72,
        n_expert: 4,
        n_used: 1,
        n_tokens: 9,
        b_rows: 1,
        dst_gap: 1,
    },
    Shape {
        ty: GgmlType::Q8_0,
        k: 256,
        n: 33,
        n_expert: 16,
        n_used: 8,
        n_tokens: 3,
        b_rows: 1,
        dst_gap: 3,
    },
    Shape {
        ty: GgmlType::Q6_K,
        k: 768,
        n: 40,
        n_expert: 6,
        n_used: 3,
        n_tokens: 4,
        b_rows: 3,
        dst_gap: 0,
    },
    // K = 2048: the stream envelope (gate/up's primitive) on an odd N.
    Shape {
        ty: GgmlType::Q4_1,
        k: 2048,
        n: 50,
        n_expert: 8,
        n_used: 8,
        n_tokens: 16,
        b_rows: 8,
        dst_gap: 2,
    },
    Shape {
        ty: GgmlType::Q5_0,
        k: 1792,
        n: 65,
        n_expert: 5,
        n_used: 3,
        n_tokens: 6,
        b_rows: 1,
        dst_gap: 5,
    },
    Shape {
        ty: GgmlType::Q5_1,
        k: 1088,
        n: 37,
        n_expert: 6,
        n_used: 2,
        n_tokens: 7,
        b_rows: 2,
        dst_gap: 1,
    },
    Shape {
        ty: GgmlType::Q2_K,
        k: 1536,
        n: 48,
        n_expert: 8,
        n_used: 4,
        n_tokens: 5,
        b_rows: 1,
        dst_gap: 0,
    },
    Shape {
        ty: GgmlType::Q3_K,
        k: 768,
        n: 81,
        n_expert: 6,
        n_used: 2,
        n_tokens: 8,
        b_rows: 2,
        dst_gap: 3,
    },
    Shape {
        ty: GgmlType::Q5_K,
        k: 1280,
        n: 35,
        n_expert: 4,
        n_used: 3,
        n_tokens: 6,
        b_rows: 3,
        dst_gap: 2,
    },
    Shape {
        ty: GgmlType::IQ4_NL,
        k: 2880,
        n: 45,
        n_expert: 4,
        n_used: 2,
        n_tokens: 5,
        b_rows: 1,
        dst_gap: 1,
    },
    Shape {
        ty: GgmlType::IQ4_XS,
        k: 1024,
        n: 64,
        n_expert: 8,
        n_used: 2,
        n_tokens: 6,
        b_rows: 2,
        dst_gap: 4,
    },
    // gpt-oss's experts: MXFP4, K = 2880 (not a multiple of 256).
    Shape {
        ty: GgmlType::MXFP4,
        k: 2880,
        n: 90,
        n_expert: 8,
        n_used: 4,
        n_tokens: 4,
        b_rows: 1,
        dst_gap: 2,
    },
    Shape {
        ty: GgmlType::IQ2_XXS,
        k: 768,
        n: 40,
        n_expert: 6,
        n_used: 2,
        n_tokens: 5,
        b_rows: 1,
        dst_gap: 1,
    },
    Shape {
        ty: GgmlType::IQ2_XS,
        k: 512,
        n: 33,
        n_expert: 4,
        n_used: 2,
        n_tokens: 6,
        b_rows: 2,
        dst_gap: 0,
    },
    Shape {
        ty: GgmlType::IQ2_S,
        k: 1024,
        n: 48,
        n_expert: 5,
        n_used: 3,
        n_tokens: 4,
        b_rows: 1,
        dst_gap: 2,
    },
    Shape {
        ty: GgmlType::IQ3_XXS,
        k: 768,
        n: 35,
        n_expert: 6,
        n_used: 2,
        n_tokens: 7,
        b_rows: 1,
        dst_gap: 3,
    },
    Shape {
        ty: GgmlType::IQ3_S,
        k: 1280,
        n: 64,
        n_expert: 4,
        n_used: 2,
        n_tokens: 5,
        b_rows: 2,
        dst_gap: 1,
    },
    Shape {
        ty: GgmlType::IQ1_S,
        k: 512,
        n: 70,
        n_expert: 8,
        n_used: 4,
        n_tokens: 3,
        b_rows: 1,
        dst_gap: 0,
    },
    Shape {
        ty: GgmlType::IQ1_M,
        k: 768,
        n: 37,
        n_expert: 5,
        n_used: 2,
        n_tokens: 6,
        b_rows: 2,
        dst_gap: 4,
    },
];

#[test]
fn emu_and_cpu_give_the_oracles_bits_and_match_the_reference() {
    let (emu, cpu, oracle) = (
        engine(BackendChoice::Emu),
        engine(BackendChoice::Cpu),
        oracle(),
    );
    for (i, &shape) in SHAPES.iter().enumerate() {
        let case = Case::new(shape, 100 + i as u64);
        let on_emu = case.run(&emu, 1);
        assert!(
            on_emu == case.run(&oracle, 1),
            "{shape:?}: emu and the oracle differ"
        );
        assert!(on_emu == case.run(&cpu, 1), "{shape:?}: emu and cpu differ");
        assert!(
            on_emu == case.run(&emu, 3),
            "{shape:?}: cooperative run differs"
        );

        let reference = case.reference();
        let (mut err, mut norm) = (0f64, 0f64);
        for (r, chunk) in on_emu.chunks_exact(case.dst_row()).enumerate() {
            let (values, gap) = chunk.split_at(shape.n);
            assert!(
                gap.iter().all(|&x| x == SENTINEL),
                "{shape:?}: wrote between rows"
            );
            for (&got, &want) in values.iter().zip(&reference[r * shape.n..]) {
                let got = f32::from_bits(got) as f64;
                assert!(got.is_finite(), "{shape:?}: row {r} not written");
                err += (got - want).powi(2);
                norm += want * want;
            }
        }
        // test-backend-ops' MUL_MAT_ID bound; int8 activations and weights stay well inside it.
        let nmse = err / norm;
        assert!(nmse < 5e-4, "{shape:?}: NMSE {nmse:e}");
    }
}

#[test]
fn deep_k_is_summed_from_segments_bit_for_bit() {
    // The emulator takes K <= 10240 per GEMM: deeper experts run as depth segments whose int32
    // products add up to the whole one; the CPU backend (the oracle) takes any K in one piece.
    let (emu, oracle) = (engine(BackendChoice::Emu), oracle());
    let cases = [
        (GgmlType::Q4_0, 8192),
        (GgmlType::Q4_0, 8224),
        (GgmlType::Q4_0, 10240),
        (GgmlType::Q4_0, 10272),
        (GgmlType::Q4_0, 14336),
        (GgmlType::Q4_K, 16384),
    ];
    for (i, (ty, k)) in cases.into_iter().enumerate() {
        let shape = Shape {
            ty,
            k,
            n: 32,
            n_expert: 4,
            n_used: 2,
            n_tokens: 16,
            b_rows: 2,
            dst_gap: 1,
        };
        let case = Case::new(shape, 200 + i as u64);
        let on_emu = case.run(&emu, 1);
        assert!(
            on_emu == case.run(&oracle, 1),
            "K={k}: emu and the oracle differ"
        );
        assert!(
            on_emu == case.run(&emu, 2),
            "K={k}: cooperative run differs"
        );
        let submits = emu.stats().submits_run_i8;
        assert!(submits > 0, "K={k}: the device ran the GEMMs");
    }
}

#[test]
fn a_pair_equals_its_two_calls_bit_for_bit() {
    // Gate and up of one expert as one GEMM: same bits as two calls, one submit per expert (one
    // thread: several would split a large expert's channels into several submits).
    let (emu, oracle) = (engine_on(BackendChoice::Emu, 1), oracle());
    let shapes = [
        SHAPES[0], // N = 100: padding channels between the two projections' blocks
        SHAPES[4], // K = 2048: the stream envelope
        Shape {
            ty: GgmlType::Q4_0,
            k: 14336,
            n: 40,
            n_expert: 4,
            n_used: 2,
            n_tokens: 8,
            b_rows: 1,
            dst_gap: 3,
        }, // deep K: depth segments of both projections
    ];
    for (i, &shape) in shapes.iter().enumerate() {
        let gate = Case::new(shape, 300 + i as u64);
        let up = gate.sibling(400 + i as u64);
        let separate = (gate.run(&emu, 1), up.run(&emu, 1));
        assert!(
            separate == (gate.run(&oracle, 1), up.run(&oracle, 1)),
            "{shape:?}: emu and the oracle differ"
        );
        let before = emu.stats();
        assert!(
            gate.run_pair(&up, &emu, 1) == separate,
            "{shape:?}: pair differs"
        );
        let after = emu.stats();
        let submits = |s: &ork_moe::moe::Stats| s.submits_run_i8 + s.submits_stream;
        let experts_used = {
            let mut ids = gate.ids.clone();
            ids.sort_unstable();
            ids.dedup();
            ids.len() as u64
        };
        let segments = shape.k.div_ceil(10240) as u64;
        assert_eq!(
            submits(&after) - submits(&before),
            experts_used * segments,
            "{shape:?}"
        );
        assert!(
            gate.run_pair(&up, &emu, 3) == separate,
            "{shape:?}: cooperative pair"
        );
        assert!(
            gate.run_pair(&up, &oracle, 1) == separate,
            "{shape:?}: the oracle's pair"
        );
    }
}

#[test]
fn a_fused_gate_up_tensor_is_one_call() {
    // llama.cpp's ffn_gate_up_exps: one MUL_MAT_ID with N = 2·n_ff, split into views afterwards.
    let shape = Shape {
        ty: GgmlType::Q4_K,
        k: 2048,
        n: 1536,
        n_expert: 8,
        n_used: 4,
        n_tokens: 8,
        b_rows: 1,
        dst_gap: 0,
    };
    let case = Case::new(shape, 500);
    let emu = engine_on(BackendChoice::Emu, 1);
    let on_emu = case.run(&emu, 1);
    assert!(on_emu == case.run(&oracle(), 1));
    let stats = emu.stats();
    assert_eq!(
        stats.submits_stream, stats.experts_inflated,
        "one submit per expert"
    );
}

/// NMSE of `dst` against the f64 reference, over the rows written.
fn nmse(case: &Case, dst: &[u32]) -> f64 {
    let reference = case.reference();
    let (mut err, mut norm) = (0f64, 0f64);
    for (r, chunk) in dst.chunks_exact(case.dst_row()).enumerate() {
        for (&got, &want) in chunk[..case.s.n].iter().zip(&reference[r * case.s.n..]) {
            err += (f32::from_bits(got) as f64 - want).powi(2);
            norm += want * want;
        }
    }
    err / norm
}

#[test]
fn outlier_activations_stay_within_ggmls_bound_by_default() {
    // The outlier case of docs/ACCURACY.md: K = 2048, N = 64, 8 experts, 2 slots, 32 tokens,
    // activations in [-1, 1] except channel 7 = ±10·s and channel 1500 = 5·s in every token,
    // s = 1 and 5 (×10, ×50). One int8 scale per row gives NMSE 1.4e-3 and 7e-3; the default
    // outlier split takes those channels out of the int8 row.
    let (emu, oracle) = (engine(BackendChoice::Emu), oracle());
    for (i, ty) in [GgmlType::Q4_0, GgmlType::Q4_K].into_iter().enumerate() {
        for s in [1.0f32, 5.0] {
            let shape = Shape {
                ty,
                k: 2048,
                n: 64,
                n_expert: 8,
                n_used: 2,
                n_tokens: 32,
                b_rows: 1,
                dst_gap: 0,
            };
            let mut case = Case::new(shape, 600 + i as u64);
            for (t, row) in case.b.chunks_exact_mut(2048).enumerate() {
                row[7] = if t % 2 == 0 { 10.0 * s } else { -10.0 * s };
                row[1500] = 5.0 * s;
            }
            let on_emu = case.run(&emu, 1);
            assert!(
                on_emu == case.run(&oracle, 1),
                "{ty:?} x{s}: emu and the oracle differ"
            );
            let e = nmse(&case, &on_emu);
            assert!(e < 5e-4, "{ty:?} x{}: NMSE {e:e}", 10.0 * s);
        }
    }
}

#[test]
fn a_tiny_row_keeps_int8_resolution() {
    // Every |x| about 1e-40 (subnormal): the row's scale is split so that the outputs are not
    // flushed towards zero by a subnormal row scale times the channel scale.
    let emu = engine(BackendChoice::Emu);
    let shape = Shape {
        ty: GgmlType::Q4_0,
        k: 2048,
        n: 64,
        n_expert: 4,
        n_used: 2,
        n_tokens: 8,
        b_rows: 1,
        dst_gap: 0,
    };
    let mut case = Case::new(shape, 700);
    for x in case.b.iter_mut() {
        *x *= 1e-40;
    }
    let e = nmse(&case, &case.run(&emu, 1));
    assert!(e < 5e-4, "tiny row NMSE {e:e}");
}

#[test]
fn submitter_threads_give_the_same_bits() {
    // Phase 2 as on the board: the caller's threads prepare experts and scatter, submitter
    // threads (one per NPU core) run the GEMMs, each on one core.
    let inline = engine(BackendChoice::Emu);
    for n in [1, 3, 5] {
        let piped = engine_with_submitters(n);
        for (i, &shape) in SHAPES.iter().enumerate() {
            let case = Case::new(shape, 800 + i as u64);
            let want = case.run(&inline, 1);
            assert!(case.run(&piped, 1) == want, "{n} submitters, {shape:?}");
            assert!(
                case.run(&piped, 3) == want,
                "{n} submitters, cooperative, {shape:?}"
            );
        }
        let gate = Case::new(SHAPES[4], 900);
        let up = gate.sibling(901);
        assert!(gate.run_pair(&up, &piped, 2) == gate.run_pair(&up, &inline, 1));
        let deep = Case::new(
            Shape {
                ty: GgmlType::Q4_0,
                k: 14336,
                n: 32,
                n_expert: 4,
                n_used: 2,
                n_tokens: 8,
                b_rows: 2,
                dst_gap: 1,
            },
            902,
        );
        assert!(
            deep.run(&piped, 2) == deep.run(&inline, 1),
            "deep K, {n} submitters"
        );
    }
}

#[test]
fn a_traced_call_reports_its_experts_in_phase_2_order() {
    let emu = engine_on(BackendChoice::Emu, 1);
    let case = Case::new(SHAPES[0], 1000);
    let run = |case: &Case| {
        let dst: Vec<AtomicU32> = (0..case.dst_len()).map(|_| AtomicU32::new(0)).collect();
        let [w, b, ids, d] = case.descs(&dst);
        let plan = emu.plan(&w, &b, &ids, &d).unwrap();
        let p = &plan.problem;
        let io = Inputs {
            weights: &case.weights[..p.w_extent],
            name: w.name,
            b: &case.b[..p.b_extent / 4],
            ids: &case.ids[..p.ids_extent / 4],
            dst: &dst[..p.dst_extent / 4],
            pair: None,
        };
        emu.run_traced(plan, &io).unwrap().1
    };
    let cold = run(&case);
    let mut rows = vec![0usize; case.s.n_expert];
    for &e in &case.ids {
        rows[e as usize] += 1;
    }
    let used = rows.iter().filter(|&&r| r > 0).count();
    assert_eq!(cold.len(), used);
    // Most rows first, ties by id; every expert inflated on a cold cache, found on a warm one.
    assert!(cold
        .windows(2)
        .all(|w| (w[0].rows, w[1].expert) >= (w[1].rows, w[0].expert)));
    assert!(cold.iter().all(|r| rows[r.expert] == r.rows && !r.hit));
    assert!(run(&case).iter().all(|r| r.hit));
}

#[test]
fn repacked_experts_give_the_plain_bits() {
    // Every layout the library reads, through the whole call: N a multiple of the group rows but
    // not of 32, activations with outlier channels (their weight columns come from the layout),
    // single, cooperative, pair; emulator and the oracle.
    let (emu, oracle) = (engine_on(BackendChoice::Emu, 1), oracle());
    for (i, (ty, layout)) in Layout::REPACKED.into_iter().enumerate() {
        let k = if ty.block_elems() == 256 { 1280 } else { 768 };
        let shape = Shape {
            ty,
            k,
            n: 13 * layout.rows(),
            n_expert: 6,
            n_used: 3,
            n_tokens: 7,
            b_rows: 1 + 2 * (i % 2),
            dst_gap: 2,
        };
        let mut plain = Case::new(shape, 1000 + i as u64);
        for (r, row) in plain.b.chunks_exact_mut(k).enumerate() {
            row[5] = 30.0;
            row[k - 3] = if r % 2 == 0 { -25.0 } else { 12.0 };
        }
        let packed = plain.repacked(layout);
        let name = layout.name(ty);
        let want = plain.run(&emu, 1);
        assert!(packed.run(&emu, 1) == want, "{name}: emu");
        assert!(packed.run(&oracle, 1) == want, "{name}: the oracle");
        assert!(packed.run(&emu, 3) == want, "{name}: cooperative");
        let up = plain.sibling(2000 + i as u64);
        let want = plain.run_pair(&up, &emu, 1);
        assert!(
            packed.run_pair(&up.repacked(layout), &emu, 2) == want,
            "{name}: pair"
        );
    }
}

#[test]
fn a_pair_needs_one_layout() {
    let emu = engine(BackendChoice::Emu);
    let layout = Layout::Repacked { rows: 4, chunk: 4 };
    let gate = Case::new(SHAPES[0], 1100);
    let (up, up_packed) = (gate.sibling(1101), gate.sibling(1101).repacked(layout));
    let dst: Vec<AtomicU32> = (0..gate.dst_len()).map(|_| AtomicU32::new(0)).collect();
    let [w0, b, ids, d0] = gate.descs(&dst);
    let dst1: Vec<AtomicU32> = (0..gate.dst_len()).map(|_| AtomicU32::new(0)).collect();
    let [w1, _, _, d1] = up_packed.descs(&dst1);
    let e = emu
        .plan_pair(&w0, &w1, &b, &ids, &d0, &d1)
        .expect_err("two layouts");
    assert_eq!(e.kind, ErrorKind::NotHandled);
    assert!(e.message().contains("q4_0 768x100x8 and q4_0_4x4"), "{e}");
    let [w1, ..] = up.descs(&dst1);
    emu.plan_pair(&w0, &w1, &b, &ids, &d0, &d1)
        .expect("one layout");
}

#[test]
fn the_layout_is_part_of_the_cache_key() {
    // The same bytes at the same address read in another layout are other weights: a cache hit
    // on the plain inflate would give the plain result.
    let layout = Layout::Repacked { rows: 8, chunk: 8 };
    let shape = Shape {
        ty: GgmlType::Q4_0,
        k: 512,
        n: 64,
        n_expert: 4,
        n_used: 2,
        n_tokens: 8,
        b_rows: 1,
        dst_gap: 0,
    };
    let mut plain = Case::new(shape, 1200);
    // Bit 6 of every byte clear: any two bytes read as an fp16 scale are finite.
    plain.weights.iter_mut().for_each(|b| *b &= !0x40);
    let (warm, fresh) = (engine(BackendChoice::Emu), engine(BackendChoice::Emu));
    let as_plain = plain.run(&warm, 1);
    let reread = Case { layout, ..plain };
    let as_packed = reread.run(&warm, 1);
    assert!(as_packed != as_plain);
    assert!(as_packed == reread.run(&fresh, 1));
    assert_eq!(warm.stats().cache_hits, 0);
}

#[test]
fn deep_repacked_experts_give_the_plain_bits() {
    // Depth segments (K beyond the emulator's 10240) inflated from a repacked layout.
    let emu = engine(BackendChoice::Emu);
    for (ty, layout) in [
        (GgmlType::Q4_0, Layout::Repacked { rows: 4, chunk: 4 }),
        (GgmlType::Q4_K, Layout::Repacked { rows: 8, chunk: 8 }),
    ] {
        let shape = Shape {
            ty,
            k: 14336,
            n: 40,
            n_expert: 3,
            n_used: 2,
            n_tokens: 8,
            b_rows: 2,
            dst_gap: 1,
        };
        let plain = Case::new(shape, 1300);
        let packed = plain.repacked(layout);
        assert!(
            packed.run(&emu, 1) == plain.run(&emu, 1),
            "{ty:?} {layout:?}"
        );
    }
}

/// An emulator engine with `threads` prefetch threads holding at most `bytes` ahead, and no
/// cache (so that every expert the call does not find staged is inflated by it).
fn engine_prefetching(threads: usize, bytes: u64) -> Engine {
    let device = DeviceConfig {
        backend: BackendChoice::Emu,
        ..DeviceConfig::default()
    };
    engine_prefetching_on(device, threads, bytes)
}

/// [`engine_prefetching`] on the device `device` describes.
fn engine_prefetching_on(device: DeviceConfig, threads: usize, bytes: u64) -> Engine {
    Engine::new(Config {
        device,
        min_rows: 0,
        cache_bytes: 0,
        prefetch_threads: Some(threads),
        prefetch_bytes: bytes,
        dispatch: Dispatch::Always,
        ..Config::default()
    })
    .expect("the backend opens")
}

fn held(weights: &[u8]) -> Arc<Vec<u8>> {
    Arc::new(weights.to_vec())
}

fn announce(engine: &Engine, cases: &[(&Case, &Arc<Vec<u8>>)]) {
    // Metadata only: the dsts must not overlap, their bytes are never written.
    let dsts: Vec<Vec<AtomicU32>> = cases
        .iter()
        .map(|(c, _)| (0..c.dst_len()).map(|_| AtomicU32::new(0)).collect())
        .collect();
    let descs: Vec<_> = cases
        .iter()
        .zip(&dsts)
        .map(|((c, w), d)| c.descs_on(w, d))
        .collect();
    let plan = match &descs[..] {
        [[w, b, ids, d]] => engine.plan(w, b, ids, d),
        [[w0, b, ids, d0], [w1, _, _, d1]] => engine.plan_pair(w0, w1, b, ids, d0, d1),
        _ => unreachable!("one or two projections"),
    }
    .expect("a valid call");
    let weights = cases
        .iter()
        .map(|(_, w)| HeldWeights {
            data: Arc::clone(w) as Arc<dyn HeldBytes>,
            name: Some("blk.0.ffn_gate_exps.weight".into()),
        })
        .collect();
    engine.prefetch(plan, weights).expect("announced");
}

/// Waits until the prefetch threads (they run on their own) reach a state `reached` accepts, and
/// returns it; only a failure takes the minute that fails the test.
fn wait_prefetch(engine: &Engine, reached: impl Fn(&PrefetchStats) -> bool) -> PrefetchStats {
    let start = std::time::Instant::now();
    loop {
        let s = engine.prefetch_stats();
        if reached(&s) {
            return s;
        }
        assert!(start.elapsed().as_secs() < 60, "still {s:?}");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Waits until the prefetch threads staged `n` experts.
fn wait_staged(engine: &Engine, n: u64) {
    wait_prefetch(engine, |s| s.staged >= n);
}

fn distinct_experts(case: &Case) -> u64 {
    let mut ids = case.ids.clone();
    ids.sort_unstable();
    ids.dedup();
    ids.len() as u64
}

/// Without ORK_PREFETCH, threads on the CPUs given. (With neither, on the machine's idle slow
/// cores: `moe::prefetch`'s unit tests, on a described RK3588.)
#[test]
fn by_default_prefetch_threads_run_on_the_cpus_given() {
    let engine = |prefetch_threads: Option<usize>| {
        Engine::new(Config {
            device: DeviceConfig {
                backend: BackendChoice::Emu,
                ..DeviceConfig::default()
            },
            min_rows: 0,
            cache_bytes: 0,
            prefetch_threads,
            prefetch_cpus: vec![ork_moe::pool::allowed_cpus()[0]],
            dispatch: Dispatch::Always,
            ..Config::default()
        })
        .expect("the emulator opens")
    };
    // ORK_PREFETCH_CPUS alone: a thread there, which inflates what is announced.
    let given = engine(None);
    assert!(given.prefetching());
    let one = Case::new(SHAPES[0], 701);
    let w = held(&one.weights);
    announce(&given, &[(&one, &w)]);
    wait_staged(&given, one.s.n_expert as u64);
    // ORK_PREFETCH=0 with CPUs: none.
    assert!(!engine(Some(0)).prefetching());
}

#[test]
fn prefetched_experts_are_taken_and_give_the_same_bits() {
    let plain = engine_on(BackendChoice::Emu, 1);
    let engine = engine_prefetching(2, 1 << 30);
    // One projection (N = 100: padded channels), and a pair in the stream envelope (K = 2048).
    let one = Case::new(SHAPES[0], 700);
    let w = held(&one.weights);
    announce(&engine, &[(&one, &w)]);
    wait_staged(&engine, one.s.n_expert as u64);
    let s = engine.prefetch_stats();
    assert!(one.run_on(&w, &engine, 1) == one.run(&plain, 1), "single");
    let taken = engine.prefetch_stats().taken - s.taken;
    assert_eq!(
        taken,
        distinct_experts(&one),
        "every used expert came staged"
    );

    let gate = Case::new(SHAPES[4], 701);
    let up = gate.sibling(702);
    let (w0, w1) = (held(&gate.weights), held(&up.weights));
    let staged = engine.prefetch_stats().staged;
    announce(&engine, &[(&gate, &w0), (&up, &w1)]);
    wait_staged(&engine, staged + gate.s.n_expert as u64);
    let s = engine.prefetch_stats();
    let cooperative = gate.run_pair_on(&up, [&w0, &w1], &engine, 3);
    assert!(cooperative == gate.run_pair(&up, &plain, 1), "pair");
    let taken = engine.prefetch_stats().taken - s.taken;
    assert_eq!(
        taken,
        distinct_experts(&gate),
        "every used pair came staged"
    );

    // Experts no call took stay one fence, then go.
    engine.prefetch_fence();
    engine.prefetch_fence();
    let s = engine.prefetch_stats();
    assert_eq!(s.staged, s.taken + s.dropped, "{s:?}");
}

#[test]
fn after_a_fence_the_host_weights_are_no_longer_held() {
    // Many experts queued, a fence at once: the queue empties, the threads finish what they hold,
    // and nothing refers to the host's weights any more (they may be freed).
    let engine = engine_prefetching(2, 1 << 30);
    let shape = Shape {
        n_expert: 64,
        ..SHAPES[4]
    };
    let case = Case::new(shape, 710);
    let w = held(&case.weights);
    announce(&engine, &[(&case, &w)]);
    engine.prefetch_fence();
    assert_eq!(
        Arc::strong_count(&w),
        1,
        "the engine still holds the weights"
    );
    let s = engine.prefetch_stats();
    assert_eq!(s.staged + s.withdrawn, 64, "{s:?}");
    // The call still gives its bits, from what was staged and what it inflates itself.
    assert!(case.run_on(&w, &engine, 1) == case.run(&engine_on(BackendChoice::Emu, 1), 1));
}

#[test]
fn the_staging_budget_bounds_what_is_inflated_ahead() {
    // A budget of one byte: each thread may start one expert while the staging area is empty,
    // none after. Once something is staged and both threads wait, nothing moves any more (no
    // call, no fence): the rest stays queued.
    let engine = engine_prefetching(2, 1);
    let case = Case::new(SHAPES[0], 720);
    let w = held(&case.weights);
    announce(&engine, &[(&case, &w)]);
    let s = wait_prefetch(&engine, |s| s.staged > 0 && s.waiting == 2);
    assert!(s.staged <= 2, "{s:?}");
    assert_eq!(s.staged + s.queued, case.s.n_expert as u64, "{s:?}");
    assert!(case.run_on(&w, &engine, 1) == case.run(&engine_on(BackendChoice::Emu, 1), 1));
}

/// While a one-expert call (a dense matmul's) waits for its NPU runs, its threads inflate queued
/// experts of announced calls (`Staging::help_job`); results keep their bits.
#[test]
fn a_dense_call_waiting_for_its_runs_inflates_announced_experts() {
    // Each run takes 200 ms: the call's three threads wait that long for the three runs.
    let s = Standin::new(Sdk::V2_3, "run_us=200000");
    let emu = engine_on(BackendChoice::Emu, 1);
    let npu = engine_on_runtime(&s.path, 1);
    // 512 small experts queued: more than the one prefetch thread inflates in that time.
    let later = Case::new(
        Shape {
            ty: GgmlType::Q4_0,
            k: 512,
            n: 256,
            n_expert: 512,
            n_used: 2,
            n_tokens: 4,
            b_rows: 1,
            dst_gap: 0,
        },
        840,
    );
    let w = held(&later.weights);
    announce(&npu, &[(&later, &w)]);
    let dense = Case::new(DENSE, 841);
    assert!(dense.run(&npu, 3) == dense.run(&emu, 1), "dense call");
    let st = npu.prefetch_stats();
    assert!(
        st.helped > 0,
        "the waiting threads inflated nothing: {st:?}"
    );
    assert!(
        later.run_on(&w, &npu, 1) == later.run(&emu, 1),
        "later call"
    );
    npu.prefetch_fence();
    let st = npu.prefetch_stats();
    assert_eq!(st.staged + st.withdrawn, 512, "{st:?}");
}

/// [`engine_prefetching`] on the rknn backend through the stand-in runtime at `lib` (the board's
/// path: its submitter threads, one per core).
fn engine_on_runtime(lib: &str, prefetch_threads: usize) -> Engine {
    let device = DeviceConfig {
        backend: BackendChoice::Rknn,
        rknn: rknn::Config {
            lib: Some(lib.into()),
            ..rknn::Config::default()
        },
        ..DeviceConfig::default()
    };
    engine_prefetching_on(device, prefetch_threads, 1 << 30)
}

/// The whole engine on the vendor runtime's API, as a board runs it: single and paired calls,
/// from one caller and from three cooperating ones, then the same with prefetch threads
/// allocating and syncing buffers while calls bind and run. Every result has the emulator's
/// bits, the runtime sees no breach of the rules it leaves undocumented (two binds of one
/// buffer at once, a buffer freed under its views), binds never overlap, and once the engines
/// are gone no buffer or context is left.
#[test]
fn on_the_vendor_runtime_calls_and_prefetches_give_the_emulators_bits() {
    // Each bind holds its buffer 50 µs: a window for concurrent binds to show.
    let s = Standin::new(Sdk::V2_3, "bind_us=50");
    let emu = engine_on(BackendChoice::Emu, 1);
    {
        let npu = engine_on_runtime(&s.path, 0);
        for (i, &shape) in SHAPES.iter().enumerate() {
            let case = Case::new(shape, 800 + i as u64);
            let want = case.run(&emu, 1);
            assert!(case.run(&npu, 1) == want, "{shape:?}");
            assert!(case.run(&npu, 3) == want, "{shape:?}, 3 callers");
        }
        let gate = Case::new(SHAPES[4], 810);
        let up = gate.sibling(811);
        assert!(
            gate.run_pair(&up, &npu, 3) == gate.run_pair(&up, &emu, 1),
            "pair"
        );
        // One expert with every row (a dense matmul's): split over the three cores' submitters,
        // two parts each (`submitter_ways`).
        let dense = Case::new(DENSE, 830);
        let runs = s.counters().runs;
        assert!(dense.run(&npu, 1) == dense.run(&emu, 1), "one expert");
        assert_eq!(s.counters().runs - runs, 6, "two runs per core");
    }
    {
        let npu = engine_on_runtime(&s.path, 2);
        let gate = Case::new(SHAPES[4], 820);
        let up = gate.sibling(821);
        let (w0, w1) = (held(&gate.weights), held(&up.weights));
        announce(&npu, &[(&gate, &w0), (&up, &w1)]);
        wait_staged(&npu, gate.s.n_expert as u64);
        let taken = npu.prefetch_stats().taken;
        assert!(
            gate.run_pair_on(&up, [&w0, &w1], &npu, 3) == gate.run_pair(&up, &emu, 1),
            "prefetched pair"
        );
        assert_eq!(
            npu.prefetch_stats().taken - taken,
            distinct_experts(&gate),
            "every used pair came staged"
        );
        // Announced and at once called: the call and the prefetch threads race for the experts.
        let one = Case::new(SHAPES[0], 822);
        let w = held(&one.weights);
        announce(&npu, &[(&one, &w)]);
        assert!(one.run_on(&w, &npu, 3) == one.run(&emu, 1), "racing call");
        npu.prefetch_fence();
    }
    let n = s.counters();
    assert!(n.runs > 0, "{n:?}");
    assert_eq!((n.violations, n.overlapping_binds), (0, 0), "{n:?}");
    assert_eq!(
        (n.live_buffers, n.live_views, n.live_contexts),
        (0, 0, 0),
        "{n:?}"
    );
}
