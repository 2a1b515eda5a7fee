//! `ork-probe coverage FILE...`: per GGUF model, the share of its routed-expert bytes
//! (`ffn_*_exps`) and of its attention projections' bytes whose weight type the library takes,
//! as `ork_supports_type` answers. Reads the headers only; prints one Markdown table row per
//! file (tools/coverage_table.sh makes README's table with it).

use ork_moe::ffi::ork_supports_type;
use ork_moe::quant::GgmlType;
use ork_probe::gguf::{self, Header};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Clone, Debug)]
pub struct Options {
    /// GGUF model files
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

/// Bytes per type id of one group of tensors.
#[derive(Default)]
struct Group(BTreeMap<u32, u64>);

impl Group {
    fn total(&self) -> u64 {
        self.0.values().sum()
    }

    fn taken(&self) -> u64 {
        self.0
            .iter()
            .filter(|&(&id, _)| ork_supports_type(id as i32) == 1)
            .map(|(_, &b)| b)
            .sum()
    }

    /// "q4_K 62 %, q6_K 38 %", largest first.
    fn types(&self) -> String {
        let total = self.total().max(1) as f64;
        let mut by_size: Vec<_> = self.0.iter().collect();
        by_size.sort_by(|a, b| b.1.cmp(a.1));
        let parts: Vec<_> = by_size
            .iter()
            .map(|&(&id, &b)| format!("{} {:.0} %", type_name(id), 100.0 * b as f64 / total))
            .collect();
        parts.join(", ")
    }

    fn share(&self) -> String {
        match self.total() {
            0 => "-".into(),
            t => format!("{:.0} %", 100.0 * self.taken() as f64 / t as f64),
        }
    }
}

fn type_name(id: u32) -> String {
    GgmlType::from_id(id as i32).map_or(format!("type {id}"), |t| t.name().to_string())
}

/// A layer's attention projection weight (not its norms, sinks or biases).
fn is_attention(name: &str) -> bool {
    let Some((_, tail)) = name.strip_prefix("blk.").and_then(|r| r.split_once('.')) else {
        return false;
    };
    tail.starts_with("attn_")
        && tail.ends_with(".weight")
        && !tail.contains("norm")
        && !tail.starts_with("attn_sinks")
}

fn is_expert(name: &str) -> bool {
    name.starts_with("blk.") && name.contains("_exps.") && name.ends_with(".weight")
}

fn groups(h: &Header, file_len: u64) -> Result<(Group, Group), String> {
    let (mut experts, mut attention) = (Group::default(), Group::default());
    for (t, bytes) in h.tensors.iter().zip(h.tensor_bytes(file_len)?) {
        let group = if is_expert(&t.name) {
            &mut experts
        } else if is_attention(&t.name) {
            &mut attention
        } else {
            continue;
        };
        *group.0.entry(t.type_id).or_default() += bytes;
    }
    Ok((experts, attention))
}

pub fn run(o: Options) -> Result<ExitCode, String> {
    println!("| file | expert types (bytes) | experts taken | attention types (bytes) | attention taken |");
    println!("|---|---|---|---|---|");
    for path in &o.files {
        let shown = path.display();
        let file = std::fs::File::open(path).map_err(|e| format!("{shown}: {e}"))?;
        let len = file.metadata().map_err(|e| format!("{shown}: {e}"))?.len();
        let header = gguf::read_header(std::io::BufReader::new(file))
            .map_err(|e| format!("{shown}: {e}"))?;
        let (experts, attention) = groups(&header, len).map_err(|e| format!("{shown}: {e}"))?;
        let stem = path
            .file_stem()
            .map_or(shown.to_string(), |s| s.to_string_lossy().into());
        println!(
            "| {stem} | {} | {} | {} | {} |",
            experts.types(),
            experts.share(),
            attention.types(),
            attention.share()
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_groups_by_name() {
        assert!(is_expert("blk.3.ffn_down_exps.weight"));
        assert!(!is_expert("blk.3.ffn_down_exps.bias"));
        assert!(!is_expert("blk.3.ffn_down_shexp.weight"));
        assert!(is_attention("blk.0.attn_q.weight"));
        assert!(is_attention("blk.0.attn_kv_a_mqa.weight"));
        assert!(!is_attention("blk.0.attn_q_norm.weight"));
        assert!(!is_attention("blk.0.attn_sinks.weight"));
        assert!(!is_attention("token_embd.weight"));
    }

    #[test]
    fn shares_follow_the_library() {
        // q4_0 300 bytes (the engine's type since it began), f32 100 bytes (never inflated)
        let g = Group([(2, 300), (0, 100)].into_iter().collect());
        assert_eq!((g.taken(), g.total()), (300, 400));
        assert_eq!(g.share(), "75 %");
        assert_eq!(g.types(), "q4_0 75 %, f32 25 %");
        assert_eq!(Group::default().share(), "-");
    }
}
