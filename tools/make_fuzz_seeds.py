#!/usr/bin/env python3
"""Small seed files for the fuzz targets (fuzz/corpus/{gguf,safetensors}), written with the reference
writers (gguf.GGUFWriter, safetensors.numpy). Dimensions match fuzz/safetensors_fuzz.cpp's tiny
configs so the seeds reach tensor binding and value checks. Files have no extension (.gitignore
ignores *.gguf / *.safetensors outside tests/data).

Usage: python3 tools/make_fuzz_seeds.py
"""
import json
import os

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf import quants
from safetensors.numpy import save_file

ROOT = os.path.join(os.path.dirname(__file__), "..", "fuzz", "corpus")
H, L, HEADS, KV, HD, FFN, VOCAB = 32, 1, 2, 1, 16, 32, 8
rng = np.random.default_rng(3)


def gguf_seed(path, arch, wtype, tokenizer):
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(L)
    w.add_context_length(64)
    w.add_embedding_length(H)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    if tokenizer:
        w.add_tokenizer_model("gpt2")
        w.add_token_list([f"t{i}" for i in range(VOCAB)])
        w.add_token_types([1] * VOCAB)
        w.add_token_scores([0.0] * VOCAB)
        w.add_token_merges(["t 1"])
        w.add_bos_token_id(1)
        w.add_chat_template("{{x}}")
    else:
        w.add_vocab_size(VOCAB)

    def t(name, rows, cols, qt):
        x = (rng.standard_normal((rows, cols)) * 0.1).astype(np.float32)
        w.add_tensor(name, quants.quantize(x if rows > 1 else x[0], qt), raw_dtype=qt)

    t("token_embd.weight", VOCAB, H, wtype)
    t("output_norm.weight", 1, H, T.F32)
    p = "blk.0."
    t(p + "attn_norm.weight", 1, H, T.F32)
    t(p + "attn_q.weight", HEADS * HD, H, wtype)
    t(p + "attn_k.weight", KV * HD, H, wtype)
    t(p + "attn_v.weight", KV * HD, H, wtype)
    t(p + "attn_output.weight", H, HEADS * HD, wtype)
    if arch == "qwen2":
        for n, r in (("q", HEADS * HD), ("k", KV * HD), ("v", KV * HD)):
            t(p + f"attn_{n}.bias", 1, r, T.F32)
    if arch == "qwen3":
        t(p + "attn_q_norm.weight", 1, HD, T.F32)
        t(p + "attn_k_norm.weight", 1, HD, T.F32)
    t(p + "ffn_norm.weight", 1, H, T.F32)
    t(p + "ffn_gate.weight", FFN, H, wtype)
    t(p + "ffn_up.weight", FFN, H, wtype)
    t(p + "ffn_down.weight", H, FFN, wtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def st_seed(path, arch, dtype, tied):
    h, hd, heads, kv, ffn, vocab = 8, 4, 2, 1, 16, 16  # safetensors_fuzz.cpp tiny_config
    d = {}

    def a(name, *shape):
        d[name] = (rng.standard_normal(shape) * 0.1).astype(dtype)

    a("model.embed_tokens.weight", vocab, h)
    a("model.norm.weight", h)
    if not tied:
        a("lm_head.weight", vocab, h)
    p = "model.layers.0."
    a(p + "input_layernorm.weight", h)
    a(p + "self_attn.q_proj.weight", heads * hd, h)
    a(p + "self_attn.k_proj.weight", kv * hd, h)
    a(p + "self_attn.v_proj.weight", kv * hd, h)
    a(p + "self_attn.o_proj.weight", h, heads * hd)
    if arch == "qwen2":
        a(p + "self_attn.q_proj.bias", heads * hd)
        a(p + "self_attn.k_proj.bias", kv * hd)
        a(p + "self_attn.v_proj.bias", kv * hd)
    if arch == "qwen3":
        a(p + "self_attn.q_norm.weight", hd)
        a(p + "self_attn.k_norm.weight", hd)
    a(p + "post_attention_layernorm.weight", h)
    a(p + "mlp.gate_proj.weight", ffn, h)
    a(p + "mlp.up_proj.weight", ffn, h)
    a(p + "mlp.down_proj.weight", h, ffn)
    save_file(d, path, metadata={"format": "pt"})


def main():
    g = os.path.join(ROOT, "gguf")
    s = os.path.join(ROOT, "safetensors")
    os.makedirs(g, exist_ok=True)
    os.makedirs(s, exist_ok=True)
    gguf_seed(os.path.join(g, "llama-q8_0-tok"), "llama", T.Q8_0, True)
    gguf_seed(os.path.join(g, "qwen2-q4_0"), "qwen2", T.Q4_0, False)
    gguf_seed(os.path.join(g, "qwen3-f16"), "qwen3", T.F16, False)
    gguf_seed(os.path.join(g, "llama-q5_1"), "llama", T.Q5_1, False)
    st_seed(os.path.join(s, "llama-f32-tied"), "llama", np.float32, True)
    st_seed(os.path.join(s, "qwen2-f16"), "qwen2", np.float16, False)
    st_seed(os.path.join(s, "qwen3-f32-tied"), "qwen3", np.float32, True)
    with open(os.path.join(s, "config-json"), "w") as f:
        json.dump({"model_type": "llama", "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
                   "num_key_value_heads": 1, "intermediate_size": 16, "vocab_size": 16,
                   "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, f)
    with open(os.path.join(s, "index-json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}}, f)


if __name__ == "__main__":
    main()
