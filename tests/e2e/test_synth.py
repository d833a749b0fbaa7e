"""selfserve synth read by an independent reader: the `gguf` package parses our GGUF (names, shapes,
types, metadata), dequantizes every tensor, and the values are checked against a numpy
reimplementation of the generator (and, for the ggml reference quantizers, against gguf's own
quantizer, byte for byte). The safetensors folder is parsed with plain json + numpy."""
import json
import struct

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as QT  # noqa: E402

M64 = (1 << 64) - 1
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
SCALE = np.float32(0.02 * 1.7320508075688772 / 65536.0 / 2.0)


def mix64(z):
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def tensor_key(seed, name):
    h = 0xCBF29CE484222325
    for c in name.encode():
        h = ((h ^ c) * 0x100000001B3) & M64
    return int(mix64(mix64(np.uint64(seed)) ^ np.uint64(h)))


def values(seed, name, rows, cols):
    """The generator, [rows, cols] in the Hugging Face layout."""
    with np.errstate(over="ignore"):
        idx = np.arange(rows * cols, dtype=np.uint64)
        z = mix64(np.uint64(tensor_key(seed, name)) + (idx + np.uint64(1)) * GOLDEN)
    m = np.uint64(0xFFFF)
    s = (z & m) + ((z >> np.uint64(16)) & m) + ((z >> np.uint64(32)) & m) + (z >> np.uint64(48))
    v = (2 * s.astype(np.int64) - 262140).astype(np.float32) * SCALE
    return v.reshape(rows, cols)


def permute(w, n_head):
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


SMOL = dict(hidden=576, heads=9, kv=3, hd=64, ffn=1536)


def expected_tensors(layers, vocab, c, qwen3=False):
    q, kv = c["heads"] * c["hd"], c["kv"] * c["hd"]
    t = {"token_embd.weight": (vocab, c["hidden"])}
    for i in range(layers):
        b = f"blk.{i}."
        t[b + "attn_norm.weight"] = (c["hidden"],)
        t[b + "attn_q.weight"] = (q, c["hidden"])
        t[b + "attn_k.weight"] = (kv, c["hidden"])
        t[b + "attn_v.weight"] = (kv, c["hidden"])
        t[b + "attn_output.weight"] = (c["hidden"], q)
        if qwen3:
            t[b + "attn_q_norm.weight"] = (c["hd"],)
            t[b + "attn_k_norm.weight"] = (c["hd"],)
        t[b + "ffn_norm.weight"] = (c["hidden"],)
        t[b + "ffn_gate.weight"] = (c["ffn"], c["hidden"])
        t[b + "ffn_up.weight"] = (c["ffn"], c["hidden"])
        t[b + "ffn_down.weight"] = (c["hidden"], c["ffn"])
    t["output_norm.weight"] = (c["hidden"],)
    return t


def hf_values(seed, name, shape, c):
    """What the GGUF tensor `name` must hold, in GGUF row order."""
    if len(shape) == 1:
        return np.ones(shape, dtype=np.float32)
    w = values(seed, name, *shape)
    if name.endswith("attn_q.weight"):
        w = permute(w, c["heads"])
    elif name.endswith("attn_k.weight"):
        w = permute(w, c["kv"])
    return w


def synth(selfserve, out, *args):
    return selfserve("synth", "--quiet", "--out", str(out), *args)


# Error bound of each block type relative to the block's largest magnitude (derived in synth_test.cpp:
# half a step, a whole step where the signed extreme pins the range, fp16 scales ~2^-11 per step).
_F = 1 + 128 * 2 ** -11
BOUND = {QT.F32: 0.0, QT.F16: 2 ** -11, QT.BF16: 2 ** -8,
         QT.Q8_0: (0.5 + 127 * 2 ** -11) / 127, QT.Q4_0: 1 / 8 * _F, QT.Q5_0: 1 / 16 * _F,
         QT.Q4_1: 1 / 15 * _F + 2 ** -11, QT.Q5_1: 1 / 31 * _F + 2 ** -11,
         QT.Q4_K: (2 / 15 * (1 + 1 / 63) * 0.5 + 0.5 / 63) * _F,
         QT.Q6_K: 1 / 31 * (1 + 1 / 127) * 0.5 * _F + 2 ** -11}
