#!/usr/bin/env python3
"""Write a small synthetic but valid `qwen3moe` GGUF (F16 weights) for end-to-end tests.

Expert tensors have Qwen3-30B-A3B's shapes (hidden 2048, expert FFN 768, 8 experts used per token) so the
MUL_MAT_ID calls llama.cpp makes match the real model's; only the layer and expert counts are small. The
tokenizer is a byte-level BPE ("gpt2" model, "qwen2" pre-tokenizer) trained on the embedded text below.
Everything is derived from --seed: the same arguments write the same bytes.

Quantize the result with llama.cpp's llama-quantize (Q4_0, Q4_K_M). Needs PyPI gguf==0.19.0 and numpy.

--outliers gives the model real LLMs' two accuracy hazards for the int8 activation path:
- massive activations at the FFN input: the FFN input is RMSNorm(residual) * ffn_norm.weight, so a few
  channels of ffn_norm.weight are scaled (OUTLIER_CHANNELS: x20..x100); every token's FFN input then carries
  those channels at 20..100 times the others, whatever the residual holds. The router (ffn_gate_inp) reads the
  same normed input, so its columns for those channels are divided by the same factor: routing stays as
  varied as without outliers (a trained router is not dominated by them either);
- heavy-tailed weights: every matrix is drawn from Student's t with 4 degrees of freedom (scaled to the same
  variance as the Gaussian default), so blocks with a few large weights are common.
The default model (no flag) is unchanged, byte for byte.

Real scale (ggml-patch/realscale.sh): --layers 4 --experts 128 --embd-std 1 writes 4.9 GB of F16, tensor by
tensor (peak RSS ~2.8 GB). --embd-std 1 keeps the tokens distinct through the layers so that every layer
routes a 512-token ubatch to all 128 experts, as a trained (load-balanced) router roughly does; with the
default 0.05 the random attention's output, much the same for every token, soon dominates the residual
stream and the deeper layers route to ever fewer experts (125, 93, 62 of 128 in layers 0-2).
"""

import argparse
import re
from collections import Counter

import numpy as np
import gguf

TEXT = """\
The quick brown fox jumps over the lazy dog. A mixture of experts routes every token to a few small
feed forward networks and adds their outputs, weighted by the router. Only the chosen experts run, so a
large model costs little per token. The board has a neural processing unit with three cores; each core
multiplies small integer matrices very fast, but it wants its own tile layout, so weights are converted
once and kept in a cache. When a token arrives, the router picks eight experts out of many, and the
library groups the rows that share an expert into one matrix before it calls the hardware.
In the morning the market opens early; people buy bread, fish, apples and tea, and talk about the
weather, the river, the mountains and the long winter that is coming. Numbers such as 1, 2, 3, 10, 42
and 2048 appear in text too, as do questions: what is the time? where is the station? how far is it?
"""

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# --outliers: FFN-input channel (for hidden 2048; scaled to other widths) -> factor on ffn_norm.weight.
OUTLIER_CHANNELS = {7: 100.0, 300: 30.0, 1500: 50.0, 2000: 20.0}
QWEN2_SPLIT = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def train_bpe(text, n_merges):
    """Plain BPE: repeatedly merge the most frequent adjacent pair (ties broken by the pair itself)."""
    byte_map = bytes_to_unicode()
    words = Counter(tuple(byte_map[b] for b in w.encode()) for w in QWEN2_SPLIT.findall(text))
    merges = []
    for _ in range(n_merges):
        pairs = Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += count
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        merged = {}
        for word, count in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + count
        words = merged
    tokens = [byte_map[b] for b in range(256)]
    for a, b in merges:
        if a + b not in tokens:
            tokens.append(a + b)
    return tokens, [f"{a} {b}" for a, b in merges]


