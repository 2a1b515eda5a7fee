use super::*;
use ork_moe::quant::GgmlType;

/// A ubatch of `shape` with every used expert getting the same rows, every one a miss.
fn even(shape: &ModelShape, layers: usize, tokens: usize, p: &Params) -> UbatchWork {
    let rates = CpuRates::from_reference(p);
    let used = shape.n_expert.min(tokens * shape.n_used);
    let rows = (tokens * shape.n_used / used) as u32;
    let mut calls = Vec::new();
    for layer in 0..layers as u32 {
        for (proj, k, n) in [
            (Proj::Gate, shape.hidden, shape.expert_ff),
            (Proj::Up, shape.hidden, shape.expert_ff),
            (Proj::Down, shape.expert_ff, shape.hidden),
        ] {
            let act_rows = if proj == Proj::Down {
                tokens * shape.n_used
            } else {
                tokens
            };
            calls.push(CallWork {
                layer,
                proj,
                k,
                n,
                ty: GgmlType::Q4_0,
                act_rows: act_rows as u64,
                n_expert: shape.n_expert,
                experts: vec![ExpertCall { rows, hit: false }; used],
            });
        }
    }
    UbatchWork {
        tokens,
        calls,
        dense: vec![rates.dense_layer(shape, tokens, p, false); layers],
    }
}

/// `ub` with `shape`'s dense matmuls as calls of one expert (every row, a miss), ordered as
/// ggml runs them, and the dense part's CPU work without them.
fn with_dense_calls(ub: &UbatchWork, shape: &ModelShape, p: &Params) -> UbatchWork {
    let rates = CpuRates::from_reference(p);
    let layers = ub.dense.len();
    let mut calls = Vec::new();
    for layer in 0..layers as u32 {
        let dense = |proj: Proj| {
            shape
                .dense_matmuls()
                .into_iter()
                .filter(move |&(x, ..)| x == proj)
                .map(move |(proj, k, n)| CallWork {
                    layer,
                    proj,
                    k,
                    n,
                    ty: GgmlType::Q4_0,
                    act_rows: ub.tokens as u64,
                    n_expert: 1,
                    experts: vec![ExpertCall {
                        rows: ub.tokens as u32,
                        hit: false,
                    }],
                })
        };
        calls.extend(dense(Proj::AttnIn).chain(dense(Proj::AttnOut)));
        calls.extend(ub.calls.iter().filter(|c| c.layer == layer).cloned());
        calls.extend(dense(Proj::Shared));
    }
    UbatchWork {
        tokens: ub.tokens,
        calls,
        dense: vec![rates.dense_layer(shape, ub.tokens, p, true); layers],
    }
}

#[test]
fn dense_calls_take_the_projections_off_the_cpu_and_inflate_in_their_call() {
    let p = Params::default();
    let s = ModelShape::QWEN3_30B_A3B;
    let routed = even(&s, 4, 2048, &p);
    let both = with_dense_calls(&routed, &s, &p);
    let model = |ub: &UbatchWork, e: &EngineModel| {
        model_ubatch(ub, e, &p, 1 << 30, &mut ContextCache::default()).unwrap()
    };
    for e in [
        EngineModel::without_prefetch(),
        EngineModel::with_prefetch(),
    ] {
        let (routed_only, with_dense) = (model(&routed, &e), model(&both, &e));
        // The projections' MACs move to the NPU: more NPU time, far less ubatch time.
        let macs = 4.0 * 2048.0 * s.dense_matmul_macs_per_token_layer();
        let npu_us = 2.0 * macs / (p.cores * p.core_tops * 1e12) * 1e6;
        let more = with_dense.experts.bound.npu_us - routed_only.experts.bound.npu_us;
        assert!(more > npu_us && more < 1.2 * npu_us, "{more} vs {npu_us}");
        assert!(
            with_dense.whole.scheduled_us < 0.8 * routed_only.whole.scheduled_us,
            "{}",
            e.name
        );
        let e_sched = &with_dense.experts;
        assert!(e_sched.scheduled_us >= e_sched.bound.us() * (1.0 - 1e-9));
    }
    // The patch announces only the MUL_MAT_IDs: the prefetcher inflates the routed experts
    // on the A55s, each dense call its one matrix on ggml's threads, in the call.
    let g = build(
        &both,
        &EngineModel::with_prefetch(),
        &p,
        1 << 30,
        &mut ContextCache::default(),
        true,
    );
    let units = |big: bool| {
        g.tasks
            .iter()
            .filter(|t| t.work.stage() == Stage::Inflate)
            .filter(|t| (t.unit == Unit::Big) == big)
            .count()
    };
    assert_eq!(units(true), 4 * 4);
    assert_eq!(units(false), 4 * 2 * s.n_expert);
    // A dense call's one expert is split over the three cores, two parts each: six runs.
    let runs = g
        .tasks
        .iter()
        .filter(|t| matches!(t.work, Work::Run { m: 2048, .. }))
        .count();
    assert_eq!(runs, 4 * 4 * 6);
}

