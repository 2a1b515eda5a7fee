#!/usr/bin/env python3
"""Write a small synthetic but valid GGUF (F16 weights) of one MoE architecture, with its real expert shapes.

Per layer, every routed-expert tensor has the shape of the named model (hidden size K, expert FFN width N,
expert count, experts used per token, shared experts, biases), and so has attention; only the layer count
and the vocabulary (make_tiny_qwen3moe.py's byte-level BPE) are small. Weights are random: the model says
nothing, but llama.cpp builds and runs its real graph, so the MUL_MAT_ID calls are those of the real model.
Tensor names and metadata keys follow the pinned llama.cpp (src/models/<arch>.cpp).

  tools/make_tiny_moe.py ARCH OUT.gguf [--layers N] [--experts E]     (ARCH: see ARCHS below)

--experts E (default: the real count) trades realism for size in fast runs: an expert's shape is kept.
Quantize with llama-quantize. Needs PyPI gguf==0.19.0 and numpy. The same arguments write the same bytes.
"""

import argparse

import gguf
import numpy as np

from make_tiny_qwen3moe import add_vocabulary, write_tensors, write_text

# The real models' shapes. hidden = K of gate/up, expert_ffn = N (K of down); heads, kv heads, head size;
# dense_ffn: feed_forward_length, which olmoe and granitemoe read as the expert width.
ARCHS = {
    # Qwen3-30B-A3B
    "qwen3moe": dict(model="Qwen3-30B-A3B", hidden=2048, heads=32, heads_kv=4, head_dim=128,
                     experts=128, used=8, expert_ffn=768),
    # Qwen1.5-MoE-A2.7B: a shared expert (gated by ffn_gate_inp_shexp), q/k/v biases
    "qwen2moe": dict(model="Qwen1.5-MoE-A2.7B", hidden=2048, heads=16, heads_kv=16, head_dim=128,
                     experts=60, used=4, expert_ffn=1408, shared_ffn=5632),
    # OLMoE-1B-7B: q/k norms over the whole projection
    "olmoe": dict(model="OLMoE-1B-7B", hidden=2048, heads=16, heads_kv=16, head_dim=128,
                  experts=64, used=8, expert_ffn=1024, dense_ffn=1024),
    # gpt-oss-20b: K = 2880 (not a multiple of 256), per-expert biases, attention sinks, sliding window
    "gpt-oss": dict(model="gpt-oss-20b", hidden=2880, heads=64, heads_kv=8, head_dim=64,
                    experts=32, used=4, expert_ffn=2880),
    # granite-3.0-3b-a800m: muP-style scales
    "granitemoe": dict(model="granite-3.0-3b-a800m", hidden=1536, heads=24, heads_kv=8, head_dim=64,
                       experts=40, used=8, expert_ffn=512, dense_ffn=512),
    # ERNIE-4.5-21B-A3B: a leading dense layer, shared experts (2 x 1536), expert-probability bias
    "ernie4_5-moe": dict(model="ERNIE-4.5-21B-A3B", hidden=2560, heads=20, heads_kv=4, head_dim=128,
                         experts=64, used=6, expert_ffn=1536, shared_ffn=3072, dense_ffn=12288, dense_lead=1),
    # DeepSeek-V2-Lite: multi-head latent attention (no q LoRA, kv LoRA rank 512, 64 rope + 128 nope dims
    # per head, 128 value dims), a leading dense layer, two shared experts (2 x 1408)
    "deepseek2": dict(model="DeepSeek-V2-Lite", hidden=2048, heads=16, heads_kv=1, head_dim=576,
                      experts=64, used=6, expert_ffn=1408, shared_ffn=2816, dense_ffn=10944, dense_lead=1,
                      kv_lora=512, rope_dim=64, k_mla=192, v_mla=128),
    # LFM2-8B-A1B: short-convolution layers among attention ones (here odd layers attend), two leading
    # dense layers, sigmoid routing with an expert-probability bias
    "lfm2moe": dict(model="LFM2-8B-A1B", hidden=2048, heads=32, heads_kv=8, head_dim=64,
                    experts=32, used=4, expert_ffn=1792, dense_ffn=7168, dense_lead=2, conv_cache=3),
    # Qwen3.5/3.6-35B-A3B: gated delta-net layers among gated attention ones (here every second layer
    # attends), 256 experts plus a gated shared expert
    "qwen35moe": dict(model="Qwen3.6-35B-A3B", hidden=2048, heads=16, heads_kv=2, head_dim=256,
                      experts=256, used=8, expert_ffn=512, shared_ffn=512,
                      linear_k_heads=16, linear_v_heads=32, linear_head_dim=128, conv_kernel=4),
    # Gemma-4-26B-A4B: sliding-window layers (8 kv heads of 256) among full-attention ones (2 kv heads of
    # 512, keys doubling as values; here every second layer), proportional RoPE on the full layers, a dense
    # GELU MLP beside the experts in every layer, gate and up experts fused in one tensor
    "gemma4": dict(model="Gemma-4-26B-A4B", hidden=2816, heads=16, heads_kv=8, head_dim=256,
                   experts=128, used=8, expert_ffn=704, dense_ffn=2112,
                   full_heads_kv=2, full_head_dim=512, window=1024),
}