def add_vocabulary(w, n_merges):
    """Adds the byte-level BPE tokenizer trained on TEXT to writer `w`; returns its token list."""
    tokens, merges = train_bpe(TEXT, n_merges)
    tokens += SPECIAL_TOKENS
    # Pad the vocabulary to a multiple of 32 rows so every quant type can hold the embedding.
    while len(tokens) % 32:
        tokens.append(f"[PAD{len(tokens)}]")
    token_types = [gguf.TokenType.NORMAL] * len(tokens)
    for i, t in enumerate(tokens):
        if t in SPECIAL_TOKENS:
            token_types[i] = gguf.TokenType.CONTROL
        elif t.startswith("[PAD"):
            token_types[i] = gguf.TokenType.UNUSED
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(token_types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    return tokens


def write_tensors(w, tensors):
    """Writes the header, then each (name, shape, dtype, make) tensor's data, made one at a time (a
    real-scale model's experts are GBs), and closes `w`. `shape` is numpy's: ggml's ne reversed."""
    for name, shape, dtype, _ in tensors:
        w.add_tensor_info(name, shape, dtype, int(np.prod(shape)) * dtype.itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, dtype, make in tensors:
        data = make()
        assert data.shape == shape and data.dtype == dtype, name
        w.write_tensor_data(data)
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="output .gguf path (F16)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--experts-used", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--expert-ffn", type=int, default=768)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--heads-kv", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--merges", type=int, default=400)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--text-out", help="also write the embedded text (repeated) here, e.g. for llama-perplexity")
    ap.add_argument("--embd-std", type=float, default=0.05,
                    help="token embedding standard deviation (see above; 1.0 for ggml-patch/realscale.sh)")
    ap.add_argument("--outliers", action="store_true", help="massive FFN-input channels and heavy-tailed weights (see above)")
    args = ap.parse_args()
    if args.experts < 16 or args.experts_used > args.experts:
        ap.error("need at least 16 experts and experts-used <= experts")

    h, f, e, hd = args.hidden, args.expert_ffn, args.experts, args.head_dim
    w = gguf.GGUFWriter(args.out, "qwen3moe")
    w.add_name("ork-moe tiny qwen3moe" + (" (outliers)" if args.outliers else ""))
    w.add_context_length(4096)
    w.add_embedding_length(h)
    w.add_block_count(args.layers)
    w.add_feed_forward_length(f * args.experts_used)
    w.add_expert_feed_forward_length(f)
    w.add_expert_count(e)
    w.add_expert_used_count(args.experts_used)
    w.add_head_count(args.heads)
    w.add_head_count_kv(args.heads_kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    n_vocab = len(add_vocabulary(w, args.merges))

    rng = np.random.default_rng(args.seed)

    def weight(*shape, fan_in):
        # numpy shape is ggml's ne reversed; scaled so activations keep unit-ish variance through the layers
        if args.outliers:  # Student t, 4 degrees of freedom: variance 2
            return (rng.standard_t(4, shape).astype(np.float32) / np.sqrt(2.0 * fan_in)).astype(np.float16)
        return (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(fan_in)).astype(np.float16)

    outliers = {c * h // 2048: f for c, f in OUTLIER_CHANNELS.items()} if args.outliers else {}

    def ffn_norm():
        g = norm(h)
        for c, f in outliers.items():
            g[c] *= f
        return g

    def router():
        r = (rng.standard_normal((e, h), dtype=np.float32) / np.sqrt(h)).astype(np.float32)
        for c, f in outliers.items():
            r[:, c] /= f
        return r

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    # Tensors are generated and written one at a time (a real-scale model's experts are GBs): first every
    # tensor's name, shape and dtype for the header, then the data, drawn from rng in the same order.
    tensors = []

    def add(name, shape, dtype, make):
        tensors.append((name, shape, np.dtype(dtype), make))

    def add_weight(name, *shape, fan_in):
        add(name, shape, np.float16, lambda: weight(*shape, fan_in=fan_in))

    def add_norm(name, n):
        add(name, (n,), np.float32, lambda: norm(n))

    # tied output: logits = normed hidden (norm ~sqrt(h)) . embedding rows; keep their spread a few units
    add("token_embd.weight", (n_vocab, h), np.float16,
        lambda: (args.embd_std * rng.standard_normal((n_vocab, h), dtype=np.float32)).astype(np.float16))
    add_norm("output_norm.weight", h)
    for i in range(args.layers):
        p = f"blk.{i}."
        add_norm(p + "attn_norm.weight", h)
        add_weight(p + "attn_q.weight", args.heads * hd, h, fan_in=h)
        add_weight(p + "attn_k.weight", args.heads_kv * hd, h, fan_in=h)
        add_weight(p + "attn_v.weight", args.heads_kv * hd, h, fan_in=h)
        add_weight(p + "attn_output.weight", h, args.heads * hd, fan_in=args.heads * hd)
        add_norm(p + "attn_q_norm.weight", hd)
        add_norm(p + "attn_k_norm.weight", hd)
        add(p + "ffn_norm.weight", (h,), np.float32, ffn_norm)
        add(p + "ffn_gate_inp.weight", (e, h), np.float32, router)
        add_weight(p + "ffn_gate_exps.weight", e, f, h, fan_in=h)
        add_weight(p + "ffn_up_exps.weight", e, f, h, fan_in=h)
        add_weight(p + "ffn_down_exps.weight", e, h, f, fan_in=f)

    write_tensors(w, tensors)

    if args.text_out:
        write_text(args.text_out)


def write_text(path):
    """The text the tokenizer was trained on, repeated: llama-perplexity's input."""
    with open(path, "w") as out:
        out.write(TEXT * 40)


if __name__ == "__main__":
    main()