#[test]
fn a_ubatch_moves_about_75_gb_and_computes_about_1_5_s_on_the_npu() {
    // Per 512-token ubatch of Qwen3-30B-A3B, all 48 layers streamed: Q4 read + int8 written
    // by inflate + int8 read by the NPU is about 75 GB.
    let p = Params::default();
    let s = ModelShape::QWEN3_30B_A3B;
    let ub = even(&s, s.layers, 512, &p);
    let mut ctx = ContextCache::default();
    let g = build(&ub, &EngineModel::pipelined(), &p, 1 << 30, &mut ctx, false);
    let t = timeline(&g, &p).unwrap();
    let inflate = t.stage_bytes[Stage::REPORTED
        .iter()
        .position(|&x| x == Stage::Inflate)
        .unwrap()];
    let npu = t.stage_bytes[Stage::REPORTED
        .iter()
        .position(|&x| x == Stage::Npu)
        .unwrap()];
    let experts = (s.layers * 3 * s.n_expert) as u64;
    let q4 = experts * 768 * (2048 / 32 * 18);
    let int8 = experts * 768 * 2048;
    assert_eq!(inflate, q4 + int8);
    // The NPU also reads A and writes C: a little more than the weights.
    assert!(npu > int8 && npu < int8 + int8 / 5, "{npu}");
    let moved = (inflate + npu) as f64 / 1e9;
    assert!((72.0..80.0).contains(&moved), "{moved} GB");
    // NPU compute at 3 x 0.4 TOPS: about 1.5 s.
    let macs = 512.0 * s.expert_macs_per_token_layer() * s.layers as f64;
    let compute_s = 2.0 * macs / (3.0 * p.core_tops * 1e12);
    assert!((1.4..1.7).contains(&compute_s), "{compute_s}");
    assert!(t.bound.npu_us > compute_s * 1e6);
}

#[test]
fn a_profile_gives_the_same_figures_as_the_same_parameters_given_directly() {
    let mut p = Params::default();
    p.set("run_us_floor", 61.0).unwrap();
    p.set("core_tops", 0.9).unwrap();
    p.set("inflate_gbps_big_core", 7.5).unwrap();
    p.set("context_create_us", 800.0).unwrap();
    let s = ModelShape::QWEN3_30B_A3B;
    let ub = even(&s, 2, 512, &p);
    let info = ProfileInfo {
        backend: "emu".into(),
        runtime_version: "n/a".into(),
        ..ProfileInfo::default()
    };
    let text = serde_json::Value::Object(profile::fields(&p, &info)).to_string();
    let loaded = profile::read(&text, "board.json").unwrap();
    for engine in [EngineModel::blocking(), EngineModel::pipelined()] {
        let direct = model_ubatch(&ub, &engine, &p, 1 << 30, &mut ContextCache::default());
        let profiled = model_ubatch(
            &ub,
            &engine,
            &loaded.params,
            1 << 30,
            &mut ContextCache::default(),
        );
        assert_eq!(direct.unwrap(), profiled.unwrap());
    }
}

