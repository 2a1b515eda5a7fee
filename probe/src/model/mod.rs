//! `ork-probe model`: whole forward passes' MUL_MAT_ID calls of a named MoE configuration through
//! the engine on this machine, and the modelled RK3588 timeline of the same work
//! (`ork_probe::timeline`).
//!
//! Per layer the probe makes the calls ggml makes ([`calls`]): the dense matmuls the engine takes
//! (q, k, v, o; a shared expert's after the routed experts; none with `ORK_DENSE=0`), then gate
//! and up (the layer input) and down (the SiLU·mul output, one row per token and slot), with
//! synthetic weights at their real sizes ([`weights`]) and routing from [`routing`]. It measures
//! what the engine does here, then builds the board model's work graph of the whole model from
//! the counts of each call (rows per used expert, cache hits and misses, submits): the layers it
//! ran stand for all of the model's layers, repeated in turn ([`modelled`];
//! `modelled_layers_from` in the JSON says so). [`output`] prints the results, [`chart`] draws
//! them.

mod calls;
mod chart;
mod modelled;
mod options;
mod output;
mod public;
mod range;
mod routing;
mod weights;

use calls::{Layers, Measured};
use modelled::{full_weight_bytes, Board};
pub use options::Options;
use ork_moe::moe::Config;
use ork_moe::quant::GgmlType;
use ork_probe::gguf;
use ork_probe::timeline::{ModelShape, Settings, UbatchModel};
use std::process::ExitCode;
use std::time::Instant;

/// What every case runs and models with.
struct Setup {
    o: Options,
    /// The board model's parameters (`--profile`, `--param`).
    settings: Settings,
    /// The library's configuration, with the options applied.
    cfg: Config,
}

/// One ubatch: measured here, and modelled under each engine model.
struct UbatchResult {
    index: usize,
    measured: Measured,
    models: Vec<UbatchModel>,
    /// Cache hits and lookups of the whole model's calls as modelled ([`Board::ubatch`]).
    full_hits: u64,
    full_lookups: u64,
}

struct Case {
    shape: ModelShape,
    ty: GgmlType,
    tokens: usize,
    backend: &'static str,
    ubatches: Vec<UbatchResult>,
    cpu_only_tokps: f64,
    dense_us: f64,
    /// Dense matmuls the library takes per ubatch, all layers (0 with `ORK_DENSE=0`).
    dense_calls: usize,
    /// The last ubatch's prefill under the range's parameter sets.
    range: range::Range,
}

