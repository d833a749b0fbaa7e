#!/usr/bin/env python3
"""Writes tests/data/tiny-llama.gguf: a 2-layer random-weights Llama written with the reference
`gguf` GGUFWriter, so our reader is tested against the converter's own writer.

Every supported weight type appears at least once. For each tensor the dequantized first row is
stored as metadata "test.row0.<tensor name>" (f32 array), so a test can check offsets and
dequantization end to end. output_norm is 1 + i/64 (exact in f32). Tokenizer: byte-level BPE
(gpt2 style) with 256 byte tokens, a few merges and ChatML specials.

Usage: python3 tools/make_tiny_gguf.py [out.gguf]
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf import quants

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 64, 2, 4, 2, 256
HEAD_DIM = HIDDEN // HEADS
rng = np.random.default_rng(42)


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def tokenizer():
    byte_tokens = list(bytes_to_unicode().values())
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s", "r e", "Ġ w", "a t", "e n", "Ġ c"]
    merged = [m.replace(" ", "") for m in merges]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = byte_tokens + merged + specials
    types = [1] * (len(byte_tokens) + len(merged)) + [3] * len(specials)
    return tokens, types, merges, len(byte_tokens) + len(merged)


def k_quant_raw(qtype, rows, cols):
    bs, tb = gguf.GGML_QUANT_SIZES[qtype]
    nb = cols // bs
    b = rng.integers(0, 256, (rows, nb, tb), dtype=np.uint8)
    scales = rng.uniform(1e-3, 2e-2, (rows, nb, 2)).astype(np.float16).view(np.uint8)
    if qtype == T.Q4_K:
        b[..., 0:4] = scales.reshape(rows, nb, 4)
    else:
        b[..., tb - 2:tb] = scales.reshape(rows, nb, 4)[..., 0:2]
    return b.reshape(rows, nb * tb)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "data", "tiny-llama.gguf")
    tokens, types, merges, eos = tokenizer()
    vocab = len(tokens)

    w = gguf.GGUFWriter(out, "llama")
    w.add_name("tiny-llama")
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(1)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(eos)
    w.add_eos_token_id(eos + 2)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

    def add(name, qtype, rows, cols, data=None):
        if data is None:
            if qtype in (T.Q4_K, T.Q6_K):
                q = k_quant_raw(qtype, rows, cols)
            else:
                x = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
                q = quants.quantize(x, qtype)
        else:
            q = quants.quantize(data, qtype)  # 1-D for vectors
        row0 = quants.dequantize(q.reshape(rows, -1)[0:1], qtype).reshape(-1)[:cols]
        w.add_array("test.row0." + name, [float(v) for v in row0])
        w.add_tensor(name, q, raw_dtype=qtype)

    add("token_embd.weight", T.Q8_0, vocab, HIDDEN)
    add("output_norm.weight", T.F32, 1, HIDDEN, 1 + np.arange(HIDDEN, dtype=np.float32) / 64)
    add("output.weight", T.F16, vocab, HIDDEN)
    # Q4_K/Q6_K need 256-element rows: only ffn_down (cols = FFN) has them.
    kinds = [(T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.BF16, T.Q4_K),
             (T.Q8_0, T.Q8_0, T.Q8_0, T.Q8_0, T.Q4_0, T.Q5_1, T.Q6_K)]
    for i in range(LAYERS):
        p = f"blk.{i}."
        tq, tk, tv, to, tg, tu, td = kinds[i]
        add(p + "attn_norm.weight", T.F32, 1, HIDDEN, np.ones(HIDDEN, np.float32))
        add(p + "attn_q.weight", tq, HEADS * HEAD_DIM, HIDDEN)
        add(p + "attn_k.weight", tk, KV_HEADS * HEAD_DIM, HIDDEN)
        add(p + "attn_v.weight", tv, KV_HEADS * HEAD_DIM, HIDDEN)
        add(p + "attn_output.weight", to, HIDDEN, HEADS * HEAD_DIM)
        add(p + "ffn_norm.weight", T.F32, 1, HIDDEN, np.ones(HIDDEN, np.float32))
        add(p + "ffn_gate.weight", tg, FFN, HIDDEN)
        add(p + "ffn_up.weight", tu, FFN, HIDDEN)
        add(p + "ffn_down.weight", td, HIDDEN, FFN)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
