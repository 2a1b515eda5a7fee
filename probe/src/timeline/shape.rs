//! Model shapes, and the dense part (everything but the routed experts: attention, norms, the
//! router, a shared expert) priced at a CPU rate derived from a published CPU-only figure.

use super::calls::{DenseWork, Proj};
use super::params::Params;

/// What the board model needs of a MoE transformer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelShape {
    pub name: &'static str,
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub n_expert: usize,
    pub n_used: usize,
    /// FFN width of one routed expert.
    pub expert_ff: usize,
    /// FFN width of the shared expert (a dense matmul left to ggml), 0 if none.
    pub shared_ff: usize,
}

impl ModelShape {
    /// Qwen3-30B-A3B (Hugging Face config: 48 layers, 128 experts, 8 used, hidden 2048, expert
    /// FFN 768, 32 query / 4 KV heads of 128). The CPU-only reference figure is taken for it.
    pub const QWEN3_30B_A3B: ModelShape = ModelShape {
        name: "qwen3-30b-a3b",
        layers: 48,
        hidden: 2048,
        heads: 32,
        kv_heads: 4,
        head_dim: 128,
        n_expert: 128,
        n_used: 8,
        expert_ff: 768,
        shared_ff: 0,
    };

    /// Qwen1.5-MoE-A2.7B (24 layers, 60 experts, 4 used, hidden 2048, expert FFN 1408, 16 heads
    /// of 128, a shared expert of FFN 5632).
    pub const QWEN15_MOE_A27B: ModelShape = ModelShape {
        name: "qwen1.5-moe-a2.7b",
        layers: 24,
        hidden: 2048,
        heads: 16,
        kv_heads: 16,
        head_dim: 128,
        n_expert: 60,
        n_used: 4,
        expert_ff: 1408,
        shared_ff: 5632,
    };

    /// gpt-oss-20b (24 layers, 32 experts, 4 used, hidden 2880 = expert FFN, 64 query / 8
    /// KV heads of 64; its expert biases are ggml's additions after MUL_MAT_ID).
    pub const GPT_OSS_20B: ModelShape = ModelShape {
        name: "gpt-oss-20b",
        layers: 24,
        hidden: 2880,
        heads: 64,
        kv_heads: 8,
        head_dim: 64,
        n_expert: 32,
        n_used: 4,
        expert_ff: 2880,
        shared_ff: 0,
    };

    /// OLMoE-1B-7B (16 layers, 64 experts, 8 used, hidden 2048, expert FFN 1024, 16 heads of
    /// 128).
    pub const OLMOE_1B_7B: ModelShape = ModelShape {
        name: "olmoe-1b-7b",
        layers: 16,
        hidden: 2048,
        heads: 16,
        kv_heads: 16,
        head_dim: 128,
        n_expert: 64,
        n_used: 8,
        expert_ff: 1024,
        shared_ff: 0,
    };

    /// granite-3.0-3b-a800m (32 layers, 40 experts, 8 used, hidden 1536, expert FFN 512, 24
    /// query / 8 KV heads of 64).
    pub const GRANITE_3B_A800M: ModelShape = ModelShape {
        name: "granite-3.0-3b-a800m",
        layers: 32,
        hidden: 1536,
        heads: 24,
        kv_heads: 8,
        head_dim: 64,
        n_expert: 40,
        n_used: 8,
        expert_ff: 512,
        shared_ff: 0,
    };

    /// ERNIE-4.5-21B-A3B (28 layers, the first dense, priced as MoE; 64 experts, 6 used,
    /// hidden 2560, expert FFN 1536, shared experts 2 x 1536; 20 query / 4 KV heads of 128).
    pub const ERNIE45_21B_A3B: ModelShape = ModelShape {
        name: "ernie-4.5-21b-a3b",
        layers: 28,
        hidden: 2560,
        heads: 20,
        kv_heads: 4,
        head_dim: 128,
        n_expert: 64,
        n_used: 6,
        expert_ff: 1536,
        shared_ff: 3072,
    };

    /// DeepSeek-V2-Lite (27 layers, the first dense, priced as MoE; 64 experts, 6 used, hidden
    /// 2048, expert FFN 1408, shared 2 x 1408). Its latent attention is priced as 16 heads of 192.
    pub const DEEPSEEK_V2_LITE: ModelShape = ModelShape {
        name: "deepseek-v2-lite",
        layers: 27,
        hidden: 2048,
        heads: 16,
        kv_heads: 16,
        head_dim: 192,
        n_expert: 64,
        n_used: 6,
        expert_ff: 1408,
        shared_ff: 2816,
    };

