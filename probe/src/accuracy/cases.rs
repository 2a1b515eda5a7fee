//! The cases `ork-probe accuracy` measures: synthetic ones and the real weights of `--data`.

use ork_moe::inflate::ExpertWeights;
use ork_moe::quant::GgmlType;
use ork_moe::testutil::Rng;
use std::path::Path;

/// One MUL_MAT_ID: experts' weights and the routed rows.
pub struct Case {
    pub name: String,
    pub ty: GgmlType,
    pub k: usize,
    pub n: usize,
    /// Per expert, `n` rows of ggml blocks.
    pub experts: Vec<Vec<u8>>,
    /// (expert, activation row of `k`) per (token, slot).
    pub rows: Vec<(usize, Vec<f32>)>,
    /// Real weights: Q4's own error (NMSE of the outputs with dequantized against original
    /// weights), from the vectors' manifest.
    pub q4_own: Option<f64>,
}

impl Case {
    pub fn weights(&self, e: usize) -> ExpertWeights<'_> {
        ExpertWeights {
            ty: self.ty,
            data: &self.experts[e],
            row_stride: self.ty.row_bytes(self.k).expect("whole blocks"),
            n: self.n,
            k: self.k,
        }
    }
}

/// The synthetic cases (and the same at K = 768): 8 experts, 2 used, 32 tokens, N = 64.
pub fn synthetic_cases(types: &[GgmlType]) -> Vec<Case> {
    let (experts, n_used, tokens, n) = (8, 2, 32, 64);
    let mut out = Vec::new();
    for &ty in types {
        for (name, k) in [
            ("outliers_x10", 2048usize),
            ("outliers_x50", 2048),
            ("gaussian", 2048),
            ("tiny", 2048),
            ("outliers_x10", 768),
            ("gaussian", 768),
        ] {
            if !k.is_multiple_of(ty.block_elems()) {
                continue;
            }
            let mut rng = Rng::new(13 + k as u64);
            let blocks = n * k / ty.block_elems();
            let w: Vec<Vec<u8>> = (0..experts).map(|_| rng.blocks(ty, blocks, 0.05)).collect();
            let mut rows = Vec::new();
            for _ in 0..tokens {
                let x: Vec<f32> = (0..k)
                    .map(|c| match name {
                        "gaussian" => rng.normal(),
                        "tiny" => {
                            rng.uniform(0.5, 1.5) * if rng.unit() < 0.5 { -1e-40 } else { 1e-40 }
                        }
                        _ => {
                            let f = if name == "outliers_x50" { 50.0 } else { 10.0 };
                            match c {
                                7 => f * if rng.unit() < 0.5 { -1.0 } else { 1.0 },
                                c if c == k * 1500 / 2048 => f / 2.0,
                                _ => rng.uniform(-1.0, 1.0),
                            }
                        }
                    })
                    .collect();
                let first = rng.below(experts);
                let second = (first + 1 + rng.below(experts - 1)) % experts;
                for e in [first, second].into_iter().take(n_used) {
                    rows.push((e, x.clone()));
                }
            }
            out.push(Case {
                name: if k == 2048 {
                    name.to_string()
                } else {
                    format!("{name}_k{k}")
                },
                ty,
                k,
                n,
                experts: w,
                rows,
                q4_own: None,
            });
        }
    }
    out
}

/// The real-weights cases of `dir` (manifest.txt; see tools/make_accuracy_vectors.py): each
/// layer one expert, token `t` routed to experts `t mod E` and `(t + 1 + t/E) mod E`.
pub fn real_cases(dir: &Path, types: &[GgmlType]) -> Result<Vec<Case>, String> {
    let manifest = dir.join("manifest.txt");
    let text =
        std::fs::read_to_string(&manifest).map_err(|e| format!("{}: {e}", manifest.display()))?;
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let f: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> Result<usize, String> {
            f.get(i)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{}: bad line {line:?}", manifest.display()))
        };
        let (name, k, n, experts, tokens) = (f[0], num(1)?, num(2)?, num(3)?, num(4)?);
        let own = |ty: GgmlType| {
            f[5..].iter().find_map(|kv| {
                let (t, v) = kv.split_once('=')?;
                (t == ty.name()).then(|| v.parse::<f64>().ok()).flatten()
            })
        };
        let read =
            |file: String| std::fs::read(dir.join(&file)).map_err(|e| format!("{file}: {e}"));
        let act: Vec<f32> = read(format!("{name}.act.f32"))?
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect();
        if act.len() != experts * tokens * k {
            return Err(format!(
                "{name}.act.f32: {} values, expected {}",
                act.len(),
                experts * tokens * k
            ));
        }
        for &ty in types {
            let file = format!("{name}.{}.blocks", ty.name());
            if !dir.join(&file).exists() {
                continue; // e.g. Q4_K at K = 384
            }
            let blocks = read(file.clone())?;
            let per = n * ty
                .row_bytes(k)
                .ok_or(format!("{file}: K not whole blocks"))?;
            if blocks.len() != experts * per {
                return Err(format!(
                    "{file}: {} bytes, expected {}",
                    blocks.len(),
                    experts * per
                ));
            }
            let mut rows = Vec::new();
            for t in 0..tokens {
                let picks = [t % experts, (t + 1 + t / experts) % experts];
                for &e in picks.iter().take(experts.min(2)) {
                    rows.push((
                        e,
                        act[(e * tokens + t) * k..(e * tokens + t + 1) * k].to_vec(),
                    ));
                }
            }
            out.push(Case {
                name: format!("minilm_{name}"),
                ty,
                k,
                n,
                experts: blocks.chunks_exact(per).map(<[u8]>::to_vec).collect(),
                rows,
                q4_own: own(ty),
            });
        }
    }
    Ok(out)
}
