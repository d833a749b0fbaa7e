"""End-to-end checks of the selfserve CLI on the real default model."""
import json
import os
import re

STATS = re.compile(
    rb"prompt: (\d+) tokens, prefill ([\d.]+) tok/s \| generated: (\d+) tokens, decode ([\d.]+) tok/s \| peak RSS ([\d.]+) MiB"
)


def test_generate_same_seed_same_text(selfserve, default_model):
    args = ["generate", "--prompt", "The capital of France is", "--max-tokens", "24", "--seed", "5", "--quiet"]
    a = selfserve(*args)
    b = selfserve(*args)
    assert a.stdout == b.stdout
    assert len(a.stdout.strip()) > 0
    m = STATS.search(a.stderr)
    assert m, a.stderr
    assert int(m.group(3)) <= 24


# "Answer in one sentence." gives the greedy answer a margin: without it this 135M model's answer flips
# with the arithmetic (an f32 vs an f16 cache, or the AVX2 vs the AVX-512 kernels, answer in French).
CAPITAL = "What is the capital of France? Answer in one sentence."


def test_greedy_chat_is_deterministic_and_answers(selfserve, default_model):
    args = ["generate", "--chat", "--prompt", CAPITAL, "--temperature", "0", "--max-tokens", "32", "--quiet"]
    a = selfserve(*args)
    b = selfserve(*args)
    assert a.stdout == b.stdout
    assert b"Paris" in a.stdout


def test_q8_kv_cache_answers_and_bad_dtype_is_a_clear_error(selfserve, default_model):
    # The 8-bit cache is the CPU backend's (a GPU build refuses it with a clear error).
    r = selfserve("generate", "--chat", "--prompt", CAPITAL, "--temperature", "0", "--max-tokens", "32",
                  "--kv-cache-dtype", "q8_0", "--device", "cpu", "--quiet")
    assert b"Paris" in r.stdout
    bad = selfserve("generate", "--prompt", "Hi", "--kv-cache-dtype", "q4", check=False)
    assert bad.returncode != 0
    assert b"--kv-cache-dtype" in bad.stderr and b"q8_0" in bad.stderr, bad.stderr


def test_peak_rss_under_twice_the_file(selfserve, default_model):
    # The CPU backend maps the file; a CUDA context alone is several hundred MB of RSS.
    r = selfserve("generate", "--prompt", "Hello", "--max-tokens", "8", "--device", "cpu", "--quiet")
    m = STATS.search(r.stderr)
    assert m, r.stderr
    rss = float(m.group(5)) * 1048576
    assert rss < 2 * os.path.getsize(default_model), f"peak RSS {rss / 1e6:.1f} MB"


def test_device_cpu_never_touches_the_gpu_driver(selfserve, default_model):
    """--device cpu does not probe for a GPU: the dynamic loader's own trace (LD_DEBUG=files) shows no
    attempt to load the driver or the CUDA plugin (on a GPU machine the probe cost a CPU run
    hundreds of MB of RSS). --threads 1, so no topology measurement runs either."""
    r = selfserve("generate", "--prompt", "Hello", "--max-tokens", "2", "--device", "cpu", "--threads", "1",
                  "--quiet", env={"LD_DEBUG": "files"})
    assert r.stdout.strip(), r.stderr[-2000:]
    for lib in (b"libcuda.so", b"libselfserve_cuda.so", b"libcudart", b"libcublas"):
        assert lib not in r.stderr, [l for l in r.stderr.splitlines() if lib in l][:3]


def test_tokenize_round_trip(selfserve, default_model):
    text = "Hello, world! 你好 🌍 1234567 \t  code: x += 1;\n"
    r = selfserve("tokenize", "--json", input=text.encode())
    j = json.loads(r.stdout)
    assert len(j["ids"]) == len(j["pieces"]) > 5
    d = selfserve("tokenize", "--decode", input=" ".join(map(str, j["ids"])).encode())
    assert d.stdout.decode() == text


def test_tokenize_decode_rejects_bad_ids(selfserve, default_model):
    r = selfserve("tokenize", "--decode", input=b"1 2 999999999", check=False)
    assert r.returncode != 0
    assert b"out of range" in r.stderr


def test_inspect_default_model(selfserve, default_model):
    r = selfserve("inspect", default_model)
    out = r.stdout.decode()
    assert "llama" in out and "Q4_1" in out and "blk.29.ffn_down.weight" in out