    /// LFM2-8B-A1B (24 layers, the first two dense, priced as MoE; 32 experts, 4 used, hidden
    /// 2048, expert FFN 1792). Its short-convolution layers are priced as attention (32 / 8 heads
    /// of 64), which overstates their dense part.
    pub const LFM2_8B_A1B: ModelShape = ModelShape {
        name: "lfm2-8b-a1b",
        layers: 24,
        hidden: 2048,
        heads: 32,
        kv_heads: 8,
        head_dim: 64,
        n_expert: 32,
        n_used: 4,
        expert_ff: 1792,
        shared_ff: 0,
    };

    /// Qwen3.6-35B-A3B (qwen35moe: 40 layers, 256 experts, 8 used, hidden 2048, expert FFN 512,
    /// a shared expert of 512). Its delta-net layers are priced as attention (16 / 2 heads of
    /// 256).
    pub const QWEN36_35B_A3B: ModelShape = ModelShape {
        name: "qwen3.6-35b-a3b",
        layers: 40,
        hidden: 2048,
        heads: 16,
        kv_heads: 2,
        head_dim: 256,
        n_expert: 256,
        n_used: 8,
        expert_ff: 512,
        shared_ff: 512,
    };

    /// Gemma-4-26B-A4B (gemma4: 30 layers, 128 experts, 8 used, hidden 2816, expert FFN 704, a
    /// dense GELU MLP of 2112 beside the experts in every layer, priced as a shared expert).
    /// Attention priced as its 25 sliding-window layers' (16 / 8 heads of 256); the 5 full
    /// layers' 2 KV heads of 512 are close to that.
    pub const GEMMA4_26B_A4B: ModelShape = ModelShape {
        name: "gemma-4-26b-a4b",
        layers: 30,
        hidden: 2816,
        heads: 16,
        kv_heads: 8,
        head_dim: 256,
        n_expert: 128,
        n_used: 8,
        expert_ff: 704,
        shared_ff: 2112,
    };

    pub const NAMED: [ModelShape; 10] = [
        ModelShape::QWEN3_30B_A3B,
        ModelShape::QWEN15_MOE_A27B,
        ModelShape::GPT_OSS_20B,
        ModelShape::OLMOE_1B_7B,
        ModelShape::GRANITE_3B_A800M,
        ModelShape::ERNIE45_21B_A3B,
        ModelShape::DEEPSEEK_V2_LITE,
        ModelShape::LFM2_8B_A1B,
        ModelShape::QWEN36_35B_A3B,
        ModelShape::GEMMA4_26B_A4B,
    ];

    pub fn named(name: &str) -> Option<ModelShape> {
        ModelShape::NAMED.iter().copied().find(|s| s.name == name)
    }

    /// Weights of one layer's dense part: attention projections, router, shared expert (with its
    /// one-channel gate).
    pub fn dense_weights_per_layer(&self) -> u64 {
        let q = self.heads * self.head_dim;
        let kv = self.kv_heads * self.head_dim;
        let attn = self.hidden * (q + 2 * kv) + q * self.hidden;
        let shared = if self.shared_ff > 0 {
            3 * self.hidden * self.shared_ff + self.hidden
        } else {
            0
        };
        (attn + self.hidden * self.n_expert + shared) as u64
    }