#[test]
fn the_engine_and_pipelining_beat_blocking_submits() {
    let p = Params::default();
    let s = ModelShape::QWEN3_30B_A3B;
    let ub = even(&s, 4, 512, &p);
    let mut results = Vec::new();
    for engine in [
        EngineModel::blocking(),
        EngineModel::without_prefetch(),
        EngineModel::pipelined(),
        EngineModel::pipelined_fused(),
    ] {
        let m = model_ubatch(&ub, &engine, &p, 1 << 30, &mut ContextCache::default()).unwrap();
        let e = &m.experts;
        // No schedule beats the resources or the dependencies, or is slower than serial.
        assert!(
            e.scheduled_us >= e.bound.us() * (1.0 - 1e-9),
            "{}",
            engine.name
        );
        assert!(e.scheduled_us >= e.bound.critical_path_us * (1.0 - 1e-9));
        assert!(e.scheduled_us <= e.serial_us * (1.0 + 1e-9));
        assert!(m.whole.scheduled_us >= e.scheduled_us);
        results.push(m);
    }
    let (blocking, engine) = (&results[0], &results[1]);
    let (piped, fused) = (&results[2], &results[3]);
    assert!(piped.experts.scheduled_us < blocking.experts.scheduled_us);
    // The engine (submitters, recycled B, pairs) beats submits blocking ggml's threads.
    assert!(engine.experts.scheduled_us < blocking.experts.scheduled_us);
    assert_eq!(engine.experts.buffers_created, 0);
    assert!(fused.experts.runs < piped.experts.runs);
    assert_eq!(blocking.experts.runs, piped.experts.runs);
    // Blocking: one fresh buffer per miss; the pipelined ring allocates none.
    assert_eq!(blocking.experts.buffers_created, 4 * 3 * 128);
    assert_eq!(piped.experts.buffers_created, 0);
    // Pipelined, inflated experts stay inside one IOMMU domain.
    assert!(piped.experts.peak_resident_bytes as f64 <= p.domain_mb * (1u64 << 20) as f64);
}

#[test]
fn the_outlier_split_costs_the_down_experts_their_columns() {
    // 55 columns of 2048 weights per down expert, 128 experts, 2 layers, at the Q4_0 rate.
    let mut p = Params::default();
    let s = ModelShape::QWEN3_30B_A3B;
    let ub = even(&s, 2, 512, &p);
    let at = Stage::REPORTED
        .iter()
        .position(|&x| x == Stage::Outliers)
        .unwrap();
    let model = |p: &Params, engine: &EngineModel| {
        model_ubatch(&ub, engine, p, 1 << 30, &mut ContextCache::default()).unwrap()
    };
    let with = model(&p, &EngineModel::without_prefetch());
    let want = (2 * 128 * 55 * 2048) as f64 / (p.outlier_gweights_big_core * 1e3);
    let got = with.experts.stage_us[at];
    assert!((got - want).abs() < 1e-6 * want, "{got} vs {want}");
    assert_eq!(
        model(&p, &EngineModel::blocking()).experts.stage_us[at],
        0.0
    );
    p.set("outlier_columns_down", 0.0).unwrap();
    let without = model(&p, &EngineModel::without_prefetch());
    assert_eq!(without.experts.stage_us[at], 0.0);
    assert!(without.experts.serial_us < with.experts.serial_us);
    assert!(without.experts.scheduled_us <= with.experts.scheduled_us);
}

#[test]
fn inflated_experts_never_overfill_the_ring() {
    // A domain of 64 MiB holds 42 experts of 1.5 MiB: the ring binds within a call.
    let mut p = Params::default();
    p.set("domain_mb", 64.0).unwrap();
    let s = ModelShape::QWEN3_30B_A3B;
    let ub = even(&s, 3, 512, &p);
    for engine in [EngineModel::pipelined(), EngineModel::pipelined_fused()] {
        let m = model_ubatch(&ub, &engine, &p, 1 << 30, &mut ContextCache::default()).unwrap();
        assert!(m.experts.peak_resident_bytes <= 64 << 20, "{}", engine.name);
        assert!(m.experts.peak_resident_bytes > 32 << 20);
    }
}

