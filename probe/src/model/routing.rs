//! Which experts each token uses: uniform, Zipf-skewed, or a recorded trace.
//!
//! Trace format (text, one routing decision per line; `#` starts a comment):
//!
//! ```text
//! # layer token expert_0 ... expert_{n_used-1}
//! 0 0 17 3 99 42 5 120 64 8
//! 0 1 ...
//! ```
//!
//! `layer` is the model layer, `token` the token's position in the prompt. A llama.cpp run
//! through the patch can write it from each layer's first MUL_MAT_ID call (its `ids` tensor,
//! offset by the ubatch's first position). The probe maps its layer `l` to trace layer
//! `l % trace_layers` and its token `t` to the trace's `t % trace_tokens`-th position.

use ork_moe::testutil::Rng;
use std::collections::BTreeMap;

#[derive(Clone, Debug, PartialEq)]
pub enum Routing {
    Uniform,
    /// Expert popularity `1 / rank^s`, ranks shuffled per layer.
    Zipf(f64),
    /// Per trace layer, the ids of each position in prompt order.
    Trace {
        path: String,
        layers: Vec<Vec<Vec<i32>>>,
    },
}

impl Routing {
    pub fn parse(s: &str) -> Result<Routing, String> {
        if s == "uniform" {
            return Ok(Routing::Uniform);
        }
        if let Some(v) = s.strip_prefix("zipf:") {
            let x: f64 = v
                .parse()
                .ok()
                .filter(|x: &f64| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| format!("--routing zipf:S needs S >= 0, got {v:?}"))?;
            return Ok(Routing::Zipf(x));
        }
        if let Some(path) = s.strip_prefix("trace:") {
            let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
            return parse_trace(&text).map(|layers| Routing::Trace {
                path: path.to_string(),
                layers,
            });
        }
        Err(format!(
            "--routing {s:?}: expected uniform, zipf:S or trace:FILE"
        ))
    }

    pub fn name(&self) -> String {
        match self {
            Routing::Uniform => "uniform".into(),
            Routing::Zipf(s) => format!("zipf:{s}"),
            Routing::Trace { path, .. } => format!("trace:{path}"),
        }
    }

