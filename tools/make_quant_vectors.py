#!/usr/bin/env python3
"""Writes the dequantization test vectors in tests/data/quant/ from the PyPI `gguf` package.

gguf's numpy dequantizers compute in f32 with the same products in the same order as ggml's
`dequantize_row_*`, so their output is the bit pattern ggml's reference gives. For each type the
script writes `<type>.blocks` (raw blocks) and `<type>.f32` (little-endian f32, the expected
dequantized weights). Blocks are: blocks made by gguf's quantizer from Gaussian data (types it can
quantize), random bytes with every fp16 field forced finite, hand-made edge cases (zero,
subnormal, negative and largest-finite scales; MXFP4: the extreme E8M0 exponents), and for the
codebook types blocks that use every entry of their grid once (gguf decodes its grids from its
own encoding, so these check every entry of ours).

    pip install gguf==0.19.0 numpy && python3 tools/make_quant_vectors.py
"""
import os

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "quant")
rng = np.random.default_rng(20261129)

# (type, block bytes, offsets of the fp16 fields in a block), the six the engine takes first (so
# that their vectors do not depend on the others' draws from the random stream). IQ1_M's fp16 scale is the top
# nibbles of its four scale words (bytes 48..56); MXFP4's scale is the E8M0 byte 0.
TYPES = {
    "q4_0": (T.Q4_0, 18, [0]),
    "q4_1": (T.Q4_1, 20, [0, 2]),
    "q5_0": (T.Q5_0, 22, [0]),
    "q8_0": (T.Q8_0, 34, [0]),
    "q4_K": (T.Q4_K, 144, [0, 2]),
    "q6_K": (T.Q6_K, 210, [208]),
    "q5_1": (T.Q5_1, 24, [0, 2]),
    "q2_K": (T.Q2_K, 84, [80, 82]),
    "q3_K": (T.Q3_K, 110, [108]),
    "q5_K": (T.Q5_K, 176, [0, 2]),
    "iq2_xxs": (T.IQ2_XXS, 66, [0]),
    "iq2_xs": (T.IQ2_XS, 74, [0]),
    "iq2_s": (T.IQ2_S, 82, [0]),
    "iq3_xxs": (T.IQ3_XXS, 98, [0]),
    "iq3_s": (T.IQ3_S, 110, [0]),
    "iq1_s": (T.IQ1_S, 50, [0]),
    "iq1_m": (T.IQ1_M, 56, []),
    "iq4_nl": (T.IQ4_NL, 18, [0]),
    "iq4_xs": (T.IQ4_XS, 136, [0]),
    "mxfp4": (T.MXFP4, 17, []),
}
QUANTIZABLE = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.MXFP4)
EDGE_HALVES = [0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF, 0x1234]
# E8M0 bytes: the subnormal scales, around 1, the largest finite products and those that
# overflow to infinity (253..255: ggml's row validation rejects only 255).
EDGE_E8M0 = [0, 1, 2, 3, 100, 127, 128, 129, 200, 252, 253, 254, 255]


def finite_halves(blocks, offsets):
    for off in offsets:
        h = blocks[:, off:off + 2].copy().view(np.uint16)
        inf_or_nan = (h & 0x7C00) == 0x7C00
        h[inf_or_nan] &= np.uint16(0xBFFF)  # clear the exponent's top bit: finite
        blocks[:, off:off + 2] = h.view(np.uint8)
    return blocks


def set_iq1m_scale(blocks, halves):
    """The fp16 `halves` (one per block) into the top nibbles of IQ1_M's scale words."""
    words = blocks[:, 48:56].copy().view("<u2")
    for i in range(4):
        words[:, i] = (words[:, i] & 0x0FFF) | (((halves >> (4 * i)) & 0xF) << 12)
    blocks[:, 48:56] = words.view(np.uint8)


def finite_iq1m_scales(blocks):
    words = blocks[:, 48:56].view("<u2")
    h = ((words[:, 0] >> 12) | ((words[:, 1] >> 8) & 0xF0) | ((words[:, 2] >> 4) & 0xF00)
         | (words[:, 3] & 0xF000)).astype(np.uint16)
    h[(h & 0x7C00) == 0x7C00] &= np.uint16(0xBFFF)
    set_iq1m_scale(blocks, h)


