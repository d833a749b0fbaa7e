#!/usr/bin/env python3
"""Reference fixtures for src/model/quant.cpp, made with the `gguf` package (gguf.quants).

For each type: random blocks (quantized from random floats where gguf.quants can quantize, random
bytes with sane fp16 scales where it cannot), dequantized by gguf.quants.dequantize.
Writes tests/data/quant/<type>.bin:  u32 type id, u32 n elements, u32 n bytes, bytes, n x f32.
And conv.bin for the fp32 -> fp16/bf16 conversions: u32 n, n x f32 in, n x u16 fp16 (numpy),
n x u16 bf16 (gguf.quants BF16, i.e. ggml's rounding).

Usage: python3 tools/gen_quant_ref.py [out_dir]   (default tests/data/quant)
"""
import os
import struct
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

rng = np.random.default_rng(1234)


def random_floats(n):
    # A mix of scales so every quant range is used, plus exact zeros and a constant run.
    x = rng.standard_normal(n).astype(np.float32) * rng.choice([0.01, 0.1, 1.0, 10.0], n).astype(np.float32)
    x[:8] = 0.0
    x[8:16] = 0.5
    return x


def random_half_scales(n):
    return (rng.uniform(1e-3, 1e-1, n) * rng.choice([-1, 1], n)).astype(np.float16)


def raw_blocks(qtype, n_blocks):
    bs, tb = GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, (n_blocks, tb), dtype=np.uint8)
    if qtype == T.Q4_K:  # d, dmin at bytes 0..3
        b[:, 0:2] = np.abs(random_half_scales(n_blocks)).view(np.uint8).reshape(n_blocks, 2)
        b[:, 2:4] = np.abs(random_half_scales(n_blocks)).view(np.uint8).reshape(n_blocks, 2)
    elif qtype == T.Q6_K:  # d is the last 2 bytes
        b[:, tb - 2:tb] = random_half_scales(n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return b


def raw_blocks_more(qtype, n_blocks, r):
    """Random blocks of the types added later, from their own generator (the older fixtures keep their bytes)."""
    bs, tb = GGML_QUANT_SIZES[qtype]
    b = r.integers(0, 256, (n_blocks, tb), dtype=np.uint8)

    def half(n, signed=True):
        h = r.uniform(1e-3, 1e-1, n) * (r.choice([-1, 1], n) if signed else 1)
        return h.astype(np.float16).view(np.uint8).reshape(n, 2)

    if qtype == T.Q2_K:  # d, dmin are the last 4 bytes
        b[:, tb - 4:tb - 2] = half(n_blocks)
        b[:, tb - 2:tb] = half(n_blocks)
    elif qtype == T.Q3_K:  # d is the last 2 bytes
        b[:, tb - 2:tb] = half(n_blocks)
    elif qtype == T.Q5_K:  # d, dmin at bytes 0..3
        b[:, 0:2] = half(n_blocks, False)
        b[:, 2:4] = half(n_blocks, False)
    elif qtype in (T.IQ4_NL, T.IQ4_XS):  # d at bytes 0..1
        b[:, 0:2] = half(n_blocks)
    return b


def write_fixture(path, qtype, data_bytes, expected):
    with open(path, "wb") as f:
        f.write(struct.pack("<III", int(qtype), expected.size, data_bytes.size))
        f.write(data_bytes.tobytes())
        f.write(expected.astype("<f4").tobytes())


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "data", "quant")
    os.makedirs(out, exist_ok=True)

    for qtype in [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.BF16]:
        bs, tb = GGML_QUANT_SIZES[qtype]
        n = 8 * 32
        q = quants.quantize(random_floats(n), qtype).reshape(-1)
        # Append a few raw-byte blocks so bit patterns the quantizer never makes are covered too.
        if qtype != T.BF16:
            raw = raw_blocks(qtype, 2)
            raw[:, 0:2] = random_half_scales(2).view(np.uint8).reshape(2, 2)
            if qtype in (T.Q4_1, T.Q5_1):
                raw[:, 2:4] = random_half_scales(2).view(np.uint8).reshape(2, 2)
            q = np.concatenate([q, raw.reshape(-1)])
        deq = quants.dequantize(q, qtype).reshape(-1)
        write_fixture(os.path.join(out, qtype.name.lower() + ".bin"), qtype, q, deq)

    for qtype in [T.Q4_K, T.Q6_K]:
        q = raw_blocks(qtype, 4).reshape(-1)
        deq = quants.dequantize(q, qtype).reshape(-1)
        write_fixture(os.path.join(out, qtype.name.lower() + ".bin"), qtype, q, deq)

    # Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS (gguf.quants dequantizes them but cannot quantize): random blocks.
    r = np.random.default_rng(4321)
    for qtype, n_blocks in [(T.Q2_K, 6), (T.Q3_K, 6), (T.Q5_K, 6), (T.IQ4_NL, 24), (T.IQ4_XS, 6)]:
        q = raw_blocks_more(qtype, n_blocks, r).reshape(-1)
        deq = quants.dequantize(q, qtype).reshape(-1)
        write_fixture(os.path.join(out, qtype.name.lower() + ".bin"), qtype, q, deq)

    # F32 and F16 (with subnormals, infinities and NaN)
    f32 = random_floats(64)
    write_fixture(os.path.join(out, "f32.bin"), T.F32, f32.view(np.uint8), f32)
    h = rng.integers(0, 65536, 256, dtype=np.uint16)
    h[:6] = [0x0000, 0x8000, 0x0001, 0x83FF, 0x7C00, 0xFC00]
    h[6] = 0x7E00  # NaN
    write_fixture(os.path.join(out, "f16.bin"), T.F16, h.view(np.uint8), quants.dequantize(h.view(np.uint8), T.F16))

    # fp32 -> fp16 / bf16 rounding, including ties, overflow, subnormals and NaN
    x = np.concatenate([
        rng.standard_normal(200).astype(np.float32) * np.float32(1000),
        rng.standard_normal(100).astype(np.float32) * np.float32(1e-6),  # fp16 subnormal range
        np.array([0.0, -0.0, 65504.0, 65519.0, 65520.0, 1e10, -1e10, np.inf, -np.inf, np.nan,
                  1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 2.0**-25, 2.0**-24, 3 * 2.0**-25, 6.0e-5, 6.1e-5,
                  1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 3.4e38], dtype=np.float32),
        rng.integers(0, 2**32, 100, dtype=np.uint32).view(np.float32),
    ]).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        f16 = x.astype(np.float16).view(np.uint16)
    bf16 = quants.quantize(x, T.BF16).view(np.uint16)
    with open(os.path.join(out, "conv.bin"), "wb") as f:
        f.write(struct.pack("<I", x.size))
        f.write(x.astype("<f4").tobytes())
        f.write(f16.astype("<u2").tobytes())
        f.write(bf16.astype("<u2").tobytes())


if __name__ == "__main__":
    main()