    /// The dense part's weight matrices that the library takes (`ORK_DENSE`, `ork_mul_mat_mt`),
    /// as (where in the layer, K, N): the attention projections q, k, v and o, and a shared
    /// expert's gate, up and down. The router stays ggml's: llama.cpp's quantizer leaves
    /// `ffn_gate_inp.weight` in F32 (src/llama-quant.cpp), which the library does not inflate.
    pub fn dense_matmuls(&self) -> Vec<(Proj, usize, usize)> {
        let (h, q, kv) = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
        );
        let mut m = vec![
            (Proj::AttnIn, h, q),
            (Proj::AttnIn, h, kv),
            (Proj::AttnIn, h, kv),
            (Proj::AttnOut, q, h),
        ];
        if self.shared_ff > 0 {
            m.extend([
                (Proj::Shared, h, self.shared_ff),
                (Proj::Shared, h, self.shared_ff),
                (Proj::Shared, self.shared_ff, h),
            ]);
        }
        m
    }

    /// Multiply-accumulates per token and layer of [`ModelShape::dense_matmuls`].
    pub fn dense_matmul_macs_per_token_layer(&self) -> f64 {
        self.dense_matmuls()
            .iter()
            .map(|&(_, k, n)| (k * n) as f64)
            .sum()
    }

    /// Multiply-accumulates of the dense part per token and layer, the attention over `ctx`
    /// earlier positions included.
    pub fn dense_macs_per_token_layer(&self, ctx: f64) -> f64 {
        self.dense_weights_per_layer() as f64 + self.attention_macs_per_token_layer(ctx)
    }

    /// Multiply-accumulates of the attention core (QK^T and the weighted sum of V) per token and
    /// layer over `ctx` earlier positions.
    pub fn attention_macs_per_token_layer(&self, ctx: f64) -> f64 {
        2.0 * (self.heads * self.head_dim) as f64 * ctx
    }

    /// Multiply-accumulates of the router per token and layer.
    pub fn router_macs_per_token_layer(&self) -> f64 {
        (self.hidden * self.n_expert) as f64
    }

    /// Multiply-accumulates of the routed experts per token and layer.
    pub fn expert_macs_per_token_layer(&self) -> f64 {
        (self.n_used * 3 * self.hidden * self.expert_ff) as f64
    }

    /// CPU time of the leftover stages per token and layer on one big core (µs), attending over
    /// `ctx` positions: the norms, RoPE, the softmax, the KV-cache copies, the router and its
    /// top-k, each at its own rate and scaled by `leftover_cpu_factor`. They stay on the CPU
    /// whatever the library takes.
    pub fn leftover_us_per_token_layer(&self, ctx: f64, p: &Params) -> f64 {
        let per_gelem = |elems: f64, gelems: f64| elems / (gelems * 1e3);
        let qk = ((self.heads + self.kv_heads) * self.head_dim) as f64;
        let norms = (2 * self.hidden) as f64 + qk;
        let kv = (2 * self.kv_heads * self.head_dim) as f64;
        let us = per_gelem(norms, p.norm_gelems_big_core)
            + per_gelem(qk, p.rope_gelems_big_core)
            + per_gelem(self.heads as f64 * ctx, p.softmax_gelems_big_core)
            + per_gelem(kv, p.kv_copy_gelems_big_core)
            + per_gelem(self.router_macs_per_token_layer(), p.router_gmacs_big_core)
            + p.topk_us_per_token;
        us * p.leftover_cpu_factor
    }
}

/// CPU rates of a prefill, derived from a published CPU-only figure: its time per token split
/// by `mul_mat_id_share` into the routed experts and the rest; the rest, less the leftover
/// stages priced at their own rates, over the projections' MACs and the attention's at
/// `attention_factor` times their cost.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpuRates {
    /// µs per projection MAC (one token, the big cores together).
    pub dense_us_per_mac: f64,
    /// µs per routed-expert MAC on the CPU (the CPU-only run's MUL_MAT_ID).
    pub expert_us_per_mac: f64,
    /// An attention MAC's cost over a projection MAC's, calibrated so that the CPU-only model
    /// slows from a 512- to a 4096-token prompt as the Raspberry Pi 5 measured.
    pub attention_factor: f64,
}

