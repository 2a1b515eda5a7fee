//! `ork-probe model`'s output: the tables, or one JSON row per case.

use super::modelled::{engines, reference};
use super::{ms, Case, Setup};
use crate::json;
use ork_probe::timeline::{self, Stage, Timeline, UbatchModel};
use serde_json::{json, Map, Value};

/// The tables: what the engine did here, the modelled RK3588 time per ubatch, the last ubatch's
/// stages, and the board model's parameters.
pub fn print_tables(s: &Setup, cases: &[Case]) {
    print_header(s, cases);
    println!();
    print_measured(s, cases);
    println!();
    print_modelled(s, cases);
    println!();
    print_stages(cases);
    println!();
    print_parameters(s, cases);
}

fn print_header(s: &Setup, cases: &[Case]) {
    let (o, cfg) = (&s.o, &s.cfg);
    let threads = cfg.device.host.threads;
    println!(
        "ork-probe model: routing {}, cache {} MiB, {} layer(s) run here per ubatch ({} thread(s) of \
         this machine, backend {}); the RK3588 figures are MODELLED for all layers of the model",
        o.routing.name(),
        cfg.cache_bytes >> 20,
        o.layers,
        threads,
        cases.first().map_or("-", |c| c.backend)
    );
    for c in cases.iter().take(1) {
        println!(
            "dense matmuls in the library (ORK_DENSE): {} per ubatch of {} ({} per layer: the \
             attention projections, and a shared expert's where the model has one{})",
            c.dense_calls,
            c.shape.name,
            c.dense_calls / c.shape.layers,
            if c.dense_calls == 0 { ", off" } else { "" }
        );
    }
}

fn print_measured(s: &Setup, cases: &[Case]) {
    let o = &s.o;
    println!("measured here, per ubatch, the layers run here (quant includes the gather into native A; ms):");
    println!(
        "{:<18} {:<5} {:>5} {:>2} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>6} {:>6} {:>6} {:>7} {:>7} {:>5} {:>10}",
        "config", "type", "ub", "#", "route", "quant", "inflate", "gemm", "scatter", "wall", "hits",
        "misses", "evict", "GB infl", "submits", "bufs", "tok/s(all)"
    );
    for c in cases {
        for u in &c.ubatches {
            let m = &u.measured;
            let s = m.stages;
            let scale = c.shape.layers as f64 / o.layers as f64;
            println!(
                "{:<18} {:<5} {:>5} {:>2} {:>7.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>6} {:>6} {:>6} {:>7.2} {:>7} {:>5} {:>10.1}",
                c.shape.name,
                c.ty.name(),
                c.tokens,
                u.index,
                s.route as f64 / 1e6,
                s.quant as f64 / 1e6,
                s.inflate as f64 / 1e6,
                s.gemm as f64 / 1e6,
                s.scatter as f64 / 1e6,
                ms(m.wall_us),
                m.hits,
                m.misses,
                m.evictions,
                m.bytes_inflated as f64 / 1e9,
                m.submits,
                m.buffers,
                c.tokens as f64 * 1e6 / (m.wall_us * scale),
            );
        }
    }
}

fn print_modelled(s: &Setup, cases: &[Case]) {
    let settings = &s.settings;
    println!(
        "modelled RK3588, whole model, per ubatch (expert part: serial / as scheduled / bound and \
         what sets it; ms):"
    );
    println!(
        "{:<18} {:<5} {:>5} {:>2} | {:>8} {:>8} {:>8} {:<4} | {:>8} {:>8} {:<4} | {:>8} {:>8} {:<4} | {:>8} {:>8} {:<4} | {:>6} {:>4} | {:>7} {:>7} {:>7} {:>7} {:>7} {:>6}",
        "config", "type", "ub", "#", "engine", "sched", "bound", "", "prefetch", "bound", "",
        "piped", "bound", "", "fused", "bound", "", "runs", "ctx", "engine", "prefch", "piped",
        "fused", "ref", "best×"
    );
    for c in cases {
        let (ref_tokps, _) = reference(c, &settings.params);
        for u in &c.ubatches {
            let [t, p, f, pf] = [&u.models[0], &u.models[1], &u.models[2], &u.models[3]];
            let best = u
                .models
                .iter()
                .map(|m| m.prefill_tokps(c.tokens))
                .fold(0.0, f64::max);
            println!(
                "{:<18} {:<5} {:>5} {:>2} | {:>8.0} {:>8.0} {:>8.0} {:<4} | {:>8.0} {:>8.0} {:<4} | {:>8.0} {:>8.0} {:<4} | {:>8.0} {:>8.0} {:<4} | {:>6} {:>4} | {:>7.1} {:>7.1} {:>7.1} {:>7.1} {:>7.1} {:>5.2}×",
                c.shape.name,
                c.ty.name(),
                c.tokens,
                u.index,
                ms(t.experts.serial_us),
                ms(t.experts.scheduled_us),
                ms(t.experts.bound.us()),
                t.experts.bound.limit(),
                ms(pf.experts.scheduled_us),
                ms(pf.experts.bound.us()),
                pf.experts.bound.limit(),
                ms(p.experts.scheduled_us),
                ms(p.experts.bound.us()),
                p.experts.bound.limit(),
                ms(f.experts.scheduled_us),
                ms(f.experts.bound.us()),
                f.experts.bound.limit(),
                t.experts.runs,
                t.experts.contexts_created,
                t.prefill_tokps(c.tokens),
                pf.prefill_tokps(c.tokens),
                p.prefill_tokps(c.tokens),
                f.prefill_tokps(c.tokens),
                ref_tokps,
                best / ref_tokps,
            );
        }
    }
}