def grid_sweep(name, nbytes):
    """Blocks (random otherwise) whose grid indices run through every grid entry once."""
    def blocks(n):
        return rng.integers(0, 256, (n, nbytes), dtype=np.uint8)

    def put_u16(b, at, v):
        b[at:at + 2] = np.array([v], dtype="<u2").view(np.uint8)

    def get_u16(b, at):
        return int(b[at:at + 2].view("<u2")[0])

    if name == "iq2_xxs":  # 8 sub-blocks x 4 grid bytes at 2 + 8*ib
        out = blocks(8)
        for b in range(8):
            for ib in range(8):
                out[b, 2 + 8 * ib:6 + 8 * ib] = 32 * b + 4 * ib + np.arange(4)
    elif name == "iq2_xs":  # 32 u16 from byte 2, low 9 bits the index
        out = blocks(16)
        for b in range(16):
            for i in range(32):
                at = 2 + 2 * i
                put_u16(out[b], at, (get_u16(out[b], at) & 0xFE00) | (32 * b + i))
    elif name == "iq2_s":  # qs[i] at 2 + i, bits 2(i%4).. of qh[i/4] at 66 + i/4
        out = blocks(32)
        out[:, 66:74] = 0
        for b in range(32):
            for i in range(32):
                index = 32 * b + i
                out[b, 2 + i] = index & 0xFF
                out[b, 66 + i // 4] |= (index >> 8) << (2 * (i % 4))
    elif name == "iq3_xxs":  # 64 grid bytes at 2..66
        out = blocks(4)
        for b in range(4):
            out[b, 2:66] = 64 * b + np.arange(64)
    elif name == "iq3_s":  # qs[8ib + p] at 2.., bit p of qh[ib] at 66 + ib
        out = blocks(8)
        out[:, 66:74] = 0
        for b in range(8):
            for j in range(64):
                index = 64 * b + j
                out[b, 2 + j] = index & 0xFF
                out[b, 66 + j // 8] |= (index >> 8) << (j % 8)
    elif name == "iq1_s":  # qs[4ib + l] at 2.., bits 3l.. of the u16 qh[ib] at 34 + 2ib
        out = blocks(64)
        for b in range(64):
            for ib in range(8):
                qh = get_u16(out[b], 34 + 2 * ib) & 0xF000
                for l in range(4):
                    index = 32 * b + 4 * ib + l
                    out[b, 2 + 4 * ib + l] = index & 0xFF
                    qh |= (index >> 8) << (3 * l)
                put_u16(out[b], 34 + 2 * ib, qh)
    elif name == "iq1_m":  # qs[4ib + l] at 0.., low 3 bits of nibble l%2 of qh[2ib + l/2] at 32..
        out = blocks(64)
        for b in range(64):
            for ib in range(8):
                for l in range(4):
                    index = 32 * b + 4 * ib + l
                    out[b, 4 * ib + l] = index & 0xFF
                    at, shift = 32 + 2 * ib + l // 2, 4 * (l % 2)
                    out[b, at] = (int(out[b, at]) & (0xFF ^ (0x7 << shift))) | ((index >> 8) << shift)
    else:
        return None
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, (qtype, nbytes, offsets) in TYPES.items():
        parts = []
        if qtype in QUANTIZABLE:
            data = (rng.standard_normal((8, 32)) * rng.uniform(0.01, 3.0, (8, 1))).astype(np.float32)
            parts.append(quants.quantize(data, qtype).reshape(-1, nbytes))
        parts.append(rng.integers(0, 256, (24, nbytes), dtype=np.uint8))
        if (sweep := grid_sweep(name, nbytes)) is not None:
            parts.append(sweep)
        edge = rng.integers(0, 256, (len(EDGE_HALVES), nbytes), dtype=np.uint8)
        for i, h in enumerate(EDGE_HALVES):
            for off in offsets:
                edge[i, off:off + 2] = np.array([h], dtype="<u2").view(np.uint8)
        if qtype == T.IQ1_M:
            set_iq1m_scale(edge, np.array(EDGE_HALVES, dtype=np.uint16))
        if qtype == T.MXFP4:
            edge = rng.integers(0, 256, (len(EDGE_E8M0), nbytes), dtype=np.uint8)
            edge[:, 0] = EDGE_E8M0
        parts.append(edge)
        blocks = np.ascontiguousarray(np.concatenate(parts))
        finite_halves(blocks, offsets)
        if qtype == T.IQ1_M:
            finite_iq1m_scales(blocks)
        values = quants.dequantize(blocks.reshape(-1), qtype).astype("<f4")
        blocks.tofile(os.path.join(OUT, f"{name}.blocks"))
        values.tofile(os.path.join(OUT, f"{name}.f32"))
        print(f"{name}: {blocks.shape[0]} blocks, {values.size} weights")


if __name__ == "__main__":
    main()