FALLBACK = {QT.Q4_K: QT.Q5_0, QT.Q6_K: QT.Q8_0}  # llama.cpp's, for rows not whole super-blocks
REF_QUANT = {QT.Q8_0, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1}


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q6_k"])
def test_gguf_read_by_the_gguf_package(selfserve, tmp_path, dtype):
    seed, vocab = 17, 300
    path = tmp_path / "m.gguf"
    synth(selfserve, path, "--shape", "smollm2-135m", "--layers", "1", "--vocab", str(vocab),
          "--format", "gguf", "--dtype", dtype, "--seed", str(seed))
    r = gguf.GGUFReader(str(path))
    kv = {f.name: f for f in r.fields.values()}
    assert bytes(kv["general.architecture"].parts[-1]).decode() == "llama"
    assert int(kv["llama.embedding_length"].parts[-1][0]) == 576
    assert int(kv["llama.attention.head_count_kv"].parts[-1][0]) == 3
    assert int(kv["llama.block_count"].parts[-1][0]) == 1
    assert len(kv["tokenizer.ggml.tokens"].data) == vocab
    assert bytes(kv["tokenizer.ggml.model"].parts[-1]).decode() == "llama"

    want = expected_tensors(1, vocab, SMOL)
    got = {t.name: t for t in r.tensors}
    assert sorted(got) == sorted(want)
    want_type = QT[dtype.upper()]
    for name, shape in want.items():
        t = got[name]
        assert tuple(int(x) for x in reversed(t.shape)) == shape, name  # gguf lists ne[0] first
        if len(shape) == 1:
            assert t.tensor_type == QT.F32, name
        elif want_type in FALLBACK and shape[1] % 256:
            assert t.tensor_type == FALLBACK[want_type], name
        else:
            assert t.tensor_type == want_type, name
        ref = hf_values(seed, name, shape, SMOL)
        deq = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        if t.tensor_type == QT.F32:
            np.testing.assert_array_equal(deq, ref, err_msg=name)
            continue
        bs = gguf.GGML_QUANT_SIZES[t.tensor_type][0]
        blocks = ref.reshape(-1, bs) if bs > 1 else ref.reshape(-1, 1)
        amax = np.abs(blocks).max(axis=1, keepdims=True) if bs > 1 else np.abs(blocks)
        err = np.abs(deq.reshape(blocks.shape) - blocks)
        floor = 2.0 ** -25 if t.tensor_type == QT.F16 else 0.0  # half of fp16's subnormal step
        assert (err <= BOUND[t.tensor_type] * amax + floor).all(), (name, float((err / np.maximum(amax, 1e-30)).max()))
        if t.tensor_type in REF_QUANT:  # ggml's reference quantizer, reimplemented by the gguf package
            np.testing.assert_array_equal(np.asarray(t.data).reshape(-1),
                                          gguf.quants.quantize(ref, t.tensor_type).reshape(-1), err_msg=name)


def read_safetensors(path):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        assert e["dtype"] == "BF16", name
        u = np.frombuffer(data[b:end], dtype="<u2").astype(np.uint32) << 16
        out[name] = u.view(np.float32).reshape(e["shape"])
    return out


def test_safetensors_folder_is_the_gguf_model_in_bf16(selfserve, tmp_path):
    seed, vocab = 23, 400
    synth(selfserve, tmp_path / "hf", "--shape", "qwen3-06b", "--layers", "1", "--vocab", str(vocab),
          "--format", "safetensors", "--dtype", "bf16", "--seed", str(seed))
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["model_type"] == "qwen3" and cfg["head_dim"] == 128 and cfg["num_key_value_heads"] == 8
    assert cfg["hidden_size"] == 1024 and cfg["intermediate_size"] == 3072 and cfg["vocab_size"] == vocab
    tok = json.loads((tmp_path / "hf" / "tokenizer.json").read_text())
    assert len(tok["model"]["vocab"]) == vocab
    st = read_safetensors(tmp_path / "hf" / "model.safetensors")
    q = values(seed, "blk.0.attn_q.weight", 2048, 1024)
    bf = (q.view(np.uint32).astype(np.uint64) + 0x7FFF + ((q.view(np.uint32) >> 16) & 1)) >> 16
    np.testing.assert_array_equal(st["model.layers.0.self_attn.q_proj.weight"],
                                  (bf.astype(np.uint32) << 16).view(np.float32))
    np.testing.assert_array_equal(st["model.layers.0.self_attn.q_norm.weight"], np.ones(128, np.float32))
    assert "lm_head.weight" not in st  # tied
    assert st["model.embed_tokens.weight"].shape == (vocab, 1024)


def test_same_arguments_same_bytes_and_bad_arguments(selfserve, tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    args = ["--shape", "qwen25-05b", "--layers", "1", "--vocab", "300", "--dtype", "q4_k", "--seed", "5"]
    synth(selfserve, a, *args, "--threads", "1")
    synth(selfserve, b, *args, "--threads", "2")
    assert a.read_bytes() == b.read_bytes()
    r = selfserve("synth", "--shape", "gpt5", "--out", str(tmp_path / "x.gguf"), check=False)
    assert r.returncode != 0 and b"unknown shape 'gpt5'" in r.stderr
    r = selfserve("synth", "--shape", "llama3-8b", "--format", "safetensors", "--dtype", "q4_0",
                  "--out", str(tmp_path / "x"), check=False)
    assert r.returncode != 0 and b"safetensors holds f32, f16 or bf16" in r.stderr
    r = selfserve("synth", "--shape", "llama3-8b", "--format", "onnx", "--out", str(tmp_path / "y"), check=False)
    assert r.returncode != 0 and b"--format must be gguf or safetensors" in r.stderr