fn print_stages(cases: &[Case]) {
    println!("modelled RK3588, last ubatch: serial time per stage of the expert part (ms), and the whole ubatch");
    let names: Vec<&str> = Stage::REPORTED[..Stage::REPORTED.len() - 1]
        .iter()
        .map(|s| s.name())
        .collect();
    println!(
        "{:<18} {:<5} {:>5} {:<16} {} {:>9} {:>8} {:>9} {:>8}",
        "config",
        "type",
        "ub",
        "engine",
        names
            .iter()
            .map(|n| format!(
                "{:>11}",
                n.replace("buffer_", "buf_").replace("context_", "ctx_")
            ))
            .collect::<String>(),
        "GB dram",
        "dense",
        "ubatch",
        "amdahl"
    );
    for c in cases {
        let last = c.ubatches.last().expect("at least one ubatch");
        for (e, m) in engines().iter().zip(&last.models) {
            let x = &m.experts;
            let cols: String = Stage::REPORTED[..Stage::REPORTED.len() - 1]
                .iter()
                .map(|&s| format!("{:>11.0}", ms(stage_us(x, s))))
                .collect();
            println!(
                "{:<18} {:<5} {:>5} {:<16} {} {:>9.1} {:>8.0} {:>9.0} {:>7.1}",
                c.shape.name,
                c.ty.name(),
                c.tokens,
                e.name,
                cols,
                x.dram_bytes as f64 / 1e9,
                ms(c.dense_us),
                ms(m.whole.scheduled_us),
                c.tokens as f64 * 1e6 / c.dense_us,
            );
        }
    }
}

fn print_parameters(s: &Setup, cases: &[Case]) {
    let settings = &s.settings;
    println!("board model parameters (value, unit, source):");
    for line in settings.describe() {
        println!("  {line}");
    }
    for c in cases {
        let (tokps, src) = reference(c, &settings.params);
        println!(
            "reference for {}: {:.1} tok/s CPU-only ({src}); modelled CPU-only for a {}-token prompt: {:.1} tok/s",
            c.shape.name, tokps, c.tokens, c.cpu_only_tokps
        );
    }
}

fn stage_us(t: &Timeline, s: Stage) -> f64 {
    let i = Stage::REPORTED
        .iter()
        .position(|&x| x == s)
        .expect("reported");
    t.stage_us[i]
}

/// One JSON row per case: its last ubatch, measured here and modelled, and the board model's
/// parameters. Counts are written as floats, as every number of the row.
pub fn print_json(s: &Setup, cases: &[Case]) {
    let params: Map<String, Value> = timeline::SPECS
        .iter()
        .map(|spec| {
            let v = s.settings.params.get(spec.name).expect("a parameter");
            (spec.name.to_string(), json!(v))
        })
        .collect();
    json::print_rows(cases.iter().map(|c| row(s, c, &params)).collect());
}