def test_inspect_bad_file_exits_nonzero_with_one_line(selfserve, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOTAGGUF" + b"\0" * 64)
    r = selfserve("inspect", str(bad), check=False)
    assert r.returncode != 0
    assert str(bad).encode() in r.stdout + r.stderr


def test_generate_missing_model_is_a_clear_error(selfserve, tmp_path):
    r = selfserve("generate", "--model", str(tmp_path / "nope.gguf"), "--prompt", "x", check=False)
    assert r.returncode != 0
    assert b"nope.gguf" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_verify_sha256_mismatch(selfserve, default_model):
    r = selfserve("inspect", default_model, "--verify-sha256", "0" * 64, check=False)
    assert r.returncode != 0
    assert b"sha256" in r.stdout + r.stderr


def test_bench_decode_reports_every_batch_size(selfserve, default_model, tmp_path):
    out = tmp_path / "decode.json"
    # The CPU backend's stage breakdown (the CUDA backend has one only under SS_CUDA_PROFILE=1).
    r = selfserve("bench", "decode", "--batch", "1,3", "--context", "20", "--steps", "4", "--reps", "2",
                  "--threads", "1", "--device", "cpu", "--json", str(out))
    assert b"x first" in r.stdout
    j = json.loads(out.read_text())
    assert j["context"] == 20 and j["steps"] == 4 and j["threads"] == 1 and j["kv_cache_dtype"] == "f16"
    assert [x["batch"] for x in j["results"]] == [1, 3]
    for x in j["results"]:
        assert len(x["step_ms_all"]) == 2 and x["step_ms"] in x["step_ms_all"]
        assert abs(x["tok_s"] - x["batch"] * 1e3 / x["step_ms"]) < 1e-6 * x["tok_s"]
        stages = sum(x["profile_ms"].values())
        # The stage profile times the forward passes, which are nearly all of a step.
        assert 0.5 * x["step_ms"] < stages <= 1.01 * x["step_ms"], (stages, x["step_ms"])
    assert j["results"][0]["speedup"] == 1.0
    assert abs(j["results"][1]["speedup"] - j["results"][1]["tok_s"] / j["results"][0]["tok_s"]) < 1e-9


def test_bench_decode_rejects_an_empty_batch(selfserve, default_model):
    r = selfserve("bench", "decode", "--batch", "0,2", check=False)
    assert r.returncode != 0
    assert b"--batch" in r.stderr


def test_bench_decode_refuses_steps_past_the_models_context(selfserve, default_model):
    """The last decode position must exist in the model (the GPU backend's block tables end there):
    a clear error before any work, the context length read by the gguf package."""
    import pytest
    gguf = pytest.importorskip("gguf")
    r = gguf.GGUFReader(default_model)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    n_ctx = int(r.fields[f"{arch}.context_length"].parts[-1][0])
    bad = selfserve("bench", "decode", "--model", default_model, "--batch", "1", "--context", str(n_ctx - 1),
                    "--steps", "2", "--reps", "1", check=False)
    assert bad.returncode != 0
    assert f"passes the model's context of {n_ctx} tokens".encode() in bad.stderr
    ok = selfserve("bench", "decode", "--model", default_model, "--batch", "1", "--context", str(n_ctx - 2),
                   "--steps", "2", "--reps", "1", check=False)
    assert ok.returncode == 0, ok.stderr


def test_generate_json_schema(selfserve, default_model, tmp_path):
    """llama.cpp's -j / --json-schema-file: the printed text parses and validates (jsonschema package)."""
    import pytest
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"type": "object",
              "properties": {"name": {"type": "string", "maxLength": 20},
                             "age": {"type": "integer", "minimum": 0, "maximum": 30},
                             "color": {"enum": ["black", "white", "orange"]}},
              "required": ["name", "age", "color"], "additionalProperties": False}
    path = tmp_path / "cat.json"
    path.write_text(json.dumps(schema))
    for seed in ("1", "2", "3"):
        r = selfserve("generate", "--chat", "--prompt", "Describe a cat as JSON.", "--json-schema-file", str(path),
                      "--temperature", "1", "--max-tokens", "80", "--seed", seed, "--quiet")
        doc = json.loads(r.stdout)
        jsonschema.validate(doc, schema)
        assert list(doc) == ["name", "age", "color"]
    # llama.cpp's --grammar (GBNF) and a --regex: the output is a whole match (checked with Python's re).
    for seed in ("1", "2"):
        r = selfserve("generate", "--prompt", "Colors:", "--grammar",
                      'root ::= color (", " color){2}\ncolor ::= "red" | "green" | "blue"',
                      "--temperature", "1", "--max-tokens", "20", "--seed", seed, "--quiet")
        assert re.fullmatch(r"(red|green|blue)(, (red|green|blue)){2}", r.stdout.decode().strip()), r.stdout
        r = selfserve("generate", "--prompt", "The answer is", "--regex", r"(yes|no), because [a-z ]{5,30}\.",
                      "--temperature", "1", "--max-tokens", "30", "--seed", seed, "--quiet")
        assert re.fullmatch(r"(yes|no), because [a-z ]{5,30}\.", r.stdout.decode().strip()), r.stdout
    bad = selfserve("generate", "--prompt", "x", "--grammar", "root ::= item", check=False)
    assert bad.returncode != 0 and b"'item' is used but not defined" in bad.stderr, bad.stderr
    bad = selfserve("generate", "--prompt", "x", "--regex", "a", "--grammar", 'root ::= "a"', check=False)
    assert bad.returncode != 0 and b"give one of" in bad.stderr, bad.stderr
    bad = selfserve("generate", "--prompt", "x", "-j", '{"type": "string", "pattern": "(?=a)"}', check=False)
    assert bad.returncode != 0 and b"pattern" in bad.stderr and b"lookaround" in bad.stderr, bad.stderr
