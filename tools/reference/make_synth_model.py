#!/usr/bin/env python3
"""Tiny random-weight Hugging Face models for the CPU forward tests, and their reference logits.

Writes, deterministically from a seed, three models that together cover what the forward pass must
handle (each a folder under tests/data/models/, < 500 KB, committed so CI needs no Python):

  qwen2-tiny   Qwen2ForCausalLM, QKV bias, GQA 4/2, tied embeddings, BF16 weights
  qwen3-tiny   Qwen3ForCausalLM, per-head q/k RMSNorm, head_dim 32 != hidden/heads, GQA 4/1,
               linear RoPE scaling (factor 2), tied embeddings, F16 weights
  llama3-tiny  LlamaForCausalLM, rope_scaling "llama3" (all three frequency bands exercised), untied
               lm_head, GQA 4/2, F32 weights

Each folder holds config.json (the classic Hugging Face layout: rope_theta + rope_scaling, as real
checkpoints ship it), model.safetensors, tokenizer.json (a byte-level BPE trained here with the
`tokenizers` library) and tokenizer_config.json.

The reference logits come from transformers loading that very folder (weights upcast to float32,
float32 forward), on fixed token ids, and go to tests/data/reference/<name>.json (+ .bin: float32
little-endian, all positions of every sequence, rows of vocab_size).

Weights are scaled so activations keep unit size through the layers and logits spread over a few
units (std ~2-4): random HF-default init (std 0.02) would give near-uniform logits with top-2 margins
too small to test argmax.

Usage: python3 tools/reference/make_synth_model.py [--out-root DIR]
"""
import argparse
import hashlib
import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "../.."))

VOCAB = 320  # config vocab; the tokenizer has fewer entries (rows past it are padding, as in Qwen)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! Hello selfserve, an inference server written in C++.",
    "def add(a, b):\n    return a + b\n",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16",
    "Once upon a time there was a tiny model with random weights.",
] * 4
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

MODELS = {
    "qwen2-tiny": dict(
        seed=1234, dtype="bfloat16",
        config={
            "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
            "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": True, "hidden_act": "silu",
            "use_sliding_window": False, "attention_dropout": 0.0,
        }),
    "qwen3-tiny": dict(
        seed=2345, dtype="float16",
        config={
            "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
            "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32,
            "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
            "tie_word_embeddings": True, "hidden_act": "silu", "attention_bias": False,
            "use_sliding_window": False, "attention_dropout": 0.0,
        }),
    "llama3-tiny": dict(
        seed=3456, dtype="float32", seq_lengths=[7, 24, 40, 300],
        config={
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            # head_dim 16, theta 1e4: wavelengths 6.3 (kept), 20 and 63 (smoothed), >= 199 (divided by
            # factor) against low/high-frequency wavelengths 64 / 16.
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
            "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
            "bos_token_id": 1, "eos_token_id": 2,
        }),
}
# Token sequences: lengths straddle the 16-token KV block; ids cover the whole config vocab. llama3-tiny
# adds a 300-token one: far past its original 64-position context, and (at block_size 1) longer than
# one 128-chunk attention pass.
SEQ_LENGTHS = [7, 24, 40]


def build_tokenizer(folder):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers, processors
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=300, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer=trainer)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"add_bos_token": False, "add_eos_token": False, "bos_token": None,
                   "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": CHATML,
                   "model_max_length": 512, "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=1)
    return tok.get_vocab_size()


def init_weights(model, seed):
    """Deterministic weights with unit-scale activations (see module docstring)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters()):
        with torch.no_grad():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(0.7 * torch.randn(p.shape, generator=g))
            elif "lm_head" in name:
                p.copy_(torch.randn(p.shape, generator=g) * (3.0 / p.shape[1] ** 0.5))
            else:  # [out, in] projections: keep variance
                p.copy_(torch.randn(p.shape, generator=g) * (1.0 / p.shape[1] ** 0.5))


def make_model(name, spec, out_root, ref_dir):
    from transformers import AutoConfig, AutoModelForCausalLM
    folder = os.path.join(out_root, name)
    os.makedirs(folder, exist_ok=True)
    cfg_dict = dict(spec["config"])
    cfg_dict["torch_dtype"] = spec["dtype"]
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg_dict, f, indent=1)
    n_tok = build_tokenizer(folder)
    assert n_tok <= VOCAB, n_tok

    torch.manual_seed(spec["seed"])
    config = AutoConfig.from_pretrained(folder)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    init_weights(model, spec["seed"])
    dtype = getattr(torch, spec["dtype"])
    sd = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    if cfg_dict["tie_word_embeddings"]:
        sd.pop("lm_head.weight", None)
    save_file(dict(sorted(sd.items())), os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})

    # The reference: transformers loading the committed files, computing in float32.
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ref.eval()
    g = torch.Generator().manual_seed(spec["seed"] + 1)
    seqs, blobs, meta_seqs = [], [], []
    for n in spec.get("seq_lengths", SEQ_LENGTHS):
        ids = torch.randint(0, VOCAB, (n,), generator=g).tolist()
        with torch.no_grad():
            logits = ref(torch.tensor([ids])).logits[0].float().numpy()
        srt = np.argsort(-logits, axis=1, kind="stable")
        rows = np.arange(n)
        margin = logits[rows, srt[:, 0]] - logits[rows, srt[:, 1]]
        meta_seqs.append({"ids": ids, "argmax": [int(i) for i in srt[:, 0]],
                          "margin": [round(float(m), 6) for m in margin],
                          "max_abs_logit": round(float(np.abs(logits).max()), 4)})
        blobs.append(logits.astype("<f4"))
        seqs.append(ids)
    os.makedirs(ref_dir, exist_ok=True)
    with open(os.path.join(ref_dir, name + ".bin"), "wb") as f:
        for b in blobs:
            f.write(b.tobytes())
    meta = {
        "generator": "tools/reference/make_synth_model.py (transformers %s, torch %s)" % (
            __import__("transformers").__version__, torch.__version__),
        "model_dir": os.path.relpath(folder, ROOT),
        "weights_dtype": spec["dtype"],
        "vocab_size": VOCAB,
        "logits_file": name + ".bin",
        "logits_dtype": "f32",
        "logits_layout": "every position of every sequence, in order",
        "sequences": meta_seqs,
    }
    with open(os.path.join(ref_dir, name + ".json"), "w") as f:
        json.dump(meta, f, separators=(",", ":"))
    sizes = {fn: os.path.getsize(os.path.join(folder, fn)) for fn in sorted(os.listdir(folder))}
    digest = hashlib.sha256(open(os.path.join(folder, "model.safetensors"), "rb").read()).hexdigest()[:16]
    print(f"{name}: {sizes} sha256 {digest}; rope {ref.config.rope_parameters}; "
          f"min margin {min(min(s['margin']) for s in meta_seqs):.4f}, "
          f"max|logit| {max(s['max_abs_logit'] for s in meta_seqs)}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-root", default=os.path.join(ROOT, "tests/data/models"))
    ap.add_argument("--ref-dir", default=os.path.join(ROOT, "tests/data/reference"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    for name, spec in MODELS.items():
        make_model(name, spec, args.out_root, args.ref_dir)


if __name__ == "__main__":
    main()