fn row(s: &Setup, c: &Case, params: &Map<String, Value>) -> Value {
    let (o, cfg) = (&s.o, &s.cfg);
    let u = c.ubatches.last().expect("at least one ubatch");
    let first = c.ubatches.first().expect("at least one ubatch");
    let m = &u.measured;
    let scale = c.shape.layers as f64 / o.layers as f64;
    let t = &u.models[0];
    let (ref_tokps, ref_src) = reference(c, &s.settings.params);
    // Full model: the hits the modelled calls have (`Board::ubatch`); every other lookup a miss.
    let (hits, lookups) = (u.full_hits as f64, u.full_lookups as f64);
    let misses = lookups - hits;
    let per_miss = m.bytes_inflated as f64 / m.misses.max(1) as f64;
    let us_of_ns = |ns: u64| ns as f64 / 1e3;
    let mut fields: Map<String, Value> = [
        ("config", json!(c.shape.name)),
        ("layers", json!(c.shape.layers as f64)),
        ("measured_layers", json!(o.layers as f64)),
        (
            "modelled_layers_from",
            json!(format!(
                "the {} layer(s) measured here, repeated to {} (measured counts scaled by {:.1})",
                o.layers, c.shape.layers, scale
            )),
        ),
        ("type", json!(c.ty.name())),
        ("ubatch", json!(c.tokens as f64)),
        ("ubatch_index", json!(u.index as f64)),
        ("routing", json!(o.routing.name())),
        ("backend_here", json!(c.backend)),
        ("cache_mb", json!((cfg.cache_bytes >> 20) as f64)),
        ("hit_rate", json!(hits / lookups.max(1.0))),
        ("cache_hits", json!(hits)),
        ("cache_misses", json!(misses)),
        ("bytes_inflated", json!(misses * per_miss)),
        (
            "measured_hit_rate",
            json!(m.hits as f64 / (m.hits + m.misses).max(1) as f64),
        ),
        ("measured_cache_evictions", json!(m.evictions as f64)),
        ("measured_bytes_inflated", json!(m.bytes_inflated as f64)),
        ("measured_buffers_created", json!(m.buffers as f64)),
        ("submits", json!(m.submits as f64 * scale)),
        ("dense_calls", json!(c.dense_calls as f64)),
        ("npu_runs", json!(t.experts.runs as f64)),
        ("contexts_created", json!(t.experts.contexts_created as f64)),
        (
            "contexts_created_first_ubatch",
            json!(first.models[0].experts.contexts_created as f64),
        ),
        ("measured_route_us", json!(us_of_ns(m.stages.route))),
        ("measured_quant_gather_us", json!(us_of_ns(m.stages.quant))),
        ("measured_inflate_us", json!(us_of_ns(m.stages.inflate))),
        ("measured_gemm_us", json!(us_of_ns(m.stages.gemm))),
        ("measured_scatter_us", json!(us_of_ns(m.stages.scatter))),
        ("measured_wall_us", json!(m.wall_us)),
        (
            "measured_expert_tokps",
            json!(c.tokens as f64 * 1e6 / (m.wall_us * scale)),
        ),
        ("modelled_serial_us", json!(t.experts.serial_us)),
        ("modelled_scheduled_us", json!(t.experts.scheduled_us)),
        ("modelled_bound_us", json!(t.experts.bound.us())),
        ("modelled_bound_limit", json!(t.experts.bound.limit())),
        (
            "modelled_critical_path_us",
            json!(t.experts.bound.critical_path_us),
        ),
        ("modelled_dram_bytes", json!(t.experts.dram_bytes as f64)),
        ("modelled_dense_us", json!(c.dense_us)),
        ("modelled_ubatch_us", json!(t.whole.scheduled_us)),
        ("modelled_prefill_tokps", json!(t.prefill_tokps(c.tokens))),
        (
            "amdahl_ceiling_tokps",
            json!(c.tokens as f64 * 1e6 / c.dense_us),
        ),
        ("cpu_only_reference_tokps", json!(ref_tokps)),
        ("cpu_only_reference_source", json!(ref_src)),
        ("cpu_only_modelled_tokps", json!(c.cpu_only_tokps)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    for (name, i) in [("pipelined", 1), ("fused", 2), ("prefetch", 3)] {
        fields.extend(variant_fields(
            name,
            &u.models[i],
            &first.models[i],
            c.tokens,
        ));
    }
    for (i, stage) in Stage::REPORTED.iter().enumerate() {
        if *stage != Stage::Dense {
            let name = format!("modelled_{}_serial_us", stage.name());
            fields.insert(name, json!(t.experts.stage_us[i]));
        }
    }
    fields.insert("board_params".into(), Value::Object(params.clone()));
    if let Some(info) = &s.settings.profile {
        fields.insert("board_profile".into(), json!(info.path));
    }
    Value::Object(fields)
}

/// The fields of an engine model other than the engine's own, named after it: `last` its last
/// ubatch, `first` its first.
fn variant_fields(
    name: &str,
    last: &UbatchModel,
    first: &UbatchModel,
    tokens: usize,
) -> Vec<(String, Value)> {
    let x = &last.experts;
    vec![
        (format!("{name}_serial_us"), json!(x.serial_us)),
        (format!("{name}_scheduled_us"), json!(x.scheduled_us)),
        (format!("{name}_bound_us"), json!(x.bound.us())),
        (format!("{name}_bound_limit"), json!(x.bound.limit())),
        (format!("{name}_ubatch_us"), json!(last.whole.scheduled_us)),
        (
            format!("{name}_prefill_tokps"),
            json!(last.prefill_tokps(tokens)),
        ),
        (format!("{name}_npu_runs"), json!(x.runs as f64)),
        (
            format!("{name}_contexts_created_first_ubatch"),
            json!(first.experts.contexts_created as f64),
        ),
        // The whole ubatch's: a prefetcher gets ahead during the dense part.
        (
            format!("{name}_peak_resident_mib"),
            json!(last.whole.peak_resident_bytes as f64 / (1u64 << 20) as f64),
        ),
    ]
}