class Model:
    """The tensor list of one model, each tensor's data drawn from one seeded generator when written."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.tensors = []

    def add(self, name, shape, dtype, make):
        self.tensors.append((name, shape, np.dtype(dtype), make))

    def weight(self, name, rows, cols):
        """A matrix of `rows` outputs over `cols` inputs (ggml ne = {cols, rows}), unit-ish gain."""
        self.add(name, (rows, cols), np.float16,
                 lambda: (self.rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float16))

    def experts(self, name, e, rows, cols):
        self.add(name, (e, rows, cols), np.float16,
                 lambda: (self.rng.standard_normal((e, rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float16))

    def norm(self, name, *shape):
        self.add(name, shape, np.float32,
                 lambda: (1.0 + 0.1 * self.rng.standard_normal(shape, dtype=np.float32)).astype(np.float32))

    def bias(self, name, *shape):
        self.add(name, shape, np.float32,
                 lambda: (0.02 * self.rng.standard_normal(shape, dtype=np.float32)).astype(np.float32))

    def router(self, name, e, h):
        """An f32 matrix (routers, and kernels ggml takes in f32 only), unit-ish gain."""
        self.add(name, (e, h), np.float32,
                 lambda: (self.rng.standard_normal((e, h), dtype=np.float32) / np.sqrt(h)).astype(np.float32))


def add_hparams(w, arch, c, layers, experts):
    w.add_context_length(4096)
    w.add_embedding_length(c["hidden"])
    w.add_block_count(layers)
    w.add_feed_forward_length(c.get("dense_ffn", c["expert_ffn"] * c["used"]))
    w.add_expert_feed_forward_length(c["expert_ffn"])
    if "shared_ffn" in c:
        w.add_expert_shared_feed_forward_length(c["shared_ffn"])
    w.add_expert_count(experts)
    w.add_expert_used_count(c["used"])
    w.add_head_count(c["heads"])
    if arch == "gemma4":
        add_gemma4_hparams(w, c, layers)
        return
    if arch == "lfm2moe":  # a kv head count of 0 makes a layer a short-convolution one
        w.add_head_count_kv([c["heads_kv"] if il % 2 else 0 for il in range(layers)])
        w.add_shortconv_l_cache(c["conv_cache"])
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    else:
        w.add_head_count_kv(c["heads_kv"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c.get("kv_lora", c["head_dim"]))
    w.add_rope_freq_base(1000000.0 if arch != "gpt-oss" else 150000.0)
    w.add_layer_norm_rms_eps(1e-6)
    if arch == "gpt-oss":
        w.add_sliding_window(128)
    if arch == "granitemoe":
        w.add_logit_scale(6.0)
        w.add_residual_scale(0.22)
        w.add_embedding_scale(12.0)
        w.add_attention_scale(0.015625)
    if arch == "ernie4_5-moe":
        w.add_interleave_moe_layer_step(1)
    if "dense_lead" in c:
        w.add_leading_dense_block_count(c["dense_lead"])
    if arch == "qwen35moe":
        w.add_full_attention_interval(2)
        w.add_rope_dimension_count(64)
        w.add_rope_dimension_sections([11, 11, 10, 0])
        w.add_ssm_conv_kernel(c["conv_kernel"])
        w.add_ssm_inner_size(c["linear_v_heads"] * c["linear_head_dim"])
        w.add_ssm_state_size(c["linear_head_dim"])
        w.add_ssm_time_step_rank(c["linear_v_heads"])
        w.add_ssm_group_count(c["linear_k_heads"])
    if arch == "deepseek2":
        # llama.cpp tells V2-Lite (no q LoRA) by its layer count; a rank of 0 says the same at any depth
        w.add_q_lora_rank(0)
        w.add_kv_lora_rank(c["kv_lora"])
        w.add_key_length_mla(c["k_mla"])
        w.add_value_length_mla(c["v_mla"])
        w.add_rope_dimension_count(c["rope_dim"])
        w.add_expert_shared_count(c["shared_ffn"] // c["expert_ffn"])
        w.add_expert_weights_scale(1.0)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SOFTMAX)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)


def gemma4_full(il):
    """Whether gemma4 layer `il` attends to the full context (the others slide)."""
    return il % 2 == 1


def add_gemma4_hparams(w, c, layers):
    full = [gemma4_full(il) for il in range(layers)]
    w.add_head_count_kv([c["full_heads_kv"] if f else c["heads_kv"] for f in full])
    w.add_sliding_window_pattern([not f for f in full])
    w.add_sliding_window(c["window"])
    w.add_key_length(c["full_head_dim"])
    w.add_value_length(c["full_head_dim"])
    w.add_key_length_swa(c["head_dim"])
    w.add_value_length_swa(c["head_dim"])
    w.add_rope_dimension_count(c["full_head_dim"])
    w.add_rope_dimension_count_swa(c["head_dim"])
    w.add_rope_freq_base(1000000.0)
    w.add_rope_freq_base_swa(10000.0)
    w.add_shared_kv_layers(0)
    w.add_embedding_length_per_layer_input(0)
    w.add_final_logit_softcapping(30.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)


def add_gemma4_layer(m, c, p, il, e):
    h, f = c["hidden"], c["expert_ffn"]
    full = gemma4_full(il)
    hd = c["full_head_dim"] if full else c["head_dim"]
    kv = (c["full_heads_kv"] if full else c["heads_kv"]) * hd
    m.norm(p + "attn_norm.weight", h)
    m.weight(p + "attn_q.weight", c["heads"] * hd, h)
    m.weight(p + "attn_k.weight", kv, h)
    if not full:
        m.weight(p + "attn_v.weight", kv, h)
    m.weight(p + "attn_output.weight", h, c["heads"] * hd)
    m.norm(p + "attn_q_norm.weight", hd)
    m.norm(p + "attn_k_norm.weight", hd)
    m.norm(p + "post_attention_norm.weight", h)
    m.norm(p + "layer_output_scale.weight", 1)
    for name in ("ffn_norm", "post_ffw_norm", "pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"):
        m.norm(p + name + ".weight", h)
    m.weight(p + "ffn_gate.weight", c["dense_ffn"], h)
    m.weight(p + "ffn_up.weight", c["dense_ffn"], h)
    m.weight(p + "ffn_down.weight", h, c["dense_ffn"])
    m.router(p + "ffn_gate_inp.weight", e, h)
    m.norm(p + "ffn_gate_inp.scale", h)
    m.experts(p + "ffn_gate_up_exps.weight", e, 2 * f, h)
    m.experts(p + "ffn_down_exps.weight", e, h, f)
    m.norm(p + "ffn_down_exps.scale", e)


def add_mla_attention(m, c, p):
    h, n, r = c["hidden"], c["heads"], c["kv_lora"]
    m.norm(p + "attn_norm.weight", h)
    m.norm(p + "attn_kv_a_norm.weight", r)
    m.weight(p + "attn_q.weight", n * c["k_mla"], h)
    m.weight(p + "attn_kv_a_mqa.weight", r + c["rope_dim"], h)
    m.experts(p + "attn_k_b.weight", n, r, c["k_mla"] - c["rope_dim"])
    m.experts(p + "attn_v_b.weight", n, c["v_mla"], r)
    m.weight(p + "attn_output.weight", h, n * c["v_mla"])


def add_short_conv(m, c, p):
    h = c["hidden"]
    m.norm(p + "attn_norm.weight", h)
    # ggml's ssm_conv takes the kernel in f32 only
    m.router(p + "shortconv.conv.weight", h, c["conv_cache"])
    m.weight(p + "shortconv.in_proj.weight", 3 * h, h)
    m.weight(p + "shortconv.out_proj.weight", h, h)


def add_gated_delta_net(m, c, p):
    h, d = c["hidden"], c["linear_head_dim"]
    key, value, v_heads = c["linear_k_heads"] * d, c["linear_v_heads"] * d, c["linear_v_heads"]
    m.weight(p + "attn_qkv.weight", 2 * key + value, h)
    m.weight(p + "attn_gate.weight", value, h)
    m.router(p + "ssm_conv1d.weight", 2 * key + value, c["conv_kernel"])  # f32 for ssm_conv
    m.bias(p + "ssm_dt.bias", v_heads)
    m.bias(p + "ssm_a", v_heads)
    m.weight(p + "ssm_beta.weight", v_heads, h)
    m.weight(p + "ssm_alpha.weight", v_heads, h)
    m.norm(p + "ssm_norm.weight", d)
    m.weight(p + "ssm_out.weight", h, value)


def add_attention(m, arch, c, p, il):
    if arch == "deepseek2":
        add_mla_attention(m, c, p)
        return
    if arch == "lfm2moe" and il % 2 == 0:
        add_short_conv(m, c, p)
        return
    h, hd = c["hidden"], c["head_dim"]
    q, kv = c["heads"] * hd, c["heads_kv"] * hd
    m.norm(p + "attn_norm.weight", h)
    if arch == "qwen35moe" and il % 2 == 0:
        add_gated_delta_net(m, c, p)
        return
    # qwen35moe's q projection also yields the output gate
    m.weight(p + "attn_q.weight", 2 * q if arch == "qwen35moe" else q, h)
    m.weight(p + "attn_k.weight", kv, h)
    m.weight(p + "attn_v.weight", kv, h)
    if arch in ("qwen2moe", "gpt-oss"):
        m.bias(p + "attn_q.bias", q)
        m.bias(p + "attn_k.bias", kv)
        m.bias(p + "attn_v.bias", kv)
    m.weight(p + "attn_output.weight", h, q)
    if arch in ("qwen3moe", "lfm2moe", "qwen35moe"):
        m.norm(p + "attn_q_norm.weight", hd)
        m.norm(p + "attn_k_norm.weight", hd)
    if arch == "olmoe":
        m.norm(p + "attn_q_norm.weight", q)
        m.norm(p + "attn_k_norm.weight", kv)
    if arch == "gpt-oss":
        m.bias(p + "attn_output.bias", h)
        m.bias(p + "attn_sinks.weight", c["heads"])


def add_ffn(m, arch, c, p, il, e):
    h, f = c["hidden"], c["expert_ffn"]
    # gpt-oss's and qwen35moe's FFN norm is named post_attention_norm
    m.norm(p + ("post_attention_norm.weight" if arch in ("gpt-oss", "qwen35moe") else "ffn_norm.weight"), h)
    if il < c.get("dense_lead", 0):
        m.weight(p + "ffn_gate.weight", c["dense_ffn"], h)
        m.weight(p + "ffn_up.weight", c["dense_ffn"], h)
        m.weight(p + "ffn_down.weight", h, c["dense_ffn"])
        return
    m.router(p + "ffn_gate_inp.weight", e, h)
    if arch == "gpt-oss":
        m.bias(p + "ffn_gate_inp.bias", e)
    if arch in ("ernie4_5-moe", "lfm2moe"):
        m.bias(p + "exp_probs_b.bias", e)
    m.experts(p + "ffn_gate_exps.weight", e, f, h)
    m.experts(p + "ffn_up_exps.weight", e, f, h)
    m.experts(p + "ffn_down_exps.weight", e, h, f)
    if arch == "gpt-oss":
        m.bias(p + "ffn_gate_exps.bias", e, f)
        m.bias(p + "ffn_up_exps.bias", e, f)
        m.bias(p + "ffn_down_exps.bias", e, h)
    if "shared_ffn" in c:
        s = c["shared_ffn"]
        if arch in ("qwen2moe", "qwen35moe"):
            m.router(p + "ffn_gate_inp_shexp.weight", 1, h)
        m.weight(p + "ffn_gate_shexp.weight", s, h)
        m.weight(p + "ffn_up_shexp.weight", s, h)
        m.weight(p + "ffn_down_shexp.weight", h, s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("arch", choices=sorted(ARCHS))
    ap.add_argument("out", help="output .gguf path (F16)")
    ap.add_argument("--layers", type=int, help="default: the leading dense layers and 2 MoE layers")
    ap.add_argument("--experts", type=int, help="routed experts per layer (default: the real model's)")
    ap.add_argument("--merges", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--text-out", help="also write the embedded text (repeated) here, e.g. for llama-perplexity")
    args = ap.parse_args()
    c = ARCHS[args.arch]
    e = args.experts or c["experts"]
    args.layers = args.layers or c.get("dense_lead", 0) + 2
    if e < c["used"] or args.layers <= c.get("dense_lead", 0):
        ap.error(f"{args.arch} needs at least {c['used']} experts and {c.get('dense_lead', 0) + 1} layers")

    w = gguf.GGUFWriter(args.out, args.arch)
    w.add_name(f"ork-moe tiny {args.arch} ({c['model']} shapes)")
    add_hparams(w, args.arch, c, args.layers, e)
    n_vocab = len(add_vocabulary(w, args.merges))

    m = Model(args.seed)
    h = c["hidden"]
    # embedding rows small: the tied or separate output keeps logits a few units apart
    m.add("token_embd.weight", (n_vocab, h), np.float16,
          lambda: (0.05 * m.rng.standard_normal((n_vocab, h), dtype=np.float32)).astype(np.float16))
    m.norm("token_embd_norm.weight" if args.arch == "lfm2moe" else "output_norm.weight", h)
    # qwen2moe, olmoe and gpt-oss load no tied output; granitemoe and gemma4 would tie it to an embedding
    # they scale up (×12, ×√hidden), so every position would predict its own token with p ≈ 1 and the KL
    # divergence of the e2e check would have nothing to measure
    if args.arch in ("qwen2moe", "olmoe", "gpt-oss", "granitemoe", "gemma4"):
        m.weight("output.weight", n_vocab, h)
    if args.arch == "gemma4":
        # proportional RoPE: a quarter of the full layers' head rotates, the rest keeps a frequency factor
        # of 1e30 (convert_hf_to_gguf's ROPE_FREQS)
        rot = c["full_head_dim"] // 8
        m.add("rope_freqs.weight", (c["full_head_dim"] // 2,), np.float32,
              lambda: np.array([1.0] * rot + [1e30] * (c["full_head_dim"] // 2 - rot), dtype=np.float32))
    for il in range(args.layers):
        p = f"blk.{il}."
        if args.arch == "gemma4":
            add_gemma4_layer(m, c, p, il, e)
            continue
        add_attention(m, args.arch, c, p, il)
        add_ffn(m, args.arch, c, p, il, e)
    write_tensors(w, m.tensors)
    if args.text_out:
        write_text(args.text_out)


if __name__ == "__main__":
    main()
