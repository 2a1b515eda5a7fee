#!/usr/bin/env python3
"""Writes the dequantization test vectors in tests/data/quant/ from the PyPI `gguf` package.

gguf's numpy dequantizers compute in f32 with the same products in the same order as ggml's
`dequantize_row_*`, so their output is the bit pattern ggml's reference gives. For each type the
script writes `<type>.blocks` (raw blocks) and `<type>.f32` (little-endian f32, the expected
dequantized weights). Blocks are: blocks made by gguf's quantizer from Gaussian data (types it can
quantize), random bytes with every fp16 field forced finite, and hand-made edge cases (zero,
subnormal, negative and largest-finite scales).

    pip install gguf==0.19.0 numpy && python3 tools/make_quant_vectors.py
"""
import os

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "quant")
rng = np.random.default_rng(20261129)

# (type, block bytes, offsets of the fp16 fields in a block)
TYPES = {
    "q4_0": (T.Q4_0, 18, [0]),
    "q4_1": (T.Q4_1, 20, [0, 2]),
    "q5_0": (T.Q5_0, 22, [0]),
    "q8_0": (T.Q8_0, 34, [0]),
    "q4_K": (T.Q4_K, 144, [0, 2]),
    "q6_K": (T.Q6_K, 210, [208]),
}
EDGE_HALVES = [0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF, 0x1234]


def finite_halves(blocks, offsets):
    for off in offsets:
        h = blocks[:, off:off + 2].copy().view(np.uint16)
        inf_or_nan = (h & 0x7C00) == 0x7C00
        h[inf_or_nan] &= np.uint16(0xBFFF)  # clear the exponent's top bit: finite
        blocks[:, off:off + 2] = h.view(np.uint8)
    return blocks


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, (qtype, nbytes, offsets) in TYPES.items():
        parts = []
        if qtype in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q8_0):
            data = (rng.standard_normal((8, 32)) * rng.uniform(0.01, 3.0, (8, 1))).astype(np.float32)
            parts.append(quants.quantize(data, qtype).reshape(-1, nbytes))
        parts.append(finite_halves(rng.integers(0, 256, (24, nbytes), dtype=np.uint8), offsets))
        edge = finite_halves(rng.integers(0, 256, (len(EDGE_HALVES), nbytes), dtype=np.uint8), offsets)
        for i, h in enumerate(EDGE_HALVES):
            for off in offsets:
                edge[i, off:off + 2] = np.array([h], dtype="<u2").view(np.uint8)
        parts.append(edge)
        blocks = np.ascontiguousarray(np.concatenate(parts))
        values = quants.dequantize(blocks.reshape(-1), qtype).astype("<f4")
        blocks.tofile(os.path.join(OUT, f"{name}.blocks"))
        values.tofile(os.path.join(OUT, f"{name}.f32"))
        print(f"{name}: {blocks.shape[0]} blocks, {values.size} weights")


if __name__ == "__main__":
    main()
