#!/usr/bin/env python3
"""Reference logits for the default model, computed by Hugging Face transformers (not our C++).

transformers loads the GGUF file and dequantizes every weight to float32, then runs its own Llama
forward in float32. For each prompt we record: the token ids (tokenized by the HF tokenizer built from
the same GGUF, so the test does not depend on our tokenizer), the argmax and top-2 margin at every
position, the top-8 (id, logit) at every position, and the full logit vector (float16) at a few
positions.

It also measures the noise our SIMD kernels are expected to add: like llama.cpp they round every
matmul input to 8-bit blocks of 32 (Q8_0/Q8_1: d = max|x|/127, q = round(x/d)) before the integer
dot product with the quantized weights. We re-run the forward with exactly that rounding applied to
every Linear input ("q8sim", weights unchanged) and record how far it moves the logits and the top-2
gap. A second run with the inputs perturbed by 1e-6 (relative) before rounding shows that this noise
is chaotic: two equally correct 8-bit implementations differ from each other as much as either
differs from the float forward, so q8sim is a noise measurement, not a tighter reference. The C++
test derives its tolerances from these numbers (see tests/unit/backend/forward_test.cpp).

Output (committed, < 3 MB): tests/data/reference/<name>.json and <name>.bin (float16 little-endian,
rows of vocab_size in the order listed in json["full_logits"]).

Usage: python3 tools/reference/make_logits_ref.py [--model PATH] [--out-dir DIR]
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

PROMPTS = [
    # chat-formatted, as the server will send it
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "The quick brown fox jumps over the lazy dog. The quick brown",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "1, 2, 3, 5, 8, 13, 21, 34, 55, 89,",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old woman who "
    "knew the names of every bird. One morning she woke to find that the birds had gone silent, and",
]
TOPK = 8


def default_model_path():
    home = os.environ.get("SELFSERVE_HOME")
    base = os.path.join(home, "models") if home else os.path.expanduser("~/.cache/selfserve/models")
    return os.path.join(base, "SmolLM2-135M-Instruct.Q4_1.gguf")


def q8_blocks(x, block=32):
    """Round x the way the kernels quantize activations: per 32-block, d = amax/127, q = round(x/d)."""
    shp = x.shape
    xb = x.reshape(-1, shp[-1] // block, block)
    amax = xb.abs().amax(dim=-1, keepdim=True)
    d = amax / 127.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(xb * inv).clamp(-127, 127)
    return (q * d).reshape(shp)


def forward_logits(model, ids):
    with torch.no_grad():
        out = model(torch.tensor([ids], dtype=torch.long))
    return out.logits[0].float().numpy()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=default_model_path())
    ap.add_argument("--out-dir", default=os.path.join(os.path.dirname(__file__), "../../tests/data/reference"))
    ap.add_argument("--name", default="smollm2-135m-instruct-q4_1")
    args = ap.parse_args()
    if not os.path.exists(args.model):
        sys.exit(f"{args.model}: not found (download the default model first)")

    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    d, f = os.path.split(os.path.abspath(args.model))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    model.eval()
    vocab = model.config.vocab_size

    # Activation-rounding noise probe: a pre-hook on every Linear rounds its input like Q8_0/Q8_1.
    def q8_hook(_mod, inputs):
        return (q8_blocks(inputs[0]),)

    records, blobs, full_index = [], [], []
    noise = {"max_abs_diff": 0.0, "max_rel_diff": 0.0, "max_margin_change": 0.0, "perturbed_max_abs_diff": 0.0}
    flips = []
    for pi, text in enumerate(PROMPTS):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        n = len(ids)
        rows = np.arange(n)
        logits = forward_logits(model, ids)  # [n, vocab]
        gen = torch.Generator().manual_seed(pi)
        hooks = [m.register_forward_pre_hook(q8_hook) for m in model.modules() if isinstance(m, torch.nn.Linear)]
        logits_q8 = forward_logits(model, ids)
        for h in hooks:
            h.remove()
        hooks = [m.register_forward_pre_hook(
                     lambda _m, i: (q8_blocks(i[0] * (1 + 1e-6 * torch.randn(i[0].shape, generator=gen))),))
                 for m in model.modules() if isinstance(m, torch.nn.Linear)]
        logits_q8b = forward_logits(model, ids)
        for h in hooks:
            h.remove()

        srt = np.argsort(-logits, axis=1, kind="stable")
        top1 = srt[:, 0]
        margin = logits[rows, srt[:, 0]] - logits[rows, srt[:, 1]]
        diff = np.abs(logits - logits_q8).max(axis=1)
        # How much 8-bit activation rounding moves the reference's top-2 gap (what decides top-1).
        dm = np.abs((logits_q8[rows, srt[:, 0]] - logits_q8[rows, srt[:, 1]]) - margin)
        noise["max_abs_diff"] = max(noise["max_abs_diff"], float(diff.max()))
        noise["max_rel_diff"] = max(noise["max_rel_diff"], float((diff / np.abs(logits).max(axis=1)).max()))
        noise["max_margin_change"] = max(noise["max_margin_change"], float(dm.max()))
        noise["perturbed_max_abs_diff"] = max(noise["perturbed_max_abs_diff"], float(np.abs(logits_q8 - logits_q8b).max()))
        f = [int(p) for p in np.nonzero(np.argmax(logits_q8, axis=1) != top1)[0]]
        flips += [{"prompt": pi, "pos": p, "margin": round(float(margin[p]), 5)} for p in f]
        for p in sorted(set([0, n // 3, (2 * n) // 3, n - 1])):
            full_index.append({"prompt": pi, "pos": p})
            blobs.append(logits[p].astype("<f2"))
        records.append({
            "text": text,
            "ids": [int(i) for i in ids],
            "argmax": [int(i) for i in top1],
            "margin": [round(float(m), 5) for m in margin],
            "topk_ids": [[int(i) for i in row[:TOPK]] for row in srt],
            "topk_logits": [[round(float(logits[r, i]), 5) for i in srt[r, :TOPK]] for r in range(n)],
            "max_abs_logit": [round(float(v), 4) for v in np.abs(logits).max(axis=1)],
            "q8sim_max_abs_diff": [round(float(v), 5) for v in diff],
        })
        print(f"prompt {pi}: {n} tokens, min margin {margin.min():.4f}, q8sim max|d| {diff.max():.4f}, "
              f"top-1 flips {f}", file=sys.stderr)

    os.makedirs(args.out_dir, exist_ok=True)
    bin_name = args.name + ".bin"
    with open(os.path.join(args.out_dir, bin_name), "wb") as fbin:
        for b in blobs:
            fbin.write(b.tobytes())
    meta = {
        "generator": "tools/reference/make_logits_ref.py (transformers %s, torch %s)" % (
            __import__("transformers").__version__, torch.__version__),
        "model_file": os.path.basename(args.model),
        "vocab_size": int(vocab),
        "logits_file": bin_name,
        "logits_dtype": "f16",
        "full_logits": full_index,
        "q8sim_noise": {k: round(v, 5) for k, v in noise.items()},
        "q8sim_top1_flips": flips,
        "prompts": records,
    }
    with open(os.path.join(args.out_dir, args.name + ".json"), "w") as fj:
        json.dump(meta, fj, separators=(",", ":"))
    print(f"wrote {args.out_dir}/{args.name}.json + {bin_name}; q8sim noise {noise}", file=sys.stderr)


if __name__ == "__main__":
    main()