    /// Checks a trace fits the model: `n_used` ids per position, each below `n_expert`.
    pub fn check(&self, n_expert: usize, n_used: usize) -> Result<(), String> {
        let Routing::Trace { path, layers } = self else {
            return Ok(());
        };
        for (l, positions) in layers.iter().enumerate() {
            for (t, ids) in positions.iter().enumerate() {
                if ids.len() != n_used || ids.iter().any(|&e| e < 0 || e as usize >= n_expert) {
                    return Err(format!(
                        "{path}: layer {l} position {t}: expected {n_used} expert ids below {n_expert}, got {ids:?}"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The `[n_used, tokens]` ids of one ubatch (`ubatch`-th of its size) at layer `layer`.
    pub fn ids(
        &self,
        layer: usize,
        ubatch: usize,
        tokens: usize,
        n_expert: usize,
        n_used: usize,
        rng: &mut Rng,
    ) -> Vec<i32> {
        let mut out = Vec::with_capacity(tokens * n_used);
        match self {
            Routing::Uniform => {
                for _ in 0..tokens {
                    pick_distinct(&mut out, n_used, || rng.below(n_expert));
                }
            }
            Routing::Zipf(s) => {
                // The same ranking for every ubatch of a layer; tokens drawn independently.
                let mut rank_rng = Rng::new(0x21bf ^ layer as u64);
                let mut experts: Vec<usize> = (0..n_expert).collect();
                for i in (1..n_expert).rev() {
                    experts.swap(i, rank_rng.below(i + 1));
                }
                let mut cumulative = Vec::with_capacity(n_expert);
                let mut total = 0.0;
                for r in 0..n_expert {
                    total += 1.0 / ((r + 1) as f64).powf(*s);
                    cumulative.push(total);
                }
                for _ in 0..tokens {
                    pick_distinct(&mut out, n_used, || {
                        let u = rng.unit() as f64 * total;
                        experts[cumulative.partition_point(|&c| c <= u).min(n_expert - 1)]
                    });
                }
            }
            Routing::Trace { layers, .. } => {
                let positions = &layers[layer % layers.len()];
                for t in 0..tokens {
                    out.extend(&positions[(ubatch * tokens + t) % positions.len()]);
                }
            }
        }
        out
    }
}

/// Appends `n` distinct experts drawn by `draw`.
fn pick_distinct(out: &mut Vec<i32>, n: usize, mut draw: impl FnMut() -> usize) {
    let start = out.len();
    while out.len() - start < n {
        let e = draw() as i32;
        if !out[start..].contains(&e) {
            out.push(e);
        }
    }
}

fn parse_trace(text: &str) -> Result<Vec<Vec<Vec<i32>>>, String> {
    let mut by_layer: BTreeMap<usize, BTreeMap<usize, Vec<i32>>> = BTreeMap::new();
    for (no, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let nums: Vec<i64> = line
            .split_whitespace()
            .map(|w| w.parse::<i64>())
            .collect::<Result<_, _>>()
            .map_err(|_| format!("trace line {}: not whole numbers: {line:?}", no + 1))?;
        if nums.len() < 3 || nums[0] < 0 || nums[1] < 0 {
            return Err(format!(
                "trace line {}: expected `layer token expert...`",
                no + 1
            ));
        }
        let ids = nums[2..].iter().map(|&e| e as i32).collect();
        if by_layer
            .entry(nums[0] as usize)
            .or_default()
            .insert(nums[1] as usize, ids)
            .is_some()
        {
            return Err(format!("trace line {}: position given twice", no + 1));
        }
    }
    if by_layer.is_empty() {
        return Err("the trace has no routing lines".into());
    }
    // Layers 0..n and positions 0..m each, without gaps: what a run writes.
    let mut layers = Vec::new();
    for (i, (l, positions)) in by_layer.into_iter().enumerate() {
        if l != i {
            return Err(format!("the trace has no layer {i}"));
        }
        let mut ids = Vec::new();
        for (j, (t, v)) in positions.into_iter().enumerate() {
            if t != j {
                return Err(format!("trace layer {l} has no position {j}"));
            }
            ids.push(v);
        }
        layers.push(ids);
    }
    Ok(layers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_and_zipf_pick_distinct_experts_and_zipf_is_skewed() {
        let mut rng = Rng::new(1);
        for r in [Routing::Uniform, Routing::Zipf(1.2)] {
            let ids = r.ids(3, 0, 512, 128, 8, &mut rng);
            assert_eq!(ids.len(), 512 * 8);
            for tok in ids.chunks(8) {
                let mut t = tok.to_vec();
                t.sort();
                t.dedup();
                assert_eq!(t.len(), 8);
                assert!(t.iter().all(|&e| (0..128).contains(&e)));
            }
        }
        let mut count = vec![0usize; 128];
        for e in Routing::Zipf(1.2).ids(0, 0, 512, 128, 8, &mut rng) {
            count[e as usize] += 1;
        }
        count.sort_unstable();
        // The hottest expert gets far more than the average 32 rows, some get few.
        assert!(count[127] > 200 && count[0] < 16, "{count:?}");
    }

    #[test]
    fn traces_are_read_and_checked() {
        let text = "# layer token ids\n0 0 1 2\n0 1 3 4 # c\n1 0 5 6\n1 1 7 0\n";
        let r = Routing::Trace {
            path: "t".into(),
            layers: parse_trace(text).unwrap(),
        };
        r.check(8, 2).unwrap();
        assert!(r.check(7, 2).is_err());
        assert!(r.check(8, 3).is_err());
        let mut rng = Rng::new(0);
        assert_eq!(r.ids(1, 0, 2, 8, 2, &mut rng), vec![5, 6, 7, 0]);
        // Layer 2 maps to trace layer 0; ubatch 1 of 1 token is position 1.
        assert_eq!(r.ids(2, 1, 1, 8, 2, &mut rng), vec![3, 4]);
        for bad in ["", "0 0", "0 0 1\n0 0 2", "1 0 1 2", "0 1 1 2", "0 x 1"] {
            assert!(parse_trace(bad).is_err(), "{bad:?}");
        }
    }
}
