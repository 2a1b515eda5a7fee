//! `ork-probe model`'s options.

use super::routing::Routing;
use crate::options::{backend, count, counts, list, types};
use clap::Args;
use ork_moe::npu::BackendChoice;
use ork_moe::quant::GgmlType;
use ork_probe::timeline::{self, ModelShape, Settings};
use std::path::PathBuf;

// As for the other subcommands: a list option is one value split at commas, and of an option
// given twice the last counts (but every `--param`).
#[derive(Args, Clone, Debug)]
#[command(args_override_self = true)]
pub struct Options {
    /// qwen3-30b-a3b, qwen1.5-moe-a2.7b, gpt-oss-20b, olmoe-1b-7b, granite-3.0-3b-a800m,
    /// ernie-4.5-21b-a3b, deepseek-v2-lite, lfm2-8b-a1b, qwen3.6-35b-a3b, gemma-4-26b-a4b
    #[arg(long = "config", value_name = "C,...", value_parser = configs, default_value = "qwen3-30b-a3b")]
    pub configs: ::std::vec::Vec<ModelShape>,
    /// A GGUF model file: its shapes, expert count and expert type (read from the header; the
    /// weights are not read) replace --config and --types
    #[arg(long, value_name = "FILE")]
    pub gguf: Option<PathBuf>,
    /// Expert weight types (a K that is not whole blocks of the type uses q5_0, as
    /// llama-quantize does)
    #[arg(long, value_name = "T,...", value_parser = types, default_value = "q4_0,q4_K")]
    pub types: ::std::vec::Vec<GgmlType>,
    /// Tokens per ubatch; one ubatch is a prompt of U tokens
    #[arg(long, value_name = "U,...", value_parser = counts, default_value = "512,2048")]
    pub ubatch: ::std::vec::Vec<usize>,
    /// Layers run here; the model repeats them to the full depth
    #[arg(long, value_name = "N", value_parser = count, default_value = "4")]
    pub layers: usize,
    /// Ubatches run per case; the JSON reports the last
    #[arg(long, value_name = "N", value_parser = count, default_value = "2")]
    pub ubatches: usize,
    /// uniform, zipf:S, or trace:FILE (see model/routing.rs)
    #[arg(long, value_name = "R", value_parser = Routing::parse, default_value = "uniform")]
    pub routing: Routing,
    /// The engine's expert cache [default: the library's, 1024, or ORK_CACHE_MB]
    #[arg(long = "cache-mb", value_name = "MB")]
    pub cache_mb: Option<u64>,
    /// Board profile JSON (parameters by name) instead of the defaults
    #[arg(long, value_name = "FILE", value_parser = profile)]
    pub profile: Option<Settings>,
    /// Override one board model parameter (repeatable; applied after --profile)
    #[arg(long = "param", value_name = "NAME=VALUE")]
    pub params: Vec<String>,
    /// Threads of the CPU runs [default: ORK_THREADS, else all cores]
    #[arg(long, value_name = "N", value_parser = count)]
    pub threads: Option<usize>,
    /// auto, emu, rknn or cpu [default: ORK_BACKEND, else auto]
    #[arg(long, value_name = "B", value_parser = backend)]
    pub backend: Option<BackendChoice>,
    /// One JSON array on stdout instead of the tables (one object per case)
    #[arg(long)]
    pub json: bool,
    /// Draw the modelled time per layer into FILE
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
}

impl Options {
    /// The board model's parameters: the profile's (else the defaults) with every `--param`
    /// applied on top, whatever the order they were given in.
    pub fn settings(&self) -> Result<Settings, String> {
        let mut settings = self.profile.clone().unwrap_or_default();
        for assignment in &self.params {
            settings.apply_override(assignment)?;
        }
        Ok(settings)
    }
}

fn configs(s: &str) -> Result<Vec<ModelShape>, String> {
    list(s, |c| {
        ModelShape::named(c).ok_or_else(|| {
            let names: Vec<_> = ModelShape::NAMED.iter().map(|s| s.name).collect();
            format!("unknown model {c:?}: {}", names.join(", "))
        })
    })
}

fn profile(path: &str) -> Result<Settings, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let settings = timeline::profile::read(&text, path)?;
    for (name, why) in &settings.rejected_fits {
        eprintln!(
            "model: {path}: {name} not fitted ({why}); the profile's or the model's value stands"
        );
    }
    Ok(settings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Model {
        #[command(flatten)]
        options: Options,
    }

    fn parse(args: &str) -> Result<(Options, Settings), String> {
        let argv = std::iter::once("model").chain(args.split_whitespace());
        let o = Model::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .options;
        let settings = o.settings()?;
        Ok((o, settings))
    }

    #[test]
    fn options_parse_and_reject() {
        let (o, settings) = parse(
            "--config qwen1.5-moe-a2.7b --types q4_K --ubatch 512 --layers 2 --routing zipf:1.1 \
             --cache-mb 256 --param shared_dram_gbps=25",
        )
        .unwrap();
        assert_eq!(o.configs, vec![ModelShape::QWEN15_MOE_A27B]);
        assert_eq!(o.types, vec![GgmlType::Q4_K]);
        assert_eq!(
            (o.layers, o.ubatch.clone(), o.cache_mb),
            (2, vec![512], Some(256))
        );
        assert_eq!(settings.params.shared_dram_gbps, 25.0);
        assert_eq!(o.routing, Routing::Zipf(1.1));
        for bad in [
            "--config gpt",
            "--layers 0",
            "--routing skewed",
            "--param nope=1",
            "--frobnicate",
            "--ubatch",
            "--quick",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn defaults_and_repeated_options() {
        let (o, settings) = parse("").unwrap();
        assert_eq!(o.configs, vec![ModelShape::QWEN3_30B_A3B]);
        assert_eq!(o.types, vec![GgmlType::Q4_0, GgmlType::Q4_K]);
        assert_eq!(
            (o.ubatch.clone(), o.layers, o.ubatches),
            (vec![512, 2048], 4, 2)
        );
        assert_eq!(o.routing, Routing::Uniform);
        assert_eq!((o.cache_mb, o.threads, o.backend), (None, None, None));
        assert!(!o.json && o.svg.is_none());
        assert_eq!(settings, Settings::default());
        let (o, settings) =
            parse("--layers 3 --layers 5 --param cores=2 --param=shared_dram_gbps=30").unwrap();
        assert_eq!(o.layers, 5);
        assert_eq!(settings.params.cores, 2.0);
        assert_eq!(settings.params.shared_dram_gbps, 30.0);
    }
}
