#!/usr/bin/env python3
"""Writes tiny random-weights Hugging Face folders with transformers' own save_pretrained:
  tests/data/tiny-qwen2/  Qwen2 (q/k/v biases), untied, one model.safetensors
  tests/data/tiny-qwen3/  Qwen3 (q_norm/k_norm, head_dim != hidden/heads), tied, two shards + index
Known values for the tests: model.norm.weight = 1 + i/64; layer 0 q_proj.bias = i/8 (exact in bf16).
Each folder gets a tiny byte-level BPE tokenizer.json (300 tokens; the embedding has 304 rows) and a
tokenizer_config.json with a ChatML chat_template.

Usage: python3 tools/make_tiny_safetensors.py [out_dir]   (default tests/data)
"""
import json
import os
import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def make_tokenizer(path):
    """A byte-level BPE (Qwen style) trained on a few sentences: 256 bytes + merges + ChatML specials."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    text = ["The quick brown fox jumps over the lazy dog.", "Hello world, this is a tiny tokenizer.",
            "user", "assistant", "system", "the cat sat on the mat"] * 20
    tok.train_from_iterator(text, trainer)
    tok.save(path)


def finish(model, out, **save_kw):
    with torch.no_grad():
        n = model.model.norm.weight.numel()
        model.model.norm.weight.copy_(1 + torch.arange(n, dtype=torch.float32) / 64)
        attn = model.model.layers[0].self_attn
        if attn.q_proj.bias is not None:
            attn.q_proj.bias.copy_(torch.arange(attn.q_proj.bias.numel(), dtype=torch.float32) / 8)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True, **save_kw)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": CHATML, "eos_token": "<|im_end|>", "add_bos_token": False}, f, indent=1)
    make_tokenizer(os.path.join(out, "tokenizer.json"))
    for junk in ("generation_config.json",):
        p = os.path.join(out, junk)
        if os.path.exists(p):
            os.remove(p)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "data")
    torch.manual_seed(0)
    common = dict(vocab_size=304, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-6)

    q2 = Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=False, rope_theta=1000000.0))
    finish(q2, os.path.join(root, "tiny-qwen2"))

    q3 = Qwen3ForCausalLM(Qwen3Config(**common, head_dim=16, tie_word_embeddings=True, rope_theta=1000000.0))
    finish(q3, os.path.join(root, "tiny-qwen3"), max_shard_size="20KB")


if __name__ == "__main__":
    main()