impl CpuRates {
    /// From the reference figure, taken for [`ModelShape::QWEN3_30B_A3B`] at the reference's
    /// prompt length (attention over half of it on average), the attention factor calibrated on
    /// `pi5_pp512_tokps` and `pi5_pp4096_tokps`.
    pub fn from_reference(p: &Params) -> CpuRates {
        let shape = ModelShape::QWEN3_30B_A3B;
        let target = p.pi5_pp512_tokps / p.pi5_pp4096_tokps;
        let slowdown = |f: f64| {
            let r = CpuRates::with_attention_factor(p, f);
            r.cpu_only_tokps(&shape, 512, p) / r.cpu_only_tokps(&shape, 4096, p)
        };
        let (mut lo, mut hi) = (0.0, 64.0);
        if slowdown(lo) >= target {
            hi = lo;
        }
        for _ in 0..64 {
            let mid = (lo + hi) / 2.0;
            if slowdown(mid) < target {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        CpuRates::with_attention_factor(p, hi)
    }

    /// The rates with an attention MAC at `attention_factor` projection MACs.
    pub fn with_attention_factor(p: &Params, attention_factor: f64) -> CpuRates {
        let r = ModelShape::QWEN3_30B_A3B;
        let token_us = 1e6 / p.cpu_only_reference_tokps;
        let layers = r.layers as f64;
        let ctx = p.reference_context / 2.0;
        let leftover = r.leftover_us_per_token_layer(ctx, p) / p.big_cores * layers;
        let macs = (r.dense_matmul_macs_per_token_layer()
            + attention_factor * r.attention_macs_per_token_layer(ctx))
            * layers;
        let expert = r.expert_macs_per_token_layer() * layers;
        CpuRates {
            dense_us_per_mac: (token_us * (1.0 - p.mul_mat_id_share) - leftover).max(0.0) / macs,
            expert_us_per_mac: token_us * p.mul_mat_id_share / expert,
            attention_factor,
        }
    }

    /// Wall time of one layer's CPU part per token but the routed experts (µs), attending over
    /// `ctx` positions; with `matmuls_offloaded` without the projections.
    fn dense_us_per_token_layer(
        &self,
        shape: &ModelShape,
        ctx: f64,
        p: &Params,
        matmuls_offloaded: bool,
    ) -> f64 {
        let projections = if matmuls_offloaded {
            0.0
        } else {
            shape.dense_matmul_macs_per_token_layer()
        };
        (projections + self.attention_factor * shape.attention_macs_per_token_layer(ctx))
            * self.dense_us_per_mac
            + shape.leftover_us_per_token_layer(ctx, p) / p.big_cores
    }

    /// CPU-only prefill tok/s of `shape` for a prompt of `tokens` (attention over half of it on
    /// average), at these rates.
    pub fn cpu_only_tokps(&self, shape: &ModelShape, tokens: usize, p: &Params) -> f64 {
        let layers = shape.layers as f64;
        let dense = self.dense_us_per_token_layer(shape, tokens as f64 / 2.0, p, false);
        let expert = shape.expert_macs_per_token_layer() * self.expert_us_per_mac;
        1e6 / ((dense + expert) * layers)
    }

    /// The dense part of one layer for a prompt ubatch of `tokens` starting at position 0, on
    /// the CPU; with `matmuls_offloaded` without [`ModelShape::dense_matmuls`] (the library's
    /// calls then), whose MACs and weights it leaves out.
    pub fn dense_layer(
        &self,
        shape: &ModelShape,
        tokens: usize,
        p: &Params,
        matmuls_offloaded: bool,
    ) -> DenseWork {
        let t = tokens as u64;
        let act_elems = t * (shape.n_used * shape.expert_ff) as u64;
        let combine_elems = t * (shape.n_used * shape.hidden) as u64;
        let offloaded = if matmuls_offloaded {
            shape.dense_matmul_macs_per_token_layer()
        } else {
            0.0
        };
        let total_us =
            self.dense_us_per_token_layer(shape, tokens as f64 / 2.0, p, matmuls_offloaded)
                * tokens as f64;
        DenseWork {
            // SiLU·mul and the combine are part of the measured dense time: taken out of it
            // here so that they can sit between the calls.
            before_us: (total_us - self.elementwise_us(act_elems + combine_elems, p)).max(0.0),
            act_elems,
            combine_elems,
            bytes: ((shape.dense_weights_per_layer() as f64 - offloaded) * p.dense_weight_bytes)
                as u64,
        }
    }

    /// Wall time of an element-wise ggml op over `elems` on the big cores together.
    pub fn elementwise_us(&self, elems: u64, p: &Params) -> f64 {
        elems as f64 / (p.elementwise_gelems_big_core * 1e3 * p.big_cores)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_model_reproduces_the_reference_figure() {
        let p = Params::default();
        let r = CpuRates::from_reference(&p);
        let s = ModelShape::QWEN3_30B_A3B;
        let at_ref = r.cpu_only_tokps(&s, p.reference_context as usize, &p);
        assert!((at_ref - p.cpu_only_reference_tokps).abs() < 1e-9);
        // Longer prompts attend over more positions: slower per token.
        assert!(r.cpu_only_tokps(&s, 2048, &p) < at_ref);
    }

    #[test]
    fn the_attention_factor_reproduces_the_pi5_slowdown() {
        let p = Params::default();
        let r = CpuRates::from_reference(&p);
        let s = ModelShape::QWEN3_30B_A3B;
        let slowdown = r.cpu_only_tokps(&s, 512, &p) / r.cpu_only_tokps(&s, 4096, &p);
        assert!(
            (slowdown - 10.91 / 8.62).abs() < 1e-6,
            "{slowdown} at factor {}",
            r.attention_factor
        );
        // At the projections' rate the model slows less than the Pi 5 did.
        let flat = CpuRates::with_attention_factor(&p, 1.0);
        assert!(flat.cpu_only_tokps(&s, 512, &p) / flat.cpu_only_tokps(&s, 4096, &p) < slowdown);
        assert!(
            (1.0..4.0).contains(&r.attention_factor),
            "{}",
            r.attention_factor
        );
    }

    #[test]
    fn qwen3_expert_mac_share_is_about_two_thirds() {
        let s = ModelShape::QWEN3_30B_A3B;
        let e = s.expert_macs_per_token_layer();
        let share = e / (e + s.dense_macs_per_token_layer(32.0));
        assert!((0.6..0.7).contains(&share), "{share}");
        assert_eq!(e, 8.0 * 3.0 * 2048.0 * 768.0);
    }

    #[test]
    fn dense_layers_add_up_to_the_dense_share() {
        let p = Params::default();
        let r = CpuRates::from_reference(&p);
        let s = ModelShape::QWEN3_30B_A3B;
        let tokens = p.reference_context as usize;
        let d = r.dense_layer(&s, tokens, &p, false);
        let elementwise = r.elementwise_us(d.act_elems + d.combine_elems, &p);
        let per_token = (d.before_us + elementwise) * s.layers as f64 / tokens as f64;
        let expected = 1e6 / p.cpu_only_reference_tokps * (1.0 - p.mul_mat_id_share);
        assert!((per_token - expected).abs() < 1e-6 * expected);
    }

    /// The leftover stages of Qwen3-30B-A3B by hand, per token and layer on one A76 at the
    /// default rates, attending over 1024 positions: norms 2·2048 + 36·128 = 8704 elements at
    /// 0.5 Gelem/s, RoPE 4608 at 0.25, softmax 32·1024 at 0.4, KV copies 1024 at 0.5, router
    /// 2048·128 MACs at 5 GMAC/s, top-k 1 µs.
    const LEFTOVER_AT_1024_US: f64 = 8704.0 / 500.0
        + 4608.0 / 250.0
        + 32768.0 / 400.0
        + 1024.0 / 500.0
        + 262144.0 / 5000.0
        + 1.0;

    #[test]
    fn leftover_stages_are_priced_at_their_rates() {
        let p = Params::default();
        let s = ModelShape::QWEN3_30B_A3B;
        let us = s.leftover_us_per_token_layer(1024.0, &p);
        assert!((us - LEFTOVER_AT_1024_US).abs() < 1e-9, "{us}");
        let mut doubled = p.clone();
        doubled.set("leftover_cpu_factor", 2.0).unwrap();
        assert!((s.leftover_us_per_token_layer(1024.0, &doubled) - 2.0 * us).abs() < 1e-9);
    }

    #[test]
    fn offloaded_matmuls_leave_the_attention_core_and_the_leftover_stages() {
        let p = Params::default();
        let r = CpuRates::from_reference(&p);
        let s = ModelShape::QWEN3_30B_A3B;
        // q 2048x4096, k and v 2048x512, o 4096x2048
        assert_eq!(s.dense_matmul_macs_per_token_layer(), 18_874_368.0);
        let (all, cpu) = (
            r.dense_layer(&s, 2048, &p, false),
            r.dense_layer(&s, 2048, &p, true),
        );
        let priced =
            |d: &DenseWork| d.before_us + r.elementwise_us(d.act_elems + d.combine_elems, &p);
        // 2048 tokens attend over 1024 positions on average: the attention's MACs at the
        // calibrated factor, and the leftover stages on the 4 A76s, per token.
        let attention = r.attention_factor * 2.0 * 4096.0 * 1024.0 * r.dense_us_per_mac;
        let expected = 2048.0 * (attention + LEFTOVER_AT_1024_US / 4.0);
        assert!(
            (priced(&cpu) - expected).abs() < 1e-6 * expected,
            "{expected}"
        );
        let projections = 2048.0 * 18_874_368.0 * r.dense_us_per_mac;
        assert!((priced(&all) - priced(&cpu) - projections).abs() < 1e-6 * projections);
        assert_eq!(cpu.bytes, (2048.0 * 128.0 * p.dense_weight_bytes) as u64);
        // A shared expert is a dense matmul too.
        assert_eq!(ModelShape::QWEN15_MOE_A27B.dense_matmuls().len(), 7);
    }
}