#[test]
fn prefetching_on_the_little_cores_beats_the_engine_within_its_budget() {
    let mut p = Params::default();
    let s = ModelShape::QWEN3_30B_A3B;
    let ub = even(&s, s.layers, 512, &p);
    let model = |p: &Params, e: &EngineModel| {
        model_ubatch(&ub, e, p, 1 << 30, &mut ContextCache::default()).unwrap()
    };
    let (engine, ahead) = (
        model(&p, &EngineModel::without_prefetch()),
        model(&p, &EngineModel::with_prefetch()),
    );
    // The gain is the A55s inflating during the dense part (the A76s'); the expert part
    // alone, inflated at A55 speed, need not be faster.
    assert!(ahead.whole.scheduled_us < engine.whole.scheduled_us);
    // The same experts inflated, every one on an A55: at little_core_factor of the speed.
    let at = Stage::REPORTED
        .iter()
        .position(|&x| x == Stage::Inflate)
        .unwrap();
    assert_eq!(
        ahead.experts.stage_bytes[at],
        engine.experts.stage_bytes[at]
    );
    let ratio = engine.experts.stage_us[at] / ahead.experts.stage_us[at];
    assert!((ratio - p.little_core_factor).abs() < 1e-9, "{ratio}");
    let g = build(
        &ub,
        &EngineModel::with_prefetch(),
        &p,
        1 << 30,
        &mut ContextCache::default(),
        true,
    );
    let inflates: Vec<_> = g
        .tasks
        .iter()
        .filter(|t| t.work.stage() == Stage::Inflate)
        .collect();
    assert_eq!(inflates.len(), s.layers * 2 * s.n_expert);
    assert!(inflates.iter().all(|t| t.unit == Unit::Little));
    // The prefetcher starts at graph begin: the first call's inflates wait for nothing (the
    // budget holds all of them), so they overlap layer 0's dense part.
    assert!(inflates[..s.n_expert].iter().all(|t| t.deps.is_empty()));
    assert!(inflates[s.n_expert..].iter().any(|t| !t.deps.is_empty()));
    // The staging budget, not the IOMMU domain, bounds what is resident, and it binds: the
    // A55s get ahead during the dense part.
    for mb in [1024.0, 256.0] {
        p.set("prefetch_mb", mb).unwrap();
        let budget = (mb * (1u64 << 20) as f64) as u64;
        let peak = model(&p, &EngineModel::with_prefetch())
            .whole
            .peak_resident_bytes;
        assert!(peak <= budget && peak > budget / 2, "{mb} MiB: {peak}");
    }
    let piped = model(&p, &EngineModel::pipelined())
        .whole
        .peak_resident_bytes;
    assert!(piped > 1 << 30, "{piped}");
}

#[test]
fn contexts_are_created_once_per_shape_and_core() {
    let p = Params::default();
    let s = ModelShape::QWEN3_30B_A3B;
    let ub = even(&s, 2, 512, &p);
    let mut ctx = ContextCache::default();
    let g = build(&ub, &EngineModel::blocking(), &p, 1 << 30, &mut ctx, false);
    let first = timeline(&g, &p).unwrap();
    // One M (32 rows per expert): gate/up on core 0 share one context, down has 3 slices.
    assert_eq!(first.contexts_created, 1 + 3);
    let g = build(&ub, &EngineModel::blocking(), &p, 1 << 30, &mut ctx, false);
    assert_eq!(timeline(&g, &p).unwrap().contexts_created, 0);
    assert_eq!(ctx.created, 4);
}

#[test]
fn submitters_cost_cpu_time_per_run() {
    let mut p = Params::default();
    let s = ModelShape::QWEN3_30B_A3B;
    let ub = even(&s, 2, 64, &p);
    let submit_us = |p: &Params| {
        let mut ctx = ContextCache::default();
        let g = build(
            &ub,
            &EngineModel::with_prefetch(),
            p,
            1 << 30,
            &mut ctx,
            false,
        );
        let t = timeline(&g, p).unwrap();
        let at = Stage::REPORTED
            .iter()
            .position(|&x| x == Stage::Submit)
            .unwrap();
        (t.stage_us[at], t.runs, t.scheduled_us)
    };
    let (us, runs, scheduled) = submit_us(&p);
    assert!(runs > 0);
    assert!(
        (us - runs as f64 * 10.0).abs() < 1e-6,
        "{us} for {runs} runs"
    );
    p.set("submit_cpu_us", 1000.0).unwrap();
    let (us, _, slower) = submit_us(&p);
    assert!((us - runs as f64 * 1000.0).abs() < 1e-6);
    assert!(slower > scheduled, "{slower} vs {scheduled}");
}

#[test]
fn a_slower_memory_controller_slows_the_dram_bound_ubatch() {
    let p = Params::default();
    let s = ModelShape::QWEN3_30B_A3B;
    let ub = even(&s, 4, 512, &p);
    let tokps = |p: &Params| {
        let mut ctx = ContextCache::default();
        model_ubatch(&ub, &EngineModel::with_prefetch(), p, 1 << 30, &mut ctx)
            .unwrap()
            .prefill_tokps(512)
    };
    let mut parked = p.clone();
    parked.set("dmc_mhz", 528.0).unwrap();
    assert_eq!(parked.at_dmc().shared_dram_gbps, p.shared_dram_gbps / 4.0);
    assert_eq!(
        parked.at_dmc().memcpy_gbps_big_core,
        p.memcpy_gbps_big_core / 4.0
    );
    let (fast, slow) = (tokps(&p), tokps(&parked));
    assert!(slow < 0.6 * fast, "{slow} vs {fast}");
}