pub fn run(o: Options) -> Result<ExitCode, String> {
    let s = setup(o)?;
    let started = Instant::now();
    let mut cases = Vec::new();
    for &shape in &s.o.configs {
        for &ty in &s.o.types {
            for &tokens in &s.o.ubatch {
                cases.push(run_case(&s, shape, ty, tokens)?);
            }
        }
    }
    eprintln!("model: done in {:.1} s", started.elapsed().as_secs_f64());
    if s.o.json {
        output::print_json(&s, &cases);
    } else {
        output::print_tables(&s, &cases);
    }
    if let Some(path) = &s.o.svg {
        std::fs::write(path, chart::svg(&cases)).map_err(|e| format!("{}: {e}", path.display()))?;
        eprintln!("model: wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// The board model's parameters and the library's configuration from `o`, each with a warning
/// where the results would mislead.
fn setup(mut o: Options) -> Result<Setup, String> {
    if let Some(path) = o.gguf.clone() {
        let (shape, ty) = from_gguf(&path)?;
        o.configs = vec![shape];
        o.types = vec![ty];
    }
    let settings = o.settings()?;
    let mut cfg = crate::options::library_config_from_env()?;
    if let Some(mb) = o.cache_mb {
        cfg.cache_bytes = mb << 20;
    }
    if let Some(t) = o.threads {
        cfg.device.host.threads = ork_moe::config::threads(t);
    }
    if let Some(b) = o.backend {
        cfg.device.backend = b;
    }
    ork_moe::ffi::log_install(cfg.log_level);
    if let Some(info) = &settings.profile {
        // `ork-probe board` off a board (emulator, stand-in runtime) measures this machine.
        if info.backend != "rknn" || info.runtime_version.contains("stand-in") {
            eprintln!(
                "model: warning: {} was written on backend {} ({}): its NPU figures are not a board's",
                info.path, info.backend, info.runtime_version
            );
        }
    }
    for shape in &o.configs {
        o.routing.check(shape.n_expert, shape.n_used)?;
        let full_bytes = full_weight_bytes(shape, cfg.dense);
        let run_bytes = full_bytes / shape.layers as u64 * o.layers as u64;
        if run_bytes <= cfg.cache_bytes && full_bytes > cfg.cache_bytes {
            eprintln!(
                "model: warning: the experts of {} layers ({} MB int8) fit the {} MB cache, those \
                 of all {} do not: the modelled hits are too many; raise --layers",
                o.layers,
                run_bytes >> 20,
                cfg.cache_bytes >> 20,
                shape.layers
            );
        }
    }
    Ok(Setup { o, settings, cfg })
}

/// The shape and expert type of the GGUF model at `path`, from its header.
fn from_gguf(path: &std::path::Path) -> Result<(ModelShape, GgmlType), String> {
    let shown = path.display();
    let file = std::fs::File::open(path).map_err(|e| format!("{shown}: {e}"))?;
    let header =
        gguf::read_header(std::io::BufReader::new(file)).map_err(|e| format!("{shown}: {e}"))?;
    let shape = gguf::model_shape(&header, "gguf").map_err(|e| format!("{shown}: {e}"))?;
    // A name per shape, for the tables and the synthetic weights' cache file; one string for
    // the process's lifetime.
    let name = format!(
        "{}-{}x{}x{}",
        header.arch().unwrap_or("gguf"),
        shape.hidden,
        shape.expert_ff,
        shape.n_expert
    );
    let shape = ModelShape {
        name: name.leak(),
        ..shape
    };
    let id = gguf::expert_type(&header).expect("model_shape found the experts");
    let ty = GgmlType::from_id(id as i32)
        .filter(|t| GgmlType::QUANTIZED.contains(t))
        .ok_or_else(|| format!("{shown}: expert type {id} is not one the engine takes"))?;
    eprintln!(
        "model: {shown}: {}, {} layers, hidden {}, {} experts ({} used) of FFN {}, shared FFN {}, \
         heads {}/{} of {}, experts {}",
        header.arch().unwrap_or("?"),
        shape.layers,
        shape.hidden,
        shape.n_expert,
        shape.n_used,
        shape.expert_ff,
        shape.shared_ff,
        shape.heads,
        shape.kv_heads,
        shape.head_dim,
        ty.name()
    );
    Ok((shape, ty))
}

/// One case: its layers run through the engine ubatch by ubatch, each ubatch modelled.
fn run_case(s: &Setup, shape: ModelShape, ty: GgmlType, tokens: usize) -> Result<Case, String> {
    let mut layers = Layers::new(shape, ty, tokens, s.o.layers, &s.cfg)?;
    let mut board = Board::new(shape, tokens, &s.settings.params, &s.cfg);
    let mut ubatches = Vec::new();
    let mut range = None;
    for u in 0..s.o.ubatches {
        let (measured, calls) = layers.run(u, &s.o.routing)?;
        if u + 1 == s.o.ubatches {
            range = Some(range::model(&board, &calls, s.o.layers, &s.settings)?);
        }
        let modelled = board.ubatch(&calls, s.o.layers)?;
        let models = modelled.models;
        eprintln!(
            "model: {} {} ub{tokens} ubatch {}/{}: {:.0} ms here for {} layers; modelled RK3588 \
             prefill {:.1} tok/s engine, {:.1} with prefetch, {:.1} pipelined",
            shape.name,
            ty.name(),
            u + 1,
            s.o.ubatches,
            measured.wall_us / 1e3,
            s.o.layers,
            models[0].prefill_tokps(tokens),
            models[3].prefill_tokps(tokens),
            models[1].prefill_tokps(tokens),
        );
        ubatches.push(UbatchResult {
            index: u,
            measured,
            models,
            full_hits: modelled.hits,
            full_lookups: modelled.lookups,
        });
    }
    Ok(Case {
        shape,
        ty,
        tokens,
        backend: layers.backend(),
        ubatches,
        cpu_only_tokps: board.cpu_only_tokps(),
        dense_us: board.dense_us(),
        dense_calls: layers.dense_per_layer() * shape.layers,
        range: range.expect("at least one ubatch"),
    })
}

fn ms(us: f64) -> f64 {
    us / 1e3
}
